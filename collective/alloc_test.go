// The race detector's bookkeeping allocates, so allocation counts mean
// nothing under it: these tests are built without it only.

//go:build !race

package collective

import (
	"context"
	"fmt"
	"slices"
	"testing"
)

// rankLoop keeps one goroutine per rank alive across calls, so that a
// step of every rank allocates nothing but what the collectives do
// (starting goroutines would).
type rankLoop struct {
	start []chan func(r int, c Comm) error
	done  chan error
}

func newRankLoop(t testing.TB, comms []Comm) *rankLoop {
	l := &rankLoop{done: make(chan error, len(comms))}
	for r, c := range comms {
		start := make(chan func(int, Comm) error)
		l.start = append(l.start, start)
		go func() {
			for f := range start {
				l.done <- f(r, c)
			}
		}()
	}
	t.Cleanup(func() {
		for _, s := range l.start {
			close(s)
		}
	})
	return l
}

// step runs f on every rank at once and returns the first error.
func (l *rankLoop) step(f func(r int, c Comm) error) error {
	for _, s := range l.start {
		s <- f
	}
	var first error
	for range l.start {
		if err := <-l.done; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// TestSteadyStateAllocatesNothing: once warm, a collective allocates
// nothing on any rank, through shared memory and through sockets alike.
func TestSteadyStateAllocatesNothing(t *testing.T) {
	const n = 4
	for _, transport := range []string{"auto", "tcp"} {
		comms := testWorld(t, n, TCPOptions{Transport: transport})
		loop := newRankLoop(t, comms)
		ctx := context.Background()
		for _, size := range []int{8, 64 << 10, 3 << 20} {
			bufs := make([][]byte, n)
			outs := make([][]byte, n)
			for r := range bufs {
				bufs[r] = make([]byte, size)
				outs[r] = make([]byte, n*size)
			}
			counts := slices.Repeat([]int{size / 4 / n}, n)
			per := size / n / 4 * 4
			calls := []struct {
				name string
				f    func(r int, c Comm) error
			}{
				{"all_reduce", func(r int, c Comm) error { return c.AllReduce(ctx, bufs[r], Float32, Sum) }},
				{"broadcast", func(r int, c Comm) error { return c.Broadcast(ctx, bufs[r], Float32, 1) }},
				{"reduce", func(r int, c Comm) error { return c.Reduce(ctx, bufs[r], Float32, Sum, 2) }},
				{"all_gather", func(r int, c Comm) error { return c.AllGather(ctx, outs[r], bufs[r], Float32) }},
				{"reduce_scatter", func(r int, c Comm) error {
					return c.ReduceScatter(ctx, bufs[r][:per], outs[r][:n*per], Float32, Sum, counts)
				}},
				{"all_to_all", func(r int, c Comm) error {
					return c.AllToAll(ctx, outs[r][:n*per], bufs[r][:n*per], Float32, counts, counts)
				}},
				{"barrier", func(r int, c Comm) error { return c.Barrier(ctx) }},
			}
			for _, call := range calls {
				t.Run(fmt.Sprintf("%s/%s/%dB", transport, call.name, size), func(t *testing.T) {
					var err error
					run := func() {
						if e := loop.step(call.f); e != nil && err == nil {
							err = e
						}
					}
					// Connections, pools and buffers warm up. The buffers
					// of frames that come before their receives grow to
					// the most ever out at once, which a peer running a
					// call ahead sets by timing: over TCP, 3 MiB
					// all_gathers still found new highs after 5 calls.
					for range 50 {
						run()
					}
					allocs := fewestAllocs(run)
					if err != nil {
						t.Fatal(err)
					}
					if allocs != 0 {
						t.Errorf("%v allocations per call on %d ranks", allocs, n)
					}
				})
			}
		}
	}
}

// TestHierarchicalAllocatesNothing: once warm, hierarchical collectives
// allocate nothing.
func TestHierarchicalAllocatesNothing(t *testing.T) {
	comms := hostsWorld(t, []int{0, 0, 1, 1}, TCPOptions{Algorithm: "hier"})
	loop := newRankLoop(t, comms)
	ctx := context.Background()
	for _, size := range []int{8, 64 << 10, 3 << 20} {
		bufs := make([][]byte, len(comms))
		for r := range bufs {
			bufs[r] = make([]byte, size)
		}
		calls := map[string]func(r int, c Comm) error{
			"all_reduce": func(r int, c Comm) error { return c.AllReduce(ctx, bufs[r], Float32, Sum) },
			"broadcast":  func(r int, c Comm) error { return c.Broadcast(ctx, bufs[r], Float32, 3) },
			"barrier":    func(r int, c Comm) error { return c.Barrier(ctx) },
		}
		for name, f := range calls {
			t.Run(fmt.Sprintf("%s/%dB", name, size), func(t *testing.T) {
				var err error
				run := func() {
					if e := loop.step(f); e != nil && err == nil {
						err = e
					}
				}
				for range 5 {
					run()
				}
				allocs := fewestAllocs(run)
				if err != nil {
					t.Fatal(err)
				}
				if allocs != 0 {
					t.Errorf("%v allocations per call", allocs)
				}
			})
		}
	}
}

// fewestAllocs is the fewest allocations per call of run over a few
// measurements: the counts are the process's, and goroutines that earlier
// tests left winding down may allocate during one; a collective that
// allocates does so in every one.
func fewestAllocs(run func()) float64 {
	allocs := testing.AllocsPerRun(20, run)
	for range 2 {
		allocs = min(allocs, testing.AllocsPerRun(20, run))
	}
	return allocs
}
