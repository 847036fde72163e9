package collective

import (
	"context"
	"fmt"
)

// ReduceScatter reduces in across the ranks and leaves slice i of the
// result on rank i, leaving in intact: in shared memory when the world
// has it (allreduce_shm.go); else on a copy of in, a recursive-doubling all-reduce of the copy for small inputs, a ring
// reduce-scatter with the slices as the ring's chunks for large ones.
func (c *comm) ReduceScatter(ctx context.Context, out, in []byte, dt DType, op Op, counts []int) error {
	if err := checkReduction(dt, op); err != nil {
		return err
	}
	if len(counts) != c.size() {
		return fmt.Errorf("collective: reduce_scatter: %d counts for %d ranks", len(counts), c.size())
	}
	total := 0
	for _, n := range counts {
		if n < 0 {
			return fmt.Errorf("collective: reduce_scatter: negative count %d", n)
		}
		total += n
	}
	es := dt.Size()
	if len(in) != total*es || len(out) != counts[c.rank]*es {
		return fmt.Errorf("collective: reduce_scatter: in holds %d bytes and out %d, want %d and %d",
			len(in), len(out), total*es, counts[c.rank]*es)
	}
	algo := c.reduceScatterAlgorithm(len(in))
	h := header{coll: collReduceScatter, dtype: dt, reduce: op, algo: algo, count: uint64(total)}
	if algo == algoHier {
		h.root = countsKey(counts)
	}
	o, err := c.begin(ctx, h)
	if err != nil {
		return err
	}
	chunks := fillCountSpans(o.spans(1, len(counts)), counts, es)
	if algo == algoShm || algo == algoHier {
		if algo == algoShm {
			err = o.reduceScatterShared(out, in, chunks)
		} else {
			err = o.reduceScatterHierarchical(out, in, chunks)
		}
		if err = c.end(o, err); err == nil && op == Avg {
			divideBy(out, dt, c.size())
		}
		return err
	}
	work := o.scratch(len(in))
	copy(work, in)
	if algo == algoRD {
		err = o.allReduceDoubling(work)
	} else {
		err = o.ringReduceScatter(work, chunks)
	}
	if err == nil {
		copy(out, chunks[c.rank].of(work))
	}
	if err = c.end(o, err); err == nil && op == Avg {
		divideBy(out, dt, c.size())
	}
	return err
}
