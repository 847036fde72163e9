package collective

import (
	"errors"
	"net"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// outConn is our connection to one peer. Its frames go out in order from
// one queue, written without blocking by whoever holds the right to
// write (writing):
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
	raw  syscall.RawConn

	mu      sync.Mutex
	cond    sync.Cond  // signalled when handed frames are queued, writing ends or err is set
	queue   []*sendReq // oldest first; the first may be partly written
	sent    int        // bytes of queue[0]'s frame written
	writing bool       // someone holds the right to write
	handed  bool       // the writer goroutine should write what is queued
	err     error      // set once; queued and later sends fail with it

	iov   []unix.Iovec // scratch of whoever writes, kept to allocate nothing
	batch []*sendReq   // scratch: the frames a write finished

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
	o := &outConn{t: t, peer: peer, conn: c, raw: raw, iov: make([]unix.Iovec, 0, maxIovec)}
	o.cond.L = &o.mu
	o.pushOnce = func(fd uintptr) { o.pushErr = o.push(int(fd)) }
	o.pushUntil = func(fd uintptr) bool {
		o.pushErr = o.push(int(fd))
		return o.pushErr != errWouldBlock // false: wait until writable
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

// drive writes what the socket takes now, unless someone else is
// writing; an op calls it while it waits.
func (o *outConn) drive() {
	o.mu.Lock()
	if o.writing || o.err != nil || len(o.queue) == 0 {
		o.mu.Unlock()
		return
	}
	o.writing = true
	o.mu.Unlock()
	o.release(o.pushNow())
}

// pushNow writes what the socket takes without waiting. The caller holds
// the right to write.
func (o *outConn) pushNow() error {
	if err := o.raw.Control(o.pushOnce); err != nil {
		return err
	}
	if o.pushErr == errWouldBlock {
		return nil
	}
	return o.pushErr
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

// release gives up the right to write; the writer goroutine takes over
// if frames were handed to it meanwhile.
func (o *outConn) release(err error) {
	o.mu.Lock()
	o.writing = false
	if o.err != nil || o.handed && len(o.queue) > 0 {
		o.cond.Signal()
	}
	o.mu.Unlock()
	if err != nil {
		o.t.lostOutgoing(o.peer, err)
	}
}

// pushAll writes queued frames until the queue is empty, waiting in the
// runtime's poller while the socket is full. The caller holds the right
// to write.
func (o *outConn) pushAll() error {
	if err := o.raw.Write(o.pushUntil); err != nil {
		return err
	}
	return o.pushErr
}

// push writes queued frames until the queue is empty or the socket full
// (errWouldBlock). The caller holds the right to write.
func (o *outConn) push(fd int) error {
	for {
		o.mu.Lock()
		o.skipCanceled()
		iov := o.vectors()
		o.mu.Unlock()
		if len(iov) == 0 {
			return nil
		}
		n, errno := writevNonblocking(fd, iov)
		clear(o.iov[:cap(o.iov)]) // drop references to callers' buffers
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
		o.advance(int(n))
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
func (o *outConn) vectors() []unix.Iovec {
	iov := o.iov[:0]
	skip := o.sent
	for _, r := range o.queue {
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
	o.iov = iov
	return iov
}

// advance accounts for n bytes written, finishing the frames they
// completed.
func (o *outConn) advance(n int) {
	o.mu.Lock()
	done := o.batch[:0]
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
	o.batch = done
}

// write is the writer goroutine: it writes the frames handed to it,
// waiting in the runtime's poller while the socket is full, until fail.
func (o *outConn) write() {
	defer o.t.wg.Done()
	for {
		o.mu.Lock()
		for (!o.handed || len(o.queue) == 0 || o.writing) && o.err == nil {
			o.cond.Wait()
		}
		if err := o.err; err != nil {
			// Frames written whole are the writer's to finish as sent,
			// even when the peer has read them and gone since.
			for o.writing {
				o.cond.Wait()
			}
			rest := o.queue
			o.queue = nil
			o.mu.Unlock()
			for _, r := range rest {
				r.finish(err)
			}
			return
		}
		o.writing = true
		o.mu.Unlock()
		o.release(o.pushAll())
	}
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
