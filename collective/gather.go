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
	algo := c.movementAlgorithm(c.allGatherAlgorithm(len(out)))
	o, err := c.begin(ctx, header{coll: collAllGather, dtype: dt, algo: algo, count: uint64(len(in) / dt.Size())})
	if err != nil {
		return err
	}
	switch algo {
	case algoShm:
		return c.end(o, o.allGatherShared(out, in, -1))
	case algoBruck:
		return c.end(o, o.bruckAllGather(out, in))
	case algoHier:
		return c.end(o, o.allGatherHierarchical(out, in))
	}
	chunks := fillEqualSpans(o.spans(0, c.size()), len(in))
	copy(chunks[c.rank].of(out), in)
	return c.end(o, o.ringAllGather(out, chunks))
}

// bruckAllGather gathers every rank's in into out in ceil(log2 n) rounds
// (Bruck et al., 1997): a work buffer holds the blocks of ranks me,
// me+1, ... in that order; in the round at distance d, rank me sends its
// first min(d, n-d) blocks to rank me-d and appends as many from rank
// me+d, so after the last round it holds all n, which it rotates into
// place. The ring's n-1 steps each wait for a message; small gathers are
// that wait.
func (o *op) bruckAllGather(out, in []byte) error {
	n, me, size := o.c.size(), o.c.rank, len(in)
	work := o.scratch(len(out))
	copy(work, in)
	// Every round's receives are posted at once, each into its own part
	// of work: a round's blocks then land in place even when they come
	// before we reach it. They follow each other in o.recvs.
	first := len(o.recvs)
	for d := 1; d < n; d *= 2 {
		o.expect((me+d)%n, work[d*size:][:min(d, n-d)*size], d*size)
	}
	for d := 1; d < n; d *= 2 {
		blocks := min(d, n-d) * size
		// What we send has landed (in earlier rounds), and no receive
		// writes there.
		if err := o.send((me-d+n)%n, work[:blocks], d*size); err != nil {
			return err
		}
		k := o.segments(blocks)
		if err := o.awaitAll(o.recvs[first : first+k]); err != nil {
			return err
		}
		first += k
	}
	for i := range n {
		copy(out[(me+i)%n*size:][:size], work[i*size:][:size])
	}
	return nil
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
