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

	"github.com/gorun/gorun/internal/rawio"
)

// inConn is the receiving end of one peer's connection: a parser that
// reads whatever the socket holds without blocking and routes each frame
// as it completes. Whoever holds its read token (turn) reads it, one at a
// time:
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
	fd   int // the non-blocking socket; read, armed and closed only by the token's holder

	// turn is the read token: taking it (tryTake, take) is the right to
	// read the socket and to touch the parser, the reader; give hands
	// both back. An op takes it only when it is free, and the poller,
	// finding it taken, leaves the connection to the holder
	// (poller.service).
	turn readTurn

	spinners atomic.Int32 // ops spinning on the connection (op.poll)
	idle     atomic.Bool  // the poller left it unarmed (poller.service)
}

// reader is the parser of one connection's frames, and the state of its
// socket: only the holder of the connection's read token has it.
type reader struct {
	ic     *inConn
	closed bool // ic.fd is closed (once the connection failed)
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
}

// readTurn is a connection's read token, holding its reader. A mutex
// underneath rather than a channel: a channel hands a token given back
// straight to a taker parked on it (the poller, or an op re-arming the
// connection), and a spinning op must then wait for that goroutine to
// be scheduled; 4 ranks' 8-byte all_reduce over TCP took 150-180 us a
// call instead of 10-20 in 4 runs of 10 (2 cores, loaded). A mutex spins
// before it parks and lets the spinning op take it first.
type readTurn struct {
	mu sync.Mutex
	rd *reader
}

// tryTake takes the read token if nobody holds it, else returns nil.
func (ic *inConn) tryTake() *reader {
	if ic.turn.mu.TryLock() {
		return ic.turn.rd
	}
	return nil
}

// take waits for the read token.
func (ic *inConn) take() *reader {
	ic.turn.mu.Lock()
	return ic.turn.rd
}

// give hands the read token back.
func (rd *reader) give() { rd.ic.turn.mu.Unlock() }

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
	ic := &inConn{t: t, src: src, lane: lane, fd: fd}
	ic.turn.rd = &reader{ic: ic, buf: make([]byte, size)}
	return ic, nil
}

// poll reads what has come, unless someone else holds the read token;
// an op calls it while it spins for a frame, having just found the
// socket readable or not (socketSet.readable). It reports false once the
// connection has failed, and reports why to the transport itself.
func (ic *inConn) poll(readable bool) bool {
	rd := ic.tryTake()
	if rd == nil {
		return true
	}
	err := errWouldBlock
	switch {
	case rd.closed:
		err = net.ErrClosed
	case readable || rd.heldBack():
		err = rd.pump()
	}
	if err != errWouldBlock && err != errHeldBack {
		// Report it now: the socket may stay silent, and the poller
		// would never look at it again.
		rd.retire(err)
		return false
	}
	rd.give()
	return true
}

// retire closes the connection, which failed with err, and reports that
// to the transport unless it was closed already; it gives the token back.
func (rd *reader) retire(err error) {
	closedNow := rd.ic.t.poller.drop(rd)
	rd.give()
	if closedNow {
		rd.ic.t.lostIncoming(rd.ic.src, rd.ic.lane, err)
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
	rd := ic.take()
	if !rd.closed {
		unix.Shutdown(ic.fd, unix.SHUT_RDWR)
	}
	rd.give()
	ic.t.poller.wake(ic)
}

// pump reads and routes frames until the socket is empty (errWouldBlock),
// the next frame is held back (errHeldBack) or the connection fails.
func (rd *reader) pump() error {
	for rd.err == nil {
		if !rd.inBody {
			if rd.w-rd.r >= headerSize {
				if err := rd.begin(); err == errHeldBack {
					return err
				} else if err != nil {
					rd.err = err
				}
				continue
			}
			if err := rd.fill(); err != nil {
				return err
			}
			continue
		}
		need := rd.need()
		if need == 0 {
			rd.end()
			continue
		}
		if rd.w > rd.r {
			rd.consume(min(need, rd.w-rd.r))
			continue
		}
		// The buffer is empty: a large remainder goes straight from the
		// socket to its destination.
		if rd.dst != nil && need >= len(rd.buf)/4 {
			n, err := rd.read(rd.dst[rd.got:])
			if err != nil {
				return err
			}
			rd.got += n
			rd.direct = true
			continue
		}
		if err := rd.fill(); err != nil {
			return err
		}
	}
	return rd.err
}

// heldBack reports whether the next frame's header is read but the
// frame is held back (begin): the socket may be empty, and only pump
// finds out when the frame may come.
func (rd *reader) heldBack() bool { return !rd.inBody && rd.w-rd.r >= headerSize }

// fill reads into the buffer's free end, moving what is unread to its
// start first; after a payload read straight into place (direct), only
// up to the next header. With 256 KiB segments on one lane, reading the
// buffer full had an eighth of every payload copied twice.
func (rd *reader) fill() error {
	if rd.r > 0 {
		rd.w = copy(rd.buf, rd.buf[rd.r:rd.w])
		rd.r = 0
	}
	end := len(rd.buf)
	if rd.direct && !rd.inBody && rd.w < headerSize {
		end = headerSize
	}
	n, err := rd.read(rd.buf[rd.w:end])
	rd.w += n
	return err
}

// read is one non-blocking read. A failure is kept, and fails the frame
// being filled, so that whoever reads next sees it.
func (rd *reader) read(p []byte) (int, error) {
	for {
		n, err := rawio.Read(rd.ic.fd, p)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return 0, errWouldBlock
		case err != nil:
			rd.fail(err)
		case n == 0:
			if rd.inBody || rd.w > rd.r {
				rd.fail(io.ErrUnexpectedEOF)
			} else {
				rd.fail(io.EOF)
			}
		default:
			rd.ic.t.moved.Add(1)
			return n, nil
		}
		return 0, rd.err
	}
}

func (rd *reader) fail(err error) {
	rd.err = err
	r, f := rd.req, rd.frame
	if r == nil && f == nil {
		return
	}
	rd.req, rd.frame = nil, nil
	m := rd.ic.t.match
	m.mu.Lock()
	m.broke(rd.ic.src, r, f, fmt.Errorf("connection lost in the middle of a frame: %w", err))
	m.mu.Unlock()
	if f != nil {
		rd.ic.t.bufs.put(f)
	}
}

// need is how many payload bytes the current frame still wants.
func (rd *reader) need() int {
	if rd.dst == nil {
		return rd.skip
	}
	return len(rd.dst) - rd.got
}

// consume moves n buffered bytes into the current frame.
func (rd *reader) consume(n int) {
	if rd.dst == nil {
		rd.skip -= n
	} else {
		copy(rd.dst[rd.got:], rd.buf[rd.r:rd.r+n])
		rd.got += n
	}
	rd.r += n
}

// begin decodes the buffered header and decides where its payload goes:
// into the receive posted for it, into a pooled buffer until one is
// posted, or nowhere; or leaves the frame unread (errHeldBack).
func (rd *reader) begin() error {
	h := &rd.hdr
	if err := h.decode(rd.buf[rd.r : rd.r+headerSize]); err != nil {
		return err
	}
	rd.r += headerSize
	rd.inBody, rd.got, rd.dst, rd.skip, rd.direct = true, 0, nil, 0, false
	switch h.kind {
	case kindData:
	case kindAbort, kindQuery, kindStatus:
		rd.dst = make([]byte, h.length)
		return nil
	default:
		return fmt.Errorf("collective: unexpected frame kind %d", h.kind)
	}
	m := rd.ic.t.match
	m.mu.Lock()
	verdict, r, f := m.arrive(h.boxKey(rd.ic.src, rd.ic.lane), h)
	m.mu.Unlock()
	switch verdict {
	case arriveDiscard, arriveMismatch:
		rd.skip = int(h.length)
	case arriveFill:
		rd.req, rd.dst = r, r.buf
	case arriveHold:
		rd.frame, rd.dst = f, f.data
	case arriveHoldBack:
		rd.r -= headerSize
		rd.inBody = false
		return errHeldBack
	}
	return nil
}

// end routes the frame whose payload has all come.
func (rd *reader) end() {
	rd.inBody = false
	h := rd.hdr
	m := rd.ic.t.match
	switch r, f := rd.req, rd.frame; {
	case r != nil:
		rd.req = nil
		m.mu.Lock()
		r.complete()
		m.mu.Unlock()
	case f != nil:
		rd.frame = nil
		m.mu.Lock()
		m.deliver(h.boxKey(rd.ic.src, rd.ic.lane), f) // a receive may have been posted while we read
		m.mu.Unlock()
	case h.kind != kindData:
		rd.ic.t.control(rd.ic.src, &h, rd.dst)
	}
	rd.dst = nil
}
