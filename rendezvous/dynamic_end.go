package rendezvous

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gorun/gorun/rendezvous/internal/jobstate"
)

// errNoRound is returned by the calls that need a round before the first.
var errNoRound = errors.New("rendezvous: no round yet")

// current returns this node's round and the state that opened it.
func (d *Dynamic) current() (*RoundInfo, jobstate.State, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.round == nil {
		return nil, jobstate.State{}, errNoRound
	}
	return d.round, d.state, nil
}

// Done is the exit barrier: this node's workers all succeeded in the
// current round. It returns nil once every participant has said so (the
// last one to say so ends the job: later joins get ErrJobEnded), or
// ErrRoundChanged if the round is superseded first (re-rendezvous and
// run the workers again), or ErrJobFailed or ErrJobEnded as soon as the
// job is over, or an error naming how many nodes finished if timeout
// (when positive) passes first.
func (d *Dynamic) Done(ctx context.Context, timeout time.Duration) error {
	ctx, done, err := d.begin(ctx)
	if err != nil {
		return err
	}
	defer done()
	ri, st, err := d.current()
	if err != nil {
		return err
	}
	o, r, n := d.opts, st.Round, ri.GroupWorldSize
	finished, err := d.job.Add(ctx, roundKey(r, "done"), 1)
	if err != nil {
		return fmt.Errorf("rendezvous: exit barrier of round %d: %w", r, err)
	}
	if int(finished) >= n {
		if err := d.job.Set(ctx, roundKey(r, "complete"), nil); err != nil {
			return fmt.Errorf("rendezvous: exit barrier of round %d: %w", r, err)
		}
		// Even if the round was superseded meanwhile (a node came to
		// wait for a place), its work is done: so is the job.
		return d.endJob(ctx, st, fmt.Sprintf("job ended: all %d nodes finished round %d", n, r))
	}

	var deadline time.Time
	if timeout > 0 {
		deadline = o.Now().Add(timeout)
	}
	for {
		cur, err := d.job.state(ctx)
		if err != nil {
			return err
		}
		wait := d.poll
		if !deadline.IsZero() {
			wait = min(wait, deadline.Sub(o.Now()))
		}
		// After a change, look once more: the last node marks the barrier
		// complete before it ends the job.
		if cur != st {
			wait = 0
		}
		_, ok, err := d.job.await(ctx, roundKey(r, "complete"), wait)
		if err == nil && !ok && cur != st {
			ok, err = d.job.Check(ctx, []string{roundKey(r, "complete")})
		}
		switch {
		case err != nil:
			return fmt.Errorf("rendezvous: exit barrier of round %d: %w", r, err)
		case ok:
			return nil
		case cur.End != jobstate.Running:
			return d.overError(ctx, cur)
		case cur != st:
			return fmt.Errorf("%w: %s", ErrRoundChanged, d.job.reason(ctx, r, cur, d.poll))
		case !deadline.IsZero() && !o.Now().Before(deadline):
			finished, err := d.job.counter(ctx, roundKey(r, "done"))
			if err != nil {
				return fmt.Errorf("rendezvous: exit barrier timeout after %v in round %d: %w", timeout, r, err)
			}
			return fmt.Errorf("rendezvous: exit barrier timeout after %v: %d of %d nodes finished round %d", timeout, finished, n, r)
		}
	}
}

// Fail reports that this node's workers failed in the current round:
// report (one line of JSON, for Failures) is appended to the job's
// failures, and the round is superseded. The first failure of a round
// spends one restart of the job's budget, opening a round whose Restarts
// counts it; later ones in the same round, often the same fault seen by
// other nodes, spend nothing. restart is false when the budget is spent:
// the job has failed for everyone.
func (d *Dynamic) Fail(ctx context.Context, report []byte) (restart bool, err error) {
	ctx, done, err := d.begin(ctx)
	if err != nil {
		return false, err
	}
	defer done()
	_, st, err := d.current()
	if err != nil {
		return false, err
	}
	line := bytes.TrimRight(report, "\n")
	if bytes.ContainsRune(line, '\n') {
		return false, errors.New("rendezvous: a failure report must be one line")
	}
	if err := d.job.Append(ctx, keyFailures, append(bytes.Clone(line), '\n')); err != nil {
		return false, fmt.Errorf("rendezvous: record failure: %w", err)
	}

	o := d.opts
	to := st.AfterFailure(o.MaxRestarts)
	reason := to.FailureReason(o.NodeID, o.Host, o.MaxRestarts)
	cur, err := d.job.advance(ctx, st, to, reason)
	if err != nil {
		return false, fmt.Errorf("rendezvous: open the round after %d: %w", st.Round, err)
	}
	if cur == to {
		d.log.Info().Int("round", st.Round).Msg(reason)
	}
	switch cur.End {
	case jobstate.Failed:
		return false, nil
	case jobstate.Ended:
		return false, d.overError(ctx, cur)
	}
	return true, nil
}

// Weigh records that this node's workers failed in its current round and
// that it is weighing the failure before it reports it (Fail): waiting to
// hear whether a lost node caused it. A node that ends the job meanwhile
// waits for it in AwaitReports, since its report may hold the root cause.
// Call end once the failure is reported or dropped.
func (d *Dynamic) Weigh(ctx context.Context) (end func(), err error) {
	ctx, done, err := d.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	_, st, err := d.current()
	if err != nil {
		return nil, err
	}
	// Counted per round: a node that dies while weighing never ends it,
	// and must hold up no round but its own.
	key := roundKey(st.Round, keyWeighing)
	if _, err := d.job.Add(ctx, key, 1); err != nil {
		return nil, fmt.Errorf("rendezvous: record a failure being weighed: %w", err)
	}
	return func() {
		ctx, done, err := d.begin(context.Background())
		if err != nil {
			return
		}
		defer done()
		ctx, cancel := context.WithTimeout(ctx, d.opts.HeartbeatInterval)
		defer cancel()
		if _, err := d.job.Add(ctx, key, -1); err != nil {
			d.log.Warn().Err(err).Msg("could not record the end of weighing a failure; other nodes wait out their grace")
		}
	}, nil
}

// AwaitAlive waits until every other node of the current round has
// heartbeated twice since the call, and reports whether they all did
// before ctx ended: then no node of the round was lost when the call
// began. Twice, because one increment may have been on its way when a
// node died. It reports false too when the round's nodes or their
// heartbeats cannot be read: no news.
func (d *Dynamic) AwaitAlive(ctx context.Context) bool {
	nodes, err := d.Nodes(ctx)
	if err != nil {
		return false
	}
	ctx, done, err := d.begin(ctx)
	if err != nil {
		return false
	}
	defer done()
	// The heartbeat count each node not yet seen beating twice had when
	// first read; -1 until then.
	pending := make(map[string]int64, len(nodes))
	for _, n := range nodes {
		if n.ID != d.opts.NodeID {
			pending[n.ID] = -1
		}
	}
	// Poll well within an interval: the answer comes one poll after the
	// second beat.
	tick := time.NewTicker(d.opts.HeartbeatInterval / 10)
	defer tick.Stop()
	for {
		for id, first := range pending {
			beat, err := d.beats.Add(ctx, heartbeatKey(id), 0)
			switch {
			case err != nil:
				return false // ctx ended, or the store is gone
			case first < 0:
				pending[id] = beat
			case beat-first >= 2:
				delete(pending, id)
			}
		}
		if len(pending) == 0 {
			return true
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return false
		}
	}
}

// AwaitReports waits until no node is weighing a failure (see Weigh) of
// the round whose end failed the job (of the current round while the job
// runs), or timeout: a node that died while weighing never ends it.
func (d *Dynamic) AwaitReports(ctx context.Context, timeout time.Duration) error {
	ctx, done, err := d.begin(ctx)
	if err != nil {
		return err
	}
	defer done()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	st, err := d.job.state(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("rendezvous: count the failures being weighed: %w", err)
	}
	// An end opens the round after the last one (jobstate.State.Ending): the
	// reports that count are of the round it superseded.
	r := st.Round
	if st.End != jobstate.Running {
		r--
	}
	// Poll more often than d.poll, half a heartbeat: the job is over, and
	// its report waits on this.
	tick := time.NewTicker(min(d.opts.HeartbeatInterval, 50*time.Millisecond))
	defer tick.Stop()
	for {
		n, err := d.job.counter(ctx, roundKey(r, keyWeighing))
		switch {
		case err != nil && ctx.Err() != nil:
			return nil
		case err != nil:
			return fmt.Errorf("rendezvous: count the failures being weighed: %w", err)
		case n <= 0:
			return nil
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return nil
		}
	}
}

// Failures returns the failure reports of every node, oldest first.
func (d *Dynamic) Failures(ctx context.Context) ([][]byte, error) {
	ctx, done, err := d.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	if ok, err := d.job.Check(ctx, []string{keyFailures}); err != nil || !ok {
		return nil, err
	}
	all, err := d.job.Get(ctx, keyFailures)
	if err != nil {
		return nil, err
	}
	return bytes.Split(bytes.TrimSuffix(all, []byte("\n")), []byte("\n")), nil
}

// Shutdown ends the job for every node, as when it succeeded, its budget
// is spent, or the user aborts it: the current round is superseded and
// later joins fail with ErrJobEnded. Call Close afterwards.
func (d *Dynamic) Shutdown(ctx context.Context) error {
	ctx, done, err := d.begin(ctx)
	if err != nil {
		return err
	}
	defer done()
	st, err := d.job.state(ctx)
	if err == nil {
		err = d.endJob(ctx, st, fmt.Sprintf("job ended: node %s on %s shut it down", d.opts.NodeID, d.opts.Host))
	}
	if err != nil {
		return fmt.Errorf("rendezvous: shut down job %s: %w", d.opts.RunID, err)
	}
	return nil
}

// endJob moves the job from state st, or whichever follows, to its end,
// unless it is over already.
func (d *Dynamic) endJob(ctx context.Context, st jobstate.State, reason string) error {
	var err error
	// Each lost CompareSet means the state moved on; ctx bounds the race.
	for err == nil && st.End == jobstate.Running {
		st, err = d.job.advance(ctx, st, st.Ending(), reason)
	}
	return err
}

// Leave tells the other nodes, within ctx, that this one is going, so
// that none waits for it: it withdraws from a round that Next gave up
// joining, and supersedes its round if that is still current, so that the
// others go on without it at once. A node that hosts the store
// (HostsStore) ends the job instead, and voids the round being formed:
// the store goes with it, so the others cannot go on, and they learn at
// once that the job is over rather than lose the store under them. It
// stops the heartbeats, and closes Changed of this node's round; Close,
// afterwards, says nothing more to the store. Like Next, it is meant for
// the agent's loop, once no other call is in progress.
func (d *Dynamic) Leave(ctx context.Context) error {
	ctx, done, err := d.begin(ctx)
	if err != nil {
		return err
	}
	defer done()
	d.mu.Lock()
	if d.left {
		d.mu.Unlock()
		return nil
	}
	d.left = true
	d.mu.Unlock()
	return d.leave(ctx)
}

// leave is Leave without its bookkeeping, for Close as well.
func (d *Dynamic) leave(ctx context.Context) error {
	d.mu.Lock()
	ri, st, a := d.round, d.state, d.abandoned
	d.abandoned = nil
	d.stopWatchLocked()
	d.mu.Unlock()
	o := d.opts
	var err error
	switch {
	case o.HostsStore:
		err = d.endForAll(ctx)
	case a != nil:
		err = d.withdraw(ctx, a.st, a.idx)
	}
	if ri != nil && !ri.ended() {
		if !o.HostsStore {
			reason := fmt.Sprintf("node %s on %s left", o.NodeID, o.Host)
			to := st.Superseded()
			if cur, aerr := d.job.advance(ctx, st, to, reason); aerr != nil {
				err = errors.Join(err, fmt.Errorf("rendezvous: leave round %d: %w", st.Round, aerr))
			} else if cur == to {
				d.log.Info().Int("round", st.Round).Msg(reason)
			}
		}
		ri.end("this node left the rendezvous")
	}
	return err
}

// endForAll ends the job as its store's host leaves, unless it is over,
// and voids the round being formed, so that the nodes waiting for it to
// be decided wake and find the job over.
func (d *Dynamic) endForAll(ctx context.Context) error {
	st, err := d.job.state(ctx)
	if err != nil || st.End != jobstate.Running {
		return err
	}
	reason := fmt.Sprintf("job ended: node %s on %s, which hosts the store, left", d.opts.NodeID, d.opts.Host)
	if err := d.endJob(ctx, st, reason); err != nil {
		return fmt.Errorf("rendezvous: end job %s: %w", d.opts.RunID, err)
	}
	d.log.Info().Int("round", st.Round).Msg(reason)
	if _, err := d.job.decide(ctx, st.Round, 0); err != nil {
		return fmt.Errorf("rendezvous: void round %d: %w", st.Round, err)
	}
	return nil
}

// Close leaves the rendezvous, as Leave does within CloseTimeout unless
// Leave was called, and closes the stores. It does not end the job
// (Shutdown does) unless this node hosts the store: if this node's round
// is still current, it opens the next one so that the other nodes go on
// without it at once (unlike torch's, where one agent's exit closes the
// rendezvous for all). Calls in progress return ErrHandlerClosed; Close
// waits for them and for the heartbeats to stop, and closes Changed of
// this node's round.
func (d *Dynamic) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	left := d.left
	d.mu.Unlock()
	d.quit()
	d.ops.Wait()

	var err error
	if left {
		d.mu.Lock()
		d.stopWatchLocked()
		d.mu.Unlock()
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), d.opts.CloseTimeout)
		err = d.leave(ctx)
		cancel()
	}
	for _, s := range d.owned {
		err = errors.Join(err, s.Close())
	}
	return err
}
