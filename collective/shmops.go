package collective

import "time"

// The steps every shared-memory collective is made of. A collective runs
// as blocks; block stamps count blocks across the world's calls, so every
// rank must run as many blocks per call as the others (they derive the
// number from the call's shape, which the published headers check).
// Block g uses slot g%2 of every rank that writes in it; a writer first
// waits until every peer has consumed block g-2, which last used that
// slot. Each rank then says what it did with its counters:
//
//   - written: its slot holds its data for block g (writers only);
//   - reduced: its chunk of block g is reduced, in its slot (all_reduce
//     and reduce);
//   - consumed: it has read all it reads of block g from the peers'
//     slots. Every rank signals every block, reader or not, since the
//     next writer of the slot waits for all.
//
// A rank checks the call of each peer it waits for against its own (see
// checkSharedPeer), and before returning waits until every peer it did
// not wait for has published this call too, and checks it: the ranks of
// a broadcast only wait for the root, so two ranks that each think they
// are the root would otherwise never meet. No rank can thus leave a call
// before every other has entered it.

// runShared runs body, a collective's blocks, in shared memory.
func (o *op) runShared(body func(s *shmWorld) error) error {
	s := o.c.shm
	if !s.enter() {
		return ErrClosed
	}
	defer s.exit()
	clear(s.checked)
	s.checked[o.c.rank] = true
	if err := body(s); err != nil {
		return err
	}
	return o.awaitArrivals()
}

// next returns the stamp of the call's next block.
func (s *shmWorld) next() uint32 {
	s.stamp++
	return s.stamp
}

// eachBlock runs body on buf cut into blocks of up to a slot, in order,
// with each block's stamp and offset in buf. An empty buf still gets one
// block, empty: the ranks meet in it (a barrier passes nil).
func (s *shmWorld) eachBlock(buf []byte, body func(g uint32, lo int, block []byte) error) error {
	for lo := 0; ; lo += s.slot {
		if err := body(s.next(), lo, buf[lo:min(lo+s.slot, len(buf))]); err != nil {
			return err
		}
		if lo+s.slot >= len(buf) {
			return nil
		}
	}
}

// self is this rank's region.
func (o *op) self() *shmRegion { return &o.c.shm.regions[o.c.rank] }

// region is peer's region.
func (o *op) region(peer int) *shmRegion { return &o.c.shm.regions[peer] }

// slotOf is the slot peer uses for block g.
func (o *op) slotOf(peer int, g uint32) []byte { return o.region(peer).slots[g%2] }

// claimSlot returns our slot for block g once every peer is done with
// the block that used it before.
func (o *op) claimSlot(g uint32) ([]byte, error) {
	for peer := range o.c.size() {
		if peer != o.c.rank {
			if err := o.awaitShared(peer, o.region(peer).consumed, g-2, false); err != nil {
				return nil, err
			}
		}
	}
	return o.self().slots[g%2], nil
}

// awaitWritten waits until peer's slot holds its data for block g.
func (o *op) awaitWritten(peer int, g uint32) error {
	return o.awaitShared(peer, o.region(peer).written, g, true)
}

// awaitReduced waits until peer's slot holds its reduced chunk of block g.
func (o *op) awaitReduced(peer int, g uint32) error {
	return o.awaitShared(peer, o.region(peer).reduced, g, true)
}

func (o *op) signalWritten(g uint32) {
	o.c.shm.signal(o.c.rank, o.self().written, g)
}

func (o *op) signalReduced(g uint32) {
	o.c.shm.signal(o.c.rank, o.self().reduced, g)
}

func (o *op) signalConsumed(g uint32) {
	o.c.shm.signal(o.c.rank, o.self().consumed, g)
}

// eachWritten calls each for every peer once the peer's block g is
// written, taking whichever is ready first (in orderAfter's order among
// those): with more ranks than cores, a peer off its core then delays
// only its own piece.
func (o *op) eachWritten(g uint32, each func(peer int) error) error {
	n, me := o.c.size(), o.c.rank
	left := o.c.peerScratch(n - 1)
	for i := range left {
		left[i] = orderAfter(me, n, i)
	}
	for len(left) > 0 {
		pick, spun := o.firstWritten(left, g)
		peer := left[pick]
		if err := o.awaitSharedSince(peer, o.region(peer).written, g, true, spun); err != nil {
			return err
		}
		if err := each(peer); err != nil {
			return err
		}
		left = append(left[:pick], left[pick+1:]...)
	}
	return nil
}

// firstWritten returns the index in peers of the first that has written
// block g. While none has, it looks at them all, as awaitShared looks at
// one: polling, then for up to shmSpin polling on or, on a crowded host
// (see shmwait.go), yielding the core between looks. Then it settles for the first, since a futex sleeps on one word, and
// returns when it began to spin (zero when it did not) for its caller's
// wait (awaitSharedSince) to go on from there. Waiting on the first
// alone cost a 1 MiB all_to_all of 4 ranks on 2 cores a seventh of its
// time in one A/B (353 against 301 us, medians of 10 rounds): another
// peer was ready while it was not.
func (o *op) firstWritten(peers []int, g uint32) (int, time.Time) {
	var start time.Time
	every := shmCheckEvery // looks between checks of the time
	if !o.c.shm.crowded {
		every *= shmPollsPerLook // looks without a yield between are quick
	}
	for look := 1; ; look++ {
		for i, peer := range peers {
			if reached(o.region(peer).written.Load(), g) {
				return i, start
			}
		}
		if look < o.c.shm.polls/len(peers) {
			continue
		}
		if start.IsZero() {
			o.handoff() // nobody drives our sockets while we wait here
			start = time.Now()
		} else if look%every == 0 && time.Since(start) >= shmSpin {
			return 0, start
		}
		o.driveSending()
		if o.c.shm.crowded {
			o.yieldFor(peers[0])
		}
	}
}

// consumeAll says this rank is done with block g and waits until every
// peer is too: then none reads the buffer this rank published for g
// (publish) any more, and the call may return it to its caller.
func (o *op) consumeAll(g uint32) error {
	o.signalConsumed(g)
	for peer := range o.c.size() {
		if peer != o.c.rank {
			if err := o.awaitShared(peer, o.region(peer).consumed, g, true); err != nil {
				return err
			}
		}
	}
	return nil
}

// awaitArrivals waits until every peer not checked yet has published this
// call, and checks it.
func (o *op) awaitArrivals() error {
	s := o.c.shm
	for peer := range o.c.size() {
		if !s.checked[peer] {
			if err := o.awaitShared(peer, o.region(peer).published, uint32(o.hdr.seq), true); err != nil {
				return err
			}
		}
	}
	return nil
}

// evenSpan is part i of count elements of size bytes cut into parts
// near-equal ranges, the first count%parts one element longer
// (fillEvenSpans fills a slice with every part).
func evenSpan(count, size, parts, i int) span {
	q, r := count/parts, count%parts
	off := i*q + min(i, r)
	n := q
	if i < r {
		n++
	}
	return span{off * size, n * size}
}

// subSlot is the bytes of each of the n parts of a slot that holds one
// piece per rank: a multiple of 64, so pieces start on cache lines and
// hold whole elements of every type.
func subSlot(slot, n int) int { return max(slot/n&^63, 64) }

// window is the part of s that round k of pieces of size sub carries,
// empty once s is used up.
func window(s span, k, sub int) span {
	lo := min(k*sub, s.len)
	return span{s.off + lo, min(sub, s.len-lo)}
}

// ceilDiv is a/b rounded up, for a >= 0 and b > 0.
func ceilDiv(a, b int) int { return (a + b - 1) / b }

// roundsFor is how many rounds carry pieces of up to longest bytes, sub
// bytes of each per round: at least one, since every rank runs the
// call's blocks even when it has nothing to send.
func roundsFor(longest, sub int) int { return max(ceilDiv(longest, sub), 1) }

// orderAfter returns the i-th peer after rank me among n ranks, so that
// ranks start reading from different peers.
func orderAfter(me, n, i int) int { return (me + 1 + i) % n }

// copyPiece bounds the bytes of one memmove in shared-memory algorithms.
// Go's memmove switches to non-temporal stores from 1 MiB on, which send
// the data past the caches to memory: right for a copy nobody reads
// soon, wrong for a slot a peer reads next.
const copyPiece = 512 << 10

// copyCached copies src into dst (as copy does) in pieces that memmove
// keeps in the caches.
func copyCached(dst, src []byte) {
	n := min(len(dst), len(src))
	for lo := 0; lo < n; lo += copyPiece {
		hi := min(lo+copyPiece, n)
		copy(dst[lo:hi], src[lo:hi])
	}
}
