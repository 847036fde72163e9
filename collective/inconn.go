package collective

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// inConn is the receiving end of one peer's connection: a parser that
// reads whatever the socket holds without blocking and routes each frame
// as it completes. Two kinds of caller drive it, one at a time (mu):
//
//   - an op waiting for a frame from this peer (op.poll), which reads
//     the socket itself while it spins, so the frame lands in the op's
//     buffer with no thread to wake in between;
//   - the transport's poller (poller.go), when no op spins on it.
//
// The socket is ours alone, outside the Go runtime's poller: registered
// there, every frame's arrival would wake a runtime thread (one blocked
// in epoll_wait for idle Ps) only to find the op had read it already, a
// context switch per message on the cores the ops need, which cost as
// much as the message itself.
type inConn struct {
	t    *transport
	src  int // world rank of the sender
	lane int // which of its connections to us this is

	mu     sync.Mutex
	fd     int  // a non-blocking socket, read only with mu held
	closed bool // fd is closed (by the poller, once the connection failed)
	buf    []byte
	r      int // buf[r:w] is read but not parsed
	w      int
	err    error // sticky: why the connection can be read no further

	// The frame being read: its header, and where its payload goes.
	hdr    header
	inBody bool
	// direct says the last payload was read straight into its
	// destination: the next frame is likely another segment of the same
	// large message, so its header is read alone (fill), and its payload
	// straight into place too rather than partly through buf.
	direct bool
	dst    []byte   // the payload's destination; nil to discard
	skip   int      // payload bytes left to discard when dst is nil
	got    int      // payload bytes in dst so far
	req    *recvReq // the posted receive being filled, or nil
	frame  *frame   // the pooled buffer of an unexpected frame, or nil

	missed   atomic.Bool  // the poller found mu held: its holder reads again
	spinners atomic.Int32 // ops spinning on the connection (op.poll)
	idle     atomic.Bool  // the poller left it unarmed (poller.service)
}

// socketSet is the sockets a spinning op reads, at most maxStreams, for
// one system call to say which have something (readable): bit i of its
// answer for the i-th added. A socket may have been closed since, and its
// number reused; the reads that follow check, so a wrong answer costs
// only a look.
type socketSet struct {
	fds [maxStreams]unix.PollFd
	n   int
}

func (s *socketSet) add(fd int) {
	s.fds[s.n] = unix.PollFd{Fd: int32(fd), Events: unix.POLLIN}
	s.n++
}

// ready collects the answer of a poll that found n sockets ready.
func (s *socketSet) ready(n int) uint32 {
	var bits uint32
	for i := range s.fds[:s.n] {
		if n > 0 && s.fds[i].Revents != 0 {
			bits |= 1 << i
		}
	}
	return bits
}

// errWouldBlock says the socket is empty for now.
var errWouldBlock = errors.New("collective: no data yet")

// errHeldBack says the next frame waits in the socket until a receive
// asks for it (mayReadAhead).
var errHeldBack = errors.New("collective: read ahead as far as allowed")

// newInConn takes over c's socket: it duplicates the descriptor and
// closes c, which takes it out of the runtime's poller (no FIN goes:
// the duplicate keeps the socket open).
func newInConn(t *transport, src, lane int, c net.Conn) (*inConn, error) {
	raw, err := rawConn(c)
	if err != nil {
		return nil, err
	}
	fd := -1
	cerr := raw.Control(func(s uintptr) {
		fd, err = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0)
	})
	if err = cmp.Or(cerr, err); err != nil {
		return nil, fmt.Errorf("collective: duplicate socket: %w", err)
	}
	c.Close()
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, err
	}
	size := readBufferSize
	if lane > 0 {
		size = laneBufferSize
	}
	return &inConn{t: t, src: src, lane: lane, fd: fd, buf: make([]byte, size)}, nil
}

// poll reads what has come, unless someone else is reading; an op calls
// it while it spins for a frame, having just found the socket readable
// or not (socketSet.readable). It reports false once the connection has
// failed, and reports why to the transport itself.
func (ic *inConn) poll(readable bool) bool {
	for {
		if !ic.mu.TryLock() {
			return true
		}
		err := errWouldBlock
		switch {
		case ic.closed:
			err = net.ErrClosed
		case readable || ic.heldBack():
			err = ic.pump()
		}
		if err != errWouldBlock && err != errHeldBack {
			// Report it now: the socket may stay silent, and the poller
			// would never look at it again.
			ic.retire(err)
			return false
		}
		ic.mu.Unlock()
		if !ic.missed.Swap(false) {
			return true
		}
	}
}

// retire closes the connection, which failed with err, and reports that
// to the transport unless it was closed already; it releases mu.
func (ic *inConn) retire(err error) {
	closedNow := ic.t.poller.drop(ic)
	ic.mu.Unlock()
	if closedNow {
		ic.t.lostIncoming(ic.src, ic.lane, err)
	}
}

// spin and unspin bracket an op's spinning on the connection. The last
// spinner to leave re-arms the connection in the poller when ops are
// parked, since one of them may wait for its next frame.
func (ic *inConn) spin() { ic.spinners.Add(1) }

func (ic *inConn) unspin() {
	if ic.spinners.Add(-1) == 0 && ic.t.parked.Load() > 0 {
		ic.t.poller.wake(ic)
	}
}

// cut shuts the socket down, so that its peer and the poller see the end;
// used when a frame is stuck half-read into a buffer whose op gave up.
func (ic *inConn) cut() {
	ic.mu.Lock()
	if !ic.closed {
		unix.Shutdown(ic.fd, unix.SHUT_RDWR)
	}
	ic.mu.Unlock()
	ic.t.poller.wake(ic)
}

// pump reads and routes frames until the socket is empty (errWouldBlock),
// the next frame is held back (errHeldBack) or the connection fails.
// Called with mu held.
func (ic *inConn) pump() error {
	for ic.err == nil {
		if !ic.inBody {
			if ic.w-ic.r >= headerSize {
				if err := ic.begin(); err == errHeldBack {
					return err
				} else if err != nil {
					ic.err = err
				}
				continue
			}
			if err := ic.fill(); err != nil {
				return err
			}
			continue
		}
		need := ic.need()
		if need == 0 {
			ic.end()
			continue
		}
		if ic.w > ic.r {
			ic.take(min(need, ic.w-ic.r))
			continue
		}
		// The buffer is empty: a large remainder goes straight from the
		// socket to its destination.
		if ic.dst != nil && need >= len(ic.buf)/4 {
			n, err := ic.read(ic.dst[ic.got:])
			if err != nil {
				return err
			}
			ic.got += n
			ic.direct = true
			continue
		}
		if err := ic.fill(); err != nil {
			return err
		}
	}
	return ic.err
}

// heldBack reports whether the next frame's header is read but the
// frame is held back (begin): the socket may be empty, and only pump
// finds out when the frame may come. Called with mu held.
func (ic *inConn) heldBack() bool { return !ic.inBody && ic.w-ic.r >= headerSize }

// fill reads into the buffer's free end, moving what is unread to its
// start first; after a payload read straight into place (direct), only
// up to the next header. With 256 KiB segments on one lane, reading the
// buffer full had an eighth of every payload copied twice.
func (ic *inConn) fill() error {
	if ic.r > 0 {
		ic.w = copy(ic.buf, ic.buf[ic.r:ic.w])
		ic.r = 0
	}
	end := len(ic.buf)
	if ic.direct && !ic.inBody && ic.w < headerSize {
		end = headerSize
	}
	n, err := ic.read(ic.buf[ic.w:end])
	ic.w += n
	return err
}

// read is one non-blocking read. A failure is kept, and fails the frame
// being filled, so that whoever reads next sees it.
func (ic *inConn) read(p []byte) (int, error) {
	for {
		n, err := readNonblocking(ic.fd, p)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return 0, errWouldBlock
		case err != nil:
			ic.fail(err)
		case n == 0:
			if ic.inBody || ic.w > ic.r {
				ic.fail(io.ErrUnexpectedEOF)
			} else {
				ic.fail(io.EOF)
			}
		default:
			ic.t.moved.Add(1)
			return n, nil
		}
		return 0, ic.err
	}
}

func (ic *inConn) fail(err error) {
	ic.err = err
	r, f := ic.req, ic.frame
	if r == nil && f == nil {
		return
	}
	ic.req, ic.frame = nil, nil
	m := ic.t.match
	m.mu.Lock()
	m.broke(ic.src, r, f, fmt.Errorf("connection lost in the middle of a frame: %w", err))
	m.mu.Unlock()
	if f != nil {
		ic.t.bufs.put(f)
	}
}

// need is how many payload bytes the current frame still wants.
func (ic *inConn) need() int {
	if ic.dst == nil {
		return ic.skip
	}
	return len(ic.dst) - ic.got
}

// take moves n buffered bytes into the current frame.
func (ic *inConn) take(n int) {
	if ic.dst == nil {
		ic.skip -= n
	} else {
		copy(ic.dst[ic.got:], ic.buf[ic.r:ic.r+n])
		ic.got += n
	}
	ic.r += n
}

// begin decodes the buffered header and decides where its payload goes:
// into the receive posted for it, into a pooled buffer until one is
// posted, or nowhere; or leaves the frame unread (errHeldBack).
func (ic *inConn) begin() error {
	h := &ic.hdr
	if err := h.decode(ic.buf[ic.r : ic.r+headerSize]); err != nil {
		return err
	}
	ic.r += headerSize
	ic.inBody, ic.got, ic.dst, ic.skip, ic.direct = true, 0, nil, 0, false
	switch h.kind {
	case kindData:
	case kindAbort, kindQuery, kindStatus:
		ic.dst = make([]byte, h.length)
		return nil
	default:
		return fmt.Errorf("collective: unexpected frame kind %d", h.kind)
	}
	m := ic.t.match
	m.mu.Lock()
	verdict, r, f := m.arrive(h.boxKey(ic.src, ic.lane), h)
	m.mu.Unlock()
	switch verdict {
	case arriveDiscard, arriveMismatch:
		ic.skip = int(h.length)
	case arriveFill:
		ic.req, ic.dst = r, r.buf
	case arriveHold:
		ic.frame, ic.dst = f, f.data
	case arriveHoldBack:
		ic.r -= headerSize
		ic.inBody = false
		return errHeldBack
	}
	return nil
}

// end routes the frame whose payload has all come.
func (ic *inConn) end() {
	ic.inBody = false
	h := ic.hdr
	m := ic.t.match
	switch r, f := ic.req, ic.frame; {
	case r != nil:
		ic.req = nil
		m.mu.Lock()
		r.complete()
		m.mu.Unlock()
	case f != nil:
		ic.frame = nil
		m.mu.Lock()
		m.deliver(h.boxKey(ic.src, ic.lane), f) // a receive may have been posted while we read
		m.mu.Unlock()
	case h.kind != kindData:
		ic.t.control(ic.src, &h, ic.dst)
	}
	ic.dst = nil
}
