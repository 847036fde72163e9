package elastic

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/gorun/gorun/launcher"
)

// fakeClock is a clock that moves only when told.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time          { return c.t }
func (c *fakeClock) advance(d time.Duration) { c.t = c.t.Add(d) }

// counter is a worker's progress counter as a test drives it.
type counter struct {
	n   uint64
	err error
}

func (c *counter) read() (uint64, error) { return c.n, c.err }

func TestHangWatch(t *testing.T) {
	const timeout = 10 * time.Second
	// step is one check: first the clock advances and the counters of
	// the listed local ranks move, then the check must find stuck.
	type step struct {
		advance time.Duration
		move    []int
		exit    []int
		stuck   []int
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"steady progress", []step{
			{advance: 0, move: []int{0, 1}},
			{advance: 9 * time.Second, move: []int{0, 1}},
			{advance: 9 * time.Second, move: []int{0, 1}},
			{advance: 9 * time.Second, move: []int{0, 1}},
		}},
		{"never started counters arm nothing", []step{
			{advance: time.Hour},
			{advance: time.Hour},
		}},
		{"one rank stops", []step{
			{advance: time.Second, move: []int{0, 1}},
			{advance: 9 * time.Second, move: []int{0}},
			{advance: 1 * time.Second, move: []int{0}, stuck: []int{1}},
		}},
		{"the timeout counts from the last move", []step{
			{advance: time.Second, move: []int{0, 1}},
			{advance: 9 * time.Second},
			{advance: 999 * time.Millisecond, move: []int{1}},
			{advance: 1 * time.Millisecond, stuck: []int{0}},
			{advance: timeout, stuck: []int{0, 1}},
		}},
		{"a counter that moved once then stopped", []step{
			{advance: time.Minute, move: []int{0}},
			{advance: timeout, stuck: []int{0}},
		}},
		{"an exited worker is not stuck", []step{
			{advance: time.Second, move: []int{0, 1}},
			{advance: time.Second, exit: []int{1}},
			{advance: timeout, stuck: []int{0}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}
			h := newHangWatch(timeout, clock.now)
			counters := []*counter{{}, {}}
			for lr, c := range counters {
				h.add(lr, 10+lr, c.read)
			}
			for i, s := range tc.steps {
				clock.advance(s.advance)
				for _, lr := range s.move {
					counters[lr].n++
				}
				for _, lr := range s.exit {
					h.forget(lr)
				}
				var got []int
				for _, w := range h.check() {
					got = append(got, w.localRank)
					if w.rank != 10+w.localRank || w.idle < timeout {
						t.Errorf("step %d: stuck %+v: want rank %d and idle of at least %s", i, w, 10+w.localRank, timeout)
					}
				}
				if !slices.Equal(got, s.stuck) {
					t.Errorf("step %d: stuck local ranks %v, want %v", i, got, s.stuck)
				}
			}
		})
	}
}

func TestHangWatchUnreadableCounterIsUnchanged(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	h := newHangWatch(time.Second, clock.now)
	c := &counter{n: 1}
	h.add(0, 0, c.read)
	if stuck := h.check(); len(stuck) != 0 {
		t.Fatalf("stuck at once: %v", stuck)
	}
	c.err, c.n = errors.New("gone"), 2
	clock.advance(time.Second)
	if stuck := h.check(); len(stuck) != 1 || stuck[0].idle != time.Second {
		t.Fatalf("an unreadable counter: stuck %v, want local rank 0 idle 1s", stuck)
	}
}

func TestHangCheckPeriod(t *testing.T) {
	for timeout, want := range map[time.Duration]time.Duration{
		time.Second:      100 * time.Millisecond,
		2 * time.Second:  200 * time.Millisecond,
		30 * time.Second: 3 * time.Second,
		time.Hour:        5 * time.Second,
	} {
		if got := hangCheckPeriod(timeout); got != want {
			t.Errorf("hangCheckPeriod(%s) = %s, want %s", timeout, got, want)
		}
	}
}

func TestProgressFileReads(t *testing.T) {
	dir, err := launcher.OpenLogDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	p, err := createProgressFile(dir, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(p.path) != progressFileName {
		t.Errorf("progress file %s", p.path)
	}
	f, err := os.OpenFile(p.path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if n, err := readCounter(f); n != 0 || err != nil {
		t.Fatalf("new counter = %d, %v; want 0", n, err)
	}
	b := make([]byte, 8)
	b[0] = 1 // 1 or 1<<56: the byte order is the host's
	if _, err := f.WriteAt(b, 0); err != nil {
		t.Fatal(err)
	}
	if n, err := readCounter(f); n == 0 || err != nil {
		t.Fatalf("counter after a write = %d, %v; want it moved", n, err)
	}
}

func TestHangFailure(t *testing.T) {
	found := time.Unix(1_700_000_000, 0)
	h := &hangCheck{
		stuck:   map[int]stuckWorker{1: {localRank: 1, rank: 3, idle: 30*time.Second + 40*time.Millisecond}},
		pending: 1,
		found:   found,
		watch:   newHangWatch(time.Second, time.Now),
	}
	if stuck, _ := h.exited(0); stuck {
		t.Error("local rank 0 taken for stuck")
	}
	stuck, all := h.exited(1)
	if !stuck || !all {
		t.Fatalf("exited(1) = %v, %v; want true, true", stuck, all)
	}
	for _, tc := range []struct {
		exit      launcher.Exit
		written   *launcher.ErrorInfo
		code      int
		traceback string
	}{
		{launcher.Exit{LocalRank: 1, Rank: 3, ExitCode: 2}, nil, 2, ""},
		{launcher.Exit{LocalRank: 1, Rank: 3, ExitCode: 0}, nil, 1, ""},
		{launcher.Exit{LocalRank: 1, Rank: 3, ExitCode: 134, Signal: 6}, &launcher.ErrorInfo{Message: "boom", Traceback: "at x"}, 134, "boom\nat x"},
	} {
		f := h.failure(tc.exit.LocalRank, Failure{Exit: tc.exit, Error: tc.written})
		if f.Error == nil || f.Error.Message != "hang: no collective progress for 30s" || f.Error.Traceback != tc.traceback {
			t.Errorf("failure of %v: error %+v", tc.exit, f.Error)
		}
		if f.ExitCode != tc.code || !f.When().Equal(found) {
			t.Errorf("failure of %v: exit code %d at %s, want %d at %s", tc.exit, f.ExitCode, f.When(), tc.code, found)
		}
	}
}
