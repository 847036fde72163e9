package collective

import (
	"errors"
	"io"
	"slices"
	"sync"
)

// The matching state: where each frame that comes belongs. It is kept
// apart from the sockets (inconn.go, outconn.go): nothing here reads,
// writes or blocks, so every decision it makes (which posted receive a
// frame fills, whether a peer may be read further ahead, what a lost
// connection fails) is a method on plain data, tested by tables
// (matching_test.go). The matcher owns it under its own mutex, which
// guards nothing else; a socket's reader takes it for as long as one
// decision about one frame takes, and never while it reads.

// matching is the routing state proper. Its owner serialises every call.
type matching struct {
	closed  bool // the transport closed: receives posted now fail
	boxes   map[boxKey]*mailbox
	peers   []peerMatch // by world rank
	retired map[uint64]bool
	// anyWanted counts the AnySource receives waiting: any peer's frame
	// may be what one of them waits for.
	anyWanted int
	bufs      *bufferPool // where the frames read ahead get their buffers
}

// peerMatch is what the matching knows of one peer's incoming frames.
type peerMatch struct {
	// held is the bytes of this peer's frames read before anyone asked
	// for them (in mailboxes, or being read), wanted the receives posted
	// for its frames, still waiting: together, how far ahead the peer
	// may be read (mayReadAhead).
	held, wanted int
	// ended, by lane, says why the incoming connection ended: nothing
	// more will come on it, and receives posted for it fail.
	ended [maxStreams]error
}

func newMatching(size int, bufs *bufferPool) matching {
	return matching{
		boxes:   make(map[boxKey]*mailbox),
		peers:   make([]peerMatch, size),
		retired: make(map[uint64]bool),
		bufs:    bufs,
	}
}

// matcher owns the matching state, and the communicators that frames
// other than data are routed to, behind one mutex. Lock order: the
// transport's mutex, when held, is taken first.
type matcher struct {
	mu sync.Mutex
	matching
	comms   map[uint64]*comm
	orphans map[uint64]*abortNote // aborts for communicators not split yet
	queries map[uint64]chan statusReply
}

func newMatcher(size int, bufs *bufferPool) *matcher {
	return &matcher{
		matching: newMatching(size, bufs),
		comms:    make(map[uint64]*comm),
		orphans:  make(map[uint64]*abortNote),
		queries:  make(map[uint64]chan statusReply),
	}
}

// arrival is what becomes of a data frame whose header has been read.
type arrival uint8

const (
	arriveDiscard  arrival = iota // its communicator is closed: the payload is skipped
	arriveFill                    // read straight into the posted receive it matches
	arriveMismatch                // the posted receive wanted another header and failed; the payload is skipped
	arriveHold                    // read into a pooled buffer until its receive is posted
	arriveHoldBack                // left in the socket: the peer is as far ahead as it may be
)

// arrive decides where a data frame with header h from key.src goes, and
// books it: the receive it fills (filling now, or failed with a
// mismatch) or the buffer it is held in.
func (m *matching) arrive(key boxKey, h *header) (arrival, *recvReq, *frame) {
	if m.retired[h.comm] {
		return arriveDiscard, nil, nil
	}
	if r := m.takePosted(key, h); r != nil {
		r.from = key.src
		if *h != r.want {
			r.got = *h
			r.mismatch = true
			r.complete()
			return arriveMismatch, r, nil
		}
		r.state = reqFilling
		return arriveFill, r, nil
	}
	if !mayReadAhead(m.peers[key.src], m.anyWanted, h) {
		return arriveHoldBack, nil, nil
	}
	f := m.bufs.get(h)
	m.hold(key.src, f)
	return arriveHold, nil, f
}

// deliver routes a frame held in f, read whole, from key.src: into the
// receive posted for it meanwhile, else into its mailbox.
func (m *matching) deliver(key boxKey, f *frame) {
	if r := m.takePosted(key, &f.h); r != nil {
		m.fill(r, f, key.src)
		return
	}
	b := m.box(key)
	b.frames = append(b.frames, f)
}

// broke accounts for a frame from src whose connection failed while it
// was read: the receive it filled fails, the buffer it was held in is
// no longer held.
func (m *matching) broke(src int, r *recvReq, f *frame, cause error) {
	if r != nil {
		r.cause = cause
		r.complete()
	}
	if f != nil {
		m.release(src, f)
	}
}

// takePosted pops the receive a frame with header h from key.src should
// fill: the oldest posted in its mailbox, else, for the first frame of a
// message on a tag, the oldest AnySource receive.
func (m *matching) takePosted(key boxKey, h *header) *recvReq {
	if box := m.boxes[key]; box != nil && len(box.posted) > 0 {
		m.unwant(key.src, 1)
		return popFront(&box.posted)
	}
	if key.p2p && h.offset == 0 && key.lane == 0 {
		anyKey := key
		anyKey.src = anySource
		if box := m.boxes[anyKey]; box != nil && len(box.posted) > 0 {
			m.unwant(anySource, 1)
			return popFront(&box.posted)
		}
	}
	return nil
}

// heldLimit bounds the bytes of a peer's frames (of any kind) that a rank
// holds unasked-for before it stops reading that peer's collective
// frames, while no receive waits for the peer: the rest stays in the
// socket, and the sender waits, as TCP's flow control makes it. Without a bound, a sender that runs ahead
// (a broadcast's root calling in a loop) filled the receiver's memory
// without end, 1 GB in 6 seconds of 1 MiB broadcasts, and the receiver
// spent 43% of its time in the kernel faulting in and zeroing the fresh
// memory. A collective's frames can wait: the ranks of a communicator
// call its collectives in the same order, so the receiver asks for them
// when it gets there. A receive waiting for the peer lifts the bound, as
// the frame it waits for may come after those held back (another
// communicator's, a tag's). Send/recv frames are always read: a Send
// completes whether or not its Recv was posted, so two ranks may both
// send before they receive.
const heldLimit = 4 << 20

// mayReadAhead says whether a frame with header h from peer p, which no
// receive waits for, may be read now, anyWanted AnySource receives
// waiting.
func mayReadAhead(p peerMatch, anyWanted int, h *header) bool {
	n := int(h.length)
	return h.coll == collSend || p.held == 0 || p.held+n <= heldLimit || p.wanted > 0 || anyWanted > 0
}

// hold and release account for the buffered frames of src.
func (m *matching) hold(src int, f *frame)    { m.peers[src].held += len(f.data) }
func (m *matching) release(src int, f *frame) { m.peers[src].held -= len(f.data) }

// want and unwant count n receives of src (or anySource) into and out
// of its mailboxes.
func (m *matching) want(src, n int) {
	if src == anySource {
		m.anyWanted += n
	} else {
		m.peers[src].wanted += n
	}
}

func (m *matching) unwant(src, n int) { m.want(src, -n) }

// box returns key's mailbox, creating it.
func (m *matching) box(key boxKey) *mailbox {
	b := m.boxes[key]
	if b == nil {
		b = &mailbox{}
		m.boxes[key] = b
	}
	return b
}

// post hands r over: it completes at once from a frame that came
// earlier, or fails at once when its sender is gone, or waits in its
// mailbox. members are the world ranks an AnySource receive listens to.
func (m *matching) post(r *recvReq, key boxKey, members []int) {
	if m.closed {
		r.cause = ErrClosed
		r.complete()
		return
	}
	if key.src == anySource {
		for _, src := range members {
			k := key
			k.src = src
			if b := m.boxes[k]; b != nil && len(b.frames) > 0 && b.frames[0].h.offset == 0 {
				m.fill(r, popFront(&b.frames), src)
				return
			}
		}
	} else {
		if b := m.boxes[key]; b != nil && len(b.frames) > 0 {
			m.fill(r, popFront(&b.frames), key.src)
			return
		}
		if err := m.peers[key.src].ended[key.lane]; err != nil {
			r.cause = err
			r.complete()
			return
		}
	}
	b := m.box(key)
	b.posted = append(b.posted, r)
	r.state = reqPosted
	m.want(key.src, 1)
}

// fill completes r from an unexpected frame f sent by src.
func (m *matching) fill(r *recvReq, f *frame, src int) {
	r.from = src
	m.release(src, f)
	switch {
	case f.h != r.want:
		r.got = f.h
		r.mismatch = true
	case r.borrow:
		r.buf, r.lent = f.data, f
		r.complete()
		return
	default:
		copy(r.buf, f.data)
	}
	m.bufs.put(f)
	r.complete()
}

// cancel withdraws r and returns the state it was in: reqPosted (now
// withdrawn, no token will come), reqFilling (a reader is copying into buf
// right now; the token comes when that read ends) or reqDone (the token
// is waiting to be taken).
func (m *matching) cancel(r *recvReq, key boxKey) reqState {
	state := r.state
	if state == reqPosted {
		if b := m.boxes[key]; b != nil {
			if i := slices.Index(b.posted, r); i >= 0 {
				b.posted = slices.Delete(b.posted, i, i+1)
				m.unwant(key.src, 1)
			}
		}
		r.state = reqIdle
	}
	return state
}

// laneEnd says how the end of a peer's connection (read failing with
// err) reads in the errors of the receives it fails, and whether it ends
// the peer's other lanes too. An end between frames (EOF) ends just the
// lane, as a peer that closes ends its lanes one by one, each after its
// last frame, while the others may still hold frames it sent before;
// anything else breaks the peer's frames, and ends every lane.
func laneEnd(err error) (cause error, everyLane bool) {
	switch {
	case errors.Is(err, io.EOF):
		return errors.New("connection closed (the process exited or closed its communicator)"), false
	case errors.Is(err, io.ErrUnexpectedEOF):
		return errors.New("connection closed in the middle of a frame (the process died)"), true
	}
	return err, true
}

// endLane records that src's connection on lane ended with err (laneEnd)
// and fails the receives waiting on the lanes it ended. It returns the
// cause it recorded.
func (m *matching) endLane(src, lane int, err error) error {
	cause, every := laneEnd(err)
	ended := m.peers[src].ended[lane : lane+1]
	if every {
		ended = m.peers[src].ended[:]
	}
	for i := range ended {
		if ended[i] == nil {
			ended[i] = cause
		}
	}
	for key, b := range m.boxes {
		err := m.peers[src].ended[key.lane]
		if key.src != src || err == nil {
			continue
		}
		for _, r := range b.posted {
			r.cause = err
			r.complete()
		}
		m.unwant(src, len(b.posted))
		b.posted = nil
	}
	return cause
}

// laneEnded reports why src's connection on lane ended, or nil.
func (m *matching) laneEnded(src, lane int) error { return m.peers[src].ended[lane] }

// peerEnded reports why one of src's connections to us ended, or nil.
func (m *matching) peerEnded(src int) error {
	for _, err := range m.peers[src].ended {
		if err != nil {
			return err
		}
	}
	return nil
}

// retire forgets a communicator's mailboxes and recycles their frames;
// frames that come for it later are discarded.
func (m *matching) retire(comm uint64) {
	for key, b := range m.boxes {
		if key.comm != comm {
			continue
		}
		for _, f := range b.frames {
			m.release(key.src, f)
			m.bufs.put(f)
		}
		for _, r := range b.posted {
			r.cause = ErrClosed
			r.complete()
		}
		m.unwant(key.src, len(b.posted))
		delete(m.boxes, key)
	}
	m.retired[comm] = true
}

// The matcher's locked entry points, for ops and readers.

// post hands r to the matching (matching.post).
func (m *matcher) post(r *recvReq, key boxKey, members []int) {
	m.mu.Lock()
	m.matching.post(r, key, members)
	m.mu.Unlock()
}

// cancel withdraws r (matching.cancel).
func (m *matcher) cancel(r *recvReq, key boxKey) reqState {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.matching.cancel(r, key)
}
