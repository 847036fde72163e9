package etcd

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gorun/gorun/rendezvous"
	"github.com/gorun/gorun/rendezvous/internal/jobstate"
)

// Next blocks until this node takes part in a complete round and returns
// it (Current tells more). Calling it again while that round is current
// opens a new round for everyone. It fails when the job is over
// (rendezvous.ErrJobEnded, ErrJobFailed), when JoinTimeout passes without
// a place for this node (ErrJoinTimeout), when etcd does not answer within
// RequestTimeout, or when ctx ends.
func (h *Handler) Next(ctx context.Context) (*rendezvous.Round, error) {
	ctx, done, err := h.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	o := h.opts
	if o.MinNodes > o.MaxNodes {
		return nil, fmt.Errorf("rendezvous/etcd: min nodes %d > max nodes %d", o.MinNodes, o.MaxNodes)
	}
	h.withdrawAbandoned(ctx)
	st, err := h.leaveRound(ctx)
	if err != nil {
		return nil, err
	}
	deadline := o.Now().Add(o.JoinTimeout)
	for {
		if st.End != jobstate.Running {
			return nil, h.overError(ctx, st)
		}
		lease, err := h.ensureLease(ctx)
		if err != nil {
			return nil, err
		}
		rd, err := h.join(ctx, st, lease, &deadline)
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			// The lease lapsed before the join (a cluster too busy to
			// renew it, a long pause): join again with a new one.
			h.log.Warn().Int("round", st.Round).Msg("this node's etcd lease lapsed as it joined: joining with a new one")
			h.mu.Lock()
			if h.lease == lease {
				h.lease = 0
			}
			h.mu.Unlock()
		} else if rd != nil || err != nil {
			return rd, err
		}
		if st, _, err = h.readState(ctx); err != nil {
			return nil, err
		}
	}
}

// withdrawAbandoned takes back the key of a join that its caller gave up.
func (h *Handler) withdrawAbandoned(ctx context.Context) {
	h.mu.Lock()
	key := h.abandoned
	h.abandoned = ""
	h.mu.Unlock()
	if key == "" {
		return
	}
	wctx, cancel := context.WithTimeout(ctx, h.opts.CloseTimeout)
	defer cancel()
	if _, err := h.kv.Delete(wctx, key); err != nil {
		h.log.Warn().Err(err).Msg("could not withdraw an abandoned join")
	}
}

// leaveRound stops this node's part in its round, opening a new round if
// that one is still current, and returns the job's state.
func (h *Handler) leaveRound(ctx context.Context) (jobstate.State, error) {
	h.mu.Lock()
	prev, prevState, key := h.round, h.state, h.myKey
	h.stopWatchLocked()
	h.mu.Unlock()
	st, _, err := h.readState(ctx)
	if err != nil || prev == nil {
		return st, err
	}
	if st == prevState {
		reason := fmt.Sprintf("node %s on %s asked for a new round", h.opts.NodeID, h.opts.Host)
		if st, err = h.advance(ctx, st, st.Superseded(), reason); err != nil {
			return st, err
		}
	}
	prev.End(h.reason(ctx, prevState.Round))
	if key != "" {
		// The round is over: its key only kept this node in it.
		rctx, cancel := h.request(ctx)
		_, _ = h.kv.Delete(rctx, key)
		cancel()
	}
	return st, nil
}

// snapshot is a joiner's view of round r at one revision.
type snapshot struct {
	rev   int64
	state jobstate.State
	// arrivals counts the joins of the round (the versions of its
	// arrivals key): the nodes there, unless some withdrew. Reading it
	// costs O(1), where counting the round's keys cost O(n) for every
	// joiner, O(n²) for the round; the decider counts them once.
	arrivals int
	lastCall bool
	decision *decision
	// short is the last shortage a decider found, if any.
	short *shortage
}

// shortage is what a decider that found too few nodes recorded: found
// were there when arrivals had joined.
type shortage struct{ arrivals, found int }

// there is how many nodes are in the round, as far as the joiners know:
// the joins counted, less those a decider found withdrawn.
func (s snapshot) there() int {
	if s.short != nil && s.arrivals >= s.short.arrivals {
		return s.short.found + s.arrivals - s.short.arrivals
	}
	return s.arrivals
}

// decided returns, when events hold round st.Round's decision, what a
// snapshot taken then would show, sparing every joiner a read as the round
// forms: the transaction that put it found the job's state still st. With
// the round superseded too, it returns nil: the caller reads.
func (h *Handler) decided(st jobstate.State, evs []*clientv3.Event) *snapshot {
	var news *snapshot
	for _, ev := range evs {
		switch string(ev.Kv.Key) {
		case h.k(supersededKey(st.Round)):
			return nil
		case h.k(finalKey(st.Round)):
			var d decision
			if ev.Type != mvccpb.PUT || json.Unmarshal(ev.Kv.Value, &d) != nil {
				return nil // the read that follows says what is wrong
			}
			news = &snapshot{rev: ev.Kv.ModRevision, state: st, decision: &d}
		}
	}
	return news
}

// roundWatch follows a round from before this node joins it until the
// node leaves it: the keys under its call/ (the last call, the decision, a
// shortage, the supersede marker). Its watch starts at the present, which
// etcd serves at no cost, and lives as long as the round: a watch from a
// past revision makes etcd read every change since (etcd 3.4 does so 512
// watches at a time, holding up writes meanwhile), and with thousands of
// nodes joining, a joiner's revision is past by the time its watch
// arrives. The deletions of the round's node keys are watched only once
// the round is decided (watchRound): a prefix watch that every joiner
// held over the node keys as the round formed made etcd match each join
// against every watcher, O(n²) in the round (filtering the puts out does
// not spare the match).
type roundWatch struct {
	ctx   context.Context
	stop  context.CancelFunc
	calls clientv3.WatchChan
}

// watchNews starts following round r.
func (h *Handler) watchNews(ctx context.Context, r int) (*roundWatch, error) {
	wctx, stop := context.WithCancel(h.life)
	w := &roundWatch{ctx: wctx, stop: stop}
	w.calls = h.cli.Watch(wctx, h.k(callKey(r)), clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	if err := h.awaitCreated(ctx, r, w.calls); err != nil {
		stop()
		return nil, err
	}
	return w, nil
}

// awaitCreated waits until etcd has made the watches of round r.
func (h *Handler) awaitCreated(ctx context.Context, r int, chans ...clientv3.WatchChan) error {
	rctx, cancel := h.request(ctx)
	defer cancel()
	for _, ch := range chans {
		select {
		case wr, ok := <-ch:
			if !ok || !wr.Created || wr.Err() != nil {
				return fmt.Errorf("rendezvous/etcd: watch round %d: %w", r, cmp.Or(wr.Err(), errors.New("watch closed")))
			}
		case <-rctx.Done():
			return h.unreachable(ctx, fmt.Sprintf("watch round %d", r), context.Cause(rctx))
		}
	}
	return nil
}

// awaitNews waits until round st.Round's call/ keys change after revision
// rev (w follows them), until, one of more changes (from rev), or ctx
// ends. It returns the decision when that is the news (decided); nil
// otherwise: the caller reads, unless quiet says that only until passed.
func (h *Handler) awaitNews(ctx context.Context, w *roundWatch, st jobstate.State, rev int64, until time.Time, more ...watched) (news *snapshot, quiet bool, err error) {
	wctx, cancel := context.WithDeadline(ctx, until)
	defer cancel()
	var moreNews chan struct{}
	if len(more) > 0 {
		moreNews = make(chan struct{}, 1)
		go func() {
			h.awaitChange(wctx, rev, time.Time{}, more...)
			moreNews <- struct{}{}
		}()
	}
	for {
		select {
		case wr, ok := <-w.calls:
			if !ok || wr.Err() != nil || wr.Canceled {
				// Follow the round again, from now: the read that
				// follows covers what came between.
				w.calls = h.cli.Watch(w.ctx, h.k(callKey(st.Round)), clientv3.WithPrefix(), clientv3.WithCreatedNotify())
				return nil, false, h.awaitCreated(ctx, st.Round, w.calls)
			}
			var fresh []*clientv3.Event // what the last read did not see
			for _, ev := range wr.Events {
				if ev.Kv.ModRevision > rev {
					fresh = append(fresh, ev)
				}
			}
			if len(fresh) > 0 {
				return h.decided(st, fresh), false, nil
			}
		case <-moreNews:
			return nil, false, context.Cause(ctx)
		case <-wctx.Done():
			return nil, ctx.Err() == nil, context.Cause(ctx)
		}
	}
}

// readCall fills in what the keys under round r's call/ say.
func (h *Handler) readCall(r int, kvs []*mvccpb.KeyValue, s *snapshot) error {
	for _, kv := range kvs {
		switch string(kv.Key) {
		case h.k(lastCallKey(r)):
			s.lastCall = true
		case h.k(finalKey(r)):
			var d decision
			if err := json.Unmarshal(kv.Value, &d); err != nil {
				return fmt.Errorf("rendezvous/etcd: decision of round %d: %w", r, err)
			}
			s.decision = &d
		case h.k(shortKey(r)):
			var sh shortage
			if _, err := fmt.Sscan(string(kv.Value), &sh.arrivals, &sh.found); err != nil {
				return fmt.Errorf("rendezvous/etcd: shortage of round %d: %w", r, err)
			}
			s.short = &sh
		}
	}
	return nil
}

func (h *Handler) snapshot(ctx context.Context, r int) (snapshot, error) {
	rctx, cancel := h.request(ctx)
	defer cancel()
	t, err := h.kv.Txn(rctx).Then(
		clientv3.OpGet(h.k(keyState)),
		clientv3.OpGet(h.k(arrivalsKey(r))),
		clientv3.OpGet(h.k(callKey(r)), clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return snapshot{}, h.unreachable(ctx, fmt.Sprintf("read round %d", r), err)
	}
	s := snapshot{rev: t.Header.Revision}
	if kvs := t.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		if s.state, err = jobstate.Parse(kvs[0].Value); err != nil {
			return s, err
		}
	}
	if kvs := t.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
		s.arrivals = int(kvs[0].Version)
	}
	return s, h.readCall(r, t.Responses[2].GetResponseRange().Kvs, &s)
}

// join adds this node to round st.Round and follows it until this node
// takes part (a round), or the job moves on (no round, no error: join the
// job's current round), or it gives up. A spare's wait is not a join: its
// deadline starts again after it.
func (h *Handler) join(ctx context.Context, st jobstate.State, lease clientv3.LeaseID, deadline *time.Time) (*rendezvous.Round, error) {
	o, r := h.opts, st.Round
	key := h.k(nodeKey(r, o.NodeID))
	me, _ := json.Marshal(h.self)
	w, err := h.watchNews(ctx, r)
	if err != nil {
		return nil, err
	}
	kept := false // w goes on following the round this node takes part in
	defer func() {
		if !kept {
			w.stop()
		}
	}()
	rctx, cancel := h.request(ctx)
	// Only a node not there yet counts itself: a join made again (an
	// attempt that timed out may have been applied) must not count
	// twice.
	t, err := h.kv.Txn(rctx).If(clientv3.Compare(clientv3.Value(h.k(keyState)), "=", st.String()),
		clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, string(me), clientv3.WithLease(lease)),
			clientv3.OpPut(h.k(arrivalsKey(r)), "", clientv3.WithPrevKV()),
			clientv3.OpGet(h.k(callKey(r)), clientv3.WithPrefix())).
		Else(clientv3.OpGet(h.k(keyState)), clientv3.OpGet(key, clientv3.WithCountOnly()),
			clientv3.OpGet(h.k(arrivalsKey(r))), clientv3.OpGet(h.k(callKey(r)), clientv3.WithPrefix())).Commit()
	cancel()
	if err != nil {
		return nil, h.unreachable(ctx, fmt.Sprintf("join round %d", r), err)
	}
	s := snapshot{rev: t.Header.Revision, state: st}
	idx := 0 // this node's arrival index
	calls := t.Responses[len(t.Responses)-1].GetResponseRange().Kvs
	if t.Succeeded {
		// What the join read is the first look at the round, and needs
		// no read of its own.
		if prev := t.Responses[1].GetResponsePut().PrevKv; prev != nil {
			idx = int(prev.Version)
		}
		s.arrivals = idx + 1
	} else {
		kvs := t.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 || string(kvs[0].Value) != st.String() || t.Responses[1].GetResponseRange().Count == 0 {
			return nil, nil // the job moved on
		}
		// An earlier attempt joined.
		if kvs := t.Responses[2].GetResponseRange().Kvs; len(kvs) > 0 {
			s.arrivals = int(kvs[0].Version)
		}
		idx = max(s.arrivals-1, 0)
	}
	h.mu.Lock()
	h.myKey = key
	h.mu.Unlock()
	if err := h.readCall(r, calls, &s); err != nil {
		h.giveUp(ctx, key)
		return nil, err
	}
	// A join that fills the round decides it at once: a last call would
	// only wake every joiner for nothing.
	if there := s.there(); there >= o.MinNodes && there < o.MaxNodes && !s.lastCall {
		h.openLastCall(ctx, r)
	}

	var lastCall time.Time // when this node saw MinNodes arrivals
	start := o.Now()
	read := start          // when s was read
	var reported time.Time // the last progress report
	var news *snapshot     // the decision, as the wait's events told it
	// Until then s stands: only a report was due, which s serves, and
	// no deadline that needs a fresh read has come.
	var staleUntil time.Time
	for first := true; ; first = false {
		if news != nil {
			// What the wait did not tell stays as last read.
			news.arrivals, news.lastCall, news.short = s.arrivals, s.lastCall, s.short
			s, news = *news, nil
		} else if !first && !o.Now().Before(staleUntil) {
			if s, err = h.snapshot(ctx, r); err != nil {
				h.giveUp(ctx, key)
				return nil, err
			}
			read = o.Now()
		}
		now := o.Now()
		if (s.lastCall || s.there() >= o.MinNodes) && lastCall.IsZero() {
			lastCall = now
		}
		v := view{
			moved: s.state != st, arrivals: s.there(), decided: s.decision != nil,
			lastCallDue:  !lastCall.IsZero() && !now.Before(lastCall.Add(o.LastCallTimeout)),
			pastDeadline: !now.Before(*deadline),
			minNodes:     o.MinNodes, maxNodes: o.MaxNodes,
		}
		var me seat
		if d := s.decision; d != nil && d.N > 0 && !v.moved {
			v.size = d.N
			if me, v.member, err = h.seatOf(ctx, r, *d, o.NodeID); err != nil {
				h.giveUp(ctx, key)
				return nil, err
			}
		}
		step := nextStep(v)
		busy := false // another node decides the round
		if step == stepDecide {
			// Full, unless at the last call or the deadline.
			need := o.MaxNodes
			if v.lastCallDue || v.pastDeadline {
				need = o.MinNodes
			}
			verdict, rev, err := h.decide(ctx, st, need, lease)
			if err != nil {
				h.giveUp(ctx, key)
				return nil, err
			}
			if verdict != verdictBusy {
				// Decided, or too few there (recorded): look again.
				continue
			}
			// Wait for the decider's word, or for its claim to lapse.
			busy, step, s.rev = true, stepWait, rev
		}
		switch step {
		case stepRetry:
			return nil, nil
		case stepTakePart:
			kept = true
			return h.takePart(st, *s.decision, me, s.rev, w)
		case stepVoid, stepTimedOut:
			// Read before this node's key goes.
			w := h.waiting(ctx, r, idx, s.there(), 0, "join timeout")
			if _, _, err := h.decide(ctx, st, 0, lease); err != nil {
				h.log.Warn().Err(err).Int("round", r).Msg("could not void the round")
			}
			h.giveUp(ctx, key)
			return nil, fmt.Errorf("%w after %v: %d of min %d nodes joined round %d; missing: %s",
				rendezvous.ErrJoinTimeout, o.JoinTimeout, s.there(), o.MinNodes, r, w.MissingText())
		case stepSpare:
			h.log.Info().Int("round", r).Msg("round is full: waiting as a spare")
			if _, err := h.awaitChange(ctx, s.rev, time.Time{}, watched{key: keyState}); err != nil {
				h.giveUp(ctx, key)
				return nil, err
			}
			*deadline = o.Now().Add(o.JoinTimeout)
			return nil, nil
		case stepOpenNext:
			reason := fmt.Sprintf("node %s on %s waits to join (round %d has %d of max %d nodes)",
				o.NodeID, o.Host, r, s.decision.N, o.MaxNodes)
			_, err := h.advance(ctx, st, st.Superseded(), reason)
			return nil, err
		}
		if !now.Before(rendezvous.NextProgress(start, reported)) {
			left, until := deadline.Sub(now), "join timeout"
			if !lastCall.IsZero() {
				left, until = lastCall.Add(o.LastCallTimeout).Sub(now), "last call"
			}
			report := h.waiting(ctx, r, idx, s.there(), left, until)
			report.CountedAgo = now.Sub(read)
			report.Log(h.log)
			reported = now
		}
		// Wait for the last call, the deadline, a decision, a move or the
		// next progress report; for the decider's word, or its claim to
		// lapse; and, too few there after the last call, for a join.
		until := rendezvous.NextProgress(start, reported)
		reportOnly := true // until is due for a report alone
		if !v.pastDeadline && deadline.Before(until) {
			until, reportOnly = *deadline, false
		}
		if due := lastCall.Add(o.LastCallTimeout); !lastCall.IsZero() && !v.lastCallDue && due.Before(until) {
			until, reportOnly = due, false
		}
		var more []watched
		switch {
		case busy:
			more = append(more, watched{key: claimKey(r), deletesOnly: true})
		case v.lastCallDue:
			more = append(more, watched{key: arrivalsKey(r)})
		}
		var quiet bool
		if news, quiet, err = h.awaitNews(ctx, w, st, s.rev, until, more...); err != nil {
			h.giveUp(ctx, key)
			return nil, err
		}
		// Woken for a report alone, a node other than the first of a
		// large round reports what it read last. Reading for it cost
		// etcd a request per node per ProgressPeriod, and a round of n
		// nodes forming on one cluster takes O(n) periods: O(n²) in all.
		staleUntil = time.Time{}
		if quiet && reportOnly && idx > 0 && s.there() > rendezvous.NamedReportNodes {
			staleUntil = minTime(*deadline, read.Add(staleFor))
			if !lastCall.IsZero() && !v.lastCallDue {
				staleUntil = minTime(staleUntil, lastCall.Add(o.LastCallTimeout))
			}
		}
	}
}

// staleFor is how long a large round's waiting node reports from its last
// read: a read a minute costs etcd little, and keeps a node whose watch
// missed the decision from waiting for its join timeout.
const staleFor = time.Minute

// waiting describes round r, which arrivals nodes joined, as this node,
// arrival idx, reports it: in one read of their keys; a read that fails
// makes a report that names no one. In a round of more than
// rendezvous.NamedReportNodes only the first arrival reads them, and the
// others report counts, lest each report cost the round O(n²).
func (h *Handler) waiting(ctx context.Context, r, idx, arrivals int, left time.Duration, until string) rendezvous.Waiting {
	o := h.opts
	w := rendezvous.Waiting{Joined: arrivals, Min: o.MinNodes, Max: o.MaxNodes, Left: max(left, 0), Until: until}
	if idx > 0 && arrivals > rendezvous.NamedReportNodes {
		return w
	}
	rctx, cancel := h.request(ctx)
	defer cancel()
	resp, err := h.kv.Get(rctx, h.k(nodesKey(r)), clientv3.WithPrefix())
	if err != nil {
		return w
	}
	var ranks []int
	for _, kv := range resp.Kvs {
		var m member
		if json.Unmarshal(kv.Value, &m) != nil {
			return w
		}
		w.Names = append(w.Names, m.Host)
		ranks = append(ranks, m.Rank)
	}
	w.Joined = max(w.Joined, len(w.Names))
	w.Missing = rendezvous.MissingNodes(w.Names, ranks, o.Expected, o.MinNodes, o.MaxNodes)
	return w
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// openLastCall tells the round's joiners that MinNodes arrived, once.
func (h *Handler) openLastCall(ctx context.Context, r int) {
	rctx, cancel := h.request(ctx)
	defer cancel()
	k := h.k(lastCallKey(r))
	_, _ = h.kv.Txn(rctx).If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).Then(clientv3.OpPut(k, "")).Commit()
}

// watched is a key (relative) that awaitChange watches: with prefix, the
// keys under it; with deletesOnly, its deletion alone.
type watched struct {
	key                 string
	prefix, deletesOnly bool
}

// awaitChange watches keys from revision rev+1 until one changes, until
// (when not zero), or ctx ends. It returns the events that woke it, if
// any: one watch's first answer.
func (h *Handler) awaitChange(ctx context.Context, rev int64, until time.Time, keys ...watched) ([]*clientv3.Event, error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if !until.IsZero() {
		var c2 context.CancelFunc
		wctx, c2 = context.WithDeadline(wctx, until)
		defer c2()
	}
	changed := make(chan []*clientv3.Event, len(keys))
	for _, w := range keys {
		opts := []clientv3.OpOption{clientv3.WithRev(rev + 1)}
		if w.prefix {
			opts = append(opts, clientv3.WithPrefix())
		}
		if w.deletesOnly {
			opts = append(opts, clientv3.WithFilterPut())
		}
		ch := h.cli.Watch(wctx, h.k(w.key), opts...)
		go func() {
			// An answer without events (the watch broke) is news too:
			// the caller reads again.
			for wr := range ch {
				changed <- wr.Events
				return
			}
		}()
	}
	var evs []*clientv3.Event
	select {
	case evs = <-changed:
	case <-wctx.Done():
	}
	return evs, context.Cause(ctx)
}

// seatOf reads member id's seat in round r, decided as d; ok is false
// when id is not a member.
func (h *Handler) seatOf(ctx context.Context, r int, d decision, id string) (s seat, ok bool, err error) {
	rctx, cancel := h.request(ctx)
	defer cancel()
	resp, err := h.kv.Get(rctx, h.k(seatKey(r, d.By, id)))
	if err != nil {
		return s, false, h.unreachable(ctx, fmt.Sprintf("read a seat in round %d", r), err)
	}
	if len(resp.Kvs) == 0 {
		return s, false, nil
	}
	if err := json.Unmarshal(resp.Kvs[0].Value, &s); err != nil {
		return s, false, fmt.Errorf("rendezvous/etcd: seat of %s in round %d: %w", id, r, err)
	}
	return s, true, nil
}

// seats reads every seat of round r, decided as d, in group-rank order:
// O(n) bytes, for reports and for the rare calls that need every member.
func (h *Handler) seats(ctx context.Context, r int, d decision) ([]seat, error) {
	rctx, cancel := h.request(ctx)
	defer cancel()
	resp, err := h.kv.Get(rctx, h.k(seatsKey(r, d.By)), clientv3.WithPrefix())
	if err != nil {
		return nil, h.unreachable(ctx, fmt.Sprintf("read the seats of round %d", r), err)
	}
	seats := make([]seat, len(resp.Kvs))
	for i, kv := range resp.Kvs {
		if err := json.Unmarshal(kv.Value, &seats[i]); err != nil {
			return nil, fmt.Errorf("rendezvous/etcd: seat %s of round %d: %w", kv.Key, r, err)
		}
	}
	slices.SortFunc(seats, func(a, b seat) int { return cmp.Compare(a.GroupRank, b.GroupRank) })
	return seats, nil
}

// seatBatch is how many seats one transaction writes: etcd refuses
// transactions of more than --max-txn-ops operations, 128 by default.
const seatBatch = 128

// putSeats writes the seats of round r, decided by by, a few batches at a
// time.
func (h *Handler) putSeats(ctx context.Context, r int, by string, seats []seat) error {
	var wg sync.WaitGroup
	errs := make(chan error, len(seats)/seatBatch+1)
	sem := make(chan struct{}, 8)
	for lo := 0; lo < len(seats); lo += seatBatch {
		batch := seats[lo:min(lo+seatBatch, len(seats))]
		ops := make([]clientv3.Op, len(batch))
		for i, s := range batch {
			b, err := json.Marshal(s)
			if err != nil {
				return err
			}
			ops[i] = clientv3.OpPut(h.k(seatKey(r, by, s.ID)), string(b))
		}
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			if _, err := h.kv.Txn(ctx).Then(ops...).Commit(); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// verdict is what a try to decide a round came to.
type verdict int

const (
	verdictDone  verdict = iota // decided, by this node or another, or the job moved on
	verdictShort                // fewer than needed were there: recorded for all
	verdictBusy                 // another node is deciding it
)

// decide fixes round st.Round's members, unless fixed already: its first
// MaxNodes joiners, by arrival, if at least need are there, or none when
// need is 0 (void). Only the holder of the round's claim, on its lease,
// decides: the others wait for its word (verdictBusy, with the revision
// at which they saw the claim held), so that the O(n) read of the members
// and write of their seats happens once a round, not once per node that
// saw it full. The decider writes the seats first, under its own name, so
// that a member that sees the decision finds its seat; one whose claim
// lapsed midway leaves seats that nobody reads. Fewer than need there
// (some withdrew), it records how many (verdictShort) for every joiner to
// count from.
func (h *Handler) decide(ctx context.Context, st jobstate.State, need int, lease clientv3.LeaseID) (verdict, int64, error) {
	o, r := h.opts, st.Round
	rctx, cancel := h.request(ctx)
	defer cancel()
	final, claim := h.k(finalKey(r)), h.k(claimKey(r))
	open := []clientv3.Cmp{
		clientv3.Compare(clientv3.Value(h.k(keyState)), "=", st.String()),
		clientv3.Compare(clientv3.CreateRevision(final), "=", 0),
	}
	fail := func(err error) (verdict, int64, error) {
		return verdictDone, 0, h.unreachable(ctx, fmt.Sprintf("decide round %d", r), err)
	}
	var d decision
	if need > 0 {
		t, err := h.kv.Txn(rctx).If(append(open, clientv3.Compare(clientv3.CreateRevision(claim), "=", 0))...).
			Then(clientv3.OpPut(claim, o.NodeID, clientv3.WithLease(lease))).
			Else(clientv3.OpGet(claim)).Commit()
		if err != nil {
			return fail(err)
		}
		claimed := t.Header.Revision
		if !t.Succeeded {
			kvs := t.Responses[0].GetResponseRange().Kvs
			switch {
			case len(kvs) == 0:
				return verdictDone, 0, nil // decided, or the job moved on
			case string(kvs[0].Value) != o.NodeID:
				return verdictBusy, t.Header.Revision, nil
			}
			// An earlier attempt claimed it.
			claimed = kvs[0].CreateRevision
		}
		ours := clientv3.Compare(clientv3.CreateRevision(claim), "=", claimed)
		// release gives the claim up, with ops, even when ctx ended.
		release := func(ops ...clientv3.Op) error {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), h.opts.RequestTimeout)
			defer cancel()
			_, err := h.kv.Txn(rctx).If(ours).Then(append(ops, clientv3.OpDelete(claim))...).Commit()
			return err
		}
		t, err = h.kv.Txn(rctx).Then(
			clientv3.OpGet(h.k(nodesKey(r)), clientv3.WithPrefix(),
				clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(int64(o.MaxNodes))),
			clientv3.OpGet(h.k(arrivalsKey(r)))).Commit()
		if err != nil {
			_ = release()
			return fail(err)
		}
		kvs := t.Responses[0].GetResponseRange().Kvs
		if len(kvs) < need {
			arrivals := 0
			if a := t.Responses[1].GetResponseRange().Kvs; len(a) > 0 {
				arrivals = int(a[0].Version)
			}
			if err := release(clientv3.OpPut(h.k(shortKey(r)), fmt.Sprintf("%d %d", arrivals, len(kvs)))); err != nil {
				return fail(err)
			}
			return verdictShort, 0, nil
		}
		ms := make([]member, len(kvs))
		for i, kv := range kvs {
			if err := json.Unmarshal(kv.Value, &ms[i]); err != nil {
				_ = release()
				return verdictDone, 0, fmt.Errorf("rendezvous/etcd: member %s of round %d: %w", kv.Key, r, err)
			}
			ms[i].arrival = kv.CreateRevision
			if ms[i].Since == 0 {
				// First time in a round: where it arrived places it,
				// in this round and the next.
				ms[i].Since = kv.CreateRevision
			}
		}
		var seats []seat
		d, seats = roster{Rev: t.Header.Revision, Nodes: order(ms)}.decide(o.NodeID)
		if err := h.putSeats(rctx, r, o.NodeID, seats); err != nil {
			_ = release()
			return fail(err)
		}
	}
	b, err := json.Marshal(d)
	if err != nil {
		return verdictDone, 0, err
	}
	// The claim goes with the decision, or once the decision is moot.
	_, err = h.kv.Txn(rctx).If(open...).Then(clientv3.OpPut(final, string(b)), clientv3.OpDelete(claim)).
		Else(clientv3.OpDelete(claim)).Commit()
	if err != nil {
		return fail(err)
	}
	return verdictDone, 0, nil
}

// giveUp takes this node's key out of a round it stops joining: at once
// when etcd failed (best effort), or, when ctx ended (its caller is in a
// hurry), in the next Next, Leave or Close.
func (h *Handler) giveUp(ctx context.Context, key string) {
	if ctx.Err() != nil {
		h.mu.Lock()
		h.abandoned = key
		h.mu.Unlock()
		return
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), h.opts.CloseTimeout)
	defer cancel()
	_, _ = h.kv.Delete(wctx, key)
}

// takePart makes this node's round from the decision it read at rev and
// its seat, and watches it.
func (h *Handler) takePart(st jobstate.State, d decision, me seat, rev int64, w *roundWatch) (*rendezvous.Round, error) {
	o := h.opts
	ri := rendezvous.NewRoundInfo(st.Round, st.Restarts, me.GroupRank, d.N, me.FirstRank, d.World)
	h.mu.Lock()
	if h.self.Since == 0 {
		h.self.Since = me.Since
	}
	h.round, h.state, h.decision = ri, st, d
	h.stopWatch = h.watchRound(ri, st, d, rev, w)
	h.mu.Unlock()
	h.log.Info().Int("round", st.Round).Int("restarts", st.Restarts).Int("group_rank", me.GroupRank).
		Int("nodes", d.N).Int("world_size", d.World).Msg("round complete")
	return &rendezvous.Round{
		Store:          NewStore(h.cli, h.k(roundKey(st.Round, "store/"))),
		GroupRank:      me.GroupRank,
		GroupWorldSize: d.N,
		StoreHost:      o.StoreHost,
		StorePort:      o.StorePort,
	}, nil
}

// watchRound ends ri when round st.Round is superseded (its superseded
// key is put, with the job's state that moves on) and supersedes it when a
// member's key goes (its lease lapsed, or it left), until the returned
// stop. It goes on with w's watch of the call/ keys, which followed the
// round from before the decision this node read at rev, and watches the
// node keys' deletions from the decider's read of the members on (d.Rev),
// so that none goes unseen between the two. A broken watch is made again
// from the revision it reached; a node cut off from etcd learns from its
// lease (ensureLease).
func (h *Handler) watchRound(ri *rendezvous.RoundInfo, st jobstate.State, d decision, rev int64, w *roundWatch) (stop func()) {
	ctx, cancel := context.WithCancel(h.life)
	nodePfx := h.k(nodesKey(st.Round))
	// wasMember tells whether the node whose key went was a member, by its
	// seat: one read per key gone, where holding every member cost each
	// node O(n).
	wasMember := func(key string) (seat, bool) {
		id := strings.TrimPrefix(key, nodePfx)
		if id == h.opts.NodeID {
			return seat{member: h.self}, true
		}
		rctx, rcancel := context.WithTimeout(ctx, h.opts.RequestTimeout)
		defer rcancel()
		s, ok, err := h.seatOf(rctx, st.Round, d, id)
		if err != nil {
			// Unsure: a key gone in a decided round most likely was a
			// member's; superseding a round costs a new one, missing a
			// death costs the job.
			return seat{member: member{ID: id, Host: "?"}}, true
		}
		return s, ok
	}
	superseded := h.k(supersededKey(st.Round))
	done := make(chan struct{})
	go func() {
		defer close(done)
		callsRev, nodesRev := rev+1, d.Rev+1
		// From the decider's read of the members on: the few changes
		// since (the seats, the decision) are all etcd catches up.
		calls, wcancel := w.calls, w.stop
		nodes := h.cli.Watch(w.ctx, nodePfx, clientv3.WithPrefix(), clientv3.WithRev(nodesRev), clientv3.WithFilterPut())
		for {
			for calls != nil && nodes != nil {
				select {
				case <-ctx.Done():
					wcancel()
					return
				case wr, ok := <-calls:
					if !ok || wr.Err() != nil || wr.Canceled {
						calls = nil
						break
					}
					callsRev = max(callsRev, wr.Header.Revision+1)
					for _, ev := range wr.Events {
						if ev.Type == mvccpb.PUT && string(ev.Kv.Key) == superseded {
							ri.End(string(ev.Kv.Value))
							wcancel()
							return
						}
					}
				case wr, ok := <-nodes:
					if !ok || wr.Err() != nil || wr.Canceled {
						nodes = nil
						break
					}
					nodesRev = max(nodesRev, wr.Header.Revision+1)
					for _, ev := range wr.Events {
						// A key gone before the decider read the
						// members was not a member's.
						if ev.Type != mvccpb.DELETE || ev.Kv.ModRevision <= d.Rev {
							continue
						}
						m, ok := wasMember(string(ev.Kv.Key))
						if !ok {
							continue
						}
						reason := fmt.Sprintf("node %s on %s is gone: it left, or its etcd lease lapsed", m.ID, m.Host)
						if m.ID == h.opts.NodeID {
							reason = fmt.Sprintf("node %s on %s lost its etcd lease", m.ID, m.Host)
						}
						rctx, rcancel := context.WithTimeout(ctx, h.opts.RequestTimeout)
						_, err := h.advance(rctx, st, st.Superseded(), reason)
						rcancel()
						if err != nil {
							h.log.Warn().Err(err).Msg("could not end the round")
						}
					}
				}
			}
			wcancel()
			// The watch broke (a member went, a compaction): watch again
			// from where it was, after a pause that a busy cluster can
			// bear.
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			var wctx context.Context
			wctx, wcancel = context.WithCancel(ctx)
			calls = h.cli.Watch(wctx, h.k(callKey(st.Round)), clientv3.WithPrefix(), clientv3.WithRev(callsRev))
			nodes = h.cli.Watch(wctx, nodePfx, clientv3.WithPrefix(), clientv3.WithRev(nodesRev), clientv3.WithFilterPut())
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// stopWatchLocked stops watching the round; h.mu is held.
func (h *Handler) stopWatchLocked() {
	if h.stopWatch != nil {
		stop := h.stopWatch
		h.stopWatch = nil
		h.mu.Unlock()
		stop()
		h.mu.Lock()
	}
}

// Leave tells the other nodes, within ctx, that this one is going: it
// supersedes its round if still current, so that the others go on without
// it at once, and revokes its lease, which takes its keys. No node hosts
// anything the others need, so no node's leaving ends the job. Close,
// afterwards, says nothing more.
func (h *Handler) Leave(ctx context.Context) error {
	ctx, done, err := h.begin(ctx)
	if err != nil {
		return err
	}
	defer done()
	h.mu.Lock()
	if h.left {
		h.mu.Unlock()
		return nil
	}
	h.left = true
	h.mu.Unlock()
	return h.leave(ctx)
}

func (h *Handler) leave(ctx context.Context) error {
	h.mu.Lock()
	h.stopWatchLocked()
	ri, st, lease, abandoned := h.round, h.state, h.lease, h.abandoned
	h.abandoned = ""
	h.mu.Unlock()
	var err error
	if ri != nil && ri.Reason() == "" {
		reason := fmt.Sprintf("node %s on %s left", h.opts.NodeID, h.opts.Host)
		if _, aerr := h.advance(ctx, st, st.Superseded(), reason); aerr != nil {
			err = aerr
		}
		ri.End("this node left the rendezvous")
	}
	if lease != 0 {
		if _, rerr := h.cli.Revoke(ctx, lease); rerr != nil {
			err = errors.Join(err, fmt.Errorf("rendezvous/etcd: revoke this node's lease: %w", rerr))
		}
	} else if abandoned != "" {
		_, _ = h.kv.Delete(ctx, abandoned)
	}
	return err
}

// Close leaves the rendezvous, as Leave does within CloseTimeout unless
// Leave was called, and closes the client. It never ends the job for the
// others.
func (h *Handler) Close() error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	left := h.left
	h.mu.Unlock()
	h.quit()
	h.ops.Wait()
	var err error
	if left {
		h.mu.Lock()
		h.stopWatchLocked()
		h.mu.Unlock()
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), h.opts.CloseTimeout)
		err = h.leave(ctx)
		cancel()
	}
	return errors.Join(err, h.cli.Close())
}
