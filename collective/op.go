package collective

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// op is one call in flight: the frames it posted and queued, and how it
// ends. Algorithms post receives (expect) before the matching data can
// arrive where they can, queue sends (send), and wait (await, flush); a
// failure anywhere ends the op through finish, which withdraws what is
// still outstanding so the caller's buffers are free when the call
// returns, and tells the other ranks.
type op struct {
	c      *comm
	ctx    context.Context
	hdr    header // the template of this op's data frames
	recvs  []*recvReq
	sends  []*sendReq
	unsent int      // sends before it are written (drive)
	held   []*frame // scratch buffers, back to the pool at finish
	// sending is another op whose queued sends this one writes while it
	// waits in shared memory, or nil: the world op of an all_to_all whose
	// host view this op runs, with pieces in flight while the host's
	// ranks meet (shmwait.go).
	sending *op
}

func (o *op) reset(c *comm, ctx context.Context, h header) {
	o.c, o.ctx, o.hdr, o.sending = c, ctx, h, nil
}

// label names the op in errors: "all_reduce seq 7", "send to rank 2 tag 5".
func (o *op) label() string {
	if o.hdr.coll == collSend {
		return fmt.Sprintf("send/recv tag %d", o.hdr.tag)
	}
	return fmt.Sprintf("%v seq %d", o.hdr.coll, o.hdr.seq)
}

func (o *op) segment() int { return o.c.cfg.segment }

// segments is how many frames carry n bytes: one per segment, and one
// for an empty buffer, whose header still goes.
func (o *op) segments(n int) int { return max(ceilDiv(n, o.segment()), 1) }

// spans returns the call's span list i (0 or 1), n long.
func (o *op) spans(i, n int) []span { return o.c.spanScratch(i, n) }

// expect posts receives for buf from peer, one per segment (at least one,
// so that empty buffers still exchange a header), the payload landing at
// offset off of the logical buffer both sides agree on. It returns the
// new requests in order.
func (o *op) expect(peer int, buf []byte, off int) []*recvReq {
	return o.expectInto(peer, buf, off, false)
}

// expectOperand is expect for scratch that the op only reads once the
// receive is done, through the request's buf: a frame that came early
// lends its buffer instead of being copied into scratch.
func (o *op) expectOperand(peer int, scratch []byte, off int) []*recvReq {
	return o.expectInto(peer, scratch, off, true)
}

func (o *op) expectInto(peer int, buf []byte, off int, borrow bool) []*recvReq {
	start := len(o.recvs)
	t, src := o.c.t, o.c.world[peer]
	seg := o.segment()
	for lo := 0; ; lo += seg {
		hi := min(lo+seg, len(buf))
		r := t.reqs.recv()
		r.want = o.hdr
		r.want.offset = uint64(off + lo)
		r.want.length = uint32(hi - lo)
		r.src, r.lane, r.peer, r.buf, r.borrow = src, t.lane(src, &r.want), peer, buf[lo:hi], borrow
		o.recvs = append(o.recvs, r)
		t.match.post(r, o.key(r), nil)
		if hi == len(buf) {
			break
		}
	}
	return o.recvs[start:]
}

// expectAny posts a receive for the first segment of buf from whichever
// member sends first on this op's tag.
func (o *op) expectAny(buf []byte) *recvReq {
	r := o.c.t.reqs.recv()
	r.want = o.hdr
	r.want.length = uint32(min(len(buf), o.segment()))
	r.src, r.peer, r.buf = anySource, AnySource, buf[:r.want.length]
	o.recvs = append(o.recvs, r)
	o.c.t.match.post(r, o.key(r), o.c.world)
	return r
}

// key is the mailbox r waits in.
func (o *op) key(r *recvReq) boxKey {
	return o.hdr.boxKey(r.src, r.lane)
}

// send queues buf for peer in segments, each frame saying it belongs at
// offset off (plus the segment's position) of the logical buffer.
func (o *op) send(peer int, buf []byte, off int) error {
	dst := o.c.world[peer]
	conns, err := o.c.t.outgoing(o.ctx, dst)
	if err != nil {
		if o.ctx.Err() != nil {
			return o.timedOut("connecting to", []int{peer})
		}
		return &PeerError{Rank: peer, Op: o.label(), Err: err}
	}
	seg := o.segment()
	for lo := 0; ; lo += seg {
		hi := min(lo+seg, len(buf))
		r := o.c.t.reqs.send()
		h := o.hdr
		h.offset = uint64(off + lo)
		h.length = uint32(hi - lo)
		h.encode(&r.hdr)
		oc := conns[o.c.t.lane(dst, &h)]
		r.payload, r.peer, r.conn = buf[lo:hi], peer, oc
		o.sends = append(o.sends, r)
		oc.enqueue(r, true)
		if hi == len(buf) {
			break
		}
	}
	return nil
}

// await blocks until r is filled, the context is done, or the
// communicator fails.
func (o *op) await(r *recvReq) error {
	if !o.poll(r) {
		o.park()
		defer o.unpark()
		if o.hdr.coll != collSend {
			o.c.waitingOn.Store(int32(r.peer))
		}
		select {
		case <-r.done:
		case <-o.ctx.Done():
			return o.timedOut("waiting for", nil)
		case <-o.c.failed:
			return o.c.failure()
		}
		if o.hdr.coll != collSend {
			o.c.waitingOn.Store(-1)
		}
	}
	r.consumed = true
	switch {
	case r.cause != nil:
		return &PeerError{Rank: o.c.commRank(r.src, r.peer), Op: o.label(), Err: r.cause}
	case r.mismatch:
		return o.mismatch(r)
	}
	return nil
}

// poll takes r's token if it comes soon, spinning: a frame from a peer
// that keeps pace arrives within microseconds, sooner than a goroutine
// parked on the channel would be woken to take it. While it spins it
// reads r's sender's connections itself (inConn.poll; all its lanes, as
// the frames after r's are on their way on the others) and writes its own
// frames (drive), yielding the core every few looks (on a machine with
// more ranks than cores, the peer may need it to send what we wait for:
// at 4 ranks on 2 cores this halved an 8-byte all_reduce), until no byte
// has moved for config.spinLimit. Without a connection to read (shared
// memory, AnySource, not connected yet) it spins only for awaitSpin,
// while the transport's poller runs on the other P (twoPs, procs.go). It
// stops early when the op's context ends or the communicator fails.
func (o *op) poll(r *recvReq) bool {
	select {
	case <-r.done:
		return true
	default:
	}
	t := o.c.t
	var lanes [maxStreams]*inConn
	var sockets socketSet
	conns := lanes[:0]
	if r.src >= 0 {
		for lane := range t.peers[r.src].lanes {
			if ic := t.incoming(r.src, lane); ic != nil {
				sockets.add(ic.fd)
				conns = append(conns, ic)
			}
		}
	}
	limit := awaitSpin
	if len(conns) > 0 {
		limit = o.c.cfg.spinLimit(t.peers[r.src].remote, int(r.want.length)) // not len(r.buf): a borrowing receive's changes under the matcher's lock
		for _, ic := range conns {
			ic.spin()
		}
		defer unspinAll(conns)
	}
	reading := len(conns) > 0
	start, moved := time.Now(), t.moved.Load()
	for i := 1; ; i++ {
		select {
		case <-r.done:
			return true
		default:
		}
		if reading {
			ready := sockets.readable()
			for k, ic := range conns {
				if !ic.poll(ready&(1<<k) != 0) {
					reading, limit = false, awaitSpin // failed: the poller reports why
					break
				}
			}
		}
		o.drive()
		if i%spinLooks == 0 {
			// The limit counts from the last byte moved, not from the
			// start: a write of a megabyte into a loopback socket can take
			// a millisecond, and parking then only adds wake-ups.
			if m := t.moved.Load(); m != moved {
				start, moved = time.Now(), m
			}
			select {
			case <-o.ctx.Done():
				return false
			case <-o.c.failed:
				return false
			default:
			}
			switch spun := time.Since(start); {
			case spun >= limit:
				return false
			case reading:
				t.yield()
			}
		}
	}
}

func unspinAll(conns []*inConn) {
	for _, ic := range conns {
		ic.unspin()
	}
}

func (o *op) awaitAll(rs []*recvReq) error {
	for _, r := range rs {
		if err := o.await(r); err != nil {
			return err
		}
	}
	return nil
}

// flush waits until every queued send has been written, so that the
// buffers they read from may change. It writes them itself (drive) for
// up to awaitYieldSpin before it hands them to the writer goroutines.
func (o *op) flush() error {
	start := time.Now()
	for i, s := range o.sends {
		if s.consumed {
			continue
		}
		for j := 1; len(s.done) == 0; j++ {
			o.drive()
			if j%spinLooks == 0 {
				if time.Since(start) >= awaitYieldSpin {
					break
				}
				o.c.t.yield()
			}
		}
		select {
		case <-s.done:
		default:
			o.unsent = i
			if err := o.awaitSend(s); err != nil {
				return err
			}
		}
		s.consumed = true
		if s.err != nil {
			return &PeerError{Rank: s.peer, Op: o.label(), Err: s.err}
		}
	}
	return nil
}

// awaitSend blocks until s is written, the context is done, or the
// communicator fails.
func (o *op) awaitSend(s *sendReq) error {
	o.park()
	defer o.unpark()
	select {
	case <-s.done:
		return nil
	case <-o.ctx.Done():
		return o.timedOut("sending to", nil)
	case <-o.c.failed:
		return o.c.failure()
	}
}

// park readies the transport for the op to block on a channel: its
// frames go to the writer goroutines, and the poller reads every
// connection (an op spinning on one left it to them), since what the op
// waits for may depend on a peer that is blocked writing to us.
func (o *op) park() {
	o.c.t.parked.Add(1)
	o.c.t.poller.wakeAll()
	o.handoff()
}

func (o *op) unpark() { o.c.t.parked.Add(-1) }

// drive writes the op's queued frames as far as their sockets take them
// now (outConn.drive), trying each connection once: a message's frames
// take a peer's lanes in turn, and a full socket refuses the second try
// as it did the first.
func (o *op) drive() {
	var driven [maxStreams]*outConn // the first connections tried
	n := 0
	for i := o.unsent; i < len(o.sends); i++ {
		s := o.sends[i]
		if s.consumed || len(s.done) > 0 {
			if i == o.unsent {
				o.unsent++
			}
			continue
		}
		if slices.Contains(driven[:n], s.conn) {
			continue
		}
		if n < len(driven) {
			driven[n] = s.conn
			n++
		}
		s.conn.drive()
	}
}

// handoff gives the op's unwritten frames to the writer goroutines: the
// op is about to block on something other than its sockets.
func (o *op) handoff() {
	var last *outConn
	for _, s := range o.sends[o.unsent:] {
		if !s.consumed && len(s.done) == 0 && s.conn != last {
			last = s.conn
			last.handoff()
		}
	}
}

// scratch returns an n-byte buffer of the op's own, pooled.
func (o *op) scratch(n int) []byte {
	f := o.c.t.bufs.get(&header{length: uint32(n)})
	o.held = append(o.held, f)
	return f.data
}

// combine sets dst = a op b with this op's type and operator.
func (o *op) combine(dst, a, b []byte) {
	combine(dst, a, b, o.hdr.dtype, o.hdr.reduce)
}

// finish ends the op. On success it waits for the sends; on failure it
// withdraws what is outstanding, marks the communicator failed and, when
// the failure started here, tells every other rank so that none hangs.
func (o *op) finish(err error) error {
	if err == nil {
		err = o.flush()
	}
	if err != nil {
		o.withdraw()
	}
	o.release()
	if err == nil {
		return nil
	}
	o.awaitCause(err)
	if o.c.fail(err) {
		o.c.log.Debug().Err(err).Msg("operation failed")
		o.c.tellOthers(err, o.label())
	}
	return o.c.failure()
}

// withdraw cancels the receives and sends still outstanding and waits
// until none can touch the caller's buffers; a frame stuck half-way is
// cut off with its connection after cancelGrace.
func (o *op) withdraw() {
	t := o.c.t
	o.park()
	defer o.unpark()
	for _, r := range o.recvs {
		if r.consumed {
			continue
		}
		switch t.match.cancel(r, o.key(r)) {
		case reqFilling:
			src, lane := r.src, r.lane
			waitOrCut(r.done, func() { t.dropIncoming(src, lane) })
		case reqDone:
			<-r.done
		}
		r.consumed = true
	}
	// Every send is canceled before any is waited for, and the last first:
	// a writer skips a canceled frame only at the head of its queue, so
	// then it finds the op's later frames canceled too. Canceled in
	// order, one at a time, a writer skipped a segment and wrote the
	// next, and the peer, still waiting for the skipped one, reported a
	// mismatch with us instead of why the op failed.
	for _, s := range slices.Backward(o.sends) {
		if !s.consumed {
			s.canceled.Store(true)
		}
	}
	for _, s := range o.sends {
		if s.consumed {
			continue
		}
		dst := o.c.world[s.peer]
		waitOrCut(s.done, func() {
			t.lostOutgoing(dst, fmt.Errorf("collective: a send stalled for %v after its operation failed", cancelGrace))
		})
		s.consumed = true
	}
}

// awaitCause gives a peer whose connection broke the time to explain:
// a rank that fails tells every other why (tellOthers) before it returns,
// and may exit right after, so our send to it can break before we have
// read its note. The note names the root cause (the rank that died, say),
// where our error would blame the messenger. The note may also be
// another rank's, on a connection of its own, the peer having relayed
// nothing (a rank that fails by a note does not pass it on). So this
// waits until the communicator fails with a note, for up to
// unconnectedWait, and longer, up to noteWait, while the peer's incoming
// connection, which carries its note, has not been read to its end.
func (o *op) awaitCause(err error) {
	var pe *PeerError
	var wt *waitTimeout
	if !errors.As(err, &pe) || errors.As(err, &wt) || pe.Rank < 0 || pe.Rank >= o.c.size() || pe.Rank == o.c.rank {
		return
	}
	t, src := o.c.t, o.c.world[pe.Rank]
	start := time.Now()
	for time.Since(start) < noteWait {
		select {
		case <-o.c.failed:
			return
		default:
		}
		ended, connected := t.laneEnded(src, 0) != nil, t.peers[src].in[0].Load() != nil // notes come on lane 0
		if (ended || !connected) && time.Since(start) >= unconnectedWait {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

func waitOrCut(done chan struct{}, cut func()) {
	timer := time.NewTimer(cancelGrace)
	defer timer.Stop()
	select {
	case <-done:
		return
	case <-timer.C:
	}
	cut()
	<-done
}

// release recycles the op's requests and scratch buffers.
func (o *op) release() {
	t := o.c.t
	for _, r := range o.recvs {
		if r.lent != nil {
			t.bufs.put(r.lent)
		}
		t.reqs.putRecv(r)
	}
	for _, s := range o.sends {
		t.reqs.putSend(s)
	}
	for _, f := range o.held {
		t.bufs.put(f)
	}
	clear(o.recvs)
	clear(o.sends)
	clear(o.held)
	o.recvs, o.sends, o.held = o.recvs[:0], o.sends[:0], o.held[:0]
	o.unsent = 0
	o.ctx = nil
}

// timedOut reports the ranks the op still waits for.
func (o *op) timedOut(action string, ranks []int) error {
	if ranks == nil {
		ranks = o.pendingRanks()
		if len(ranks) == 0 {
			action = "sending to"
			for _, s := range o.sends {
				if !s.consumed && len(s.done) == 0 {
					ranks = append(ranks, s.peer)
				}
			}
		}
		slices.Sort(ranks)
		ranks = slices.Compact(ranks)
	}
	wt := &waitTimeout{ranks: ranks, action: action, cause: o.ctx.Err()}
	// Blame the first rank that never came, else the first awaited.
	hint, culprits := o.c.diagnose(o, ranks)
	wt.hint = hint
	rank := -1
	switch {
	case len(culprits) > 0:
		rank = culprits[0]
	case len(ranks) > 0:
		rank = ranks[0]
	}
	return &PeerError{Rank: rank, Op: o.label(), Err: wt}
}

// pendingRanks lists the peers whose frames the op still waits for.
func (o *op) pendingRanks() []int {
	m := o.c.t.match
	m.mu.Lock()
	defer m.mu.Unlock()
	var ranks []int
	for _, r := range o.recvs {
		if !r.consumed && r.state != reqDone {
			ranks = append(ranks, r.peer)
		}
	}
	return ranks
}

// mismatch describes the frame r got instead of the one it wanted. While
// a member is gone, frames out of step are the death's doing (a peer cut
// off mid-pipeline), so the dead member is named instead.
func (o *op) mismatch(r *recvReq) error {
	if rank, err := o.c.goneMember(); err != nil {
		return &PeerError{Rank: rank, Op: o.label(), Err: err}
	}
	peer := o.c.commRank(r.from, r.peer)
	e := &MismatchError{
		Viewer: o.c.rank,
		RankA:  o.c.rank, RankB: peer,
		hdrA: r.want, hdrB: r.got,
	}
	want, got := r.want, r.got
	want.offset, want.length, got.offset, got.length = 0, 0, 0, 0
	switch prev := o.c.prev; {
	case want == got:
		// Both ranks are in the same call, so the sender's call broke
		// mid-stream: its note saying why is on its way. Name that cause
		// rather than the symptom.
		timer := time.NewTimer(noteWait)
		defer timer.Stop()
		select {
		case <-o.c.failed:
			return o.c.failure()
		case <-timer.C:
		}
		e.detail = fmt.Sprintf("expected %d bytes at offset %d, rank %d sent %d bytes at offset %d",
			r.want.length, r.want.offset, peer, r.got.length, r.got.offset)
	case want.root != got.root && !want.coll.rooted() && want.seq == got.seq && want.algo == got.algo:
		// The hierarchical reduce_scatter and all_to_all hash the counts
		// their frames stand for into the root field (countsKey).
		e.detail = fmt.Sprintf("rank %d and rank %d were given counts that disagree", o.c.rank, peer)
		if want.coll == collAllToAll {
			e.detail = fmt.Sprintf("rank %d's receive counts for the pieces from rank %d's host disagree with that host's send counts", o.c.rank, peer)
		}
	case got.seq < want.seq && got.seq == prev.seq:
		// The peer's frame outlived a call that completed here: a
		// broadcast or scatter root only sends, so disagreeing roots
		// surface in the next call.
		e.detail = fmt.Sprintf("at seq %d rank %d called %v", prev.seq, o.c.rank, prev.call())
	}
	e.fill()
	return e
}
