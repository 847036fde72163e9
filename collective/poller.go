package collective

import (
	"sync"
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

	mu    sync.Mutex
	conns map[int]*inConn // by sender's world rank
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
	p.conns[ic.src] = ic
	p.mu.Unlock()
	if err := p.set.add(ic.fd, ic.src); err != nil {
		p.mu.Lock()
		delete(p.conns, ic.src)
		p.mu.Unlock()
		return err
	}
	return nil
}

// arm asks for ic's next readiness event; one pending now comes at once.
func (p *poller) arm(ic *inConn) { p.set.arm(ic.fd, ic.src) }

// wake arms ic if the poller left it idle.
func (p *poller) wake(ic *inConn) {
	if ic.idle.CompareAndSwap(true, false) {
		p.arm(ic)
	}
}

// wakeAll arms every idle connection: an op is about to park.
func (p *poller) wakeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, ic := range p.conns {
		p.wake(ic)
	}
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
			p.t.log.Error().Err(err).Msg("waiting for sockets failed; incoming frames are read by ops only")
			return
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
	err := errWouldBlock
	if !ic.closed {
		err = ic.pump()
	}
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
func (p *poller) rest(ic *inConn) {
	ic.idle.Store(true)
	if ic.spinners.Load() == 0 {
		p.wake(ic)
	}
}

// drop stops watching ic and closes its socket; ic.mu is held.
func (p *poller) drop(ic *inConn) {
	p.mu.Lock()
	if p.conns[ic.src] == ic {
		delete(p.conns, ic.src)
	}
	p.mu.Unlock()
	if !ic.closed {
		p.set.remove(ic.fd)
		unix.Close(ic.fd)
		ic.closed = true
	}
}

// interrupt makes run see that the transport closed.
func (p *poller) interrupt() { p.set.interrupt() }

// shut closes every socket and the poller's own descriptors.
func (p *poller) shut() {
	p.mu.Lock()
	conns := make([]*inConn, 0, len(p.conns))
	for _, ic := range p.conns {
		conns = append(conns, ic)
	}
	p.mu.Unlock()
	for _, ic := range conns {
		ic.mu.Lock()
		p.drop(ic)
		ic.mu.Unlock()
	}
	p.set.close()
}
