package collective

import "runtime"

// The reductions through shared memory (shm.go, shmops.go).
//
// shm (all_reduce, reduce): each rank cuts a block of its buffer into n
// chunks and copies into its slot the chunks the peers reduce; it reduces
// its own chunk, reading the peers' copies from their slots and its own
// from its buffer, into its slot; the ranks that want the result copy
// every reduced chunk out. Per rank, (n-1)/n of the block is copied in,
// 1/n reduced, and the block copied out once.
//
// shm-flat (all_reduce, barrier): each rank copies its block into its
// slot and reduces the whole block reading every slot; one
// synchronisation instead of two, for small buffers whose cost is the
// synchronisation.
//
// reduce_scatter: each rank copies the pieces the others keep into its
// slot, one part of the slot per destination, and reduces its own piece.
//
// Every element is reduced in rank order, ((x0 op x1) op x2) ..., from
// the same operands, so every rank ends with the same bits.

// reduceChunk sets dst, and dst2 unless nil, to the reduction, in rank
// order, of every rank's operand for block g: span at of its slot for a
// peer, own for this rank. It waits for every operand, then reduces them
// in one pass (reduceMany). Neither dst nor dst2 overlaps an operand.
func (o *op) reduceChunk(g uint32, dst, dst2 []byte, at span, own []byte) error {
	n := o.c.size()
	var operands [maxFused][]byte
	var srcs [][]byte
	if n <= maxFused {
		srcs = operands[:n]
	} else {
		srcs = make([][]byte, n)
	}
	for peer := range n {
		srcs[peer] = own
		if peer != o.c.rank {
			if err := o.awaitWritten(peer, g); err != nil {
				return err
			}
			srcs[peer] = at.of(o.slotOf(peer, g))
		}
	}
	reduceMany(dst, dst2, srcs, o.hdr.dtype, o.hdr.reduce)
	return nil
}

// reduceShared reduces buf across the ranks into every rank's buf (root
// -1) or root's, block by block.
func (o *op) reduceShared(buf []byte, root int) error {
	n, me, es := o.c.size(), o.c.rank, o.hdr.dtype.Size()
	return o.runShared(func(s *shmWorld) error {
		return s.eachBlock(buf, func(g uint32, _ int, block []byte) error {
			slot, err := o.claimSlot(g)
			if err != nil {
				return err
			}
			count := len(block) / es
			mine := evenSpan(count, es, n, me)
			// The chunks before and after ours, which the peers reduce.
			copyCached(slot[:mine.off], block[:mine.off])
			copyCached(slot[mine.off+mine.len:len(block)], block[mine.off+mine.len:])
			o.signalWritten(g)
			// Our chunk's result goes to our slot for the peers and, when
			// we want the result, to block in the same pass.
			var result []byte
			if root < 0 || root == me {
				result = mine.of(block)
			}
			// own is read before result is written, block by block: the
			// two may be the same memory.
			if err := o.reduceChunk(g, mine.of(slot), result, mine, mine.of(block)); err != nil {
				return err
			}
			o.signalReduced(g)
			if root < 0 || root == me {
				for i := range n - 1 {
					peer := orderAfter(me, n, i)
					if err := o.awaitReduced(peer, g); err != nil {
						return err
					}
					c := evenSpan(count, es, n, peer)
					copyCached(c.of(block), c.of(o.slotOf(peer, g)))
				}
			}
			o.signalConsumed(g)
			return nil
		})
	})
}

// allReducePairSingleCopy is reduceShared's all_reduce for two ranks
// that can read each other's memory, on large buffers: each reduces its
// half of the buffer in place, reading the peer's operand straight from
// the peer's buffer (readPeer) a piece at a time into scratch that stays
// in cache, then reads the other half's result straight from the peer.
// Per rank, half the buffer crosses the kernel in and half out, and the
// reduction writes it once, where the slots cost a copy in, a reduction
// that writes two places and a copy out: 16 MiB took 2.4 ms instead of
// 2.8 on 2 cores. Outside singleCopyAllReduceMin and Max the slots win,
// and from 3 ranks on, where a copy into a slot serves every reader.
//
// Neither rank overwrites what the other still reads: the peer reads its
// half of our buffer before it says it has reduced, and we overwrite that
// half with its result only after; and each waits for the other to have
// read its result before it returns.
func (o *op) allReducePairSingleCopy(buf []byte) error {
	me, es := o.c.rank, o.hdr.dtype.Size()
	peer := 1 - me
	count := len(buf) / es
	mine, theirs := evenSpan(count, es, 2, me), evenSpan(count, es, 2, peer)
	piece := singleCopyPiece / es * es
	scratch := o.scratch(piece)
	return o.runShared(func(s *shmWorld) error {
		g := s.next()
		if err := o.publish(g, buf); err != nil {
			return err
		}
		if err := o.awaitWritten(peer, g); err != nil {
			return err
		}
		for lo := 0; lo < mine.len; lo += piece {
			p := span{mine.off + lo, min(piece, mine.len-lo)}
			operand := scratch[:p.len]
			if err := o.readFrom(peer, g, p, operand); err != nil {
				return err
			}
			o.combineOrdered(p.of(buf), operand, peer)
		}
		o.signalReduced(g)
		if err := o.awaitReduced(peer, g); err != nil {
			return err
		}
		if err := o.readFrom(peer, g, theirs, theirs.of(buf)); err != nil {
			return err
		}
		err := o.consumeAll(g)
		runtime.KeepAlive(buf)
		return err
	})
}

// publish offers buf for the peers to read in block g (readFrom), and
// says so. The slot goes unused, but the piece table of g's parity, where
// the address goes, is free once the slot is.
func (o *op) publish(g uint32, buf []byte) error {
	if _, err := o.claimSlot(g); err != nil {
		return err
	}
	o.self().pieces(g).setBase(addressOf(buf))
	o.signalWritten(g)
	return nil
}

// readFrom copies span at of the buffer peer published for block g into
// dst.
func (o *op) readFrom(peer int, g uint32, at span, dst []byte) error {
	from := o.region(peer).pieces(g).base() + uintptr(at.off)
	if err := readPeer(o.c.shm.pids[peer], from, dst); err != nil {
		return &PeerError{Rank: peer, Op: o.label(), Err: err}
	}
	return nil
}

// writeTo copies src into span at of the buffer peer published for block
// g.
func (o *op) writeTo(peer int, g uint32, at span, src []byte) error {
	to := o.region(peer).pieces(g).base() + uintptr(at.off)
	if err := writePeer(o.c.shm.pids[peer], to, src); err != nil {
		return &PeerError{Rank: peer, Op: o.label(), Err: err}
	}
	return nil
}

// allReduceSharedFlat reduces every block whole on every rank: one
// synchronisation per block. A nil buf is a barrier.
func (o *op) allReduceSharedFlat(buf []byte) error {
	return o.runShared(func(s *shmWorld) error {
		return s.eachBlock(buf, func(g uint32, _ int, block []byte) error {
			slot, err := o.claimSlot(g)
			if err != nil {
				return err
			}
			copyCached(slot, block)
			o.signalWritten(g)
			// Our own operand is read from our slot: block is the result.
			if err := o.reduceChunk(g, block, nil, span{0, len(block)}, slot[:len(block)]); err != nil {
				return err
			}
			o.signalConsumed(g)
			return nil
		})
	})
}

// reduceScatterShared reduces in across the ranks into out, which gets
// piece chunks[me] of the result. in is left intact.
func (o *op) reduceScatterShared(out, in []byte, chunks []span) error {
	n, me := o.c.size(), o.c.rank
	sub := subSlot(o.c.shm.slot, n)
	longest := 0
	for _, c := range chunks {
		longest = max(longest, c.len)
	}
	rounds := roundsFor(longest, sub)
	// Our operand is read from in unless out overlaps it, when it must
	// go through our slot too, as a peer's would.
	alias := overlaps(out, in)
	return o.runShared(func(s *shmWorld) error {
		for k := range rounds {
			g := s.next()
			slot, err := o.claimSlot(g)
			if err != nil {
				return err
			}
			for j, c := range chunks {
				if j != me || alias {
					w := window(c, k, sub)
					copyCached(slot[j*sub:], w.of(in))
				}
			}
			o.signalWritten(g)
			w := window(chunks[me], k, sub)
			own := w.of(in)
			if alias {
				own = slot[me*sub:][:w.len]
			}
			dst := out[w.off-chunks[me].off:][:w.len]
			if err := o.reduceChunk(g, dst, nil, span{me * sub, w.len}, own); err != nil {
				return err
			}
			o.signalConsumed(g)
		}
		return nil
	})
}
