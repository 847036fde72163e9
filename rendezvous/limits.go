package rendezvous

import (
	"container/list"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
)

// ErrOverBudget refuses a client request that would take the store past
// its memory budget (ServerOptions.MaxMemory). The server closes that
// client's connection; every other client goes on.
var ErrOverBudget = errors.New("rendezvous: store memory budget exceeded")

// Default resource limits of a Server, shared by all its clients.
const (
	// DefaultMaxConns bounds open client connections. A torch 1.13 client
	// holds two, a torch 2.x client one: a job of 100K ranks fits. The
	// descriptors' reserve and the memory budget bound them too, and
	// usually first.
	DefaultMaxConns = 1 << 17
	// DefaultMaxHandshakes bounds connections that have not yet sent a
	// valid first request; past it the oldest of them is closed.
	DefaultMaxHandshakes = 1024
	// DefaultHandshakeTimeout is how long a new connection may take to
	// send a valid first request.
	DefaultHandshakeTimeout = 10 * time.Second
	// DefaultIdleTimeout is how long a connection holding nothing must
	// have been idle before it may be closed to make room for a new one.
	DefaultIdleTimeout = time.Minute
	// DefaultMaxMemory is the memory budget for keys, values, waiters,
	// watches, connection buffers and requests being read.
	DefaultMaxMemory = 1 << 30
	// DefaultFDReserve is how many of the process's file descriptors the
	// server leaves to the rest of it (at most a quarter of the limit).
	DefaultFDReserve = 1024
)

// Costs charged to the memory budget beside the bytes of keys and values:
// estimates of Go's overhead, generous so that the budget bounds the heap.
const (
	connCost      = 2*connBufferSize + 4<<10 // buffers while busy, a waiting goroutine's stack, state
	entryCost     = 64                       // a map entry and a slice header
	waiterCost    = 96
	waitNodeCost  = 64
	watcherCost   = watchBacklog * 56 // the event channel's buffer
	keyHeaderCost = 16                // a string header in a request's key list
	// largeWrite is the size past which a write may not use the budget's
	// headroom: giant values cannot crowd out small rendezvous keys.
	largeWrite = 64 << 10
)

// budget counts the bytes the store holds or is reading, against a limit.
// Requests from clients reserve before they allocate and are refused when
// they would not fit; the in-process store is charged but never refused.
type budget struct {
	limit    int64 // <= 0: unlimited
	headroom int64 // kept for writes of at most largeWrite bytes
	used     atomic.Int64
	peak     atomic.Int64
}

func newBudget(limit int64) *budget {
	return &budget{limit: limit, headroom: limit / 8}
}

// reserve charges n bytes if they fit, large ones leaving the headroom.
func (b *budget) reserve(n int64, large bool) bool {
	if b == nil || n <= 0 {
		return true
	}
	if b.limit <= 0 {
		b.force(n)
		return true
	}
	max := b.limit
	if large {
		max -= b.headroom
	}
	for {
		u := b.used.Load()
		if u+n > max {
			return false
		}
		if b.used.CompareAndSwap(u, u+n) {
			b.notePeak(u + n)
			return true
		}
	}
}

// force charges n bytes (or credits -n) whatever the limit.
func (b *budget) force(n int64) {
	if b == nil || n == 0 {
		return
	}
	b.notePeak(b.used.Add(n))
}

func (b *budget) release(n int64) { b.force(-n) }

func (b *budget) notePeak(v int64) {
	for {
		p := b.peak.Load()
		if v <= p || b.peak.CompareAndSwap(p, v) {
			return
		}
	}
}

// Reasons a Server refuses, the keys of ServerStats.Refused.
const (
	RefusedBudget    = "budget"     // requests and connections past the memory budget
	RefusedCaps      = "caps"       // connections past MaxConns, none to close in their place
	RefusedFDReserve = "fd_reserve" // connections within the file descriptors' reserve
)

// ServerStats are a Server's resource figures since it started.
type ServerStats struct {
	Conns           int   // client connections open now
	PeakConns       int   // most connections open at once
	Memory          int64 // bytes charged to the memory budget now
	PeakMemory      int64 // most bytes charged at once
	RefusedRequests int64 // requests refused for the memory budget
	RefusedConns    int64 // connections closed at accept: caps, budget, descriptors
	EvictedConns    int64 // connections closed to make room for new ones
	TimedOutConns   int64 // connections closed for no valid first request in time
	// Requests counts the requests served, by operation ("get", "set",
	// ...); operations never asked are left out.
	Requests map[string]int64
	// Refused counts what was refused, by reason (Refused*): requests and
	// connections together.
	Refused map[string]int64
}

// Stats returns the server's resource figures.
func (s *Server) Stats() ServerStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return ServerStats{
		Conns:           len(s.conns),
		PeakConns:       s.peakConns,
		Memory:          s.budget.used.Load(),
		PeakMemory:      s.budget.peak.Load(),
		RefusedRequests: s.refusedRequests.Load(),
		RefusedConns:    s.refusedConns.Load(),
		EvictedConns:    s.evictedConns.Load(),
		TimedOutConns:   s.timedOutConns.Load(),
		Requests:        s.requestCounts(),
		Refused: map[string]int64{
			RefusedBudget:    s.refusedRequests.Load() + s.refusedConnsFor[refuseBudget].Load(),
			RefusedCaps:      s.refusedConnsFor[refuseCaps].Load(),
			RefusedFDReserve: s.refusedConnsFor[refuseFDs].Load(),
		},
	}
}

func (s *Server) requestCounts() map[string]int64 {
	m := make(map[string]int64)
	for o := range s.requests {
		if n := s.requests[o].Load(); n > 0 {
			m[op(o).String()] = n
		}
	}
	return m
}

// countRequest counts one request of o: the only cost of the figures on
// a request's path, one atomic add.
func (s *Server) countRequest(o op) {
	if int(o) < len(s.requests) {
		s.requests[o].Add(1)
	}
}

// Why a connection was refused at accept.
type refuseReason int

const (
	refuseBudget refuseReason = iota
	refuseCaps
	refuseFDs
	refuseReasons
)

var refuseText = [refuseReasons]string{
	refuseBudget: "memory budget exhausted",
	refuseCaps:   "connection cap reached",
	refuseFDs:    "file descriptors within the reserve",
}

// rateLimit lets through a burst of events, then one per interval; it
// counts what it held back so that the next event let through can say so.
type rateLimit struct {
	burst    int
	interval time.Duration

	mu         sync.Mutex
	tokens     int
	last       time.Time
	suppressed int
}

// allow reports whether an event at now may be logged, and how many were
// suppressed since the last one that was.
func (r *rateLimit) allow(now time.Time) (bool, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.last.IsZero() {
		r.tokens, r.last = r.burst, now
	}
	if gained := int(now.Sub(r.last) / r.interval); gained > 0 {
		r.tokens = min(r.burst, r.tokens+gained)
		r.last = r.last.Add(time.Duration(gained) * r.interval)
	}
	if r.tokens == 0 {
		r.suppressed++
		return false, 0
	}
	r.tokens--
	n := r.suppressed
	r.suppressed = 0
	return true, n
}

// peerLimit lets one event per peer through per interval.
type peerLimit struct {
	interval time.Duration

	mu   sync.Mutex
	last map[string]time.Time
}

func (p *peerLimit) allow(peer string, now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.last == nil {
		p.last = make(map[string]time.Time)
	}
	if t, ok := p.last[peer]; ok && now.Sub(t) < p.interval {
		return false
	}
	if len(p.last) >= 4096 { // many peers: forget the stale ones
		for k, t := range p.last {
			if now.Sub(t) >= p.interval {
				delete(p.last, k)
			}
		}
	}
	p.last[peer] = now
	return true
}

// guard holds a Server's resource limits, what they count, and their
// figures. Fields without their own synchronisation are guarded by
// Server.mu.
type guard struct {
	budget           *budget
	maxConns         int // <= 0: none
	maxHandshakes    int // <= 0: none
	handshakeTimeout time.Duration
	idleTimeout      time.Duration // < 0: never evict an idle connection
	fds              fdGauge

	peakConns   int
	handshaking *list.List // connections without a valid request yet, oldest first

	refusedRequests atomic.Int64
	refusedConns    atomic.Int64
	evictedConns    atomic.Int64
	timedOutConns   atomic.Int64
	refusedConnsFor [refuseReasons]atomic.Int64
	requests        [len(opNames)]atomic.Int64

	badFrameLog rateLimit // protocol violations
	acceptLog   rateLimit // connections refused at accept
	refusalLog  peerLimit // requests refused for the budget, per peer
}

// orDefault resolves an option: zero is def, a negative value none (0).
func orDefault[T int | int64 | time.Duration](v, def T) T {
	switch {
	case v == 0:
		return def
	case v < 0:
		return 0
	}
	return v
}

func newGuard(opts ServerOptions, lim limits) guard {
	idle := opts.IdleTimeout
	if idle == 0 {
		idle = DefaultIdleTimeout
	}
	reserve := opts.FDReserve
	if reserve == 0 {
		reserve = -DefaultFDReserve // the default, capped by the limit
	}
	return guard{
		budget:           newBudget(orDefault(opts.MaxMemory, DefaultMaxMemory)),
		maxConns:         orDefault(opts.MaxConns, DefaultMaxConns),
		maxHandshakes:    orDefault(opts.MaxHandshakes, DefaultMaxHandshakes),
		handshakeTimeout: orDefault(opts.HandshakeTimeout, DefaultHandshakeTimeout),
		idleTimeout:      idle,
		fds:              fdGauge{reserve: reserve, off: opts.FDReserve < 0},
		handshaking:      list.New(),
		badFrameLog:      rateLimit{burst: 20, interval: time.Second},
		acceptLog:        rateLimit{burst: 5, interval: 10 * time.Second},
		refusalLog:       peerLimit{interval: time.Minute},
	}
}

// admitLocked decides whether a new connection is served, closing older
// ones to make room where the limits allow, and charges it. The caller
// holds s.mu and closes a connection refused.
//
// Over MaxHandshakes, only a handshake silent for half the handshake
// timeout makes room: when thousands of ranks connect at once, the oldest
// may have its first request in its socket, unread by a reader not yet
// scheduled, or be a client that connected a moment ago and has not
// written yet (its own process as busy). The new connection is admitted all the same. At
// the connection cap any silent handshake gives way, then the longest
// idle connection; a client that has spoken is never closed for a new one.
func (s *Server) admitLocked(c *conn) bool {
	if s.maxHandshakes > 0 && s.handshaking.Len() >= s.maxHandshakes {
		s.evictLocked(s.silentHandshakeLocked(s.silentAge()))
	}
	atCap := s.maxConns > 0 && len(s.conns) >= s.maxConns
	if atCap || s.fds.full(len(s.conns)) {
		victim := s.silentHandshakeLocked(0)
		if victim == nil {
			victim = s.longestIdleLocked()
		}
		if victim == nil {
			reason := refuseFDs
			if atCap {
				reason = refuseCaps
			}
			s.refuseConnLocked(c, reason)
			return false
		}
		s.evictLocked(victim)
	}
	if !s.budget.reserve(connCost, false) {
		s.refuseConnLocked(c, refuseBudget)
		return false
	}
	if s.handshakeTimeout > 0 {
		_ = c.nc.SetReadDeadline(time.Now().Add(s.handshakeTimeout))
	}
	c.opened = time.Now()
	c.handshake = s.handshaking.PushBack(c)
	s.peakConns = max(s.peakConns, len(s.conns)+1)
	return true
}

func (s *Server) refuseConnLocked(c *conn, reason refuseReason) {
	s.refusedConns.Add(1)
	s.refusedConnsFor[reason].Add(1)
	if ok, suppressed := s.acceptLog.allow(time.Now()); ok {
		c.logAt(zerolog.WarnLevel).Str("reason", refuseText[reason]).Int("conns", len(s.conns)).Int("suppressed", suppressed).
			Msg("refusing a store connection")
	}
}

// evictLocked closes v to make room; its goroutine then finds it closed.
func (s *Server) evictLocked(v *conn) {
	if v == nil {
		return
	}
	s.evictedConns.Add(1)
	v.nc.Close()
	s.dropLocked(v)
}

// dropLocked forgets c and its charge; it may run twice for one conn.
func (s *Server) dropLocked(c *conn) {
	if _, ok := s.conns[c]; !ok {
		return
	}
	delete(s.conns, c)
	s.leaveHandshakesLocked(c)
	s.budget.release(connCost)
}

// handshook takes c out of the connections still to send a valid request.
func (s *Server) handshook(c *conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.leaveHandshakesLocked(c)
}

func (s *Server) leaveHandshakesLocked(c *conn) {
	if c.handshake != nil {
		s.handshaking.Remove(c.handshake)
		c.handshake = nil
	}
}

// silentAge is how long a connection may send nothing before it counts as
// silent over MaxHandshakes: half the handshake timeout. A rank's client
// writes its first request as soon as it connects, but on a loaded machine
// with thousands connecting at once, a second after the server accepted
// it is not yet "at once".
func (s *Server) silentAge() time.Duration {
	if s.handshakeTimeout > 0 {
		return s.handshakeTimeout / 2
	}
	return DefaultHandshakeTimeout / 2
}

// silentHandshakeLocked returns the oldest connection still to send a
// valid request if it has been open at least minAge and nothing waits in
// its socket (one with bytes there has a reader the scheduler has not run
// yet), else nil.
func (s *Server) silentHandshakeLocked(minAge time.Duration) *conn {
	e := s.handshaking.Front()
	if e == nil {
		return nil
	}
	c := e.Value.(*conn)
	if time.Since(c.opened) < minAge || hasInput(c.nc) {
		return nil
	}
	return c
}

// longestIdleLocked returns the connection idle longest, holding nothing,
// if it has been idle for the idle timeout.
func (s *Server) longestIdleLocked() *conn {
	if s.idleTimeout < 0 {
		return nil
	}
	now := time.Now()
	var victim *conn
	var longest time.Duration
	for c := range s.conns {
		// A request already in the socket makes it busy, not idle: its
		// reader has only not been scheduled yet.
		if d, ok := c.idleFor(now); ok && d >= s.idleTimeout && d > longest && !hasInput(c.nc) {
			victim, longest = c, d
		}
	}
	return victim
}

// fdGauge tells when the process's open files come within a reserve of
// its RLIMIT_NOFILE. It counts the process's descriptors (a directory
// read) every 64 accepts or once the connections grew by half, whichever
// is more, and whenever the estimate from its connection count comes near,
// not at every accept. Guarded by Server.mu.
type fdGauge struct {
	reserve    int  // negative: -default, capped at a quarter of the limit
	off        bool // no reserve
	other      int  // descriptors not the server's at the last count
	sinceCount int  // accepts since that count
}

// full reports whether a new connection, beside conns, would leave fewer
// than the reserve; the new connection's descriptor is already open.
func (g *fdGauge) full(conns int) bool {
	if g.off {
		return false
	}
	limit := fdLimit()
	if limit <= 0 {
		return false
	}
	reserve := g.reserve
	if reserve < 0 {
		reserve = min(-reserve, limit/4)
	}
	// Counting reads a directory of every descriptor: done every 64
	// accepts it made accepting 16K connections quadratic (half the
	// server's time), so it is done once the connections grew by a
	// half since the last count, or at each accept near the limit.
	g.sinceCount++
	if g.sinceCount < max(64, conns/2) && conns+1+g.other < limit-2*reserve {
		return false
	}
	g.sinceCount = 0
	n, err := countFDs()
	if err != nil {
		return conns+1+g.other > limit-reserve
	}
	g.other = max(n-conns-1, 0)
	return n > limit-reserve
}
