//go:build linux

package rendezvous

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/internal/rawio"
)

// eventLoop serves the connections idle between requests without a
// goroutine each. They sit, parked, in one epoll set; when one becomes
// readable the loop reads what came, and if it is whole requests it
// handles them and writes the replies at once, without blocking, and parks
// the connection again. Anything else (a partial frame, a reply the socket
// cannot take, an error) goes back to the connection's goroutine path
// (conn.serve) with the bytes already read.
//
// At the scale of a job's init (thousands of ranks, each a few small
// requests), a goroutine per exchange cost more in scheduler hand-offs
// and fresh stacks than the requests themselves; the loop pays one read
// and one write per batch, as a C event loop does.
//
// The epoll set's own descriptor waits in Go's poller, so the loop holds
// no thread while nothing happens, and Shutdown wakes it with a deadline.
// One goroutine runs the loop (run); it alone reads from a parked
// connection's socket. The parked map says who owns a connection: the
// loop takes it out when it serves it, a goroutine puts it in to park it,
// and Shutdown and a close from elsewhere take it out to end it.
type eventLoop struct {
	srv *Server
	ep  *os.File // the epoll set
	rc  syscall.RawConn

	mu      sync.Mutex
	parked  map[uint64]*conn // by conn.loopID
	nextID  uint64
	stopped bool

	// What the loop did, for tests and profiles: batches it handled
	// itself, and connections it handed to goroutines.
	inline, handedOff atomic.Int64

	// The loop goroutine's own.
	events []unix.EpollEvent
	in     *bufio.Reader // what one read from a connection brought
	fr     frameReader
}

// loopReadSize is the most the loop reads from a connection at once:
// many small requests. A batch that fills it goes to the goroutine path.
const loopReadSize = 64 << 10

// newEventLoop returns a running loop for s, or nil where epoll is not
// available (the goroutine path then serves every connection).
func newEventLoop(s *Server) *eventLoop {
	fd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil
	}
	// Nonblocking, so that os.NewFile puts it in Go's poller.
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil
	}
	ep := os.NewFile(uintptr(fd), "rendezvous-epoll")
	rc, err := ep.SyscallConn()
	if err != nil || ep.SetReadDeadline(time.Time{}) != nil {
		ep.Close() // not pollable: the loop could not wait in Go's poller
		return nil
	}
	l := &eventLoop{
		srv:    s,
		ep:     ep,
		rc:     rc,
		parked: make(map[uint64]*conn),
		events: make([]unix.EpollEvent, 256),
		in:     bufio.NewReaderSize(nil, loopReadSize),
		fr:     frameReader{lim: s.limits, mem: s.budget},
	}
	l.fr.r = l.in
	s.wg.Add(1)
	go l.run()
	return l
}

// run waits for parked connections to become readable and serves them,
// until stop. It closes the epoll set when it returns.
func (l *eventLoop) run() {
	defer l.srv.wg.Done()
	defer l.ep.Close()
	defer l.stop() // if the set failed: nothing parked may be left unserved
	for {
		var n int
		var pollErr error
		err := l.rc.Read(func(fd uintptr) bool {
			n, pollErr = epollPoll(int(fd), l.events)
			if pollErr == unix.EINTR {
				n, pollErr = 0, nil
				return true // ask again
			}
			return n > 0 || pollErr != nil // none ready: Go's poller waits for the set
		})
		if err != nil || pollErr != nil || l.isStopped() {
			return // stop's deadline, or the set failed
		}
		for i := range l.events[:n] {
			if c := l.take(eventID(&l.events[i])); c != nil {
				l.serve(c)
			}
		}
	}
}

func eventID(ev *unix.EpollEvent) uint64 {
	return uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
}

// parkedConns counts the connections parked now.
func (l *eventLoop) parkedConns() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.parked)
}

func (l *eventLoop) isStopped() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stopped
}

// take removes a parked connection, making the caller its owner; nil if
// it is not parked (an event that came after someone else took it).
func (l *eventLoop) take(id uint64) *conn {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.parked[id]
	if c != nil {
		delete(l.parked, id)
	}
	return c
}

// park hands c, whose caller owns it and which holds no buffer, to the
// loop. It reports false, the caller keeping c, if the loop has stopped
// or c's socket could not join the set.
func (l *eventLoop) park(c *conn) bool {
	l.mu.Lock()
	if l.stopped {
		l.mu.Unlock()
		return false
	}
	if c.loopID == 0 {
		l.nextID++
		c.loopID = l.nextID
	}
	id := c.loopID
	add := !c.inSet
	c.inSet = true
	l.parked[id] = c
	l.mu.Unlock()
	// Past this point c may already be another's: in the set, the loop
	// may serve it, and a close may end it. Only id is used.
	var err error
	if add {
		if err = l.ctl(c, unix.EPOLL_CTL_ADD, id); err != nil && l.take(id) == c {
			c.inSet = false
			return false
		}
	} else {
		// Back from the loop's own serving, still in the set: only make
		// sure no close came meanwhile, which nobody would notice now.
		err = c.raw.Control(func(uintptr) {})
	}
	if err != nil {
		// The loop cannot serve it (not in the set, or closed); a close or
		// stop that took it meanwhile owns it now.
		return l.take(id) == nil
	}
	return true
}

// ctl adds c's socket to the set, level-triggered: a connection the loop
// serves and parks again costs no call, or deletes it when the loop hands
// the connection to a goroutine.
func (l *eventLoop) ctl(c *conn, op int, id uint64) error {
	ev := unix.EpollEvent{
		Events: unix.EPOLLIN | unix.EPOLLRDHUP,
		Fd:     int32(uint32(id)),
		Pad:    int32(uint32(id >> 32)),
	}
	var ctlErr error
	err := l.rc.Control(func(epfd uintptr) {
		ctlErr = c.raw.Control(func(fd uintptr) {
			ctlErr = epollCtl(int(epfd), op, int(fd), &ev)
		})
	})
	if err != nil {
		return err
	}
	return ctlErr
}

// handOff gives a connection the loop took back to a goroutine, with the
// bytes the loop read and did not handle. It leaves the set first: a
// goroutine reads it now.
func (l *eventLoop) handOff(c *conn, preread []byte) {
	if c.inSet {
		c.inSet = false
		_ = l.ctl(c, unix.EPOLL_CTL_DEL, c.loopID) // fails only if closed, which the goroutine sees
	}
	c.preread = preread
	l.handedOff.Add(1)
	go c.serve()
}

// handshakeExpired ends c if it is still parked fresh from accept, with
// no request yet, when its handshake time is up; on the goroutine path
// its read deadline does the same.
func (l *eventLoop) handshakeExpired(c *conn) {
	l.mu.Lock()
	expired := c.loopID != 0 && l.parked[c.loopID] == c && !c.isHandshaken()
	if expired {
		delete(l.parked, c.loopID)
	}
	l.mu.Unlock()
	if expired {
		c.finish(os.ErrDeadlineExceeded)
	}
}

// closed is told that c's socket was closed by someone other than its
// owner (eviction, Close, a failed write of a fired WAIT): a parked
// connection has no goroutine to notice, so one is started to end it.
func (l *eventLoop) closed(c *conn) {
	l.mu.Lock()
	parked := c.loopID != 0 && l.parked[c.loopID] == c
	if parked {
		delete(l.parked, c.loopID)
	}
	l.mu.Unlock()
	if parked {
		go c.finish(net.ErrClosed)
	}
}

// stop ends the loop: every parked connection goes back to a goroutine,
// which drains it during Shutdown (conn.serve), and later parks fail.
func (l *eventLoop) stop() {
	l.mu.Lock()
	if l.stopped {
		l.mu.Unlock()
		return
	}
	l.stopped = true
	parked := l.parked
	l.parked = nil
	l.mu.Unlock()
	for _, c := range parked {
		go c.serve()
	}
	_ = l.ep.SetReadDeadline(time.Unix(1, 0)) // wake run
}

// serve reads what came on a connection the loop took and handles it,
// then parks the connection again or hands it to its goroutine path.
func (l *eventLoop) serve(c *conn) {
	c.leaveIdle()
	l.in.Reset(readOnce{c})
	_, err := l.in.Peek(1)
	got := l.in.Buffered()
	switch {
	case got == 0 && errors.Is(err, errWouldBlock):
		l.repark(c) // woken for nothing: an event from before it was taken
		return
	case got == 0:
		c.finish(err)
		return
	}
	batch, _ := l.in.Peek(got)
	if !c.detected {
		// A connection parked fresh from accept: its first bytes tell
		// its dialect, as on the goroutine path (frameReader.detectDialect).
		d, skip, ok := detectDialectBytes(batch)
		if !ok {
			l.handOff(c, bytes.Clone(batch))
			l.in.Reset(nil)
			return
		}
		c.detected, c.dialect = true, d
		_, _ = l.in.Discard(skip)
		batch = batch[skip:]
		if d == DialectV2 {
			c.handshook()
		}
	}
	if planBatch(batch, got == loopReadSize, c.dialect, l.srv.limits) != planInline {
		l.handOff(c, bytes.Clone(batch))
		l.in.Reset(nil)
		return
	}
	rest, err := l.handleBatch(c)
	l.in.Reset(nil)
	l.inline.Add(1)
	if err != nil {
		c.finish(err)
		return
	}
	if rest != nil || c.hasUnsent() {
		l.handOff(c, rest) // the goroutine finishes the write, waiting
		return
	}
	l.repark(c)
}

// handleBatch handles the whole requests in l.in, then writes their
// replies without blocking; what the socket does not take is kept in
// c.unsent. Once the socket takes no more it stops: the requests left
// (rest) go to the goroutine path, whose writes wait for the peer, so a
// client that sends requests and reads no replies holds at most one
// reply of them here.
func (l *eventLoop) handleBatch(c *conn) (rest []byte, err error) {
	c.wmu.Lock()
	c.loopWriting = true
	c.wmu.Unlock()
	greeted := c.isHandshaken()
	for err == nil && l.in.Buffered() > 0 {
		if c.hasUnsent() {
			rest, _ = l.in.Peek(l.in.Buffered())
			rest = bytes.Clone(rest)
			break
		}
		var req request
		req, err = l.fr.readRequest(c.dialect)
		l.fr.releaseHeld()
		if err == nil {
			err = c.handle(&req)
		}
		l.fr.releaseHeld()
		if err == nil && !greeted {
			greeted = true
			c.handshook() // a torch 1.13 client's first valid request
		}
	}
	c.wmu.Lock()
	if ferr := c.flushLocked(); err == nil {
		err = ferr
	}
	c.loopWriting = false
	c.wmu.Unlock()
	return rest, err
}

func (l *eventLoop) repark(c *conn) {
	if !c.park() {
		l.handOff(c, nil)
	}
}

// errWouldBlock is a read of a socket with nothing in it.
var errWouldBlock = errors.New("rendezvous: would block")

// readOnce reads a connection's socket once without waiting.
type readOnce struct{ c *conn }

func (r readOnce) Read(p []byte) (int, error) {
	var n int
	var rerr error
	if err := r.c.raw.Read(func(fd uintptr) bool {
		n, rerr = rawio.Read(int(fd), p)
		return true
	}); err != nil {
		return 0, err
	}
	switch {
	case rerr == unix.EAGAIN:
		return 0, errWouldBlock
	case rerr != nil:
		return 0, rerr
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// sendByte writes b to c's socket if it takes it without waiting, and
// reports whether it did. The caller holds wmu.
func (c *conn) sendByte(b byte) bool {
	p := [1]byte{b}
	var n int
	var werr error
	if err := c.raw.Write(func(fd uintptr) bool {
		n, werr = rawio.Write(int(fd), p[:])
		return true
	}); err != nil || werr != nil {
		return false
	}
	return n == 1
}

// writeNow writes p to c's socket without waiting and keeps what it did
// not take in c.unsent, behind anything already kept there. The caller
// holds wmu.
func (c *conn) writeNow(p []byte) (int, error) {
	if len(c.unsent) > 0 {
		c.keepUnsent(p)
		return len(p), nil
	}
	var n int
	var werr error
	if err := c.raw.Write(func(fd uintptr) bool {
		n, werr = rawio.Write(int(fd), p)
		return true
	}); err != nil {
		return 0, err
	}
	if werr == unix.EAGAIN {
		n, werr = 0, nil
	}
	if werr != nil {
		return 0, werr
	}
	if n < len(p) {
		c.keepUnsent(p[n:])
	}
	return len(p), nil
}

// keepUnsent keeps p for the goroutine path to send, charged to the
// memory budget until it is sent. The caller holds wmu.
func (c *conn) keepUnsent(p []byte) {
	c.srv.budget.force(int64(len(p)))
	c.unsent = append(c.unsent, p...)
}

// loopConn is a connection's socket as the server holds it when the loop
// may park it: closing it from elsewhere ends it even while parked.
type loopConn struct {
	net.Conn
	c *conn
}

func (lc *loopConn) Close() error {
	err := lc.Conn.Close()
	if l := lc.c.srv.loop(); l != nil {
		l.closed(lc.c)
	}
	return err
}

// SyscallConn keeps the socket reachable for peeks and readiness waits.
func (lc *loopConn) SyscallConn() (syscall.RawConn, error) { return lc.c.raw, nil }

// forLoop returns nc as the server holds it, and its raw socket if the
// loop may park it: a plain TCP socket, not one behind a wrapper (an
// authenticating one) that reads must go through.
func forLoop(c *conn, nc net.Conn) (net.Conn, syscall.RawConn) {
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		return nc, nil
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return nc, nil
	}
	return &loopConn{Conn: nc, c: c}, raw
}

// The loop's system calls never block (nonblocking sockets, epoll_wait
// with no timeout), so they are made raw (internal/rawio says why).

// epollPoll returns the events ready now, without waiting.
func epollPoll(epfd int, events []unix.EpollEvent) (int, error) {
	n, _, errno := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(epfd), uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), 0, 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

func epollCtl(epfd, op, fd int, ev *unix.EpollEvent) error {
	_, _, errno := unix.RawSyscall6(unix.SYS_EPOLL_CTL, uintptr(epfd), uintptr(op), uintptr(fd), uintptr(unsafe.Pointer(ev)), 0, 0)
	if errno != 0 {
		return errno
	}
	return nil
}
