package collective

import (
	goruntime "runtime"
	"sync"
)

// Two Ps while a transport is open. An op spins on its sockets holding a
// P, and the poller's goroutine needs another whenever a socket nobody
// spins on has data; with one P (the Go runtime's choice for a process
// pinned to one core: taskset, gorun --bind-to, a Slurm or container CPU
// limit) each such hand-off waited for the scheduler's monitor to preempt
// the spinner, 10 to 20 ms (4 ranks pinned two to a core, over TCP: an
// 8-byte all_reduce took 220 us instead of 46, 1 MiB 11 ms instead of
// 1.5). Two Ps cost no core: the poller's mostly sleeps.
//
// GOMAXPROCS belongs to the whole process, so the transports own the
// raise together: the first to open raises it from 1 to 2, the last to
// close puts back what it was, unless someone set another value since
// (theirs then stands). Setting GOMAXPROCS turns off the Go runtime's own
// updates of it (runtime.SetDefaultGOMAXPROCS turns them back on); a
// process that never had one P is never touched.
var twoPs = procsFloor{min: 2, gomaxprocs: goruntime.GOMAXPROCS}

// procsFloor keeps GOMAXPROCS at min or more while it has holders.
type procsFloor struct {
	min        int
	gomaxprocs func(n int) int // runtime.GOMAXPROCS: sets n > 0, returns the previous value

	mu      sync.Mutex
	holders int
	raised  int // the value before the raise, while raised; 0 when not
}

// hold raises GOMAXPROCS to the floor if it is below, and reports
// whether it did. Every hold is paired with one release.
func (f *procsFloor) hold() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.holders++
	if now := f.gomaxprocs(0); now < f.min {
		f.gomaxprocs(f.min)
		if f.raised == 0 {
			f.raised = now
		}
		return true
	}
	return false
}

// release drops a hold; the last one restores the value before the raise
// when GOMAXPROCS is still the floor.
func (f *procsFloor) release() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.holders--; f.holders > 0 || f.raised == 0 {
		return
	}
	if f.gomaxprocs(0) == f.min {
		f.gomaxprocs(f.raised)
	}
	f.raised = 0
}
