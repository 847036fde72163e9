package collective

import (
	"context"
	"fmt"
)

// AllGather concatenates every rank's in into out in rank order, by a ring
// whose ranks forward each segment as it lands, straight into out.
func (c *comm) AllGather(ctx context.Context, out, in []byte, dt DType) error {
	if err := checkBuffer("all_gather", in, dt); err != nil {
		return err
	}
	if len(out) != c.size()*len(in) {
		return fmt.Errorf("collective: all_gather: out holds %d bytes, want %d ranks x %d", len(out), c.size(), len(in))
	}
	o, err := c.begin(ctx, header{coll: collAllGather, dtype: dt, algo: algoRing, count: uint64(len(in) / dt.Size())})
	if err != nil {
		return err
	}
	chunks := equalSpans(len(in), c.size())
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
	o, err := c.begin(ctx, header{coll: collGather, dtype: dt, algo: algoDirect, root: int32(root), count: uint64(len(in) / dt.Size())})
	if err != nil {
		return err
	}
	chunks := equalSpans(len(in), c.size())
	if c.rank != root {
		return c.end(o, o.send(root, in, chunks[c.rank].off))
	}
	var incoming []*recvReq
	for peer, at := range chunks {
		if peer != root {
			incoming = append(incoming, o.expect(peer, at.of(out), at.off)...)
		}
	}
	copy(chunks[root].of(out), in)
	return c.end(o, o.awaitAll(incoming))
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
	o, err := c.begin(ctx, header{coll: collScatter, dtype: dt, algo: algoDirect, root: int32(root), count: uint64(len(out) / dt.Size())})
	if err != nil {
		return err
	}
	chunks := equalSpans(len(out), c.size())
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

// equalSpans cuts n ranks' worth of size bytes each.
func equalSpans(size, n int) []span {
	spans := make([]span, n)
	for i := range spans {
		spans[i] = span{i * size, size}
	}
	return spans
}
