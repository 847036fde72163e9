package collective

import (
	"net"
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
}

// restLimit bounds how long a connection stays unarmed.
const restLimit = 100 * time.Millisecond

func newPoller(t *transport) (*poller, error) {
	set, err := newPollSet()
	if err != nil {
		return nil, err
	}
	return &poller{t: t, set: set}, nil
}

// add starts watching ic, unless the transport's close dropped it first.
func (p *poller) add(ic *inConn) error {
	ic.mu.Lock()
	defer ic.mu.Unlock()
	if ic.closed {
		return ErrClosed
	}
	return p.set.add(ic.fd, pollKey(ic))
}

// pollKey names ic in the poll set: its sender and lane.
func pollKey(ic *inConn) int { return ic.src*maxStreams + ic.lane }

// arm asks for ic's next readiness event; one pending now comes at once.
// ic.mu is held, so that a closed descriptor, whose number may have been
// reused, is never touched.
func (p *poller) arm(ic *inConn) {
	if !ic.closed {
		p.set.arm(ic.fd, pollKey(ic))
	}
}

// wake arms ic if the poller left it idle; if it holds back a frame it
// has read the header of, it reads on at once instead, since the socket
// may have nothing more to tell the poller. ic.mu must not be held.
func (p *poller) wake(ic *inConn) {
	if ic.idle.CompareAndSwap(true, false) {
		ic.mu.Lock()
		if ic.heldBack() {
			p.read(ic)
			return
		}
		p.arm(ic)
		ic.mu.Unlock()
	}
}

// wakeAll arms every idle connection: an op is about to park.
func (p *poller) wakeAll() {
	for i := range p.t.peers {
		for lane := range p.t.peers[i].in {
			if ic := p.t.peers[i].in[lane].Load(); ic != nil {
				p.wake(ic)
			}
		}
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
			// Never seen; the sweep below still reads what comes.
			p.t.log.Error().Err(err).Msg("waiting for sockets failed")
			time.Sleep(time.Millisecond)
		}
		for _, key := range ready {
			if ic := p.t.peers[key/maxStreams].in[key%maxStreams].Load(); ic != nil {
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
	p.read(ic)
}

// read pumps ic and releases ic.mu, which the caller holds: it re-arms
// ic, or leaves it idle while it holds a frame back, or retires it.
func (p *poller) read(ic *inConn) {
	if ic.closed {
		ic.mu.Unlock()
		return
	}
	switch err := ic.pump(); err {
	case errWouldBlock:
		p.arm(ic)
		ic.mu.Unlock()
	case errHeldBack:
		// Armed, a readable socket would wake us at once, again and
		// again. A receive posted for this peer reads it (its op spins
		// on it, or parks, which wakes every idle connection), and so
		// does the sweep.
		ic.idle.Store(true)
		ic.mu.Unlock()
	default:
		ic.retire(err)
	}
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

// drop stops watching ic and closes its socket, reporting whether it
// was open; a receive being filled fails. ic.mu is held.
func (p *poller) drop(ic *inConn) bool {
	if ic.closed {
		return false
	}
	p.set.remove(ic.fd)
	unix.Close(ic.fd)
	ic.closed = true
	if ic.err == nil {
		ic.fail(net.ErrClosed)
	}
	return true
}

// interrupt makes run see that the transport closed.
func (p *poller) interrupt() { p.set.interrupt() }

// shut closes every socket and the poller's own descriptors. The
// transport is closed: no connection is added after.
func (p *poller) shut() {
	for i := range p.t.peers {
		for lane := range p.t.peers[i].in {
			if ic := p.t.peers[i].in[lane].Load(); ic != nil {
				ic.mu.Lock()
				p.drop(ic)
				ic.mu.Unlock()
			}
		}
	}
	p.set.close()
}
