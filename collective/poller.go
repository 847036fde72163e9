package collective

import (
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// poller reads incoming connections that no op is reading: one goroutine
// in epoll_wait on an epoll set of our own. Each connection is armed for
// one readiness event at a time (EPOLLONESHOT) and re-armed after it is
// read dry, except while ops spin on it: they read it themselves, and an
// armed socket would wake this goroutine's thread for every frame. Such
// a connection stays unarmed (idle) until an op parks (transport.parked:
// a parked op needs someone else to read its frames, and a peer blocked
// on a full socket to us might be what it waits for), or restLimit
// passes, so that a frame no op waits for (a peer's query) is not left
// unread for long.
type poller struct {
	t   *transport
	set *pollSet // the descriptors and their arming (epoll on Linux)

	// Lock order: an inConn's mu before mu, never the other way.
	mu     sync.Mutex
	conns  map[int]*inConn // by sender's world rank
	closed bool            // shut: no socket is added
	// list is conns as a slice, replaced whole when conns changes, so
	// that parking ops walk it without a lock or an allocation.
	list atomic.Pointer[[]*inConn]
}

// restLimit bounds how long a connection stays unarmed.
const restLimit = 100 * time.Millisecond

func newPoller(t *transport) (*poller, error) {
	set, err := newPollSet()
	if err != nil {
		return nil, err
	}
	return &poller{t: t, set: set, conns: make(map[int]*inConn)}, nil
}

// add starts watching ic.
func (p *poller) add(ic *inConn) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	if err := p.set.add(ic.fd, ic.src); err != nil {
		return err
	}
	p.conns[ic.src] = ic
	p.relist()
	return nil
}

// relist rebuilds list from conns; mu is held.
func (p *poller) relist() {
	list := make([]*inConn, 0, len(p.conns))
	for _, ic := range p.conns {
		list = append(list, ic)
	}
	p.list.Store(&list)
}

// arm asks for ic's next readiness event; one pending now comes at once.
// ic.mu is held, so that a closed descriptor, whose number may have been
// reused, is never touched.
func (p *poller) arm(ic *inConn) {
	if !ic.closed {
		p.set.arm(ic.fd, ic.src)
	}
}

// wake arms ic if the poller left it idle. ic.mu must not be held.
func (p *poller) wake(ic *inConn) {
	if ic.idle.CompareAndSwap(true, false) {
		ic.mu.Lock()
		p.arm(ic)
		ic.mu.Unlock()
	}
}

// wakeAll arms every idle connection: an op is about to park.
func (p *poller) wakeAll() {
	for _, ic := range p.snapshot() {
		p.wake(ic)
	}
}

func (p *poller) snapshot() []*inConn {
	if list := p.list.Load(); list != nil {
		return *list
	}
	return nil
}

// run serves readiness events until the transport closes.
func (p *poller) run() {
	defer p.t.wg.Done()
	ready := make([]int, 0, 64)
	lastSweep := time.Now()
	for {
		var err error
		ready, err = p.set.wait(ready[:0], restLimit)
		select {
		case <-p.t.done:
			p.shut()
			return
		default:
		}
		if err != nil {
			// Never seen; the sweep below still reads what comes.
			p.t.log.Error().Err(err).Msg("waiting for sockets failed")
			time.Sleep(time.Millisecond)
		}
		for _, src := range ready {
			p.mu.Lock()
			ic := p.conns[src]
			p.mu.Unlock()
			if ic != nil {
				p.service(ic)
			}
		}
		if time.Since(lastSweep) >= restLimit {
			lastSweep = time.Now()
			p.wakeAll()
		}
	}
}

// service reads ic after a readiness event, and re-arms it, unless ops
// spin on it (they read it; it stays idle) or it failed (it is closed).
func (p *poller) service(ic *inConn) {
	if ic.spinners.Load() > 0 || !ic.mu.TryLock() && !p.missed(ic) {
		p.rest(ic)
		return
	}
	if ic.closed {
		ic.mu.Unlock()
		return
	}
	err := ic.pump()
	if err == errWouldBlock {
		p.arm(ic)
		ic.mu.Unlock()
		return
	}
	p.drop(ic)
	ic.mu.Unlock()
	p.t.lostIncoming(ic.src, err)
}

// missed records that mu was held, so that its holder reads again, and
// tries once more to take it.
func (p *poller) missed(ic *inConn) bool {
	ic.missed.Store(true)
	return ic.mu.TryLock()
}

// rest leaves ic unarmed, unless the ops spinning on it left meanwhile.
// ic.mu is not held.
func (p *poller) rest(ic *inConn) {
	ic.idle.Store(true)
	if ic.spinners.Load() == 0 {
		p.wake(ic)
	}
}

// drop stops watching ic and closes its socket; a receive being filled
// fails. ic.mu is held.
func (p *poller) drop(ic *inConn) {
	p.mu.Lock()
	if p.conns[ic.src] == ic {
		delete(p.conns, ic.src)
		p.relist()
	}
	p.mu.Unlock()
	if !ic.closed {
		p.set.remove(ic.fd)
		unix.Close(ic.fd)
		ic.closed = true
		if ic.err == nil {
			ic.fail(net.ErrClosed)
		}
	}
}

// interrupt makes run see that the transport closed.
func (p *poller) interrupt() { p.set.interrupt() }

// shut closes every socket and the poller's own descriptors.
func (p *poller) shut() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	for _, ic := range p.snapshot() {
		ic.mu.Lock()
		p.drop(ic)
		ic.mu.Unlock()
	}
	p.set.close()
}
