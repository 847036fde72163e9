package rendezvous

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/gorun/gorun/rendezvous/internal/jobstate"
	"github.com/rs/zerolog"
)

// Errors of the dynamic rendezvous. The errors returned wrap them, with the
// details, for errors.Is.
var (
	// ErrRoundChanged is returned by Done when the round was superseded
	// before every node finished: re-rendezvous and run the workers again.
	ErrRoundChanged = errors.New("rendezvous: round changed")
	// ErrJobEnded: the job was shut down, or every node finished it.
	ErrJobEnded = errors.New("rendezvous: job has ended")
	// ErrJobFailed: a failure found the restart budget spent.
	ErrJobFailed = errors.New("rendezvous: job has failed")
	// ErrJoinTimeout: no complete round took this node in before
	// JoinTimeout.
	ErrJoinTimeout = errors.New("rendezvous: join timeout")
	// ErrHandlerClosed is returned by calls on a closed handler, and ends
	// those in progress when it closes.
	ErrHandlerClosed = errors.New("rendezvous: handler closed")
)

// Defaults of DynamicOptions, torch's where it has them.
const (
	DefaultJoinTimeout       = 600 * time.Second
	DefaultLastCallTimeout   = 30 * time.Second
	DefaultCloseTimeout      = 30 * time.Second
	DefaultHeartbeatInterval = 5 * time.Second
	DefaultHeartbeatMisses   = 3
)

// ElasticOptions are what every elastic rendezvous backend takes (Dynamic
// here, the etcd handler in rendezvous/etcd): who this node is, the job
// it joins and how long it waits. Zero durations and counts take the
// defaults above.
type ElasticOptions struct {
	// RunID names the job; every node of a job gives the same (default
	// "none", as torch's).
	RunID string
	// A round starts with between MinNodes (default 1) and MaxNodes
	// (default MinNodes) nodes.
	MinNodes, MaxNodes int
	// NodeID identifies this agent; it must be unique in the job (default
	// "<host>:<pid>:<random>").
	NodeID string
	// Host (default the hostname) and Addr name the node in reports.
	Host, Addr string
	// NProc is the number of workers this node runs (default 1); nodes may
	// differ.
	NProc int
	// NodeRank is the group rank this node asks for, or -1 for none; ranks
	// follow the requests only when every participant makes one. The zero
	// value asks for rank 0.
	NodeRank int
	// StoreHost and StorePort locate the store that workers join, hosted
	// by the round's group rank 0; every Round reports them.
	StoreHost string
	StorePort int
	// JoinTimeout bounds Next for a node that no complete round takes in
	// (spares excepted: they wait for a place as long as ctx allows).
	JoinTimeout time.Duration
	// LastCallTimeout is how long a round stays open for more nodes once
	// MinNodes have joined, as measured by each waiting node's own clock.
	LastCallTimeout time.Duration
	// CloseTimeout bounds what Close, a join that the backend failed, and
	// a join abandoned by its caller (withdrawn by the next Next or Close)
	// still say to the backend; Leave takes its bound from its caller.
	CloseTimeout time.Duration
	// Expected names the hosts of the job's nodes, one per node, when the
	// launcher knows them (a Slurm step): a waiting node's progress reports
	// and its join timeout name those not there.
	Expected []string
	// MaxRestarts is the job's restart budget, shared by every node.
	MaxRestarts int
	Logger      zerolog.Logger
	// Now reads the clock (default time.Now). Waits use the runtime's
	// timers, so tests fake both with testing/synctest.
	Now func() time.Time
}

// WithDefaults returns o with the defaults in place of its zero fields.
func (o ElasticOptions) WithDefaults() ElasticOptions {
	orDuration(&o.JoinTimeout, DefaultJoinTimeout)
	orDuration(&o.LastCallTimeout, DefaultLastCallTimeout)
	orDuration(&o.CloseTimeout, DefaultCloseTimeout)
	if o.RunID == "" {
		o.RunID = "none"
	}
	o.MinNodes = max(o.MinNodes, 1)
	if o.MaxNodes == 0 {
		o.MaxNodes = o.MinNodes
	}
	o.NProc = max(o.NProc, 1)
	if o.Host == "" {
		o.Host, _ = os.Hostname()
	}
	if o.NodeID == "" {
		o.NodeID = fmt.Sprintf("%s:%d:%s", o.Host, os.Getpid(), rand.Text()[:8])
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// orDuration sets *d to def when *d is not positive.
func orDuration(d *time.Duration, def time.Duration) {
	if *d <= 0 {
		*d = def
	}
}

// DynamicOptions configure a c10d rendezvous on a store.
type DynamicOptions struct {
	ElasticOptions
	// HostsStore says that the store lives in this process and goes with
	// it: leaving then ends the job (Leave), since the others cannot go on
	// without the store.
	HostsStore bool
	// Every participant heartbeats every HeartbeatInterval; a node whose
	// heartbeat counter stays the same for HeartbeatMisses intervals of the
	// observer's clock is dead.
	HeartbeatInterval time.Duration
	HeartbeatMisses   int
	// HeartbeatTimeout, when positive, bounds each heartbeat: one that
	// takes longer fails, as torch's heartbeat_timeout bounds its
	// keep-alives.
	HeartbeatTimeout time.Duration
	// HeartbeatStore, when set, carries the heartbeats instead of the main
	// store: a second connection, so that long blocking calls on the first
	// (the agent's own waits on Round.Store included) cannot delay them,
	// and on which the heartbeat goroutine may block to hear of a new round
	// at once rather than at its next heartbeat. The handler owns it as it
	// owns the main store.
	HeartbeatStore Store
}

func (o DynamicOptions) withDefaults() DynamicOptions {
	o.ElasticOptions = o.ElasticOptions.WithDefaults()
	orDuration(&o.HeartbeatInterval, DefaultHeartbeatInterval)
	if o.HeartbeatMisses <= 0 {
		o.HeartbeatMisses = DefaultHeartbeatMisses
	}
	return o
}

// Dynamic is an elastic rendezvous in the manner of torch's c10d handler,
// rebuilt so that a join costs O(1) store requests (torch's costs O(n)
// under contention, hence O(n²) per round), the restart budget is global,
// a dead participant ends the round for everyone at once, and an agent
// that leaves does not close the rendezvous for the others.
//
// The job moves through rounds. Nodes join the current round until
// MaxNodes have, or LastCallTimeout after MinNodes have; the round is then
// decided and its participants run their workers, each heartbeating and
// watching the next one's heartbeat. The round is superseded, and every
// participant's RoundInfo.Changed closes, when a participant dies or
// leaves, a node waits for a place (rounds below MaxNodes), a node reports
// a failure (Fail), or the job ends.
//
// Next, Done and Fail are meant for the agent's loop, one call at a time;
// Current, Nodes, Failures, Shutdown and Close may be called from any
// goroutine.
//
// What it guarantees (torch's c10d backend): elastic rounds of MinNodes to
// MaxNodes, a lost node noticed within HeartbeatInterval x HeartbeatMisses,
// and nothing else to run. What it costs: the store lives in one agent
// (HostsStore), so losing that node, or the network to it, ends the job
// for everyone; and every node heartbeats to it, so that one process
// carries the whole job's traffic. The etcd backend (package
// rendezvous/etcd) keeps the same semantics without that single point of
// failure, at the price of an etcd cluster.
type Dynamic struct {
	opts DynamicOptions
	log  zerolog.Logger
	// job is the store under "rdzv/<run id>"; beats is the same or the
	// heartbeat store, likewise: ownBeats tells.
	job, beats jobStore
	ownBeats   bool
	// owned are the stores the handler closes.
	owned []Store
	// self is this node's descriptor; Since is set once it takes part.
	self descriptor
	// poll bounds each blocking wait: a waiting node looks at the job's
	// state that often, and a wait on the connection that carries the
	// heartbeats holds them up no longer.
	poll time.Duration

	life context.Context // done once Close begins
	quit context.CancelFunc
	ops  sync.WaitGroup // calls in progress, which Close waits for

	mu     sync.Mutex
	closed bool
	left   bool           // Leave was called: Close says nothing more
	round  *RoundInfo     // the latest round this node took part in
	state  jobstate.State // the job state that opened it
	watch  *roundWatch    // that round's heartbeats; nil once stopped
	// abandoned is where this node arrived in a round that its caller
	// gave up joining (Next's ctx ended): the next Next, Leave or Close
	// withdraws it, each within its own bound.
	abandoned *arrival
}

// arrival is this node's arrival, idx-th, in the round that st opened.
type arrival struct {
	st  jobstate.State
	idx int
}

var _ Handler = (*Dynamic)(nil)

// NewDynamic returns an elastic rendezvous handler on store, which it owns
// from then on (Close closes it). Nothing is sent before Next.
func NewDynamic(store Store, opts DynamicOptions) *Dynamic {
	opts = opts.withDefaults()
	d := &Dynamic{
		opts:  opts,
		log:   opts.Logger.With().Str("run", opts.RunID).Str("node", opts.NodeID).Logger(),
		job:   jobStore{NewPrefixStore("rdzv/"+opts.RunID, store)},
		owned: []Store{store},
		self: descriptor{
			ID: opts.NodeID, Host: opts.Host, Addr: opts.Addr, PID: os.Getpid(),
			NProc: opts.NProc, Rank: opts.NodeRank, Since: [2]int{-1, -1},
		},
		poll: opts.HeartbeatInterval / 2,
	}
	d.beats = d.job
	if hs := opts.HeartbeatStore; hs != nil {
		d.beats = jobStore{NewPrefixStore("rdzv/"+opts.RunID, hs)}
		d.ownBeats = true
		d.owned = append(d.owned, hs)
	}
	d.life, d.quit = context.WithCancel(context.Background())
	return d
}

// RoundInfo is what Next tells about the round beyond Round: this node's
// global ranks, the restart count, and when the round is over.
type RoundInfo struct {
	// Number counts the job's rounds from 0.
	Number int
	// Restarts is the job's restart count when the round opened: the
	// failures that spent the budget so far (TORCHELASTIC_RESTART_COUNT).
	Restarts int
	// GroupRank is this node's rank among GroupWorldSize nodes.
	GroupRank, GroupWorldSize int
	// FirstRank is the global rank of this node's local rank 0: nodes hold
	// contiguous global ranks in group-rank order, NProc each.
	FirstRank int
	// WorldSize is the round's number of workers: the sum of NProc.
	WorldSize int

	next place // what this node knows of the next one, which it watches

	changed chan struct{}
	once    sync.Once
	reason  string // set before changed closes
}

// Changed is closed when the round is superseded: a participant died or
// left, a node waits to join, a node failed (Fail), the job ended, this
// node lost the store, or it left itself (Next, Close).
func (ri *RoundInfo) Changed() <-chan struct{} { return ri.changed }

// Reason says why the round was superseded, once Changed is closed; it is
// empty before. Example: "node n2 on gpu7 missed 3 heartbeats".
func (ri *RoundInfo) Reason() string {
	select {
	case <-ri.changed:
		return ri.reason
	default:
		return ""
	}
}

// NewRoundInfo returns the round of an Elastic handler other than
// Dynamic, open until End.
func NewRoundInfo(number, restarts, groupRank, groupWorldSize, firstRank, worldSize int) *RoundInfo {
	return &RoundInfo{
		Number: number, Restarts: restarts, GroupRank: groupRank, GroupWorldSize: groupWorldSize,
		FirstRank: firstRank, WorldSize: worldSize, changed: make(chan struct{}),
	}
}

// End closes Changed with reason, the first time only: the handler that
// made the round saw it superseded.
func (ri *RoundInfo) End(reason string) { ri.end(reason) }

// end closes Changed with reason, the first time only.
func (ri *RoundInfo) end(reason string) {
	ri.once.Do(func() {
		ri.reason = reason
		close(ri.changed)
	})
}

func (ri *RoundInfo) ended() bool { return ri.Reason() != "" }

// Current returns the latest round this node took part in, or nil before
// the first.
func (d *Dynamic) Current() *RoundInfo {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.round
}

// Next blocks until this node takes part in a complete round, and returns
// it (Current tells more). Calling Next again while that round is still
// current opens a new round for everyone. It fails when the job is over
// (ErrJobEnded, ErrJobFailed), when JoinTimeout passes without a place for
// this node (ErrJoinTimeout, naming how many nodes came), or when ctx ends.
// A node that gives up a round it joined withdraws from it: at once when
// the store failed; when ctx ended, in the next Next, Leave or Close, so
// that a caller in a hurry (an agent stopped by a signal) bounds what is
// still said to the store.
func (d *Dynamic) Next(ctx context.Context) (*Round, error) {
	ctx, done, err := d.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	o := d.opts
	if o.MinNodes > o.MaxNodes {
		return nil, fmt.Errorf("rendezvous: min nodes %d > max nodes %d", o.MinNodes, o.MaxNodes)
	}
	if a := d.takeAbandoned(); a != nil {
		wctx, cancel := context.WithTimeout(ctx, o.CloseTimeout)
		d.withdraw(wctx, a.st, a.idx)
		cancel()
	}

	st, err := d.leaveRound(ctx)
	if err != nil {
		return nil, err
	}
	deadline := o.Now().Add(o.JoinTimeout)
	for {
		if st.End != jobstate.Running {
			return nil, d.overError(ctx, st)
		}
		idx, v, err := d.join(ctx, st, deadline)
		if err != nil {
			return nil, err
		}
		switch {
		case idx < v.n:
			round, err := d.takePart(ctx, st, idx, v)
			if round != nil || err != nil {
				return round, err
			}
			// A participant never registered; the round is gone.
		case v.timedOut:
			w := d.waiting(ctx, st.Round, idx, v.arrivals, 0, "join timeout")
			return nil, fmt.Errorf("%w after %v: %d of min %d nodes joined round %d; missing: %s",
				ErrJoinTimeout, o.JoinTimeout, v.arrivals, o.MinNodes, st.Round, w.MissingText())
		case v.n == o.MaxNodes:
			d.log.Info().Int("round", st.Round).Msg("round is full: waiting as a spare")
			if err := d.awaitNextRound(ctx, st); err != nil {
				return nil, err
			}
			// A spare's wait is not a join: its clock starts now.
			deadline = o.Now().Add(o.JoinTimeout)
		default:
			reason := fmt.Sprintf("node %s on %s waits to join (round %d has %d of max %d nodes)",
				o.NodeID, o.Host, st.Round, v.n, o.MaxNodes)
			if _, err := d.job.advance(ctx, st, st.Superseded(), reason); err != nil {
				return nil, fmt.Errorf("rendezvous: open the round after %d: %w", st.Round, err)
			}
		}
		if st, err = d.job.state(ctx); err != nil {
			return nil, err
		}
	}
}

// begin admits a call unless the handler is closed, and returns its
// context, which Close also ends, and what to call when it returns.
func (d *Dynamic) begin(ctx context.Context) (context.Context, func(), error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, nil, ErrHandlerClosed
	}
	d.ops.Add(1)
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(d.life, func() { cancel(ErrHandlerClosed) })
	return ctx, func() {
		stop()
		cancel(nil)
		d.ops.Done()
	}, nil
}

// leaveRound stops this node's part in its round, opening a new round if
// that one is still current, and returns the job's state.
func (d *Dynamic) leaveRound(ctx context.Context) (jobstate.State, error) {
	d.mu.Lock()
	prev, prevState := d.round, d.state
	d.stopWatchLocked()
	d.mu.Unlock()

	st, err := d.job.state(ctx)
	if err != nil || prev == nil || prev.ended() {
		return st, err
	}
	reason := fmt.Sprintf("node %s on %s asked for a new round", d.opts.NodeID, d.opts.Host)
	if st == prevState {
		st, err = d.job.advance(ctx, st, st.Superseded(), reason)
		if err != nil {
			return st, err
		}
	}
	prev.end(d.job.reason(ctx, prev.Number, st, d.poll))
	return st, nil
}

// verdict is how a round was decided, as one joiner saw it.
type verdict struct {
	n        int  // participants: arrivals 0..n-1
	decided  bool // by this node (maybe by others too, with the same n)
	arrivals int  // nodes that had joined, when timedOut
	timedOut bool // this node decided it at its join deadline
}

// join adds this node to round st.Round and waits until the round is
// decided; it withdraws the node if it gives up before that.
func (d *Dynamic) join(ctx context.Context, st jobstate.State, deadline time.Time) (idx int, v verdict, err error) {
	r := st.Round
	a, err := d.job.Add(ctx, roundKey(r, "arrivals"), 1)
	if err != nil {
		return 0, v, fmt.Errorf("rendezvous: join round %d: %w", r, err)
	}
	idx = int(a - 1)
	me := d.self
	if me.Since[0] < 0 {
		me.Since = [2]int{r, idx}
	}
	b, err := json.Marshal(me)
	if err == nil {
		err = d.job.Set(ctx, nodeKey(r, idx), b)
	}
	if err == nil && idx+1 == d.opts.MaxNodes {
		v.n, err = d.job.decide(ctx, r, d.opts.MaxNodes)
		v.decided = v.n == d.opts.MaxNodes
	} else if err == nil {
		v, err = d.awaitDecision(ctx, st, idx, deadline)
	}
	switch {
	case errors.Is(err, ErrJobEnded), errors.Is(err, ErrJobFailed):
		return idx, v, err
	case err != nil:
		d.giveUp(ctx, st, idx)
		return idx, v, fmt.Errorf("rendezvous: join round %d: %w", r, err)
	}
	return idx, v, nil
}

// awaitDecision waits for round st.Round, in which this node arrived
// idx-th, to be decided. Once MinNodes have joined, this node gives the
// round LastCallTimeout more on its own clock, then decides it with the
// nodes there; at the join deadline it decides it at once: with the nodes
// there if enough, else by voiding it.
func (d *Dynamic) awaitDecision(ctx context.Context, st jobstate.State, idx int, deadline time.Time) (verdict, error) {
	o, r := d.opts, st.Round
	var lastCall time.Time // when this node saw MinNodes arrivals
	start := o.Now()
	var reported time.Time // the last progress report
	// Its own arrival told this node how many had come: the first look
	// needs no read of the counter.
	arrivals := idx + 1
	for first := true; ; first = false {
		if !first {
			var err error
			if arrivals, err = d.job.counter(ctx, roundKey(r, "arrivals")); err != nil {
				return verdict{}, err
			}
		}
		now := o.Now()
		if arrivals >= o.MinNodes && lastCall.IsZero() {
			lastCall = now
		}
		wait := min(d.poll, deadline.Sub(now))
		switch {
		case !lastCall.IsZero() && !now.Before(lastCall.Add(o.LastCallTimeout)):
			want := min(arrivals, o.MaxNodes)
			n, err := d.job.decide(ctx, r, want)
			return verdict{n: n, decided: n == want}, err
		case !now.Before(deadline):
			want := 0
			if arrivals >= o.MinNodes {
				want = min(arrivals, o.MaxNodes)
			}
			n, err := d.job.decide(ctx, r, want)
			return verdict{n: n, decided: n == want && n > 0, arrivals: arrivals, timedOut: true}, err
		case !lastCall.IsZero():
			wait = min(wait, lastCall.Add(o.LastCallTimeout).Sub(now))
		}
		if !now.Before(NextProgress(start, reported)) {
			left, until := deadline.Sub(now), "join timeout"
			if !lastCall.IsZero() {
				left, until = lastCall.Add(o.LastCallTimeout).Sub(now), "last call"
			}
			d.waiting(ctx, r, idx, arrivals, left, until).Log(d.log)
			reported = now
		}
		wait = min(wait, NextProgress(start, reported).Sub(now))

		cur, err := d.job.state(ctx)
		if err != nil {
			return verdict{}, err
		}
		if cur.End != jobstate.Running {
			return verdict{}, d.overError(ctx, cur)
		}
		v, ok, err := d.job.await(ctx, roundKey(r, "final"), wait)
		if err != nil {
			return verdict{}, err
		}
		if ok {
			n, err := strconv.Atoi(string(v))
			return verdict{n: n}, err
		}
	}
}

// giveUp takes this node, arrival idx of round st.Round, out of the round
// as a join fails: at once, within CloseTimeout, when the store failed;
// when ctx ended, its caller gave up and may be in a hurry, so the next
// Next, Leave or Close does, within its own bound.
func (d *Dynamic) giveUp(ctx context.Context, st jobstate.State, idx int) {
	if ctx.Err() == nil {
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.opts.CloseTimeout)
		defer cancel()
		d.withdraw(wctx, st, idx)
		return
	}
	d.mu.Lock()
	d.abandoned = &arrival{st: st, idx: idx}
	d.mu.Unlock()
}

// takeAbandoned returns, and forgets, the arrival that a caller gave up.
func (d *Dynamic) takeAbandoned() *arrival {
	d.mu.Lock()
	defer d.mu.Unlock()
	a := d.abandoned
	d.abandoned = nil
	return a
}

// withdraw takes this node, arrival idx of round st.Round, out of the
// round within ctx: it voids the round if undecided (the others join the
// next one), or leaves it if decided with this node. The request that
// failed may have left the store unusable: this is best effort.
func (d *Dynamic) withdraw(ctx context.Context, st jobstate.State, idx int) error {
	n, err := d.job.decide(ctx, st.Round, 0)
	if err == nil && idx < n {
		reason := fmt.Sprintf("node %s on %s left", d.opts.NodeID, d.opts.Host)
		_, err = d.job.advance(ctx, st, st.Superseded(), reason)
	}
	if err != nil {
		d.log.Warn().Err(err).Int("round", st.Round).Msg("could not withdraw from the round")
		return fmt.Errorf("rendezvous: withdraw from round %d: %w", st.Round, err)
	}
	return nil
}

// errUnregistered: a participant never published its descriptor.
var errUnregistered = errors.New("rendezvous: a participant never registered")

// takePart reads this node's place in round st.Round, in which it arrived
// idx-th, publishing every participant's place first if it decided the
// round (or if whoever did has not in time), and starts heartbeating. It
// returns no round if a participant never registered, having superseded
// the round.
func (d *Dynamic) takePart(ctx context.Context, st jobstate.State, idx int, v verdict) (*Round, error) {
	o, r := d.opts, st.Round
	var err error
	if v.decided {
		err = d.publishPlaces(ctx, r, v.n)
	}
	var raw []byte
	if err == nil {
		var ok bool
		raw, ok, err = d.job.await(ctx, placeKey(r, idx), d.window())
		if err == nil && !ok {
			d.log.Warn().Int("round", r).Msg("no places published: computing them")
			if err = d.publishPlaces(ctx, r, v.n); err == nil {
				raw, err = d.job.Get(ctx, placeKey(r, idx))
			}
		}
	}
	if errors.Is(err, errUnregistered) {
		reason := fmt.Sprintf("a node of round %d never registered", r)
		d.log.Warn().Int("round", r).Msg(reason)
		_, err := d.job.advance(ctx, st, st.Superseded(), reason)
		return nil, err
	}
	var p place
	if err == nil {
		err = json.Unmarshal(raw, &p)
	}
	if err != nil {
		d.giveUp(ctx, st, idx)
		return nil, fmt.Errorf("rendezvous: read this node's place in round %d: %w", r, err)
	}

	ri := &RoundInfo{
		Number:         r,
		Restarts:       st.Restarts,
		GroupRank:      p.GroupRank,
		GroupWorldSize: v.n,
		FirstRank:      p.FirstRank,
		WorldSize:      p.WorldSize,
		next:           p,
		changed:        make(chan struct{}),
	}
	if d.self.Since[0] < 0 {
		d.self.Since = [2]int{r, idx}
	}
	d.mu.Lock()
	d.round, d.state = ri, st
	d.watch = d.startWatch(ri, st)
	d.mu.Unlock()
	d.log.Info().Int("round", r).Int("restarts", st.Restarts).Int("group_rank", ri.GroupRank).
		Int("nodes", v.n).Int("world_size", ri.WorldSize).Msg("round complete")
	return &Round{
		Store:          NewPrefixStore(strconv.Itoa(r), d.job.Store),
		GroupRank:      ri.GroupRank,
		GroupWorldSize: v.n,
		StoreHost:      o.StoreHost,
		StorePort:      o.StorePort,
	}, nil
}

// window is how long a node may stay silent before the others count it
// dead: heartbeats, and registering after arriving.
func (d *Dynamic) window() time.Duration {
	return d.opts.HeartbeatInterval * time.Duration(d.opts.HeartbeatMisses)
}

// publishPlaces computes the place of each of the n participants of round
// r from their descriptors, and publishes them with one request.
func (d *Dynamic) publishPlaces(ctx context.Context, r, n int) error {
	ds, err := d.descriptors(ctx, r, n)
	if err != nil {
		return err
	}
	keys := make([]string, n)
	values := make([][]byte, n)
	for i, p := range places(ds) {
		keys[i] = placeKey(r, i)
		if values[i], err = json.Marshal(p); err != nil {
			return err
		}
	}
	return d.job.MultiSet(ctx, keys, values)
}

// descriptors reads the descriptors of the n participants of round r, by
// arrival. Each registers right after it arrives: one that has not within
// a heartbeat window died in between (errUnregistered).
func (d *Dynamic) descriptors(ctx context.Context, r, n int) ([]descriptor, error) {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = nodeKey(r, i)
	}
	rctx, cancel := context.WithTimeout(ctx, d.window())
	defer cancel()
	values, err := d.job.MultiGet(rctx, keys)
	switch {
	case err != nil && ctx.Err() == nil && rctx.Err() != nil:
		return nil, errUnregistered
	case err != nil:
		return nil, err
	}
	return decodeDescriptors(values)
}

// Nodes reads the participants of this node's round, in group-rank order:
// O(n) bytes, for reports, where a round costs each node O(1).
func (d *Dynamic) Nodes(ctx context.Context) ([]NodeInfo, error) {
	ctx, done, err := d.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	ri, _, err := d.current()
	if err != nil {
		return nil, err
	}
	ds, err := d.descriptors(ctx, ri.Number, ri.GroupWorldSize)
	if err != nil {
		return nil, fmt.Errorf("rendezvous: read the nodes of round %d: %w", ri.Number, err)
	}
	nodes, _ := roster(ds)
	return nodes, nil
}

// NamedReportNodes bounds the rounds in which every waiting node names
// the nodes there in its progress reports; in larger ones only the first
// arrival does, and the others give counts, so that a report costs each
// node O(1) and the round O(n).
const NamedReportNodes = 64

// waiting describes round r, which arrivals nodes joined, as this node,
// arrival idx, reports it: one read of their descriptors, bounded, since
// a node registers just after it arrives and may have died in between; the
// report then names no one. In a round of more than NamedReportNodes only
// the first arrival reads them, and the others report counts: a report
// then costs each node O(1) and the round O(n), where every node reading
// every descriptor cost O(n²) (at 4,096 nodes, 16 million descriptors
// every ProgressPeriod, enough to stall the store that serves the round).
func (d *Dynamic) waiting(ctx context.Context, r, idx, arrivals int, left time.Duration, until string) Waiting {
	o := d.opts
	w := Waiting{Joined: arrivals, Min: o.MinNodes, Max: o.MaxNodes, Left: max(left, 0), Until: until}
	if idx > 0 && arrivals > NamedReportNodes {
		return w
	}
	keys := make([]string, arrivals)
	for i := range keys {
		keys[i] = nodeKey(r, i)
	}
	rctx, cancel := context.WithTimeout(ctx, min(d.poll, time.Second))
	defer cancel()
	values, err := d.job.MultiGet(rctx, keys)
	if err != nil {
		return w
	}
	ds, err := decodeDescriptors(values)
	if err != nil {
		return w
	}
	ranks := make([]int, len(ds))
	for i, dd := range ds {
		w.Names = append(w.Names, dd.Host)
		ranks[i] = dd.Rank
	}
	w.Missing = MissingNodes(w.Names, ranks, o.Expected, o.MinNodes, o.MaxNodes)
	return w
}

// awaitNextRound waits, as a spare, until round st.Round is superseded.
func (d *Dynamic) awaitNextRound(ctx context.Context, st jobstate.State) error {
	for {
		if _, _, err := d.job.await(ctx, roundKey(st.Round, "superseded"), d.poll); err != nil {
			return err
		}
		cur, err := d.job.state(ctx)
		if err != nil || cur != st {
			return err
		}
	}
}

// overError describes a job that is over; an ended job's error says why,
// as recorded by the node that ended it.
func (d *Dynamic) overError(ctx context.Context, st jobstate.State) error {
	if st.End == jobstate.Failed {
		return fmt.Errorf("rendezvous: job %s has failed after %d restarts: %w", d.opts.RunID, st.Restarts, ErrJobFailed)
	}
	reason, _, _ := d.job.await(ctx, roundKey(st.Round-1, "superseded"), d.poll)
	return &jobEndedError{runID: d.opts.RunID, reason: string(reason)}
}

// jobEndedError reads "rendezvous: job <run id> has ended (<reason>)".
type jobEndedError struct{ runID, reason string }

func (e *jobEndedError) Error() string {
	if e.reason == "" {
		return "rendezvous: job " + e.runID + " has ended"
	}
	return "rendezvous: job " + e.runID + " has ended (" + e.reason + ")"
}

func (e *jobEndedError) Unwrap() error { return ErrJobEnded }
