package collective

import (
	"context"
	"fmt"
)

// AllGather concatenates every rank's in into out in rank order: through
// shared memory when the world has it (movement_shm.go), else by a ring
// whose ranks forward each segment as it lands, straight into out. Gather
// and Scatter go through shared memory too when they can.
func (c *comm) AllGather(ctx context.Context, out, in []byte, dt DType) error {
	if err := checkBuffer("all_gather", in, dt); err != nil {
		return err
	}
	if len(out) != c.size()*len(in) {
		return fmt.Errorf("collective: all_gather: out holds %d bytes, want %d ranks x %d", len(out), c.size(), len(in))
	}
	algo := c.movementAlgorithm(algoRing)
	o, err := c.begin(ctx, header{coll: collAllGather, dtype: dt, algo: algo, count: uint64(len(in) / dt.Size())})
	if err != nil {
		return err
	}
	if algo == algoShm {
		return c.end(o, o.allGatherShared(out, in, -1))
	}
	chunks := fillEqualSpans(o.spans(0, c.size()), len(in))
	copy(chunks[c.rank].of(out), in)
	return c.end(o, o.ringAllGather(out, chunks))
}

// Gather concatenates every rank's in into root's out; every rank sends
// straight to the root, which posts all receives into place at once.
func (c *comm) Gather(ctx context.Context, out, in []byte, dt DType, root int) error {
	if err := checkBuffer("gather", in, dt); err != nil {
		return err
	}
	if err := c.checkRoot("gather", root); err != nil {
		return err
	}
	if c.rank == root && len(out) != c.size()*len(in) {
		return fmt.Errorf("collective: gather: out holds %d bytes, want %d ranks x %d", len(out), c.size(), len(in))
	}
	algo := c.movementAlgorithm(algoDirect)
	o, err := c.begin(ctx, header{coll: collGather, dtype: dt, algo: algo, root: int32(root), count: uint64(len(in) / dt.Size())})
	if err != nil {
		return err
	}
	if algo == algoShm {
		return c.end(o, o.allGatherShared(out, in, root))
	}
	chunks := fillEqualSpans(o.spans(0, c.size()), len(in))
	if c.rank != root {
		return c.end(o, o.send(root, in, chunks[c.rank].off))
	}
	first := len(o.recvs) // the receives below follow each other there
	for peer, at := range chunks {
		if peer != root {
			o.expect(peer, at.of(out), at.off)
		}
	}
	copy(chunks[root].of(out), in)
	return c.end(o, o.awaitAll(o.recvs[first:]))
}

// Scatter gives rank i the i-th len(out)-sized slice of root's in,
// straight from the root.
func (c *comm) Scatter(ctx context.Context, out, in []byte, dt DType, root int) error {
	if err := checkBuffer("scatter", out, dt); err != nil {
		return err
	}
	if err := c.checkRoot("scatter", root); err != nil {
		return err
	}
	if c.rank == root && len(in) != c.size()*len(out) {
		return fmt.Errorf("collective: scatter: in holds %d bytes, want %d ranks x %d", len(in), c.size(), len(out))
	}
	algo := c.movementAlgorithm(algoDirect)
	o, err := c.begin(ctx, header{coll: collScatter, dtype: dt, algo: algo, root: int32(root), count: uint64(len(out) / dt.Size())})
	if err != nil {
		return err
	}
	if algo == algoShm {
		return c.end(o, o.scatterShared(out, in, root))
	}
	chunks := fillEqualSpans(o.spans(0, c.size()), len(out))
	if c.rank != root {
		return c.end(o, o.awaitAll(o.expect(root, out, chunks[c.rank].off)))
	}
	for peer, at := range chunks {
		if peer != root {
			if err := o.send(peer, at.of(in), at.off); err != nil {
				return c.end(o, err)
			}
		}
	}
	copy(out, chunks[root].of(in))
	return c.end(o, nil)
}
