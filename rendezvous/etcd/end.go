package etcd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gorun/gorun/rendezvous"
	"github.com/gorun/gorun/rendezvous/internal/jobstate"
)

// errNoRound is returned by the calls that need a round before the first.
var errNoRound = errors.New("rendezvous/etcd: no round yet")

// current returns this node's round, the state that opened it, its
// decision and this node's lease.
func (h *Handler) current() (*rendezvous.RoundInfo, jobstate.State, decision, clientv3.LeaseID, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.round == nil {
		return nil, jobstate.State{}, decision{}, 0, errNoRound
	}
	return h.round, h.state, h.decision, h.lease, nil
}

// Done is the exit barrier: this node's workers all succeeded in the
// current round. It returns nil once every member has said so (the last
// ends the job), rendezvous.ErrRoundChanged if the round is superseded
// first, ErrJobFailed or ErrJobEnded if the job is over, or an error
// naming how many nodes finished if timeout (when positive) passes first.
func (h *Handler) Done(ctx context.Context, timeout time.Duration) error {
	ctx, done, err := h.begin(ctx)
	if err != nil {
		return err
	}
	defer done()
	_, st, d, _, err := h.current()
	if err != nil {
		return err
	}
	r, n := st.Round, d.N
	complete := h.k(roundKey(r, "complete"))
	rctx, cancel := h.request(ctx)
	t, err := h.kv.Txn(rctx).Then(clientv3.OpPut(h.k(roundKey(r, "done/"+h.opts.NodeID)), ""),
		clientv3.OpGet(h.k(roundKey(r, "done/")), clientv3.WithPrefix(), clientv3.WithCountOnly())).Commit()
	cancel()
	if err != nil {
		return h.unreachable(ctx, fmt.Sprintf("exit barrier of round %d", r), err)
	}
	if int(t.Responses[1].GetResponseRange().Count) >= n {
		rctx, cancel := h.request(ctx)
		_, err := h.kv.Put(rctx, complete, "")
		cancel()
		if err != nil {
			return h.unreachable(ctx, fmt.Sprintf("exit barrier of round %d", r), err)
		}
		// Even if the round was superseded meanwhile (a node came to
		// wait for a place), its work is done: so is the job.
		return h.endJob(ctx, st, fmt.Sprintf("job ended: all %d nodes finished round %d", n, r))
	}
	var deadline time.Time
	if timeout > 0 {
		deadline = h.opts.Now().Add(timeout)
	}
	for {
		rctx, cancel := h.request(ctx)
		t, err := h.kv.Txn(rctx).Then(clientv3.OpGet(h.k(keyState)), clientv3.OpGet(complete, clientv3.WithCountOnly()),
			clientv3.OpGet(h.k(roundKey(r, "done/")), clientv3.WithPrefix(), clientv3.WithCountOnly())).Commit()
		cancel()
		if err != nil {
			return h.unreachable(ctx, fmt.Sprintf("exit barrier of round %d", r), err)
		}
		cur, err := jobstate.Parse(t.Responses[0].GetResponseRange().Kvs[0].Value)
		if err != nil {
			return err
		}
		switch {
		case t.Responses[1].GetResponseRange().Count > 0:
			return nil
		case cur.End != jobstate.Running:
			return h.overError(ctx, cur)
		case cur != st:
			return fmt.Errorf("%w: %s", rendezvous.ErrRoundChanged, h.reason(ctx, r))
		case !deadline.IsZero() && !h.opts.Now().Before(deadline):
			return fmt.Errorf("rendezvous/etcd: exit barrier timeout after %v: %d of %d nodes finished round %d",
				timeout, t.Responses[2].GetResponseRange().Count, n, r)
		}
		if _, err := h.awaitChange(ctx, t.Header.Revision, deadline, watched{key: keyState}, watched{key: roundKey(r, "complete")}); err != nil {
			return err
		}
	}
}

// endJob moves the job from state st, or whichever follows, to its end,
// unless it is over already.
func (h *Handler) endJob(ctx context.Context, st jobstate.State, reason string) error {
	var err error
	for err == nil && st.End == jobstate.Running {
		st, err = h.advance(ctx, st, st.Ending(), reason)
	}
	return err
}

// Fail reports that this node's workers failed in the current round:
// report (one line of JSON) joins the job's failures, and the round is
// superseded. The first failure of a round spends one restart; later ones
// in the same round spend nothing. restart is false when the budget is
// spent: the job has failed for everyone.
func (h *Handler) Fail(ctx context.Context, report []byte) (restart bool, err error) {
	ctx, done, err := h.begin(ctx)
	if err != nil {
		return false, err
	}
	defer done()
	_, st, _, _, err := h.current()
	if err != nil {
		return false, err
	}
	line := bytes.TrimRight(report, "\n")
	if bytes.ContainsRune(line, '\n') {
		return false, errors.New("rendezvous/etcd: a failure report must be one line")
	}
	o := h.opts
	rctx, cancel := h.request(ctx)
	_, err = h.kv.Put(rctx, h.k(keyFailures+strconv.Itoa(st.Round)+"/"+o.NodeID), string(line))
	cancel()
	if err != nil {
		return false, h.unreachable(ctx, "record a failure", err)
	}
	to := st.AfterFailure(o.MaxRestarts)
	reason := to.FailureReason(o.NodeID, o.Host, o.MaxRestarts)
	cur, err := h.advance(ctx, st, to, reason)
	if err != nil {
		return false, err
	}
	switch cur.End {
	case jobstate.Failed:
		return false, nil
	case jobstate.Ended:
		return false, h.overError(ctx, cur)
	}
	return true, nil
}

// Weigh records that this node's workers failed in its round and that it
// is weighing the failure before it reports it: a key on its lease, so
// that a node that dies meanwhile holds up no one for long.
func (h *Handler) Weigh(ctx context.Context) (end func(), err error) {
	ctx, done, err := h.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	_, st, _, lease, err := h.current()
	if err != nil {
		return nil, err
	}
	key := h.k(roundKey(st.Round, "weighing/"+h.opts.NodeID))
	rctx, cancel := h.request(ctx)
	_, err = h.kv.Put(rctx, key, "", clientv3.WithLease(lease))
	cancel()
	if err != nil {
		return nil, h.unreachable(ctx, "record a failure being weighed", err)
	}
	return func() {
		ctx, done, err := h.begin(context.Background())
		if err != nil {
			return
		}
		defer done()
		ctx, cancel := context.WithTimeout(ctx, h.opts.CloseTimeout)
		defer cancel()
		if _, err := h.kv.Delete(ctx, key); err != nil {
			h.log.Warn().Err(err).Msg("could not record the end of weighing a failure; other nodes wait out their grace")
		}
	}, nil
}

// AwaitAlive reports whether every other member of the round weighs a
// failure of its own (Weigh) before ctx ends: each then lived when the
// failure came, and the failure is the workers' own. A member that does
// not (dead, or its workers unharmed) leaves it to the caller's grace.
func (h *Handler) AwaitAlive(ctx context.Context) bool {
	ctx, done, err := h.begin(ctx)
	if err != nil {
		return false
	}
	defer done()
	_, st, d, _, err := h.current()
	if err != nil {
		return false
	}
	seats, err := h.seats(ctx, st.Round, d)
	if err != nil {
		return false
	}
	pfx := h.k(roundKey(st.Round, "weighing/"))
	pending := make(map[string]bool, len(seats))
	for _, m := range seats {
		if m.ID != h.opts.NodeID {
			pending[pfx+m.ID] = true
		}
	}
	resp, err := h.kv.Get(ctx, pfx, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return false
	}
	for _, kv := range resp.Kvs {
		delete(pending, string(kv.Key))
	}
	if len(pending) == 0 {
		return true
	}
	for wr := range h.cli.Watch(ctx, pfx, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1), clientv3.WithFilterDelete()) {
		for _, ev := range wr.Events {
			delete(pending, string(ev.Kv.Key))
		}
		if len(pending) == 0 {
			return true
		}
	}
	return false
}

// AwaitReports waits until no member weighs a failure of the round whose
// end failed the job (of the current round while the job runs), or
// timeout: a dead member's key goes with its lease.
func (h *Handler) AwaitReports(ctx context.Context, timeout time.Duration) error {
	ctx, done, err := h.begin(ctx)
	if err != nil {
		return err
	}
	defer done()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	st, _, err := h.readState(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	r := st.Round
	if st.End != jobstate.Running {
		r--
	}
	pfx := h.k(roundKey(r, "weighing/"))
	resp, err := h.kv.Get(ctx, pfx, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("rendezvous/etcd: count the failures being weighed: %w", err)
	}
	weighing := len(resp.Kvs)
	if weighing == 0 {
		return nil
	}
	for wr := range h.cli.Watch(ctx, pfx, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1)) {
		for _, ev := range wr.Events {
			if ev.Type == mvccpb.DELETE {
				weighing--
			} else if ev.IsCreate() {
				weighing++
			}
		}
		if weighing <= 0 {
			return nil
		}
	}
	return nil
}

// Failures returns every node's failure reports, oldest first.
func (h *Handler) Failures(ctx context.Context) ([][]byte, error) {
	ctx, done, err := h.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	rctx, cancel := h.request(ctx)
	defer cancel()
	resp, err := h.kv.Get(rctx, h.k(keyFailures), clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return nil, h.unreachable(ctx, "read the failures", err)
	}
	var all [][]byte
	for _, kv := range resp.Kvs {
		all = append(all, kv.Value)
	}
	return all, nil
}
