package rendezvous

import (
	"bufio"
	"container/list"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"
)

// conn serves one client connection. Its goroutine reads and handles
// requests in order; replies to them are buffered and flushed before the
// next read from the network (connReader). One other goroutine at a time
// may write: the flusher of fired WAITs, started when one fires, or the
// pusher of a 1.13 watch socket's events; wmu keeps every frame whole.
// A pending WAIT costs no goroutine.
//
// An idle connection holds no buffer: its goroutine waits for the socket
// to become readable without one (awaitRequest), takes a read buffer from
// a pool for the requests that came, and gives it back, with the write
// buffer once its replies are flushed, when it is idle again. At 16K ranks
// nearly every connection is idle at any time, and two 4 KiB buffers each
// were most of the server's memory. For the same reason the connection
// keeps no logger (a zerolog context is half a KiB) and makes its map of
// pending WAITs at its first WAIT.
//
// Where the system allows, a connection idle between requests holds no
// goroutine either: it is parked in the server's event loop
// (eventloop_linux.go), which serves whole requests itself and hands the
// connection back to a goroutine (serve) for anything else. Exactly one
// of the two owns the connection's reading at a time.
type conn struct {
	srv       *Server
	nc        net.Conn
	raw       syscall.RawConn // nc's socket where the loop may park it, else nil
	r         frameReader     // r.r is nil while idle
	handshake *list.Element   // in Server.handshaking until a valid request; guarded by Server.mu
	opened    time.Time       // when admitted; guarded by Server.mu

	wmu     sync.Mutex
	w       frameWriter          // w.w is nil while nothing is buffered
	pending map[*waiter]struct{} // WAITs not yet answered, nil before the first; guarded by wmu
	// While the loop handles a batch, writes do not wait (loopWriting);
	// what the socket does not take waits in unsent for the goroutine
	// path, which sends it before anything else. Guarded by wmu.
	loopWriting bool
	unsent      []byte

	fmu      sync.Mutex
	fired    []*waiter // released WAITs whose STOP_WAITING is owed
	flushing bool      // a flusher goroutine runs

	holds   atomic.Int32 // pending WAITs and watches: the connection is not idle
	watcher *watcher     // this connection's 1.13 watches; reader goroutine only

	// Reader state, for Shutdown and eviction; guarded by smu.
	smu        sync.Mutex
	idle       bool // blocked reading between requests
	idleSince  time.Time
	nudged     bool // Shutdown set a past read deadline to wake it
	handshaken bool // a valid first request came
	// Ends the connection if it is still parked without a valid request
	// when its handshake time is up (a parked connection's read deadline
	// wakes nobody); set before it is first parked.
	handshakeTimer *time.Timer

	// Reader goroutine only (one at a time, see serve).
	atBoundary bool    // the next byte starts a request
	detected   bool    // dialect is known
	dialect    Dialect // the client's, from its first bytes
	preread    []byte  // read by the loop before it handed the connection over

	loopID uint64 // the connection's key in the event loop; guarded by its mutex
	inSet  bool   // its socket is in the loop's epoll set; its owner's
}

// Per-connection buffer sizes, kept small: torch 1.13 clients hold a second,
// idle connection each.
const connBufferSize = 4 << 10

// errServerClosing ends a connection at a request boundary once Shutdown
// has begun.
var errServerClosing = errors.New("rendezvous: server shutting down")

// The buffers of connections between requests.
var (
	readerPool = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, connBufferSize) }}
	writerPool = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, connBufferSize) }}
)

func newConn(s *Server, nc net.Conn) *conn {
	c := &conn{
		srv: s,
		r:   frameReader{lim: s.limits, mem: s.budget},
	}
	c.nc, c.raw = forLoop(c, nc)
	return c
}

// logAt starts a log event about the connection.
func (c *conn) logAt(level zerolog.Level) *zerolog.Event {
	return c.srv.log.WithLevel(level).Stringer("remote", c.nc.RemoteAddr())
}

// peerHost is the remote host, for refusal warnings.
func (c *conn) peerHost() string {
	peer := c.nc.RemoteAddr().String()
	if host, _, err := net.SplitHostPort(peer); err == nil {
		return host
	}
	return peer
}

// writer returns the connection's frame writer, with a buffer from the
// pool if it holds none. The caller holds wmu.
func (c *conn) writer() *frameWriter {
	if c.w.w == nil {
		w := writerPool.Get().(*bufio.Writer)
		w.Reset(connOut{c})
		c.w.w = w
	}
	return &c.w
}

// flushLocked sends what is buffered and gives the buffer back. The
// caller holds wmu.
func (c *conn) flushLocked() error {
	var err error
	if w := c.w.w; w != nil {
		err = w.Flush()
		w.Reset(nil)
		writerPool.Put(w)
		c.w.w = nil
	}
	if err == nil && !c.loopWriting && len(c.unsent) > 0 {
		err = c.sendUnsent()
	}
	return err
}

// sendUnsent sends what the loop could not, waiting as long as it takes.
// The caller holds wmu.
func (c *conn) sendUnsent() error {
	_, err := c.nc.Write(c.unsent)
	c.dropUnsent()
	return err
}

// dropUnsent forgets what the loop left unsent, and its charge. The
// caller holds wmu.
func (c *conn) dropUnsent() {
	c.srv.budget.release(int64(len(c.unsent)))
	c.unsent = nil
}

func (c *conn) hasUnsent() bool {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return len(c.unsent) > 0
}

// connOut is what a connection's write buffer flushes to: the socket,
// behind what the loop left unsent; without waiting while the loop writes.
// Every write happens under wmu.
type connOut struct{ c *conn }

func (o connOut) Write(p []byte) (int, error) {
	c := o.c
	if c.loopWriting {
		return c.writeNow(p)
	}
	if len(c.unsent) > 0 {
		if err := c.sendUnsent(); err != nil {
			return 0, err
		}
	}
	return c.nc.Write(p)
}

func (c *conn) flush() error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.flushLocked()
}

// takeReader gives the reader goroutine a read buffer from the pool.
func (c *conn) takeReader() {
	if c.r.r == nil {
		r := readerPool.Get().(*bufio.Reader)
		r.Reset(connReader{c})
		c.r.r = r
	}
}

// dropReader gives the read buffer back; nothing may be buffered in it.
func (c *conn) dropReader() {
	if r := c.r.r; r != nil {
		r.Reset(nil)
		readerPool.Put(r)
		c.r.r = nil
	}
}

// awaitRequest waits, holding no buffer, until the next request's bytes
// arrive (or the peer hangs up, or a deadline passes), with the replies
// owed flushed and the connection marked idle meanwhile. It returns with
// a read buffer taken and the bytes that came in it; once Shutdown has
// begun, with those that drain finds.
func (c *conn) awaitRequest() error {
	if err := c.flush(); err != nil {
		return err
	}
	c.dropReader()
	if c.preread == nil && !c.enterIdle() {
		err := waitReadable(c.nc)
		c.leaveIdle()
		shutdownWoke := err != nil && c.srv.shuttingDown() && errors.Is(err, os.ErrDeadlineExceeded)
		if err != nil && !shutdownWoke && !errors.Is(err, errors.ErrUnsupported) {
			return err
		}
		// Else connReader drains, or waits with the buffer where the
		// connection cannot wait without one.
	}
	c.takeReader()
	c.atBoundary = true
	_, err := c.r.r.Peek(1)
	return err
}

// connReader reads for the connection's bufio.Reader. It flushes owed
// replies before each read from the network, so that replies to a batch
// of pipelined requests leave in one write and no reply is held back
// while its sender waits for input. Between requests it marks the
// connection idle, which is when Shutdown may close it.
type connReader struct{ c *conn }

func (r connReader) Read(p []byte) (int, error) {
	c := r.c
	if err := c.flush(); err != nil {
		return 0, err
	}
	if len(c.preread) > 0 {
		n := copy(p, c.preread)
		if c.preread = c.preread[n:]; len(c.preread) == 0 {
			c.preread = nil
		}
		c.atBoundary = false
		return n, nil
	}
	if !c.atBoundary {
		return c.nc.Read(p) // inside a request: finish it
	}
	if c.enterIdle() {
		return c.drain(p)
	}
	n, err := c.nc.Read(p)
	c.leaveIdle()
	if n == 0 && err != nil && c.srv.shuttingDown() && errors.Is(err, os.ErrDeadlineExceeded) {
		return c.drain(p) // woken by Shutdown
	}
	if n > 0 {
		c.atBoundary = false
	}
	return n, err
}

// enterIdle marks the reader idle before it waits for a request, unless
// Shutdown has begun, which it reports. Checking the flag and marking
// under smu, as Shutdown's nudge does, means that either this sees the
// shutdown or the nudge sees the idle reader.
func (c *conn) enterIdle() (closing bool) {
	c.smu.Lock()
	defer c.smu.Unlock()
	if c.srv.shuttingDown() {
		return true
	}
	c.idle, c.idleSince = true, time.Now()
	return false
}

func (c *conn) leaveIdle() {
	c.smu.Lock()
	defer c.smu.Unlock()
	c.idle = false
	if c.nudged {
		// Data came with the nudge: its request must finish unhurried.
		c.nudged = false
		_ = c.nc.SetReadDeadline(time.Time{})
	}
}

// nudge wakes a reader idle between requests so that it sees Shutdown;
// a request being read or a reply being written is left to complete.
func (c *conn) nudge() {
	c.smu.Lock()
	defer c.smu.Unlock()
	if c.idle && !c.nudged {
		c.nudged = true
		_ = c.nc.SetReadDeadline(time.Unix(1, 0))
	}
}

// drainGrace is how long Shutdown waits on an idle connection for bytes
// already on their way: a request sent just before is served.
const drainGrace = 20 * time.Millisecond

// drain returns, during Shutdown, the bytes of a request that reached the
// kernel or arrive within drainGrace: a client's SET, which has no reply,
// is applied rather than dropped. Nothing there ends the connection.
func (c *conn) drain(p []byte) (int, error) {
	n := readAvailable(c.nc, p)
	if n == 0 {
		_ = c.nc.SetReadDeadline(time.Now().Add(drainGrace))
		n, _ = c.nc.Read(p)
	}
	_ = c.nc.SetReadDeadline(time.Time{})
	if n > 0 {
		c.atBoundary = false
		return n, nil
	}
	return 0, errServerClosing
}

// handshook notes a valid first request: the connection leaves the
// handshake deadline and the handshake count.
func (c *conn) handshook() {
	c.smu.Lock()
	if c.handshaken {
		c.smu.Unlock()
		return
	}
	c.handshaken = true
	if !c.nudged {
		_ = c.nc.SetReadDeadline(time.Time{})
	}
	if c.handshakeTimer != nil {
		c.handshakeTimer.Stop()
	}
	c.smu.Unlock()
	c.srv.handshook(c)
}

// idleFor reports how long the connection has been idle while holding
// nothing, or false if it is busy or holds a WAIT or a watch.
func (c *conn) idleFor(now time.Time) (time.Duration, bool) {
	if c.holds.Load() != 0 {
		return 0, false
	}
	c.smu.Lock()
	defer c.smu.Unlock()
	if !c.idle {
		return 0, false
	}
	return now.Sub(c.idleSince), true
}

// serve waits for the connection's next requests and handles them, in a
// goroutine of its own. The server counts the connection, not the
// goroutine, in wg: one count from admission to finish. When it has to
// wait again it parks the connection in the event loop, or, where there
// is none, hands it to a fresh goroutine and returns: a goroutine's stack
// grows while it handles requests and shrinks only at a collection that
// finds it idle, so a goroutine started to wait holds the least stack
// (2 KiB where one that served requests kept 4 or more), at the cost of
// starting one per exchange with the client.
func (c *conn) serve() {
	err := c.awaitRequest()
	if err == nil && !c.detected {
		c.detected = true
		if c.dialect, err = c.r.detectDialect(); err == nil && c.dialect == DialectV2 {
			c.handshook()
		}
	}
	if err == nil {
		err = c.serveBuffered()
	}
	if err == nil {
		err = c.flush()
	}
	if err == nil {
		c.dropReader()
		if !c.park() {
			go c.serve()
		}
		return
	}
	c.finish(err)
}

// park hands the connection, idle and holding no buffer, to the event
// loop, and reports whether the loop took it. A connection fresh from
// accept is parked, its handshake time kept by a timer (startConn); one
// that has spoken is parked only past its handshake, which the goroutine
// path's read deadline keeps. During Shutdown it stays on that path,
// which drains it.
func (c *conn) park() bool {
	if c.raw == nil || (c.detected && !c.isHandshaken()) {
		return false
	}
	l := c.srv.parkingLoop()
	if l == nil || c.enterIdle() {
		return false
	}
	if l.park(c) {
		return true
	}
	c.leaveIdle()
	return false
}

// finish ends the connection for err, its owner's last act.
func (c *conn) finish(err error) {
	if c.handshakeTimer != nil {
		c.handshakeTimer.Stop()
	}
	if errors.Is(err, errServerClosing) {
		_ = c.flush()
	}
	c.logEnd(c.dialect, err)
	c.dropReader()
	c.close()
	c.srv.wg.Done()
}

// serveBuffered handles requests until no byte of another has arrived.
func (c *conn) serveBuffered() error {
	for {
		if c.atBoundary = c.r.r.Buffered() == 0 && c.preread == nil; c.atBoundary {
			return nil
		}
		req, err := c.r.readRequest(c.dialect)
		if err == nil {
			c.r.releaseHeld() // the table charges what it keeps
			if err = c.handle(&req); err == nil {
				c.handshook()
			}
		}
		c.r.releaseHeld()
		if err != nil {
			return err
		}
	}
}

// close releases everything the connection holds in the table.
func (c *conn) close() {
	c.nc.Close()
	c.wmu.Lock()
	for w := range c.pending {
		c.srv.table.cancel(w)
	}
	clear(c.pending)
	c.dropUnsent()
	if c.w.w != nil {
		c.w.w.Reset(nil)
		writerPool.Put(c.w.w)
		c.w.w = nil
	}
	c.wmu.Unlock()
	if c.watcher != nil {
		c.srv.table.unwatch(c.watcher)
	}
	c.srv.forgetConn(c)
}

// errMissingKey ends a connection that asked GET or MULTI_GET for a key
// that does not exist, as torch 1.13's server does (its lookup throws).
// torch's clients always WAIT first, so only a key deleted in between, or
// a hand-made client, gets here.
var errMissingKey = errors.New("rendezvous: no such key")

// logEnd logs why the connection ended: at debug for ordinary hang-ups,
// for GET of a missing key and for a silent connection timed out; at warn,
// rate-limited, for a peer breaking the protocol; at warn, once per peer
// per minute, for a request refused for the memory budget.
func (c *conn) logEnd(d Dialect, err error) {
	var frameErr *frameError
	switch {
	case c.srv.shuttingDown(), errors.Is(err, net.ErrClosed), errors.Is(err, errServerClosing):
		c.logAt(zerolog.DebugLevel).Stringer("dialect", d).Msg("connection closed by server")
	case errors.Is(err, io.EOF), errors.Is(err, syscall.ECONNRESET):
		c.logAt(zerolog.DebugLevel).Stringer("dialect", d).Msg("connection closed by peer")
	case errors.Is(err, errMissingKey):
		c.logAt(zerolog.DebugLevel).Stringer("dialect", d).Err(err).Msg("closing connection on a get of a missing key")
	case errors.Is(err, ErrOverBudget):
		c.srv.refusedRequests.Add(1)
		if peer := c.peerHost(); c.srv.refusalLog.allow(peer, time.Now()) {
			c.logAt(zerolog.WarnLevel).Str("peer", peer).Int64("budget", c.srv.budget.limit).Err(err).
				Msg("refused a request past the store's memory budget; closing that connection (logged once a minute per peer)")
		}
	case errors.Is(err, os.ErrDeadlineExceeded) && !c.isHandshaken():
		c.srv.timedOutConns.Add(1)
		c.logAt(zerolog.DebugLevel).Dur("timeout", c.srv.handshakeTimeout).Msg("closing connection that sent no valid request in time")
	case errors.As(err, &frameErr):
		c.warnLimited(d, err, "closing connection on a bad frame")
	default:
		c.warnLimited(d, err, "closing connection")
	}
}

// warnLimited logs a protocol violation within the server's rate.
func (c *conn) warnLimited(d Dialect, err error, msg string) {
	ok, suppressed := c.srv.badFrameLog.allow(time.Now())
	if !ok {
		return
	}
	e := c.logAt(zerolog.WarnLevel).Stringer("dialect", d).Err(err)
	if suppressed > 0 {
		e = e.Int("suppressed", suppressed)
	}
	e.Msg(msg)
}

func (c *conn) isHandshaken() bool {
	c.smu.Lock()
	defer c.smu.Unlock()
	return c.handshaken
}

// handle executes one request and buffers its reply. An error ends the
// connection.
func (c *conn) handle(req *request) error {
	c.srv.countRequest(req.op)
	t := c.srv.table
	switch req.op {
	case opValidate:
		if req.nonce != validateMagic {
			return &frameError{reason: fmt.Sprintf("bad validate magic %#x", req.nonce)}
		}
	case opSet:
		return opErr("set", req.key, t.set(remote, req.key, req.value))
	case opAppend:
		return opErr("append", req.key, t.append(remote, req.key, req.value))
	case opMultiSet:
		if err := t.multiSet(remote, req.keys, req.values); err != nil {
			return &OpError{Op: "multi_set", Keys: req.keys, Err: err}
		}
	case opQueuePush:
		return opErr("queue_push", req.key, t.queuePush(remote, req.key, req.value))
	case opCompareSet:
		v, err := t.compareSet(remote, req.key, req.expected, req.value)
		if err != nil {
			return opErr("compare_set", req.key, err)
		}
		c.reply(func(w *frameWriter) { w.putBytes(v) })
	case opGet:
		v, ok := t.get(req.key)
		if !ok {
			return &OpError{Op: "get", Keys: []string{req.key}, Err: errMissingKey}
		}
		c.reply(func(w *frameWriter) { w.putBytes(v) })
	case opMultiGet:
		values, ok := t.multiGet(req.keys)
		if !ok {
			return &OpError{Op: "multi_get", Keys: req.keys, Err: errMissingKey}
		}
		c.reply(func(w *frameWriter) {
			for _, v := range values {
				w.putBytes(v)
			}
		})
	case opAdd:
		n, err := t.add(remote, req.key, req.delta)
		if err != nil {
			return opErr("add", req.key, err)
		}
		c.reply(func(w *frameWriter) { w.putI64(n) })
	case opCheck:
		code := checkNotReady
		if t.check(req.keys) {
			code = checkReady
		}
		c.reply(func(w *frameWriter) { w.putU8(code) })
	case opWait:
		if err := c.wait(req.keys); err != nil {
			return &OpError{Op: "wait", Keys: req.keys, Err: err}
		}
	case opCancelWait:
		c.cancelWaits()
	case opNumKeys:
		c.reply(func(w *frameWriter) { w.putI64(t.numKeys()) })
	case opDelete:
		var n int64
		if t.delete(req.key) {
			n = 1
		}
		c.reply(func(w *frameWriter) { w.putI64(n) })
	case opWatchKey:
		return opErr("watch_key", req.key, c.watch(req.key))
	case opPing:
		c.reply(func(w *frameWriter) { w.putU32(req.nonce) })
	case opQueuePop:
		n, v := t.queuePop(req.key)
		c.reply(func(w *frameWriter) {
			w.putI64(n)
			if n > 0 {
				w.putBytes(v)
			}
		})
	case opQueueLen:
		c.reply(func(w *frameWriter) { w.putI64(t.queueLen(req.key)) })
	case opList:
		keys, cost, err := t.list(remote)
		if err != nil {
			return &OpError{Op: "list", Err: err}
		}
		c.reply(func(w *frameWriter) {
			w.putI64(int64(len(keys)))
			for _, k := range keys {
				w.putString(k)
			}
		})
		t.mem.release(cost)
	}
	return nil
}

// opErr wraps a failed single-key operation, or returns nil.
func opErr(op, key string, err error) error {
	if err == nil {
		return nil
	}
	return &OpError{Op: op, Keys: []string{key}, Err: err}
}

// reply buffers a reply under the writer lock. Write errors stick in the
// buffer and end the connection at the next flush.
func (c *conn) reply(write func(*frameWriter)) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	write(c.writer())
}

// wait answers STOP_WAITING now if every key exists, else once they do.
// There is no server-side timeout: the client gives up by CANCEL_WAIT (v2)
// or by hanging up. Registering under wmu puts the waiter in pending
// before its flusher can look for it.
func (c *conn) wait(keys []string) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	w, err := c.srv.table.waitFunc(remote, keys, c.fire)
	if err != nil {
		return err
	}
	if w == nil {
		c.writer().putU8(stopWaiting)
		return nil
	}
	if c.pending == nil {
		c.pending = make(map[*waiter]struct{})
	}
	c.pending[w] = struct{}{}
	c.holds.Add(1)
	return nil
}

// fire is called by the table, under its lock, when one of this
// connection's waiters is released by the keys it waited for. It sends
// the STOP_WAITING at once if it can without waiting (answerNow), else
// queues it for a flusher goroutine, starting one if none runs:
// goroutines follow wake-ups, not waits.
func (c *conn) fire(w *waiter) {
	if c.answerNow(w) {
		return
	}
	c.fmu.Lock()
	defer c.fmu.Unlock()
	c.fired = append(c.fired, w)
	if !c.flushing {
		c.flushing = true
		c.srv.wg.Add(1)
		go c.flushFired()
	}
}

// answerNow writes w's STOP_WAITING straight to the socket if nothing
// else is being written on the connection (wmu free, no reply buffered or
// unsent, no STOP_WAITING queued before it) and the socket takes the byte
// without waiting. A barrier releases every rank at once: answered here,
// each costs one write instead of a flusher goroutine. It only tries
// wmu, which the table's lock, held here, may not wait for.
func (c *conn) answerNow(w *waiter) bool {
	if c.raw == nil || !c.wmu.TryLock() {
		return false
	}
	defer c.wmu.Unlock()
	if _, ok := c.pending[w]; !ok || c.w.w != nil || len(c.unsent) > 0 {
		return false
	}
	c.fmu.Lock()
	queued := c.flushing || len(c.fired) > 0
	c.fmu.Unlock()
	if queued || !c.sendByte(stopWaiting) {
		return false
	}
	delete(c.pending, w)
	c.holds.Add(-1)
	return true
}

// flushFired sends the STOP_WAITINGs owed for fired waiters until none
// is left, skipping those the connection withdrew meanwhile.
func (c *conn) flushFired() {
	defer c.srv.wg.Done()
	for {
		c.wmu.Lock()
		c.fmu.Lock()
		batch := c.fired
		c.fired = nil
		if len(batch) == 0 {
			c.flushing = false
			c.fmu.Unlock()
			c.wmu.Unlock()
			return
		}
		c.fmu.Unlock()
		for _, w := range batch {
			if _, ok := c.pending[w]; !ok {
				continue // answered by cancelWaits, or the connection closed
			}
			delete(c.pending, w)
			c.holds.Add(-1)
			c.writer().putU8(stopWaiting)
		}
		err := c.flushLocked()
		c.wmu.Unlock()
		if err != nil {
			c.nc.Close() // the reader goroutine ends the connection
		}
	}
}

// cancelWaits drops every pending wait of the connection and replies
// WAIT_CANCELED, as torch >= 2.2's CANCEL_WAIT does. A wait that fired
// meanwhile gets its STOP_WAITING first, which torch's client accepts
// before the 01; holding wmu keeps the two in that order.
func (c *conn) cancelWaits() {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	for w := range c.pending {
		if !c.srv.table.cancel(w) {
			c.writer().putU8(stopWaiting)
		}
		delete(c.pending, w)
		c.holds.Add(-1)
	}
	c.writer().putU8(waitCanceled)
}

// watch registers a 1.13 WATCH_KEY: it acknowledges, then pushes an event
// for each later change of key. Registering and acknowledging under wmu
// puts the acknowledgement before any event.
func (c *conn) watch(key string) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.watcher == nil {
		c.watcher = newWatcher()
		c.holds.Add(1)
		c.srv.wg.Add(1)
		go c.pushEvents(c.watcher)
	}
	if err := c.srv.table.watch(remote, key, c.watcher); err != nil {
		return err
	}
	c.writer().putU8(keyWatchRegistered)
	return nil
}

// pushEvents writes w's events until the table drops it.
func (c *conn) pushEvents(w *watcher) {
	defer c.srv.wg.Done()
	for ev := range w.events {
		c.wmu.Lock()
		w := c.writer()
		w.putU8(ev.kind)
		w.putString(ev.key)
		w.putBytes(ev.oldValue)
		w.putBytes(ev.newVal)
		err := c.flushLocked()
		c.wmu.Unlock()
		if err != nil {
			c.nc.Close()
			return
		}
	}
	if w.overflowed {
		c.logAt(zerolog.WarnLevel).Int("backlog", watchBacklog).Msg("closing watch connection that does not read its events")
		c.nc.Close()
	}
}
