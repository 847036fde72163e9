package collective

import "context"

// Barrier returns once every rank has entered it. In shared memory it is
// an empty all-reduce: every rank signals a block and waits for all the
// others'. Over sockets it goes by dissemination: in round k rank r
// signals r+2^k and waits for r-2^k, so after ceil(log2(n)) rounds every
// rank has heard, through some path, from all.
func (c *comm) Barrier(ctx context.Context) error {
	switch algo := c.barrierAlgorithm(); algo {
	case algoHier, algoShmFlat:
		o, err := c.begin(ctx, header{coll: collBarrier, algo: algo})
		if err != nil {
			return err
		}
		if algo == algoHier {
			return c.end(o, o.barrierHierarchical())
		}
		return c.end(o, o.allReduceSharedFlat(nil))
	}
	return c.barrier(ctx, collBarrier, 0)
}

// barrier runs a dissemination barrier whose empty frames carry coll and
// count (Split checks its arguments with it).
func (c *comm) barrier(ctx context.Context, coll collKind, count uint64) error {
	o, err := c.begin(ctx, header{coll: coll, algo: algoDissemination, count: count})
	if err != nil {
		return err
	}
	return c.end(o, o.dissemination())
}

// dissemination runs the rounds of a dissemination barrier.
func (o *op) dissemination() error {
	n, me := o.c.size(), o.c.rank
	for dist := 1; dist < n; dist <<= 1 {
		incoming := o.expect((me-dist+n)%n, nil, dist)
		if err := o.send((me+dist)%n, nil, dist); err != nil {
			return err
		}
		if err := o.awaitAll(incoming); err != nil {
			return err
		}
	}
	return nil
}
