package rendezvous

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun/gorun/internal/acceptloop"
)

// ErrServerClosed is returned by Serve after Shutdown or Close.
var ErrServerClosed = errors.New("rendezvous: server closed")

// Default limits of a Server, per request.
const (
	DefaultMaxKeyLen         = 8 << 10
	DefaultMaxValueLen       = 64 << 20
	DefaultMaxKeysPerRequest = 131072
)

// ServerOptions configures a Server. The zero value is usable.
type ServerOptions struct {
	// Logger receives connection events: protocol violations at warn,
	// ordinary disconnects at debug. The zero value logs nothing.
	Logger zerolog.Logger
	// MaxKeyLen bounds a key's length (default DefaultMaxKeyLen).
	MaxKeyLen int
	// MaxValueLen bounds a value's length (default DefaultMaxValueLen).
	MaxValueLen int
	// MaxKeysPerRequest bounds the keys of one CHECK, WAIT or MULTI_*
	// request (default DefaultMaxKeysPerRequest).
	MaxKeysPerRequest int

	// Resources shared by all clients; see limits.go. Zero means the
	// default, a negative value no limit.

	// MaxConns bounds open connections (default DefaultMaxConns). At the
	// cap a new connection takes the place of one that has not sent a
	// valid request, or of one idle for IdleTimeout holding nothing; if
	// there is none, it is closed.
	MaxConns int
	// MaxHandshakes bounds connections that have not sent a valid first
	// request: past it the oldest is closed if it has been silent for half
	// the HandshakeTimeout, with nothing in its socket; else the new one is
	// admitted all the same, as ranks connecting by the thousand are
	// (default DefaultMaxHandshakes).
	MaxHandshakes int
	// HandshakeTimeout closes a connection that sends no valid first
	// request in time (default DefaultHandshakeTimeout). torch 1.13's
	// silent second connection is closed so, which its client tolerates.
	HandshakeTimeout time.Duration
	// IdleTimeout is how long a connection holding nothing (no pending
	// WAIT or watch) must have been idle before it may be closed to make
	// room for a new connection at MaxConns (default DefaultIdleTimeout).
	// Idle connections are never closed otherwise: torch's clients do not
	// reconnect, and a worker may hold its store idle for days of
	// training before it needs it again.
	IdleTimeout time.Duration
	// MaxMemory is the memory budget for keys, values, waiters, watches,
	// connection buffers and requests being read (default
	// DefaultMaxMemory). A client request past it is refused with
	// ErrOverBudget and its connection closed; a value over 64 KiB may use
	// only seven eighths of it, so that small rendezvous keys still fit.
	MaxMemory int64
	// FDReserve is how many file descriptors of the process's
	// RLIMIT_NOFILE the server leaves to the rest of the process (default
	// DefaultFDReserve, at most a quarter of the limit): new connections
	// are closed at once when fewer would be left.
	FDReserve int
}

func (o ServerOptions) limits() limits {
	orDefault := func(v, def int) uint64 {
		if v <= 0 {
			return uint64(def)
		}
		return uint64(v)
	}
	return limits{
		maxKeyLen:   orDefault(o.MaxKeyLen, DefaultMaxKeyLen),
		maxValueLen: orDefault(o.MaxValueLen, DefaultMaxValueLen),
		maxKeys:     orDefault(o.MaxKeysPerRequest, DefaultMaxKeysPerRequest),
	}
}

// Server serves a store to torch's TCPStore clients, torch 1.13's and
// torch >= 2.2's alike on one port, telling them apart per connection
// (protocol §2). A request that breaks the protocol closes its connection
// only; every other client goes on.
type Server struct {
	log    zerolog.Logger
	limits limits
	table  *table
	guard  // resource limits and their figures (limits.go)

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	addr      net.Addr
	conns     map[*conn]struct{}
	shutdown  bool
	done      chan struct{}  // closed when shutdown begins
	wg        sync.WaitGroup // connections, the event loop, flushers and pushers
	loopTried bool           // parkingLoop tried to start the loop; guarded by mu
	evloop    atomic.Pointer[eventLoop]
}

// NewServer returns a Server with an empty store.
func NewServer(opts ServerOptions) *Server {
	s := &Server{
		log:       opts.Logger,
		limits:    opts.limits(),
		table:     newTable(),
		listeners: make(map[net.Listener]struct{}),
		conns:     make(map[*conn]struct{}),
		done:      make(chan struct{}),
	}
	s.guard = newGuard(opts, s.limits)
	s.table.mem = s.budget
	s.table.maxValueLen = int(s.limits.maxValueLen)
	return s
}

// Store returns an in-process view of the served store for the process
// hosting the server, its keys as they are on the wire. TCPStore clients
// (a Client, torch's) put "/" in front of every key, so to share their
// keys wrap the view as torch would: NewPrefixStore("", srv.Store()) maps
// k to "/" + k. Closing the view leaves the server running.
func (s *Server) Store() *MemoryStore {
	return newMemoryStore(s.table, DefaultTimeout)
}

// Addr returns the address of the listener Serve was last given, or nil.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// Serve accepts connections on l and serves each in its own goroutine
// until Shutdown or Close, then returns ErrServerClosed. Accept errors
// other than a closed listener (EMFILE, ECONNABORTED, ...) are retried
// after a pause doubling from 5 ms to 1 s, as net/http does
// (acceptloop). Serve closes l on return.
func (s *Server) Serve(l net.Listener) error {
	if !s.trackListener(l) {
		l.Close()
		return ErrServerClosed
	}
	defer s.untrackListener(l)
	err := acceptloop.Serve(l, s.done, s.log, func(nc net.Conn) bool {
		s.startConn(nc)
		return true
	})
	if err == nil || s.shuttingDown() {
		return ErrServerClosed
	}
	return err
}

func (s *Server) trackListener(l net.Listener) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shutdown {
		return false
	}
	s.listeners[l] = struct{}{}
	s.addr = l.Addr()
	return true
}

func (s *Server) untrackListener(l net.Listener) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.listeners[l]; ok {
		delete(s.listeners, l)
		l.Close()
	}
}

func (s *Server) shuttingDown() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

func (s *Server) startConn(nc net.Conn) {
	c := newConn(s, nc)
	s.mu.Lock()
	if s.shutdown || !s.admitLocked(c) {
		s.mu.Unlock()
		nc.Close()
		return
	}
	s.conns[c] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	// Parked at once, the connection's first request costs no goroutine
	// either; its handshake time then needs a timer of its own.
	if l := s.parkingLoop(); l != nil && c.raw != nil && s.handshakeTimeout > 0 {
		c.handshakeTimer = time.AfterFunc(s.handshakeTimeout, func() { l.handshakeExpired(c) })
	}
	if !c.park() {
		go c.serve()
	}
}

// loop returns the server's event loop, nil if none was started.
func (s *Server) loop() *eventLoop { return s.evloop.Load() }

// parkingLoop returns the event loop that idle connections park in,
// starting it at the first park; nil where there is none, or once
// Shutdown has begun.
func (s *Server) parkingLoop() *eventLoop {
	if l := s.evloop.Load(); l != nil {
		return l
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shutdown || s.loopTried {
		return s.evloop.Load()
	}
	s.loopTried = true
	l := newEventLoop(s)
	if l != nil {
		s.evloop.Store(l)
	}
	return l
}

func (s *Server) forgetConn(c *conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dropLocked(c)
}

// Shutdown stops accepting and closes connections by their state, as
// net/http's Server.Shutdown does: a connection idle between requests is
// closed at once, after the requests whose bytes have already arrived; a
// request being read, and a reply being written, complete first. Pending
// waits are dropped: their clients see the connection close. If ctx ends
// first, Shutdown closes what remains and returns ctx's error.
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.beginShutdown(func(c *conn) { c.nudge() })
	finished := make(chan struct{})
	go func() {
		s.wg.Wait()
		close(finished)
	}()
	select {
	case <-finished:
		return err
	case <-ctx.Done():
		s.closeConns()
		return ctx.Err()
	}
}

// Clients reports how many client connections are open.
func (s *Server) Clients() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// Close stops accepting and closes every connection at once.
func (s *Server) Close() error {
	return s.beginShutdown(func(c *conn) { c.nc.Close() })
}

// beginShutdown closes the listeners and applies stop to every connection.
func (s *Server) beginShutdown(stop func(*conn)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.shutdown {
		s.shutdown = true
		close(s.done)
	}
	var errs []error
	for l := range s.listeners {
		if err := l.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
		delete(s.listeners, l)
	}
	for c := range s.conns {
		stop(c)
	}
	if l := s.evloop.Load(); l != nil {
		l.stop() // its parked connections go to goroutines that see the shutdown
	}
	return errors.Join(errs...)
}

func (s *Server) closeConns() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		c.nc.Close()
	}
}
