package rendezvous

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"
)

// conn serves one client connection. Its goroutine reads and handles
// requests in order; replies to them are buffered and flushed before the
// next read from the network (flushingReader). Other goroutines write too:
// one per pending WAIT (its STOP_WAITING) and one per 1.13 watch socket
// (events); wmu keeps every frame whole.
type conn struct {
	srv *Server
	nc  net.Conn
	log zerolog.Logger
	r   frameReader

	wmu     sync.Mutex
	w       frameWriter
	pending map[*waiter]struct{} // WAITs not yet answered; guarded by wmu

	watcher *watcher // this connection's 1.13 watches; reader goroutine only
}

// Per-connection buffer sizes, kept small: torch 1.13 clients hold a second,
// idle connection each.
const connBufferSize = 4 << 10

func newConn(s *Server, nc net.Conn) *conn {
	c := &conn{
		srv:     s,
		nc:      nc,
		log:     s.log.With().Stringer("remote", nc.RemoteAddr()).Logger(),
		pending: make(map[*waiter]struct{}),
	}
	c.w = frameWriter{w: bufio.NewWriterSize(nc, connBufferSize)}
	c.r = frameReader{
		r:   bufio.NewReaderSize(flushingReader{flush: c.flush, r: nc}, connBufferSize),
		lim: s.limits,
	}
	return c
}

func (c *conn) flush() error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.w.w.Flush()
}

// stopReading makes the reader goroutine stop before its next request,
// once it has sent the replies it owes.
func (c *conn) stopReading() {
	_ = c.nc.SetReadDeadline(time.Unix(1, 0))
}

func (c *conn) serve() {
	defer c.close()
	d, err := c.r.detectDialect()
	for err == nil {
		var req request
		if req, err = c.r.readRequest(d); err == nil {
			err = c.handle(&req)
		}
	}
	c.logEnd(d, err)
}

// close releases everything the connection holds in the table.
func (c *conn) close() {
	c.nc.Close()
	c.wmu.Lock()
	for w := range c.pending {
		c.srv.table.cancel(w) // its goroutine then finds it gone and exits
	}
	clear(c.pending)
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

// logEnd logs why the connection ended: at debug for ordinary hang-ups and
// for GET of a missing key, at warn for a peer breaking the protocol.
func (c *conn) logEnd(d Dialect, err error) {
	var frameErr *frameError
	switch {
	case c.srv.shuttingDown(), errors.Is(err, net.ErrClosed):
		c.log.Debug().Stringer("dialect", d).Msg("connection closed by server")
	case errors.Is(err, io.EOF), errors.Is(err, syscall.ECONNRESET):
		c.log.Debug().Stringer("dialect", d).Msg("connection closed by peer")
	case errors.Is(err, errMissingKey):
		c.log.Debug().Stringer("dialect", d).Err(err).Msg("closing connection on a get of a missing key")
	case errors.As(err, &frameErr):
		c.log.Warn().Stringer("dialect", d).Err(err).Msg("closing connection on a bad frame")
	default:
		c.log.Warn().Stringer("dialect", d).Err(err).Msg("closing connection")
	}
}

// handle executes one request and buffers its reply. An error ends the
// connection.
func (c *conn) handle(req *request) error {
	t := c.srv.table
	switch req.op {
	case opValidate:
		if req.nonce != validateMagic {
			return &frameError{reason: fmt.Sprintf("bad validate magic %#x", req.nonce)}
		}
	case opSet:
		t.set(req.key, req.value)
	case opAppend:
		t.append(req.key, req.value)
	case opMultiSet:
		t.multiSet(req.keys, req.values)
	case opQueuePush:
		t.queuePush(req.key, req.value)
	case opCompareSet:
		c.reply(func(w *frameWriter) { w.putBytes(t.compareSet(req.key, req.expected, req.value)) })
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
		n, err := t.add(req.key, req.delta)
		if err != nil {
			return &OpError{Op: "add", Keys: []string{req.key}, Err: err}
		}
		c.reply(func(w *frameWriter) { w.putI64(n) })
	case opCheck:
		code := checkNotReady
		if t.check(req.keys) {
			code = checkReady
		}
		c.reply(func(w *frameWriter) { w.putU8(code) })
	case opWait:
		c.wait(req.keys)
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
		c.watch(req.key)
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
		keys := t.list()
		c.reply(func(w *frameWriter) {
			w.putI64(int64(len(keys)))
			for _, k := range keys {
				w.putString(k)
			}
		})
	}
	return nil
}

// reply buffers a reply under the writer lock. Write errors stick in the
// buffer and end the connection at the next flush.
func (c *conn) reply(write func(*frameWriter)) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	write(&c.w)
}

// wait answers STOP_WAITING now if every key exists, else once they do.
// There is no server-side timeout: the client gives up by CANCEL_WAIT (v2)
// or by hanging up.
func (c *conn) wait(keys []string) {
	w := c.srv.table.wait(keys)
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if w == nil {
		c.w.putU8(stopWaiting)
		return
	}
	c.pending[w] = struct{}{}
	c.srv.wg.Add(1)
	go c.replyWhenReady(w)
}

// replyWhenReady sends w's STOP_WAITING when it fires, unless the
// connection withdrew it first.
func (c *conn) replyWhenReady(w *waiter) {
	defer c.srv.wg.Done()
	<-w.done
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if _, ok := c.pending[w]; !ok {
		return // cancelled, or answered by cancelWaits
	}
	delete(c.pending, w)
	c.w.putU8(stopWaiting)
	if err := c.w.w.Flush(); err != nil {
		c.nc.Close() // the reader goroutine ends the connection
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
			c.w.putU8(stopWaiting)
		}
		delete(c.pending, w)
	}
	c.w.putU8(waitCanceled)
}

// watch registers a 1.13 WATCH_KEY: it acknowledges, then pushes an event
// for each later change of key. Registering and acknowledging under wmu
// puts the acknowledgement before any event.
func (c *conn) watch(key string) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.watcher == nil {
		c.watcher = newWatcher()
		c.srv.wg.Add(1)
		go c.pushEvents(c.watcher)
	}
	c.srv.table.watch(key, c.watcher)
	c.w.putU8(keyWatchRegistered)
}

// pushEvents writes w's events until the table drops it.
func (c *conn) pushEvents(w *watcher) {
	defer c.srv.wg.Done()
	for ev := range w.events {
		c.wmu.Lock()
		c.w.putU8(ev.kind)
		c.w.putString(ev.key)
		c.w.putBytes(ev.oldValue)
		c.w.putBytes(ev.newVal)
		err := c.w.w.Flush()
		c.wmu.Unlock()
		if err != nil {
			c.nc.Close()
			return
		}
	}
	if w.overflowed {
		c.log.Warn().Int("backlog", watchBacklog).Msg("closing watch connection that does not read its events")
		c.nc.Close()
	}
}
