package rendezvous

import "context"

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
