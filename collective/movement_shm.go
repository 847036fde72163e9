package collective

import (
	"fmt"
	"runtime"
	"unsafe"
)

// The collectives that move data without reducing it, through shared
// memory (shm.go, shmops.go). A sender copies its data into its slot
// once, block by block, and each receiver copies what it needs out of
// the sender's slot straight into its own buffer: two copies per byte
// and receiver, pipelined over two slots, with no system call while the
// ranks keep pace.

// broadcastShared copies root's buf into every rank's buf.
func (o *op) broadcastShared(buf []byte, root int) error {
	if o.c.shm.cma && len(buf) >= singleCopyBroadcastMin(o.c.size()) {
		return o.broadcastSingleCopy(buf, root)
	}
	me := o.c.rank
	return o.runShared(func(s *shmWorld) error {
		return s.eachBlock(buf, func(g uint32, _ int, block []byte) error {
			if me == root {
				slot, err := o.claimSlot(g)
				if err != nil {
					return err
				}
				copyCached(slot, block)
				o.signalWritten(g)
			} else {
				if err := o.awaitWritten(root, g); err != nil {
					return err
				}
				copyCached(block, o.slotOf(root, g))
			}
			o.signalConsumed(g)
			return nil
		})
	})
}

// broadcastSingleCopy is broadcastShared for ranks that can reach each
// other's memory, on large buffers: every receiver reads the tail of the
// root's buffer straight into its own (readFrom) while the root writes the
// head straight into every receiver's (writeTo), the head being 1/n of
// the buffer. So each of the n ranks copies (n-1)/n of the buffer, once,
// all at the same time; through the slots, the root copies all of it in
// and every receiver all of it out.
//
// The root returns once every receiver has read its tail (consumed); a
// receiver, once the root has written every head (reduced).
func (o *op) broadcastSingleCopy(buf []byte, root int) error {
	n, me := o.c.size(), o.c.rank
	head := span{0, len(buf) / n}
	tail := span{head.len, len(buf) - head.len}
	return o.runShared(func(s *shmWorld) error {
		g := s.next()
		if err := o.publish(g, buf); err != nil {
			return err
		}
		if me != root {
			if err := o.awaitWritten(root, g); err != nil {
				return err
			}
			if err := o.readFrom(root, g, tail, tail.of(buf)); err != nil {
				return err
			}
			o.signalConsumed(g)
			err := o.awaitReduced(root, g)
			runtime.KeepAlive(buf)
			return err
		}
		for i := range n - 1 {
			peer := orderAfter(me, n, i)
			if err := o.awaitWritten(peer, g); err != nil {
				return err
			}
			if err := o.writeTo(peer, g, head, head.of(buf)); err != nil {
				return err
			}
		}
		o.signalReduced(g)
		err := o.consumeAll(g)
		runtime.KeepAlive(buf)
		return err
	})
}

// allGatherShared copies every rank's in into slice r of every rank's
// out, or only root's when root is not -1 (gather).
func (o *op) allGatherShared(out, in []byte, root int) error {
	n, me, size := o.c.size(), o.c.rank, len(in)
	if root < 0 && o.c.shm.cma && size >= singleCopyMin(n) && n <= singleCopyMaxRanks {
		return o.allGatherSingleCopy(out, in)
	}
	receives := root < 0 || root == me
	return o.runShared(func(s *shmWorld) error {
		if receives {
			copyCached(out[me*size:], in)
		}
		return s.eachBlock(in, func(g uint32, lo int, block []byte) error {
			if !receives || root < 0 {
				slot, err := o.claimSlot(g)
				if err != nil {
					return err
				}
				copyCached(slot, block)
				o.signalWritten(g)
			}
			if receives {
				err := o.eachWritten(g, func(peer int) error {
					copyCached(out[peer*size+lo:][:len(block)], o.slotOf(peer, g))
					return nil
				})
				if err != nil {
					return err
				}
			}
			o.signalConsumed(g)
			return nil
		})
	})
}

// scatterShared gives rank r the r-th len(out)-sized slice of root's in:
// the root copies one piece per rank into its slot, one part each.
func (o *op) scatterShared(out, in []byte, root int) error {
	n, me, size := o.c.size(), o.c.rank, len(out)
	sub := subSlot(o.c.shm.slot, n)
	rounds := roundsFor(size, sub)
	if me == root {
		copyCached(out, in[me*size:][:size])
	}
	return o.runShared(func(s *shmWorld) error {
		for k := range rounds {
			g := s.next()
			if me == root {
				slot, err := o.claimSlot(g)
				if err != nil {
					return err
				}
				for peer := range n {
					if peer != me {
						w := window(span{peer * size, size}, k, sub)
						copyCached(slot[peer*sub:], w.of(in))
					}
				}
				o.signalWritten(g)
			} else {
				if err := o.awaitWritten(root, g); err != nil {
					return err
				}
				w := window(span{0, size}, k, sub)
				copyCached(w.of(out), o.slotOf(root, g)[me*sub:])
			}
			o.signalConsumed(g)
		}
		return nil
	})
}

// allToAllShared sends piece sends[j] of in to rank j and receives rank
// j's piece for us into recvs[j] of out. Each round carries up to one
// part of a slot of every piece; the ranks agree on how many rounds it
// takes, and check that each pair agrees on its count, through their
// piece tables (and rounds words), written before the first round's
// data. Pieces of cmaMin bytes or more skip the slots when the ranks can
// read each other's memory: the receiver copies them straight from the
// sender's input (readPeer), and the sender waits for it before it
// returns.
func (o *op) allToAllShared(out, in []byte, sends, recvs []span) error {
	s := o.c.shm
	n, me, es := o.c.size(), o.c.rank, o.hdr.dtype.Size()
	sub := subSlot(s.slot, n)
	single := func(bytes int) bool { return s.cma && bytes >= cmaMin }
	longest := 0 // of our pieces through the slots
	lent := false
	for j, c := range sends {
		if j != me {
			if single(c.len) {
				lent = true
			} else {
				longest = max(longest, c.len)
			}
		}
	}
	ours := roundsFor(longest, sub) // the rounds our pieces need
	return o.runShared(func(s *shmWorld) error {
		rounds := ours
		var first uint32
		for k := 0; k < rounds; k++ {
			g := s.next()
			slot, err := o.claimSlot(g)
			if err != nil {
				return err
			}
			if k == 0 {
				// Safe to rewrite: the peers read these while consuming
				// block g-2 at the latest, which claimSlot waited for.
				first = g
				self := o.self()
				self.rounds[g%2].Store(uint32(ours))
				table := self.pieces(g)
				for j, c := range sends {
					table.set(j, uint64(c.len/es), uint64(c.off))
				}
				table.setBase(addressOf(in))
			}
			for j, c := range sends {
				if j != me && !single(c.len) {
					copyCached(slot[j*sub:], window(c, k, sub).of(in))
				}
			}
			o.signalWritten(g)
			if k == 0 {
				// While the peers catch up.
				copyCached(recvs[me].of(out), sends[me].of(in))
			}
			err = o.eachWritten(g, func(peer int) error {
				piece := recvs[peer]
				if k == 0 {
					theirs := o.region(peer)
					table := theirs.pieces(g)
					if sent := table.count(me); sent != uint64(piece.len/es) {
						return o.pairMismatch(peer, uint64(piece.len/es), sent)
					}
					rounds = max(rounds, int(theirs.rounds[g%2].Load()))
					if single(piece.len) {
						if err := o.readFrom(peer, g, span{int(table.offset(me)), piece.len}, piece.of(out)); err != nil {
							return err
						}
					}
				}
				if !single(piece.len) {
					w := window(piece, k, sub)
					copyCached(w.of(out), o.slotOf(peer, g)[me*sub:])
				}
				return nil
			})
			if err != nil {
				return err
			}
			o.signalConsumed(g)
		}
		if lent {
			// The peers read our input in their first round.
			for j, c := range sends {
				if j != me && single(c.len) {
					if err := o.awaitShared(j, o.region(j).consumed, first, true); err != nil {
						return err
					}
				}
			}
		}
		runtime.KeepAlive(in)
		return nil
	})
}

// allGatherSingleCopy is allGatherShared's all_gather for ranks that can
// read each other's memory: each copies every peer's in straight into
// its out (readPeer), one copy per byte instead of two, and waits until
// every peer has read its own before returning.
func (o *op) allGatherSingleCopy(out, in []byte) error {
	me, size := o.c.rank, len(in)
	return o.runShared(func(s *shmWorld) error {
		g := s.next()
		if err := o.publish(g, in); err != nil {
			return err
		}
		copyCached(out[me*size:], in)
		err := o.eachWritten(g, func(peer int) error {
			return o.readFrom(peer, g, span{0, size}, out[peer*size:][:size])
		})
		if err != nil {
			return err
		}
		err = o.consumeAll(g)
		runtime.KeepAlive(in)
		return err
	})
}

// singleCopyMin is the smallest piece of an all_gather among ranks read
// straight from a peer's memory: below it, the system call's cost
// exceeds the copy it saves. Two ranks gain from smaller pieces, since
// each has only one peer to read from: on 2 cores, a 64 KiB all_gather
// (32 KiB pieces) took 7.7 to 10 us read straight and 12.7 to 16 through
// the slots in three of four interleaved runs (Open MPI 10.6 to 12.2); on
// 4 ranks 16 KiB pieces took 43 to 68 us read straight, 14 to 25 through
// the slots. all_to_all keeps cmaMin: its 64 KiB exchange of 2 ranks
// measured no faster read straight (12.6 to 15 us, slots 10 to 14).
func singleCopyMin(ranks int) int {
	if ranks == 2 {
		return cmaPairMin
	}
	return cmaMin
}

// singleCopyBroadcastMin is the smallest broadcast among ranks that goes
// straight between their buffers (broadcastSingleCopy). Measured on 2
// cores, unbound and bound, medians of 5 rounds: on 2 ranks 256 KiB took
// 11 to 12 us straight and 42 to 47 through the slots, 64 KiB 9 to 12.5
// and 13 to 17; on 4 ranks 64 KiB took 42 to 56 us straight and 25 to 28
// through the slots, 256 KiB 75 to 92 and 67 to 73.
func singleCopyBroadcastMin(ranks int) int {
	if ranks == 2 {
		return 64 << 10
	}
	return 512 << 10
}

const (
	// cmaMin and cmaPairMin: see singleCopyMin; cmaMin is all_to_all's
	// too.
	cmaMin     = 64 << 10
	cmaPairMin = 16 << 10
	// singleCopyMaxRanks bounds the worlds whose all_gather reads peers'
	// memory: a copy into a slot serves n-1 readers, and the kernel copies
	// slower than memmove, so with more ranks the slots win. Measured on
	// 2 cores with data in the buffers (not zeros, which the slots' copies
	// read from the cache): 16 MiB on 4 ranks, 4.1 ms through slots and
	// 3.3 ms by single-copy reads (OpenMPI 4.0); on 8 ranks 13.5 ms and
	// 16.4 ms.
	singleCopyMaxRanks = 4
	// singleCopyPiece is how much of the peer's operand a single-copy
	// all_reduce reads into scratch before it reduces, to find it in the
	// core's cache (64 KiB to 256 KiB measured alike; 1 MiB 35% slower).
	singleCopyPiece = 256 << 10
	// singleCopyAllReduceMin and Max bound the all_reduce of two ranks
	// that reads the peer's memory. Measured on 2 cores, single copy
	// against the slots: 2 MiB 0.38 ms and 0.33, 3 MiB 0.50 and 0.63,
	// 16 MiB 2.4 and 2.8, 24 MiB 4.2 and 4.6, 32 MiB 8.6 and 7.1, 64 MiB
	// 21 and 16 (in rounds of 1 to 4 MiB too: the slots' blocks, each
	// copied in, reduced and copied out while in cache, win there).
	singleCopyAllReduceMin = 3 << 20
	singleCopyAllReduceMax = 24 << 20
)

// addressOf is the address of b's first byte in this process, for peers
// to read it with process_vm_readv; 0 for an empty b. The buffers given
// to a Comm are on the heap, which Go does not move, and the op keeps b
// alive until its peers have read it.
func addressOf(b []byte) uintptr {
	if len(b) == 0 {
		return 0
	}
	return uintptr(unsafe.Pointer(&b[0]))
}

// pairMismatch reports a peer that sends us another count of elements
// than we expect from it, as the socket transport's frames would.
func (o *op) pairMismatch(peer int, want, sent uint64) error {
	e := &MismatchError{Viewer: o.c.rank, RankA: o.c.rank, RankB: peer, hdrA: o.hdr, hdrB: o.hdr}
	e.hdrA.count, e.hdrB.count = want, sent
	e.detail = fmt.Sprintf("rank %d expects %d elements from rank %d, which sends %d", o.c.rank, want, peer, sent)
	e.fill()
	return e
}

// overlaps reports whether a and b share memory.
func overlaps(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	a0, b0 := uintptr(unsafe.Pointer(&a[0])), uintptr(unsafe.Pointer(&b[0]))
	return a0 < b0+uintptr(len(b)) && b0 < a0+uintptr(len(a))
}
