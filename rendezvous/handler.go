package rendezvous

import (
	"context"
	"time"
)

// Round is the outcome of one rendezvous: where this node stands in the job
// and the store the round's agents share.
type Round struct {
	// Store is scoped to this round; agents use it to assign ranks and to
	// agree on anything else for the round.
	Store Store
	// GroupRank is this node's rank among GroupWorldSize nodes.
	GroupRank, GroupWorldSize int
	// StoreHost and StorePort locate the store that workers join
	// (MASTER_ADDR and MASTER_PORT in agent-store mode).
	StoreHost string
	StorePort int
}

// Handler runs rendezvous rounds for one agent.
type Handler interface {
	// Next blocks until this node is part of a complete round.
	Next(ctx context.Context) (*Round, error)
	// Leave tells the other nodes, within ctx, that this one is going, so
	// that none waits for it in vain; call Close afterwards.
	Leave(ctx context.Context) error
	// Close leaves the rendezvous and releases the store; a hosted store
	// stops serving.
	Close() error
}

// Elastic is a Handler whose rounds change as nodes come and go, with a
// restart budget, failure reports and an exit barrier that the whole job
// shares: what an elastic agent needs beyond Handler. Dynamic (c10d, on a
// store that one agent hosts) and the etcd handler (package
// rendezvous/etcd) implement it; an agent talks to any backend through
// Handler and, when it is one, Elastic, and never needs to know which.
//
// Next, Done, Fail and Leave are meant for the agent's loop, one call at a
// time; the others may be called from any goroutine.
type Elastic interface {
	Handler
	// Current returns the latest round this node took part in, or nil
	// before the first.
	Current() *RoundInfo
	// Fail reports that this node's workers failed in the current round
	// (report is one line, for Failures) and supersedes the round; the
	// first failure of a round spends one restart. restart is false once
	// the budget is spent: the job has failed for every node.
	Fail(ctx context.Context, report []byte) (restart bool, err error)
	// Weigh records that this node is deciding whether its workers'
	// failure is a lost node's doing; call end once it reported it.
	Weigh(ctx context.Context) (end func(), err error)
	// AwaitAlive reports whether every other node of the round showed,
	// before ctx ended, that it is alive since the call.
	AwaitAlive(ctx context.Context) bool
	// AwaitReports waits, up to timeout, until no node weighs a failure
	// of the round that ended the job (of the current one while it runs).
	AwaitReports(ctx context.Context, timeout time.Duration) error
	// Failures returns every node's failure reports, oldest first.
	Failures(ctx context.Context) ([][]byte, error)
	// Nodes returns the participants of this node's round, in group-rank
	// order.
	Nodes(ctx context.Context) ([]NodeInfo, error)
	// Done is the exit barrier once this node's workers succeeded: nil
	// once every node's did, ErrRoundChanged if the round changed first
	// (run again), ErrJobFailed or ErrJobEnded if the job is over.
	Done(ctx context.Context, timeout time.Duration) error
}

var _ Elastic = (*Dynamic)(nil)
