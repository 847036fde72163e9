package rendezvous

import (
	"context"
	"fmt"
	"time"

	"github.com/gorun/gorun/rendezvous/internal/jobstate"
)

// roundWatch is the goroutine that keeps one round alive from this node's
// side. Every HeartbeatInterval it
//   - adds 1 to this node's heartbeat counter,
//   - reads the counter of the next participant (in group-rank order, round
//     the ring), and supersedes the round if it stood still for
//     HeartbeatMisses intervals of this node's clock,
//   - reads the job's state, and ends the round's RoundInfo (closing
//     Changed) once the round is superseded.
//
// Watching one neighbour, not everyone, keeps a round's heartbeat traffic
// O(n) instead of O(n²), and still notices any death: unless every node is
// dead, some dead node follows a live one, and any death supersedes the
// round for all. Liveness is judged from counters only, never by comparing
// clocks of different hosts.
//
// It stops when it ends the round, or when stopped; it owns
// nothing but its ticker, and closes done when it returns.
type roundWatch struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// startWatch starts watching round ri, which st opened.
func (d *Dynamic) startWatch(ri *RoundInfo, st jobstate.State) *roundWatch {
	ctx, cancel := context.WithCancel(d.life)
	w := &roundWatch{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		d.watchRound(ctx, ri, st)
	}()
	return w
}

// stopWatchLocked stops watching the current round, if this node does,
// and waits for the goroutine. d.mu is held: the goroutine never takes it.
func (d *Dynamic) stopWatchLocked() {
	if d.watch != nil {
		d.watch.cancel()
		<-d.watch.done
		d.watch = nil
	}
}

func (d *Dynamic) watchRound(ctx context.Context, ri *RoundInfo, st jobstate.State) {
	o, window := d.opts, d.window()
	var next *place
	if ri.GroupWorldSize > 1 {
		next = &ri.next
	}
	// The next node's counter, and when this node last saw it change.
	lastBeat, lastChange := int64(-1), o.Now()
	// When the store began to fail every tick; zero while it answers.
	var failingSince time.Time

	tick := func() (reason string, err error) {
		beatCtx, cancel := ctx, context.CancelFunc(func() {})
		if o.HeartbeatTimeout > 0 {
			beatCtx, cancel = context.WithTimeout(ctx, o.HeartbeatTimeout)
		}
		_, err = d.beats.Add(beatCtx, heartbeatKey(o.NodeID), 1)
		cancel()
		if err != nil {
			return "", err
		}
		if next != nil {
			beat, err := d.beats.Add(ctx, heartbeatKey(next.Next), 0)
			if err != nil {
				return "", err
			}
			switch now := o.Now(); {
			case beat != lastBeat:
				lastBeat, lastChange = beat, now
			case now.Sub(lastChange) >= window:
				reason := fmt.Sprintf("node %s on %s missed %d heartbeats", next.Next, next.NextHost, o.HeartbeatMisses)
				d.log.Warn().Int("round", st.Round).Str("dead", next.Next).Msg(reason)
				if _, err := d.beats.advance(ctx, st, st.Superseded(), reason); err != nil {
					return "", err
				}
			}
		}
		cur, err := d.beats.state(ctx)
		if err != nil || cur == st {
			return "", err
		}
		return d.beats.reason(ctx, st.Round, cur, d.poll), nil
	}

	ticker := time.NewTicker(o.HeartbeatInterval)
	defer ticker.Stop()
	for {
		reason, err := tick()
		switch {
		case ctx.Err() != nil:
			return
		case reason != "":
			d.log.Info().Int("round", st.Round).Str("reason", reason).Msg("round superseded")
			ri.end(reason)
			return
		case err == nil:
			failingSince = time.Time{}
		case failingSince.IsZero():
			failingSince = o.Now()
			fallthrough
		default:
			d.log.Warn().Err(err).Int("round", st.Round).Msg("heartbeat failed")
			// Past a heartbeat window, the others count this node dead:
			// its round is over, and the agent should hear of it.
			if o.Now().Sub(failingSince) >= window {
				ri.end(fmt.Sprintf("lost the rendezvous store: %v", err))
				return
			}
		}
		if d.ownBeats {
			// The heartbeats' own connection can block: hear of a new
			// round at once, not at the next heartbeat. A failed wait
			// falls back on the ticker, lest it spin.
			_, _, err := d.beats.await(ctx, roundKey(st.Round, "superseded"), o.HeartbeatInterval)
			if err == nil {
				continue
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}
