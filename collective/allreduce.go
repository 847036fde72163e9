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
//
// Every round's receives are posted before the first send: a partner that
// reaches a round before us then writes into place, where a frame that
// came unasked would be copied twice (a third of the time at 16 MiB on 4
// ranks over TCP went to that copy). The reduce-scatter's halves land in
// scratch one after the other, since they overlap in buf. The all-gather's
// land in buf at once, which is safe although buf is still being reduced
// and sent: each range a partner sends there is one we sent it in the
// reduce-scatter, and it sends only after it has read all of that.
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
	// halve is the reduce-scatter round of mask over blocks [lo, hi): the
	// range this rank keeps, the one it gives, and the blocks left.
	halve := func(mask, lo, hi int) (keep, give span, nlo, nhi int) {
		mid := lo + (hi-lo)/2
		keep, give = blockRange(lo, mid), blockRange(mid, hi)
		if me&mask != 0 {
			return give, keep, mid, hi
		}
		return keep, give, lo, mid
	}
	// double is the all-gather round of mask, this rank holding blocks
	// [lo, lo+mask): the partner holds the sibling range, as large.
	double := func(mask, lo int) (mine, theirs span, nlo int) {
		their := lo ^ mask
		return blockRange(lo, lo+mask), blockRange(their, their+mask), min(lo, their)
	}

	scratch := o.scratch(len(buf))
	first := len(o.recvs)
	lo, hi, landed := 0, p2, 0
	for mask := p2 / 2; mask >= 1; mask /= 2 {
		var keep span
		keep, _, lo, hi = halve(mask, lo, hi)
		o.expectOperand(me^mask, scratch[landed:landed+keep.len], keep.off)
		landed += keep.len
	}
	for mask, glo := 1, lo; mask < p2; mask *= 2 {
		var theirs span
		_, theirs, glo = double(mask, glo)
		o.expect(me^mask, theirs.of(buf), theirs.off)
	}

	next := first // the receives of the round at hand, in o.recvs
	lo, hi = 0, p2
	for mask := p2 / 2; mask >= 1; mask /= 2 {
		partner := me ^ mask
		var keep, give span
		keep, give, lo, hi = halve(mask, lo, hi)
		if err := o.send(partner, give.of(buf), give.off); err != nil {
			return err
		}
		k := o.segments(keep.len)
		for _, r := range o.recvs[next : next+k] {
			if err := o.await(r); err != nil {
				return err
			}
			at := span{int(r.want.offset), len(r.buf)}
			o.combineOrdered(at.of(buf), r.buf, partner)
			if mask == 1 {
				// The segment is final, and the all-gather's first round
				// sends this block to this partner: send it now, while
				// the next segment comes.
				if err := o.send(partner, at.of(buf), at.off); err != nil {
					return err
				}
			}
		}
		next += k
	}
	for mask := 1; mask < p2; mask *= 2 {
		var mine, theirs span
		mine, theirs, lo = double(mask, lo)
		if mask > 1 { // mask 1's went segment by segment above
			if err := o.send(me^mask, mine.of(buf), mine.off); err != nil {
				return err
			}
		}
		k := o.segments(theirs.len)
		if err := o.awaitAll(o.recvs[next : next+k]); err != nil {
			return err
		}
		next += k
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
