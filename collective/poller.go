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
	rd := ic.take()
	defer rd.give()
	if rd.closed {
		return ErrClosed
	}
	return p.set.add(ic.fd, pollKey(ic))
}

// pollKey names ic in the poll set: its sender and lane.
func pollKey(ic *inConn) int { return ic.src*maxStreams + ic.lane }

// arm asks for the next readiness event of rd's connection; one pending
// now comes at once. Only the token's holder arms, so that a closed
// descriptor, whose number may have been reused, is never touched.
func (p *poller) arm(rd *reader) {
	if !rd.closed {
		p.set.arm(rd.ic.fd, pollKey(rd.ic))
	}
}

// wake arms ic if the poller left it idle; if it holds back a frame it
// has read the header of, it reads on at once instead, since the socket
// may have nothing more to tell the poller. It waits for the read token,
// which the caller must not hold.
func (p *poller) wake(ic *inConn) {
	if ic.idle.CompareAndSwap(true, false) {
		rd := ic.take()
		if rd.heldBack() {
			p.read(rd)
			return
		}
		p.arm(rd)
		rd.give()
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
// When the read token is taken, its holder is an op that spins on ic, or
// it is held for a moment (wake, cut, add): rest leaves ic to the first,
// and waits for the second.
func (p *poller) service(ic *inConn) {
	if ic.spinners.Load() == 0 {
		if rd := ic.tryTake(); rd != nil {
			p.read(rd)
			return
		}
	}
	p.rest(ic)
}

// read pumps rd's connection and gives the token back: it re-arms the
// connection, or leaves it idle while it holds a frame back, or retires
// it.
func (p *poller) read(rd *reader) {
	if rd.closed {
		rd.give()
		return
	}
	switch err := rd.pump(); err {
	case errWouldBlock:
		p.arm(rd)
		rd.give()
	case errHeldBack:
		// Armed, a readable socket would wake us at once, again and
		// again. A receive posted for this peer reads it (its op spins
		// on it, or parks, which wakes every idle connection), and so
		// does the sweep.
		rd.ic.idle.Store(true)
		rd.give()
	default:
		rd.retire(err)
	}
}

// rest leaves ic unarmed, unless the ops spinning on it left meanwhile.
// The caller does not hold the read token.
func (p *poller) rest(ic *inConn) {
	ic.idle.Store(true)
	if ic.spinners.Load() == 0 {
		p.wake(ic)
	}
}

// drop stops watching rd's connection and closes its socket, reporting
// whether it was open; a receive being filled fails.
func (p *poller) drop(rd *reader) bool {
	if rd.closed {
		return false
	}
	p.set.remove(rd.ic.fd)
	unix.Close(rd.ic.fd)
	rd.closed = true
	if rd.err == nil {
		rd.fail(net.ErrClosed)
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
				rd := ic.take()
				p.drop(rd)
				rd.give()
			}
		}
	}
	p.set.close()
}
