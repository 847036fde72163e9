package collective

import (
	"context"
	"math/bits"
)

// Reduce reduces buf across the ranks into root's buf: in shared memory
// when the world has it (allreduce_shm.go); else up a binomial tree for
// small buffers; for large ones a ring reduce-scatter, after which
// every rank sends its reduced chunk straight to the root. Other ranks'
// buffers are left holding partial results.
func (c *comm) Reduce(ctx context.Context, buf []byte, dt DType, op Op, root int) error {
	if err := checkReduction(dt, op); err != nil {
		return err
	}
	if err := checkBuffer("reduce", buf, dt); err != nil {
		return err
	}
	if err := c.checkRoot("reduce", root); err != nil {
		return err
	}
	algo := c.reduceAlgorithm(len(buf))
	o, err := c.begin(ctx, header{coll: collReduce, dtype: dt, reduce: op, algo: algo, root: int32(root), count: uint64(len(buf) / dt.Size())})
	if err != nil {
		return err
	}
	switch algo {
	case algoShm:
		err = o.reduceShared(buf, root)
	case algoRing:
		err = o.reduceRing(buf, root)
	default:
		err = o.reduceTree(buf, root)
	}
	if err = c.end(o, err); err == nil && op == Avg && c.rank == root {
		divideBy(buf, dt, c.size())
	}
	return err
}

// reduceTree receives every child's subtree result at once, combines them
// into buf in child order (ours first), and sends the sum to the parent.
func (o *op) reduceTree(buf []byte, root int) error {
	var kids [bits.UintSize]int
	parent, children := binomialTree(o.c.rank, root, o.c.size(), kids[:0])
	// Children in ascending relative rank: the smallest subtree first.
	// Their receives follow each other in o.recvs, in that order.
	first := len(o.recvs)
	for i := range children {
		child := children[len(children)-1-i]
		o.expect(child, o.scratch(len(buf)), 0)
	}
	for _, r := range o.recvs[first:] {
		if err := o.await(r); err != nil {
			return err
		}
		at := span{int(r.want.offset), len(r.buf)}
		o.combine(at.of(buf), at.of(buf), r.buf)
	}
	if parent >= 0 {
		return o.send(parent, buf, 0)
	}
	return nil
}

// reduceRing reduce-scatters buf along the ring, then gathers the reduced
// chunks at the root.
func (o *op) reduceRing(buf []byte, root int) error {
	n, me := o.c.size(), o.c.rank
	es := o.hdr.dtype.Size()
	chunks := fillEvenSpans(o.spans(0, n), len(buf)/es, es)
	if err := o.ringReduceScatter(buf, chunks); err != nil {
		return err
	}
	if me != root {
		return o.send(root, chunks[me].of(buf), chunks[me].off)
	}
	if err := o.flush(); err != nil { // the gather overwrites what was sent
		return err
	}
	first := len(o.recvs) // the receives below follow each other there
	for peer := range n {
		if peer != me {
			o.expect(peer, chunks[peer].of(buf), chunks[peer].off)
		}
	}
	return o.awaitAll(o.recvs[first:])
}
