package collective

import (
	"fmt"
	goruntime "runtime"
	"strings"
	"testing"
)

// TestCommOwnsGOMAXPROCS: a process with one P has two while a
// communicator is open, and one again once the last is closed.
func TestCommOwnsGOMAXPROCS(t *testing.T) {
	prev := goruntime.GOMAXPROCS(1)
	t.Cleanup(func() { goruntime.GOMAXPROCS(prev) })
	comms := testWorld(t, 2, TCPOptions{})
	if got := goruntime.GOMAXPROCS(0); got != 2 {
		t.Fatalf("GOMAXPROCS %d with communicators open, want 2", got)
	}
	comms[0].Close()
	if got := goruntime.GOMAXPROCS(0); got != 2 {
		t.Fatalf("GOMAXPROCS %d with one communicator still open, want 2", got)
	}
	comms[1].Close()
	if got := goruntime.GOMAXPROCS(0); got != 1 {
		t.Fatalf("GOMAXPROCS %d once every communicator closed, want 1 as before", got)
	}
}

// TestProcsFloor: GOMAXPROCS is raised while transports are open and put
// back when the last closes, unless someone else changed it meanwhile.
func TestProcsFloor(t *testing.T) {
	for _, tc := range []struct {
		name  string
		start int
		steps string // h: hold, r: release, s<n>: someone sets GOMAXPROCS to n
		want  []int  // GOMAXPROCS after each step
	}{
		{"one core, one transport", 1, "h r", []int{2, 1}},
		{"one core, overlapping transports", 1, "h h r r", []int{2, 2, 2, 1}},
		{"one core, one after another", 1, "h r h r", []int{2, 1, 2, 1}},
		{"many cores are never touched", 8, "h h r r", []int{8, 8, 8, 8}},
		{"two already: nothing to restore", 2, "h r", []int{2, 2}},
		{"the user's later setting stands", 1, "h s4 r", []int{2, 4, 4}},
		{"the user lowers it while held: raised again, first value restored", 1, "h s1 h r r", []int{2, 1, 2, 2, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			procs, sets := tc.start, 0
			f := procsFloor{min: 2, gomaxprocs: func(n int) int {
				prev := procs
				if n > 0 {
					procs, sets = n, sets+1
				}
				return prev
			}}
			var got []int
			for _, step := range strings.Fields(tc.steps) {
				switch step[0] {
				case 'h':
					f.hold()
				case 'r':
					f.release()
				case 's':
					fmt.Sscan(step[1:], &procs)
				}
				got = append(got, procs)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("GOMAXPROCS after %q: %v, want %v", tc.steps, got, tc.want)
			}
			if tc.start >= 2 && sets != 0 {
				t.Errorf("GOMAXPROCS set %d times in a process that had %d", sets, tc.start)
			}
		})
	}
}
