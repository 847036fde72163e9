package elastic

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun/gorun/rendezvous"
)

// membership is what the agent needs from a rendezvous: rounds to run the
// workers in, a say on restarts, and an exit barrier. The static
// rendezvous has one round and a budget of this node's own; the dynamic
// one has rounds that change with the nodes and a budget the job shares.
type membership interface {
	// next joins the next round.
	next(ctx context.Context) (*round, error)
	// fail reports this node's failures in the current round and tells
	// whether the job restarts.
	fail(ctx context.Context, failures []Failure) (restart bool, err error)
	// awaitAlive returns a channel closed once every other node of the
	// round has shown it is alive since the call (nil: never known).
	awaitAlive(ctx context.Context) <-chan struct{}
	// weigh tells the other nodes that this node's workers failed and
	// that it is deciding what to report; end tells them it is done.
	weigh(ctx context.Context) (end func())
	// failures returns every failure the job reported, on every node,
	// once the nodes still weighing a failure reported it or grace passed.
	failures(ctx context.Context, grace time.Duration) ([]Failure, error)
	// done is the exit barrier once this node's workers succeeded; it
	// returns rendezvous.ErrRoundChanged when the job must run again.
	done(ctx context.Context) error
	// leave tells the other nodes, within ctx, that this node is going,
	// stopped for why, so that none waits for it in vain; close follows.
	leave(ctx context.Context, why string) error
	// close leaves the rendezvous without ending the job for the others.
	close() error
}

// round is one placement of this node's workers in the job.
type round struct {
	store    rendezvous.Store // the round's store, shared by its agents
	number   int
	restarts int // TORCHELASTIC_RESTART_COUNT
	ranks    ranks
	// storeHost is where this node's group rank 0 is reached.
	storeHost string
	// agentStore is the store workers join in agent-store mode, when the
	// rendezvous provides one (static); nil means group rank 0 hosts a
	// fresh one for the round.
	agentStore *endpoint
	// changed is closed when the round is superseded; reason says why.
	changed <-chan struct{}
	reason  func() string
	// members reads the round's nodes, whose addresses alone (and this
	// machine's) may reach a workers' store this node hosts; nil when the
	// rendezvous names none.
	members func(ctx context.Context) ([]rendezvous.NodeInfo, error)
}

type endpoint struct {
	host string
	port int
}

// staticMembership runs torchrun's static rendezvous: one round, and a
// restart budget of this node's own.
type staticMembership struct {
	handler rendezvous.Handler
	spec    *Spec
	log     zerolog.Logger
	timeout time.Duration
	// joining is the round whose ranks are being assigned: the other
	// nodes wait for this one's, until current is set.
	joining     *rendezvous.Round
	current     *round
	restarts    int
	reports     []Failure
	maxRestarts int
}

func newStaticMembership(h rendezvous.Handler, spec *Spec, log zerolog.Logger) *staticMembership {
	return &staticMembership{handler: h, spec: spec, log: log, timeout: spec.StoreTimeout, maxRestarts: spec.MaxRestarts}
}

func (m *staticMembership) next(ctx context.Context) (*round, error) {
	if m.current != nil {
		r := *m.current
		r.restarts = m.restarts
		return &r, nil
	}
	rd, err := m.handler.Next(ctx)
	if err != nil {
		return nil, err
	}
	m.joining = rd
	await := func(ctx context.Context, keys []string) error {
		return m.awaitNodes(ctx, rd.Store, rd.GroupRank, rd.GroupWorldSize, keys)
	}
	rk, err := assignRanks(ctx, rd.Store, rd.GroupRank, rd.GroupWorldSize, m.spec.Role, m.spec.NProcPerNode, await)
	if err != nil {
		return nil, fmt.Errorf("elastic: assign ranks: %w", err)
	}
	m.joining = nil
	m.current = &round{
		store: rd.Store, ranks: rk, storeHost: rd.StoreHost,
		agentStore: &endpoint{rd.StoreHost, rd.StorePort},
		changed:    make(chan struct{}), reason: func() string { return "" },
	}
	return m.next(ctx)
}

func (m *staticMembership) fail(ctx context.Context, fs []Failure) (bool, error) {
	m.reports = fs
	if restartsLeft(m.restarts, m.maxRestarts) {
		m.restarts++
		return true, nil
	}
	// A node out of restarts is as finished as one whose workers
	// succeeded: it arrives at the exit barrier, without waiting there,
	// or the other nodes would wait out the barrier's timeout for it
	// (torchrun's agents do).
	if nodes := m.current.ranks.GroupWorldSize; nodes > 1 {
		ctx, cancel := context.WithTimeout(ctx, m.timeout)
		defer cancel()
		if err := arriveAtExit(ctx, m.current.store, nodes); err != nil {
			m.log.Warn().Err(err).Msg("exit barrier")
		}
	}
	return false, nil
}

// awaitAlive: a static node has no news of the others.
func (m *staticMembership) awaitAlive(context.Context) <-chan struct{} { return nil }

// weigh has no one to tell: a static node restarts on its own budget.
func (m *staticMembership) weigh(context.Context) func() { return func() {} }

func (m *staticMembership) failures(context.Context, time.Duration) ([]Failure, error) {
	return m.reports, nil
}

func (m *staticMembership) done(ctx context.Context) error {
	return exitBarrier(ctx, m.current.store, m.current.ranks.GroupWorldSize, m.timeout)
}

// leave: until the ranks are assigned, the other nodes wait for this
// one, or for nodes that are still to come, and the job cannot run
// without it: it tells them so (leaveRanks), and then, if it hosts the
// store, lets them read it before the store goes. Once the job runs, a
// static node has no one to tell: the others' workers see its workers go.
func (m *staticMembership) leave(ctx context.Context, why string) error {
	rd := m.joining
	if rd == nil || rd.GroupWorldSize <= 1 {
		return nil
	}
	msg := fmt.Sprintf("node %d on %s left before the job began: %s", rd.GroupRank, m.spec.Host, why)
	if err := leaveRanks(ctx, rd.Store, rd.GroupWorldSize, msg); err != nil {
		return err
	}
	return m.handler.Leave(ctx)
}

func (m *staticMembership) close() error { return m.handler.Close() }

// exitBarrier keeps this node's agent (and the store it may host) alive
// until every node's workers have finished, so no node loses the store
// while another still needs it.
func exitBarrier(ctx context.Context, store rendezvous.Store, nodes int, timeout time.Duration) error {
	if nodes <= 1 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := arriveAtExit(ctx, store, nodes); err != nil {
		return err
	}
	return store.Wait(ctx, []string{exitBarrierPrefix + "last_member"})
}

// exitBarrierPrefix is torchrun's: its keys in the store.
const exitBarrierPrefix = "torchelastic/agent/terminal_state/"

// arriveAtExit counts this node in the exit barrier; the last of the
// nodes to arrive opens it.
func arriveAtExit(ctx context.Context, store rendezvous.Store, nodes int) error {
	n, err := store.Add(ctx, exitBarrierPrefix+"num_members", 1)
	if err != nil || int(n) != nodes {
		return err
	}
	return store.Set(ctx, exitBarrierPrefix+"last_member", []byte("<val_ignored>"))
}

// elasticMembership runs an elastic rendezvous (c10d's Dynamic, etcd's
// handler): rounds of MinNodes to MaxNodes nodes, re-formed when a node
// dies or arrives, and one restart budget for the whole job.
type elasticMembership struct {
	d           rendezvous.Elastic
	exitTimeout time.Duration
}

func (m *elasticMembership) next(ctx context.Context) (*round, error) {
	rd, err := m.d.Next(ctx)
	if err != nil {
		return nil, err
	}
	ri := m.d.Current()
	return &round{
		store: rd.Store, number: ri.Number, restarts: ri.Restarts,
		ranks: ranks{
			GroupRank: ri.GroupRank, GroupWorldSize: ri.GroupWorldSize,
			BaseRank: ri.FirstRank, WorldSize: ri.WorldSize,
			BaseRoleRank: ri.FirstRank, RoleSize: ri.WorldSize,
		},
		storeHost: rd.StoreHost,
		changed:   ri.Changed(), reason: ri.Reason,
		members: m.d.Nodes,
	}, nil
}

func (m *elasticMembership) fail(ctx context.Context, fs []Failure) (bool, error) {
	return m.d.Fail(ctx, encodeFailures(fs))
}

func (m *elasticMembership) awaitAlive(ctx context.Context) <-chan struct{} {
	alive := make(chan struct{})
	go func() {
		if m.d.AwaitAlive(ctx) {
			close(alive)
		}
	}()
	return alive
}

func (m *elasticMembership) weigh(ctx context.Context) func() {
	end, err := m.d.Weigh(ctx)
	if err != nil {
		// The others then wait out their grace for this node's report.
		return func() {}
	}
	return end
}

func (m *elasticMembership) failures(ctx context.Context, grace time.Duration) ([]Failure, error) {
	if err := m.d.AwaitReports(ctx, grace); err != nil {
		return nil, err
	}
	reports, err := m.d.Failures(ctx)
	if err != nil {
		return nil, err
	}
	var all []Failure
	for _, r := range reports {
		fs, err := decodeFailures(r)
		if err != nil {
			return nil, err
		}
		all = append(all, fs...)
	}
	return all, nil
}

func (m *elasticMembership) done(ctx context.Context) error {
	err := m.d.Done(ctx, m.exitTimeout)
	if errors.Is(err, rendezvous.ErrJobEnded) {
		return nil
	}
	return err
}

func (m *elasticMembership) leave(ctx context.Context, _ string) error { return m.d.Leave(ctx) }

func (m *elasticMembership) close() error { return m.d.Close() }
