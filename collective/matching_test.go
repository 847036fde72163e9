package collective

import (
	"errors"
	"fmt"
	"io"
	"syscall"
	"testing"
)

// The matching's decisions, on plain state: no sockets, no goroutines.

// dataHeader is the header of a collective's data frame (p2p: a send's)
// at offset off, n bytes long, on communicator comm.
func dataHeader(comm uint64, p2p bool, off, n int) header {
	h := header{kind: kindData, coll: collAllReduce, comm: comm, seq: 1, count: 1 << 20, offset: uint64(off), length: uint32(n)}
	if p2p {
		h.coll, h.seq, h.tag = collSend, 0, 3
	}
	return h
}

// posted returns a receive for a frame with header h from src, ready to
// post.
func posted(h header, src int) *recvReq {
	var pool reqPool
	r := pool.recv()
	r.want, r.src, r.buf = h, src, make([]byte, h.length)
	return r
}

// isDone reports whether r's token was sent, taking it.
func isDone(r *recvReq) bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

func TestMayReadAhead(t *testing.T) {
	coll, send := dataHeader(worldID, false, 0, 1<<20), dataHeader(worldID, true, 0, 1<<20)
	cases := []struct {
		name      string
		p         peerMatch
		anyWanted int
		h         header
		want      bool
	}{
		{"nothing held", peerMatch{}, 0, coll, true},
		{"within the bound", peerMatch{held: heldLimit - 1<<20}, 0, coll, true},
		{"past the bound", peerMatch{held: heldLimit - 1<<20 + 1}, 0, coll, false},
		{"a frame past the bound when none is held", peerMatch{}, 0, dataHeader(worldID, false, 0, heldLimit+1), true},
		{"past the bound, a receive waits for the peer", peerMatch{held: heldLimit, wanted: 1}, 0, coll, true},
		{"past the bound, an AnySource receive waits", peerMatch{held: heldLimit}, 1, coll, true},
		{"past the bound, a send's frame", peerMatch{held: heldLimit}, 0, send, true},
	}
	for _, c := range cases {
		if got := mayReadAhead(c.p, c.anyWanted, &c.h); got != c.want {
			t.Errorf("%s: mayReadAhead = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestLaneEnd(t *testing.T) {
	reset := fmt.Errorf("read: %w", syscall.ECONNRESET)
	cases := []struct {
		err       error
		cause     string
		everyLane bool
	}{
		{io.EOF, "connection closed (the process exited or closed its communicator)", false},
		{io.ErrUnexpectedEOF, "connection closed in the middle of a frame (the process died)", true},
		{reset, reset.Error(), true},
		{errors.New("collective: bad frame magic"), "collective: bad frame magic", true},
	}
	for _, c := range cases {
		cause, every := laneEnd(c.err)
		if cause.Error() != c.cause || every != c.everyLane {
			t.Errorf("laneEnd(%v) = %q, %v; want %q, %v", c.err, cause, every, c.cause, c.everyLane)
		}
	}
}

// TestArrive: where a frame whose header was just read goes, and what
// that books.
func TestArrive(t *testing.T) {
	const src, comm, retired = 1, worldID, 7
	want := dataHeader(comm, false, 0, 100)
	other := want
	other.seq = 2
	p2p := dataHeader(comm, true, 0, 100)
	cases := []struct {
		name  string
		h     header
		lane  int
		setup func(m *matching) *recvReq // returns the receive the frame should complete, if any
		want  arrival
		held  int // the peer's bytes held after
	}{
		{name: "closed communicator", h: dataHeader(retired, false, 0, 100),
			setup: func(m *matching) *recvReq { return nil }, want: arriveDiscard},
		{name: "nothing posted", h: want,
			setup: func(m *matching) *recvReq { return nil }, want: arriveHold, held: 100},
		{name: "posted", h: want, setup: func(m *matching) *recvReq {
			r := posted(want, src)
			m.post(r, want.boxKey(src, 0), nil)
			return r
		}, want: arriveFill},
		{name: "posted for another call", h: want, setup: func(m *matching) *recvReq {
			r := posted(other, src)
			m.post(r, other.boxKey(src, 0), nil)
			return r
		}, want: arriveMismatch},
		{name: "an AnySource receive takes a message's first frame", h: p2p, setup: func(m *matching) *recvReq {
			r := posted(p2p, anySource)
			m.post(r, p2p.boxKey(anySource, 0), []int{0, src})
			return r
		}, want: arriveFill},
		{name: "an AnySource receive does not take a later frame", h: dataHeader(comm, true, 100, 100), setup: func(m *matching) *recvReq {
			r := posted(p2p, anySource)
			m.post(r, p2p.boxKey(anySource, 0), []int{0, src})
			return nil
		}, want: arriveHold, held: 100},
		{name: "a receive on another lane is not this frame's", h: want, lane: 1, setup: func(m *matching) *recvReq {
			r := posted(want, src)
			m.post(r, want.boxKey(src, 0), nil)
			return nil
		}, want: arriveHold, held: 100},
		{name: "read ahead as far as allowed", h: want, setup: func(m *matching) *recvReq {
			m.peers[src].held = heldLimit
			return nil
		}, want: arriveHoldBack, held: heldLimit},
		{name: "read ahead past the bound for a waiting receive", h: want, setup: func(m *matching) *recvReq {
			m.peers[src].held = heldLimit
			r := posted(want, src)
			m.post(r, want.boxKey(src, 1), nil) // on another lane: the frame held back may be in its way
			return nil
		}, want: arriveHold, held: heldLimit + 100},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var bufs bufferPool
			m := newMatching(2, &bufs)
			m.retired[retired] = true
			r := c.setup(&m)
			wanted := m.peers[src].wanted + m.anyWanted
			verdict, got, f := m.arrive(c.h.boxKey(src, c.lane), &c.h)
			if verdict != c.want {
				t.Fatalf("verdict %d, want %d", verdict, c.want)
			}
			if got != r {
				t.Fatalf("completes receive %p, want %p", got, r)
			}
			if (f != nil) != (verdict == arriveHold) || f != nil && (f.h != c.h || len(f.data) != int(c.h.length)) {
				t.Fatalf("frame %+v for verdict %d", f, verdict)
			}
			if m.peers[src].held != c.held {
				t.Errorf("held %d, want %d", m.peers[src].held, c.held)
			}
			if r != nil {
				if after := m.peers[src].wanted + m.anyWanted; after != wanted-1 {
					t.Errorf("receives wanted %d, want %d", after, wanted-1)
				}
				if r.from != src {
					t.Errorf("from %d, want %d", r.from, src)
				}
			}
			switch verdict {
			case arriveFill:
				if r.state != reqFilling || isDone(r) {
					t.Errorf("filling receive: state %d, done %v", r.state, isDone(r))
				}
			case arriveMismatch:
				if !r.mismatch || r.got != c.h || !isDone(r) {
					t.Errorf("mismatched receive: mismatch %v, got %+v, done %v", r.mismatch, r.got, isDone(r))
				}
			}
		})
	}
}

// TestPost: a receive posted completes from a frame that came first, or
// fails at once, or waits.
func TestPost(t *testing.T) {
	const src = 1
	h := dataHeader(worldID, false, 0, 4)
	other := h
	other.seq = 2
	p2p := dataHeader(worldID, true, 0, 4)
	payload := []byte{1, 2, 3, 4}
	early := func(m *matching, h header, src int) *frame {
		f := m.bufs.get(&h)
		copy(f.data, payload)
		m.hold(src, f)
		m.box(h.boxKey(src, 0)).frames = append(m.box(h.boxKey(src, 0)).frames, f)
		return f
	}
	cases := []struct {
		name     string
		h        header
		src      int
		borrow   bool
		setup    func(m *matching)
		done     bool
		cause    error
		filled   bool // buf holds the payload
		lent     bool // buf is the early frame's
		mismatch bool
	}{
		{name: "waits", h: h, src: src, setup: func(m *matching) {}},
		{name: "an early frame is copied", h: h, src: src, setup: func(m *matching) { early(m, h, src) }, done: true, filled: true},
		{name: "an early frame lends its buffer", h: h, src: src, borrow: true, setup: func(m *matching) { early(m, h, src) }, done: true, filled: true, lent: true},
		{name: "an early frame of another call", h: h, src: src, setup: func(m *matching) { early(m, other, src) }, done: true, mismatch: true},
		{name: "the lane ended", h: h, src: src, setup: func(m *matching) { m.peers[src].ended[0] = io.EOF }, done: true, cause: io.EOF},
		{name: "the lane ended after the frame came", h: h, src: src, setup: func(m *matching) {
			early(m, h, src)
			m.peers[src].ended[0] = io.EOF
		}, done: true, filled: true},
		{name: "closed", h: h, src: src, setup: func(m *matching) { m.closed = true }, done: true, cause: ErrClosed},
		{name: "AnySource from the first member with a message", h: p2p, src: anySource, setup: func(m *matching) {
			early(m, dataHeader(worldID, true, 4, 4), 0) // not a message's first frame
			early(m, p2p, src)
		}, done: true, filled: true},
		{name: "AnySource waits", h: p2p, src: anySource, setup: func(m *matching) {
			m.peers[0].ended[0] = io.EOF // an AnySource receive fails only with its communicator
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var bufs bufferPool
			m := newMatching(2, &bufs)
			c.setup(&m)
			heldBefore := m.peers[src].held
			r := posted(c.h, c.src)
			r.borrow = c.borrow
			own := r.buf
			m.post(r, c.h.boxKey(c.src, 0), []int{0, src})
			if got := isDone(r); got != c.done {
				t.Fatalf("done %v, want %v", got, c.done)
			}
			if !errors.Is(r.cause, c.cause) || (r.cause == nil) != (c.cause == nil) {
				t.Errorf("cause %v, want %v", r.cause, c.cause)
			}
			if got := string(r.buf) == string(payload); got != c.filled {
				t.Errorf("buf %v, want filled %v", r.buf, c.filled)
			}
			if got := &r.buf[0] != &own[0]; got != c.lent || (r.lent != nil) != c.lent {
				t.Errorf("lent %v (frame %v), want %v", got, r.lent != nil, c.lent)
			}
			if r.mismatch != c.mismatch {
				t.Errorf("mismatch %v, want %v", r.mismatch, c.mismatch)
			}
			if c.done {
				if c.filled || c.mismatch {
					if r.from != src || m.peers[src].held != heldBefore-4 {
						t.Errorf("from %d, held %d: want %d, %d", r.from, m.peers[src].held, src, heldBefore-4)
					}
				}
				return
			}
			if r.state != reqPosted || m.peers[max(c.src, 0)].wanted+m.anyWanted != 1 {
				t.Errorf("state %d, wanted %d, any %d: want posted, 1", r.state, m.peers[max(c.src, 0)].wanted, m.anyWanted)
			}
			if got := m.cancel(r, c.h.boxKey(c.src, 0)); got != reqPosted || r.state != reqIdle || m.peers[src].wanted+m.anyWanted != 0 {
				t.Errorf("cancel: was %d, now %d, wanted %d: want withdrawn", got, r.state, m.peers[src].wanted+m.anyWanted)
			}
		})
	}
}

// TestEndLane: a connection that ends fails the receives waiting on the
// lanes it ends, and only those.
func TestEndLane(t *testing.T) {
	const src = 1
	cases := []struct {
		err    error
		failed [3]bool // the receives on lanes 0, 1 and 2
	}{
		{io.EOF, [3]bool{false, true, false}},
		{io.ErrUnexpectedEOF, [3]bool{true, true, true}},
		{syscall.ECONNRESET, [3]bool{true, true, true}},
	}
	for _, c := range cases {
		var bufs bufferPool
		m := newMatching(3, &bufs)
		var rs [3]*recvReq
		for lane := range rs {
			h := dataHeader(worldID, false, lane*defaultSegment, 4)
			rs[lane] = posted(h, src)
			rs[lane].lane = lane
			m.post(rs[lane], h.boxKey(src, lane), nil)
		}
		other := posted(dataHeader(worldID, false, 0, 4), 2)
		m.post(other, other.want.boxKey(2, 0), nil)
		cause := m.endLane(src, 1, c.err)
		wanted := 3
		for lane, r := range rs {
			failed := isDone(r)
			if failed != c.failed[lane] {
				t.Errorf("%v: lane %d failed %v, want %v", c.err, lane, failed, c.failed[lane])
			}
			if failed {
				wanted--
				if r.cause != cause {
					t.Errorf("%v: lane %d cause %v, want %v", c.err, lane, r.cause, cause)
				}
			}
			if (m.laneEnded(src, lane) != nil) != c.failed[lane] {
				t.Errorf("%v: lane %d ended %v", c.err, lane, m.laneEnded(src, lane))
			}
		}
		if m.peers[src].wanted != wanted || isDone(other) || m.peerEnded(2) != nil {
			t.Errorf("%v: wanted %d (want %d); another peer's receive done %v", c.err, m.peers[src].wanted, wanted, isDone(other))
		}
		// A later end keeps the first cause.
		if m.endLane(src, 1, io.ErrUnexpectedEOF); m.laneEnded(src, 1) != cause {
			t.Errorf("%v: the cause became %v", c.err, m.laneEnded(src, 1))
		}
	}
}

// TestDeliverAndRetire: a frame read whole goes to the receive posted
// meanwhile, else waits in its mailbox; retiring the communicator
// recycles what waits and fails what is posted.
func TestDeliverAndRetire(t *testing.T) {
	const src = 1
	var bufs bufferPool
	m := newMatching(2, &bufs)
	h := dataHeader(worldID, false, 0, 4)
	key := h.boxKey(src, 0)
	_, _, f := m.arrive(key, &h)
	copy(f.data, "abcd")
	r := posted(h, src)
	m.post(r, key, nil)
	m.deliver(key, f)
	if !isDone(r) || string(r.buf) != "abcd" || m.peers[src].held != 0 || m.peers[src].wanted != 0 {
		t.Fatalf("delivered to a posted receive: done, buf %q, held %d, wanted %d", r.buf, m.peers[src].held, m.peers[src].wanted)
	}
	next := dataHeader(worldID, false, defaultSegment, 4)
	_, _, f = m.arrive(next.boxKey(src, 0), &next)
	m.deliver(next.boxKey(src, 0), f)
	if b := m.boxes[next.boxKey(src, 0)]; b == nil || len(b.frames) != 1 || m.peers[src].held != 4 {
		t.Fatalf("undelivered frame: mailbox %+v, held %d", b, m.peers[src].held)
	}
	waiting := posted(dataHeader(worldID, true, 0, 4), src)
	m.post(waiting, waiting.want.boxKey(src, 0), nil)
	m.retire(worldID)
	if m.peers[src].held != 0 || m.peers[src].wanted != 0 || len(m.boxes) != 0 {
		t.Errorf("after retire: held %d, wanted %d, %d mailboxes", m.peers[src].held, m.peers[src].wanted, len(m.boxes))
	}
	if !isDone(waiting) || !errors.Is(waiting.cause, ErrClosed) {
		t.Errorf("a receive posted on a retired communicator: cause %v", waiting.cause)
	}
	if verdict, _, _ := m.arrive(key, &h); verdict != arriveDiscard {
		t.Errorf("a frame for a retired communicator: verdict %d", verdict)
	}
}
