package collective

import (
	"context"
	"fmt"
)

// AllReduce reduces buf across the ranks in place. Ranks that share a
// host and its memory reduce each other's data in shared memory
// (allreduce_shm.go), as do all the collectives of such a world. Over sockets, small buffers go by recursive
// doubling, medium ones by recursive halving-doubling, large ones by a
// pipelined ring (see algorithm.go for the thresholds). Each element's
// result is computed by one rank and copied to the others, or by two
// partners from the same operands in the same order, so every rank ends
// with the same bits.
func (c *comm) AllReduce(ctx context.Context, buf []byte, dt DType, op Op) error {
	if err := checkReduction(dt, op); err != nil {
		return err
	}
	if err := checkBuffer("all_reduce", buf, dt); err != nil {
		return err
	}
	algo := c.allReduceAlgorithm(len(buf))
	o, err := c.begin(ctx, header{coll: collAllReduce, dtype: dt, reduce: op, algo: algo, count: uint64(len(buf) / dt.Size())})
	if err != nil {
		return err
	}
	switch algo {
	case algoRD:
		err = o.allReduceDoubling(buf)
	case algoRHD:
		err = o.allReduceHalving(buf)
	case algoShm:
		if c.singleCopyAllReduce(len(buf)) {
			err = o.allReducePairSingleCopy(buf)
		} else {
			err = o.reduceShared(buf, -1)
		}
	case algoShmFlat:
		err = o.allReduceSharedFlat(buf)
	case algoHier:
		err = o.allReduceHierarchical(buf)
	default:
		err = o.allReduceRing(buf)
	}
	if err = c.end(o, err); err == nil && op == Avg {
		divideBy(buf, dt, c.size())
	}
	return err
}

// checkBuffer rejects buffers that are not whole elements of a known type.
func checkBuffer(what string, b []byte, dt DType) error {
	if dt.Size() == 0 {
		return fmt.Errorf("collective: %s: unknown dtype %v", what, dt)
	}
	if len(b)%dt.Size() != 0 {
		return fmt.Errorf("collective: %s: %d bytes is not a whole number of %v elements", what, len(b), dt)
	}
	return nil
}

// foldIn starts the algorithms that need a power of two p2 of ranks: each
// rank r >= p2 hands its buffer to r-p2, which reduces it into its own
// (its own first, being the lower rank). It reports whether this rank sits
// out; such a rank receives the result from r-p2 and is done.
func (o *op) foldIn(buf []byte, p2 int) (out bool, err error) {
	me, n := o.c.rank, o.c.size()
	if me >= p2 {
		if err := o.send(me-p2, buf, 0); err != nil {
			return true, err
		}
		if err := o.flush(); err != nil {
			return true, err
		}
		return true, o.awaitAll(o.expect(me-p2, buf, 0))
	}
	if me+p2 < n {
		scratch := o.scratch(len(buf))
		if err := o.awaitAll(o.expect(me+p2, scratch, 0)); err != nil {
			return false, err
		}
		o.combine(buf, buf, scratch)
	}
	return false, nil
}

// foldOut ends them: the result goes back to the rank that sat out.
func (o *op) foldOut(buf []byte, p2 int) error {
	if me := o.c.rank; me+p2 < o.c.size() {
		return o.send(me+p2, buf, 0)
	}
	return nil
}

// combineOrdered reduces theirs into mine with the lower rank's operand
// first, so that both partners compute the same bits.
func (o *op) combineOrdered(mine, theirs []byte, partner int) {
	if o.c.rank < partner {
		o.combine(mine, mine, theirs)
	} else {
		o.combine(mine, theirs, mine)
	}
}

// allReduceDoubling exchanges the whole buffer with partners at distances
// 1, 2, 4, ... among a power of two of ranks: log2(n) rounds.
func (o *op) allReduceDoubling(buf []byte) error {
	n := o.c.size()
	if n == 1 {
		return nil
	}
	p2 := floorPowerOfTwo(n)
	if out, err := o.foldIn(buf, p2); out || err != nil {
		return err
	}
	me := o.c.rank
	scratch := o.scratch(len(buf))
	for mask := 1; mask < p2; mask <<= 1 {
		partner := me ^ mask
		incoming := o.expect(partner, scratch, 0)
		if err := o.send(partner, buf, 0); err != nil {
			return err
		}
		for _, r := range incoming {
			if err := o.await(r); err != nil {
				return err
			}
		}
		if err := o.flush(); err != nil { // buf is about to change
			return err
		}
		o.combineOrdered(buf, scratch, partner)
	}
	return o.foldOut(buf, p2)
}

// allReduceHalving is Rabenseifner's algorithm: a reduce-scatter by
// recursive halving (each round exchanges half of what is left with a
// partner, who keeps the other half) leaves block r of p2 near-equal blocks
// reduced on rank r, then an all-gather by recursive doubling spreads
// them. It moves the ring's volume in 2 log2(n) rounds.
func (o *op) allReduceHalving(buf []byte) error {
	n := o.c.size()
	if n == 1 {
		return nil
	}
	p2 := floorPowerOfTwo(n)
	if out, err := o.foldIn(buf, p2); out || err != nil {
		return err
	}
	me, es := o.c.rank, o.hdr.dtype.Size()
	blocks := fillEvenSpans(o.spans(0, p2), len(buf)/es, es)
	blockRange := func(lo, hi int) span {
		return span{blocks[lo].off, blocks[hi-1].off + blocks[hi-1].len - blocks[lo].off}
	}
	scratch := o.scratch(len(buf)) // received halves land at their own offsets

	lo, hi := 0, p2
	for mask := p2 / 2; mask >= 1; mask /= 2 {
		partner := me ^ mask
		mid := lo + (hi-lo)/2
		keep, give := blockRange(lo, mid), blockRange(mid, hi)
		if me&mask != 0 {
			keep, give = give, keep
			lo = mid
		} else {
			hi = mid
		}
		incoming := o.expect(partner, keep.of(scratch), keep.off)
		if err := o.send(partner, give.of(buf), give.off); err != nil {
			return err
		}
		for _, r := range incoming {
			if err := o.await(r); err != nil {
				return err
			}
			at := span{int(r.want.offset), len(r.buf)}
			o.combineOrdered(at.of(buf), r.buf, partner)
		}
	}
	if err := o.flush(); err != nil { // the halves given away get overwritten now
		return err
	}
	for mask := 1; mask < p2; mask *= 2 {
		partner := me ^ mask
		their := lo ^ mask // the partner holds the sibling range, as large as ours
		mine, theirs := blockRange(lo, hi), blockRange(their, their+mask)
		incoming := o.expect(partner, theirs.of(buf), theirs.off)
		if err := o.send(partner, mine.of(buf), mine.off); err != nil {
			return err
		}
		if err := o.awaitAll(incoming); err != nil {
			return err
		}
		lo = min(lo, their)
		hi = lo + 2*mask
	}
	return o.foldOut(buf, p2)
}

// allReduceRing is a ring reduce-scatter leaving chunk r reduced on rank
// r, then a ring all-gather; both pipelined by segment.
func (o *op) allReduceRing(buf []byte) error {
	n := o.c.size()
	if n == 1 {
		return nil
	}
	es := o.hdr.dtype.Size()
	chunks := fillEvenSpans(o.spans(0, n), len(buf)/es, es)
	if err := o.ringReduceScatter(buf, chunks); err != nil {
		return err
	}
	if err := o.flush(); err != nil { // the all-gather overwrites what was sent
		return err
	}
	return o.ringAllGather(buf, chunks)
}
