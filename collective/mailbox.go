package collective

import (
	"math/bits"
	"sync"
	"sync/atomic"
)

// Frames are demultiplexed into mailboxes, one per (communicator, sender,
// lane, channel): the collectives of a communicator share one channel (their
// sequence numbers keep them apart), each send/recv tag has its own. A
// mailbox holds either frames nobody asked for yet or receives posted
// before their frame came, never both: a frame meeting a posted receive
// is read straight from the socket into the receiver's buffer.

// anySource is the sender of a mailbox holding AnySource receives.
const anySource = -1

type boxKey struct {
	comm uint64
	src  int // world rank, or anySource
	lane int // the connection from src it comes on (transport.lane)
	p2p  bool
	tag  int32
}

// boxKey is the mailbox of a data frame with header h from world rank src
// on lane.
func (h *header) boxKey(src, lane int) boxKey {
	return boxKey{comm: h.comm, src: src, lane: lane, p2p: h.coll == collSend, tag: h.tag}
}

type mailbox struct {
	frames []*frame   // unexpected, oldest first
	posted []*recvReq // waiting, oldest first
}

// frame is an unexpected data frame, its payload in a pooled buffer.
type frame struct {
	h     header
	data  []byte
	class int // pool size class; -1 when not pooled
}

type reqState uint8

const (
	reqIdle    reqState = iota
	reqPosted           // in a mailbox, waiting for its frame
	reqFilling          // a reader is copying the payload into buf
	reqDone             // filled, failed or cancelled; done signalled
)

// recvReq is one posted receive: a frame with exactly header want from src
// (a world rank, or anySource) into buf. state, from, got, cause and
// mismatch are guarded by the matcher's mutex until done is signalled.
type recvReq struct {
	want header
	src  int
	lane int // the connection from src its frame comes on
	peer int // comm rank of src, for errors
	buf  []byte

	// borrow: buf is scratch the op only reads, so a frame that came
	// before r was posted may lend r its buffer instead of being copied
	// (matching.fill); lent is that frame, back to the pool with r.
	borrow bool
	lent   *frame

	state    reqState
	from     int    // world rank that sent it
	got      header // what came, when it was not want
	mismatch bool
	cause    error // why no frame can come (the peer's connection ended)

	done     chan struct{} // one token when state becomes reqDone
	consumed bool          // the op has taken the token (op-local)
}

// complete marks r done and wakes its op. Called with the matcher's
// mutex held, or by the reader that owns a filling r.
func (r *recvReq) complete() {
	r.state = reqDone
	r.done <- struct{}{}
}

// sendReq is one frame queued on an outgoing connection.
type sendReq struct {
	hdr     [headerSize]byte
	payload []byte
	peer    int      // comm rank, for errors
	conn    *outConn // where it is queued

	canceled atomic.Bool // set by an op that gave up; the writer skips it
	err      error       // set before done is signalled
	done     chan struct{}
	consumed bool
}

func (r *sendReq) finish(err error) {
	r.err = err
	r.done <- struct{}{}
}

// reqPool recycles receive and send requests and their channels, so that
// steady-state collectives allocate nothing per frame.
type reqPool struct {
	recvs freeList[recvReq]
	sends freeList[sendReq]
}

func (p *reqPool) recv() *recvReq {
	if r := p.recvs.get(); r != nil {
		return r
	}
	return &recvReq{done: make(chan struct{}, 1)}
}

func (p *reqPool) putRecv(r *recvReq) {
	*r = recvReq{done: r.done}
	p.recvs.put(r)
}

func (p *reqPool) send() *sendReq {
	if r := p.sends.get(); r != nil {
		return r
	}
	return &sendReq{done: make(chan struct{}, 1)}
}

func (p *reqPool) putSend(r *sendReq) {
	r.payload, r.conn = nil, nil
	r.err = nil
	r.consumed = false
	r.canceled.Store(false)
	p.sends.put(r)
}

// bufferPool recycles the payload buffers of unexpected frames in
// power-of-two size classes.
type bufferPool struct {
	classes [bits.UintSize]freeList[frame]
}

const minPooledClass = 10 // 1 KiB

func (p *bufferPool) get(h *header) *frame {
	n := int(h.length)
	class := max(bits.Len(uint(max(n, 1)-1)), minPooledClass)
	if f := p.classes[class].get(); f != nil {
		f.h = *h
		f.data = f.data[:n]
		return f
	}
	return &frame{h: *h, data: make([]byte, n, 1<<class), class: class}
}

func (p *bufferPool) put(f *frame) {
	if f.class >= 0 {
		p.classes[f.class].put(f)
	}
}

// freeList keeps values for reuse. Unlike a sync.Pool it keeps them
// across garbage collections, and it hands them between goroutines
// without allocating: a sync.Pool emptied by a collection had the next
// calls allocate their frames afresh (a 3 MiB all_gather of 4 ranks over
// TCP kept allocating about once in three calls, each allocation bringing
// the next collection nearer), and frames put on one P and taken on another grew and shrank
// its per-P chains, allocating too. A list holds at most as many values
// as were ever out at once: for frames, what peers sent ahead of their
// receives, which one call's data bounds.
type freeList[T any] struct {
	mu   sync.Mutex
	free []*T
}

// get returns a kept value, or nil when there is none.
func (l *freeList[T]) get() *T {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := len(l.free)
	if k == 0 {
		return nil
	}
	v := l.free[k-1]
	l.free[k-1] = nil
	l.free = l.free[:k-1]
	return v
}

func (l *freeList[T]) put(v *T) {
	l.mu.Lock()
	l.free = append(l.free, v)
	l.mu.Unlock()
}

// popFront removes and returns the first of q, shifting the rest down
// rather than reslicing, so that the queue keeps its capacity and appends
// allocate nothing once warm (the mailboxes and a connection's frames
// hold a few segments' worth).
func popFront[T any](q *[]T) T {
	s := *q
	v := s[0]
	n := copy(s, s[1:])
	var zero T
	s[n] = zero // let the collector have what it points to
	*q = s[:n]
	return v
}
