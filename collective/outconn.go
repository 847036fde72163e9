package collective

import (
	"errors"
	"net"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// outConn is our connection to one peer. Its frames go out in order from
// one queue, written without blocking by whoever holds its write token
// (writer):
//
//   - the sender itself, for a small frame with nothing ahead of it
//     (enqueue), since handing it over would cost more than the write;
//   - the op whose frames are queued, while it spins for its receives or
//     waits for its sends (op.drive): with as many ranks as cores, a
//     writer thread per process would take turns on the cores with the
//     ops, where one thread that writes and reads as the sockets allow
//     keeps each core's copy going;
//   - the writer goroutine, once a frame is handed to it (handoff): by
//     an op about to park, and for control frames, which nobody drives.
type outConn struct {
	t    *transport
	peer int // world rank
	conn net.Conn

	mu     sync.Mutex
	cond   sync.Cond  // signalled when handed frames are queued, the token comes back or err is set
	queue  []*sendReq // oldest first; the first may be partly written
	sent   int        // bytes of queue[0]'s frame written
	taken  bool       // the write token is out (w is in use)
	handed bool       // the writer goroutine should write what is queued
	err    error      // set once; queued and later sends fail with it

	w writer // reached only by taking the token: tryTakeWriter, awaitHanded
}

// writer is an outConn's write token: the socket and the writing scratch,
// held by one writer at a time. Whoever holds it may write the queue's
// head; everybody may append to the queue under mu.
type writer struct {
	o   *outConn
	raw syscall.RawConn

	iov   []unix.Iovec // kept to allocate nothing
	batch []*sendReq   // the frames a write finished

	// The callbacks for raw, made once (a closure made per call would be
	// allocated), and what the last one pushed.
	pushOnce  func(fd uintptr)
	pushUntil func(fd uintptr) bool
	pushErr   error
}

// maxIovec bounds the frames of one writev (two vectors each).
const maxIovec = 64

func newOutConn(t *transport, peer int, c net.Conn) (*outConn, error) {
	raw, err := rawConn(c)
	if err != nil {
		return nil, err
	}
	o := &outConn{t: t, peer: peer, conn: c}
	o.cond.L = &o.mu
	w := &o.w
	*w = writer{o: o, raw: raw, iov: make([]unix.Iovec, 0, maxIovec)}
	w.pushOnce = func(fd uintptr) { w.pushErr = w.push(int(fd)) }
	w.pushUntil = func(fd uintptr) bool {
		w.pushErr = w.push(int(fd))
		return w.pushErr != errWouldBlock // false: wait until writable
	}
	return o, nil
}

// enqueue queues r's frame; r finishes when it is written or cannot be.
// A small frame with nothing ahead of it is written at once, as far as
// the socket takes it. The rest of a driven frame is left for its op to
// write (drive); any other is handed to the writer goroutine.
func (o *outConn) enqueue(r *sendReq, driven bool) {
	o.mu.Lock()
	if err := o.err; err != nil {
		o.mu.Unlock()
		r.finish(err)
		return
	}
	o.queue = append(o.queue, r)
	if !driven {
		o.handed = true
		o.cond.Signal()
	}
	inline := len(o.queue) == 1 && len(r.payload) <= inlineWriteMax
	o.mu.Unlock()
	if inline {
		o.drive()
	}
}

// drive writes what the socket takes now, unless someone else holds the
// write token; an op calls it while it waits.
func (o *outConn) drive() {
	if w := o.tryTakeWriter(); w != nil {
		w.give(w.pushNow())
	}
}

// tryTakeWriter takes the write token if nobody holds it and there is
// something to write, else returns nil.
func (o *outConn) tryTakeWriter() *writer {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.taken || o.err != nil || len(o.queue) == 0 {
		return nil
	}
	o.taken = true
	return &o.w
}

// pushNow writes what the socket takes without waiting.
func (w *writer) pushNow() error {
	if err := w.raw.Control(w.pushOnce); err != nil {
		return err
	}
	if w.pushErr == errWouldBlock {
		return nil
	}
	return w.pushErr
}

// handoff has the writer goroutine write what is queued: the op that
// would have is about to block.
func (o *outConn) handoff() {
	o.mu.Lock()
	if len(o.queue) > 0 && !o.handed {
		o.handed = true
		o.cond.Signal()
	}
	o.mu.Unlock()
}

// give hands the write token back, with what its last write met; the
// writer goroutine takes over if frames were handed to it meanwhile.
func (w *writer) give(err error) {
	o := w.o
	o.mu.Lock()
	o.taken = false
	if o.err != nil || o.handed && len(o.queue) > 0 {
		o.cond.Signal()
	}
	o.mu.Unlock()
	if err != nil {
		o.t.lostOutgoing(o.peer, err)
	}
}

// pushAll writes queued frames until the queue is empty, waiting in the
// runtime's poller while the socket is full.
func (w *writer) pushAll() error {
	if err := w.raw.Write(w.pushUntil); err != nil {
		return err
	}
	return w.pushErr
}

// push writes queued frames until the queue is empty or the socket full
// (errWouldBlock).
func (w *writer) push(fd int) error {
	o := w.o
	for {
		o.mu.Lock()
		o.skipCanceled()
		iov := w.vectors()
		o.mu.Unlock()
		if len(iov) == 0 {
			return nil
		}
		n, errno := writevNonblocking(fd, iov)
		clear(w.iov[:cap(w.iov)]) // drop references to callers' buffers
		switch errno {
		case 0:
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return errWouldBlock
		default:
			return errno
		}
		o.t.moved.Add(1)
		w.advance(int(n))
	}
}

// skipCanceled finishes the frames at the head that ops gave up on and
// that have not begun to go out. mu is held.
func (o *outConn) skipCanceled() {
	for o.sent == 0 && len(o.queue) > 0 && o.queue[0].canceled.Load() {
		popFront(&o.queue).finish(nil)
	}
}

// vectors lists the unwritten bytes of the queued frames. mu is held.
func (w *writer) vectors() []unix.Iovec {
	iov := w.iov[:0]
	skip := w.o.sent
	for _, r := range w.o.queue {
		if len(iov)+2 > maxIovec {
			break
		}
		for _, b := range [2][]byte{r.hdr[:], r.payload} {
			if skip >= len(b) {
				skip -= len(b)
				continue
			}
			b = b[skip:]
			skip = 0
			v := unix.Iovec{Base: &b[0]}
			v.SetLen(len(b))
			iov = append(iov, v)
		}
	}
	w.iov = iov
	return iov
}

// advance accounts for n bytes written, finishing the frames they
// completed.
func (w *writer) advance(n int) {
	o := w.o
	o.mu.Lock()
	done := w.batch[:0]
	n += o.sent
	for len(o.queue) > 0 {
		size := headerSize + len(o.queue[0].payload)
		if n < size {
			break
		}
		n -= size
		done = append(done, popFront(&o.queue))
	}
	o.sent = n
	if len(o.queue) == 0 {
		o.handed = false
	}
	o.mu.Unlock()
	for _, r := range done {
		r.finish(nil)
	}
	clear(done)
	w.batch = done
}

// write is the writer goroutine: it writes the frames handed to it,
// waiting in the runtime's poller while the socket is full, until fail.
func (o *outConn) write() {
	defer o.t.wg.Done()
	for {
		w, unsent, err := o.awaitHanded()
		if err != nil {
			for _, r := range unsent {
				r.finish(err)
			}
			return
		}
		w.give(w.pushAll())
	}
}

// awaitHanded waits until frames are handed to the writer goroutine and
// the write token is free, and takes it. Once the connection failed it
// waits for the token to come back instead, and returns the frames still
// queued: frames written whole are the writer's to finish as sent, even
// when the peer has read them and gone since.
func (o *outConn) awaitHanded() (*writer, []*sendReq, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for (!o.handed || len(o.queue) == 0 || o.taken) && o.err == nil {
		o.cond.Wait()
	}
	if o.err != nil {
		for o.taken {
			o.cond.Wait()
		}
		unsent := o.queue
		o.queue = nil
		return nil, unsent, o.err
	}
	o.taken = true
	return &o.w, nil, nil
}

// watch waits for the peer to end the connection. The peer never writes
// on it, so a read returns only when it closed or died (EOF, reset), and
// sends fail then instead of filling the socket buffer first.
func (o *outConn) watch() {
	defer o.t.wg.Done()
	var b [1]byte
	_, err := o.conn.Read(b[:])
	if err == nil {
		err = errors.New("collective: peer wrote on a send-only connection")
	}
	o.t.lostOutgoing(o.peer, err)
}

// fail stops the connection: queued and later sends finish with err.
func (o *outConn) fail(err error) {
	o.mu.Lock()
	if o.err == nil {
		o.err = err
	}
	o.mu.Unlock()
	o.cond.Broadcast()
	o.conn.Close()
}
