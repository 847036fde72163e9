package collective

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"time"
)

// Waiting for a peer's counter in shared memory. Ranks that keep pace
// answer within a microsecond or two, so a waiter first polls the word
// alone (pollsFor). What it does next depends on whether the ranks may
// have to take turns on cores (crowded):
//
//   - Crowded (ranks that may share a core: not bound, bound several to
//     a core, or goroutines of one process): the peer may be off its core
//     until we give ours away, so the waiter keeps looking for up to
//     shmSpin but yields the core between looks. A futex round trip (a
//     system call to sleep, one to wake, and the scheduler's delay
//     between them) costs more than the blocks of a pipelined collective
//     take. Unbound beside a busy process, yielding is what lets the
//     kernel run the peer on our core: a 64 KiB all_gather of 2 unbound
//     ranks on 2 cores took 14 us yielding, 66 polling.
//   - Not crowded: every rank is bound to cores of its own, and a yield
//     cannot help the peer; it only hands our core to whatever else is
//     runnable there. The kernel's scheduler makes a task that yields
//     wait out the next one's whole time slice (milliseconds): with one
//     busy process beside 2 ranks bound to 2 cores, yielding made a
//     64 KiB all_gather take 1.4 ms instead of 7 us, where Open MPI,
//     which polls without yielding, took 10 us. So the waiter polls for
//     up to shmSpin, as Open MPI does, and no longer.
//
// Either way it then sleeps on a futex, which the peer's signal wakes
// (and which frees the core for the peer when the kernel put both on
// one). Every shmCheckEvery looks, and at least every shmNap asleep, it
// notices what no counter shows: the communicator failed, the context
// ended, the peer's sockets closed (it died), or the peer published a
// different call.
const (
	shmSpin       = 2 * time.Millisecond
	shmCheckEvery = 32
	shmNap        = 20 * time.Millisecond
	// shmPollsPerLook is how many times an uncrowded waiter polls the
	// word between two looks (where a crowded one yields).
	shmPollsPerLook = 64
)

// Polls before the first yield. When every rank on the host has a core,
// the peer is running and answers within the polls; when ranks outnumber
// cores, the peer may be off its core until we yield ours. Measured on 2
// cores with 4 ranks (medians of 5 to 8 runs): 2000 polls made an
// 8-byte all_reduce take 8.8 us, an all_gather 9.7 and an all_to_all 18;
// 100 polls, 6.3, 6.7 and 9.8. With 2 ranks, 2000 polls kept the 8-byte
// all_reduce at 2.6 us, 100 gave 3.2.
const (
	shmPolls        = 2000
	shmPollsCrowded = 100
)

// crowded says whether the ranks sharing a host may have to take turns
// on a core: unless each is bound to cores of its own (apart), they may,
// and goroutines of one process (tests) do, on the Go scheduler's Ps.
func crowded(apart, goroutines bool) bool { return goroutines || !apart }

// pollsFor returns the polls before the first yield for ranks sharing
// a host of cpus cores.
func pollsFor(ranks, cpus int) int {
	if ranks > cpus {
		return shmPollsCrowded
	}
	return shmPolls
}

// awaitShared waits until peer's counter word reaches stamp; current
// says the stamp is one of this op's blocks (not a slot's previous use).
func (o *op) awaitShared(peer int, word *atomic.Uint32, stamp uint32, current bool) error {
	return o.awaitSharedSince(peer, word, stamp, current, time.Time{})
}

// awaitSharedSince is awaitShared for a waiter that has been spinning
// since spun (firstWritten), or not at all (zero): it does not poll
// afresh, and spins only what is left of shmSpin.
func (o *op) awaitSharedSince(peer int, word *atomic.Uint32, stamp uint32, current bool, spun time.Time) error {
	if spun.IsZero() {
		for range o.c.shm.polls {
			if reached(word.Load(), stamp) {
				return o.checkSharedPeer(peer, current)
			}
		}
		o.handoff() // nobody drives our sockets while we wait here
		spun = time.Now()
	} else if reached(word.Load(), stamp) {
		return o.checkSharedPeer(peer, current)
	}
	s := o.c.shm
	region := &s.regions[peer]
	o.c.waitingOn.Store(int32(peer))
	defer o.c.waitingOn.Store(-1)
	start := spun
	sleeping := false
	for i := 1; ; i++ {
		if sleeping || i%shmCheckEvery == 0 {
			if err := o.checkPeerAlive(peer); err != nil {
				// A peer may signal and close at once (a rank that
				// returns from its last call and exits): its signal
				// counts, as it would had we looked a moment earlier.
				if reached(word.Load(), stamp) {
					return o.checkSharedPeer(peer, current)
				}
				return err
			}
			if err := o.checkSharedPeer(peer, false); err != nil {
				return err
			}
			sleeping = sleeping || time.Since(start) >= shmSpin
		}
		switch {
		case sleeping:
			o.handoffSending()
			region.sleepers.Add(1)
			if v := word.Load(); !reached(v, stamp) {
				futexWait(word, v, shmNap)
			}
			region.sleepers.Add(^uint32(0)) // minus one
		case s.crowded:
			o.driveSending()
			o.yieldFor(peer)
		default:
			o.driveSending()
			for range shmPollsPerLook {
				if reached(word.Load(), stamp) {
					break
				}
			}
		}
		if reached(word.Load(), stamp) {
			return o.checkSharedPeer(peer, current)
		}
	}
}

// driveSending writes what the op named in o.sending has queued, as far
// as its sockets take it now, as that op would while it waited on them.
func (o *op) driveSending() {
	if o.sending != nil {
		o.sending.drive()
	}
}

// handoffSending hands what the op named in o.sending has queued to the
// writer goroutines: the wait goes to sleep, and nobody would write it.
func (o *op) handoffSending() {
	if o.sending != nil {
		o.sending.handoff()
	}
}

// yieldFor gives the core away for a moment to whatever peer must run
// for us to go on.
func (o *op) yieldFor(peer int) {
	if o.c.shm.inProcess[peer] {
		runtime.Gosched() // the peer is a goroutine
		return
	}
	// Not runtime.Gosched: it wakes an idle P's thread to look for work,
	// which on a machine with few cores takes one from a peer. The
	// transport's goroutines run on the other Ps, or on this one once we
	// sleep.
	yieldProcessor()
}

// checkPeerAlive fails the op when waiting for peer is hopeless: the
// communicator failed, the context is done, or the peer is gone.
func (o *op) checkPeerAlive(peer int) error {
	select {
	case <-o.c.failed:
		return o.c.failure()
	default:
	}
	if o.ctx.Err() != nil {
		return o.timedOut("waiting for", []int{peer})
	}
	if err := o.c.t.peerGone(o.c.world[peer]); err != nil {
		return &PeerError{Rank: peer, Op: o.label(), Err: err}
	}
	return nil
}

// checkSharedPeer fails the op when peer published another call than
// ours for this sequence number. With arrived, the peer has signalled
// this op's data, so it must have published this very call.
func (o *op) checkSharedPeer(peer int, arrived bool) error {
	s := o.c.shm
	if s.checked[peer] {
		return nil
	}
	theirs, ok := s.lookup(peer, o.hdr.seq)
	switch {
	case ok && theirs == o.hdr:
		s.checked[peer] = true
	case ok:
		e := &MismatchError{Viewer: o.c.rank, RankA: o.c.rank, RankB: peer, hdrA: o.hdr, hdrB: theirs}
		e.fill()
		return e
	case arrived && s.movedOn(peer, o.hdr.seq):
		// The peer has published shmHistory calls since, overwriting this
		// one's entry: it signalled our block, then went on with calls
		// that need nobody (a broadcast root's over sockets, which
		// GORUN_ALGO can force). Those calls' frames are checked on the
		// sockets; this one can no longer be.
		s.checked[peer] = true
	case arrived:
		return &PeerError{Rank: peer, Op: o.label(), Err: fmt.Errorf("%w: it signalled data in shared memory for another call", ErrMismatch)}
	}
	return nil
}
