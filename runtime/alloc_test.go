// The race detector's bookkeeping allocates, so allocation counts mean
// nothing under it: these tests are built without it only.

//go:build !race

package runtime

import (
	"context"
	"fmt"
	goruntime "runtime"
	"testing"
)

// blockingCalls are the blocking collectives whose steady state must not
// allocate: the calls on host tensors a training loop makes every step,
// run inline on the caller's goroutine. Each gives the call to repeat on
// buffers of its own, for a world of 2 ranks.
var blockingCalls = []struct {
	name string
	call func() func(ctx context.Context, pg *ProcessGroup) error
}{
	{"all_reduce", func() func(context.Context, *ProcessGroup) error {
		x := Of([]float32{1, 2})
		return func(ctx context.Context, pg *ProcessGroup) error { return pg.AllReduce(ctx, x, Sum) }
	}},
	{"broadcast", func() func(context.Context, *ProcessGroup) error {
		x := Of([]float32{1, 2})
		return func(ctx context.Context, pg *ProcessGroup) error { return pg.Broadcast(ctx, x, 1) }
	}},
	{"reduce", func() func(context.Context, *ProcessGroup) error {
		x := Of([]float32{1, 2})
		return func(ctx context.Context, pg *ProcessGroup) error { return pg.Reduce(ctx, x, 0, Max) }
	}},
	{"barrier", func() func(context.Context, *ProcessGroup) error {
		return func(ctx context.Context, pg *ProcessGroup) error { return pg.Barrier(ctx) }
	}},
	{"all_gather_into_tensor", func() func(context.Context, *ProcessGroup) error {
		in, out := Of([]float32{1, 2}), Of(make([]float32, 4))
		return func(ctx context.Context, pg *ProcessGroup) error { return pg.AllGatherInto(ctx, out, in) }
	}},
	{"reduce_scatter_tensor", func() func(context.Context, *ProcessGroup) error {
		in, out := Of([]float32{1, 2, 3, 4}), Of(make([]float32, 2))
		return func(ctx context.Context, pg *ProcessGroup) error { return pg.ReduceScatterFrom(ctx, out, in, Sum) }
	}},
	{"all_to_all_single", func() func(context.Context, *ProcessGroup) error {
		in, out := Of([]float32{1, 2}), Of(make([]float32, 2))
		return func(ctx context.Context, pg *ProcessGroup) error { return pg.AllToAllSingle(ctx, out, in, nil, nil) }
	}},
	{"all_gather", func() func(context.Context, *ProcessGroup) error {
		in, out := Of([]float32{1, 2}), []Tensor{Of(make([]float32, 2)), Of(make([]float32, 2))}
		return func(ctx context.Context, pg *ProcessGroup) error { return pg.AllGather(ctx, out, in) }
	}},
	{"reduce_scatter", func() func(context.Context, *ProcessGroup) error {
		in, out := []Tensor{Of([]float32{1, 2}), Of([]float32{3, 4})}, Of(make([]float32, 2))
		return func(ctx context.Context, pg *ProcessGroup) error { return pg.ReduceScatter(ctx, out, in, Sum) }
	}},
	{"all_to_all", func() func(context.Context, *ProcessGroup) error {
		in, out := []Tensor{Of([]float32{1, 2}), Of([]float32{3, 4})}, []Tensor{Of(make([]float32, 2)), Of(make([]float32, 2))}
		return func(ctx context.Context, pg *ProcessGroup) error { return pg.AllToAll(ctx, out, in) }
	}},
	{"all_to_all_single/splits", func() func(context.Context, *ProcessGroup) error {
		in, out := Of([]float32{1, 2, 3}), Of(make([]float32, 3))
		splits := []int{1, 2}
		return func(ctx context.Context, pg *ProcessGroup) error {
			if pg.Rank() == 1 {
				return pg.AllToAllSingle(ctx, out, in, []int{2, 1}, []int{2, 1})
			}
			return pg.AllToAllSingle(ctx, out, in, splits, splits)
		}
	}},
}

// mallocsDuring returns the heap allocations the process makes while f
// runs: every rank's, as the ranks are goroutines of this process.
func mallocsDuring(f func() error) (uint64, error) {
	var before, after goruntime.MemStats
	goruntime.ReadMemStats(&before)
	err := f()
	goruntime.ReadMemStats(&after)
	return after.Mallocs - before.Mallocs, err
}

// TestBlockingCollectiveAllocatesNothing: once warm, a blocking
// collective on 8 host bytes allocates nothing, on any rank, between the
// call and the transport: no closure, Work, channel, context or timer.
// Early in a process every allocation lands on a fresh page, and the page
// fault costs a small collective many times its own time.
func TestBlockingCollectiveAllocatesNothing(t *testing.T) {
	const warm, calls = 50, 400
	for _, c := range blockingCalls {
		t.Run(c.name, func(t *testing.T) {
			// Rank 1 makes the same calls as rank 0, which measures
			// both: the count is the process's.
			fewest := ^uint64(0)
			onTCPRanks(t, 2, func(pg *ProcessGroup) error {
				ctx := context.Background()
				call := c.call()
				loop := func() error {
					for range calls {
						if err := call(ctx, pg); err != nil {
							return err
						}
					}
					return nil
				}
				for range warm {
					if err := call(ctx, pg); err != nil {
						return err
					}
				}
				// Both ranks are warm before rank 0 counts.
				if err := pg.Barrier(ctx); err != nil {
					return err
				}
				// The fewest of three rounds: background goroutines
				// (the store's, the Go runtime's) may allocate during
				// one; a collective that allocates does so in all.
				for range 3 {
					if pg.Rank() != 0 {
						if err := loop(); err != nil {
							return err
						}
						continue
					}
					n, err := mallocsDuring(loop)
					if err != nil {
						return err
					}
					fewest = min(fewest, n)
				}
				return nil
			})
			if n := fewest; n != 0 && !t.Failed() {
				t.Errorf("%d allocations in %d calls on 2 ranks: %.2f per call per rank", n, calls, float64(n)/calls/2)
			}
		})
	}
}

// BenchmarkBlockingCollective measures a blocking collective of 8 bytes
// on a world of 2 ranks over loopback (shared memory), the latency a
// training loop's small all_reduce sees.
func BenchmarkBlockingCollective(b *testing.B) {
	for _, c := range blockingCalls {
		b.Run(c.name, func(b *testing.B) {
			onTCPRanks(b, 2, func(pg *ProcessGroup) error {
				ctx := context.Background()
				call := c.call()
				for range 50 {
					if err := call(ctx, pg); err != nil {
						return err
					}
				}
				if err := pg.Barrier(ctx); err != nil {
					return err
				}
				if pg.Rank() == 0 {
					b.ReportAllocs()
					b.ResetTimer()
				}
				for range b.N {
					if err := call(ctx, pg); err != nil {
						return fmt.Errorf("%s: %w", c.name, err)
					}
				}
				return nil
			})
		})
	}
}
