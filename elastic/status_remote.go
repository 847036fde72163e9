package elastic

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/gorun/gorun/rendezvous"
)

// roundsBack is how many rounds before the current one RemoteStatus looks
// in: while a new round forms, the nodes still publish into the last one.
const roundsBack = 2

// RemoteStatus reads every node's status document of run runID from the
// job's store s, as a Client of the rendezvous endpoint sees it, writing
// nothing: the dynamic rendezvous's current round (or, while it forms, an
// earlier one), else node 0's store of a static rendezvous.
func RemoteStatus(ctx context.Context, s rendezvous.Store, runID string) ([]NodeStatus, error) {
	r, _, err := rendezvous.DynamicRound(ctx, s, runID)
	switch {
	case errors.Is(err, rendezvous.ErrNoJob):
		return roundStatus(ctx, rendezvous.StaticRoundStore(s, runID))
	case err != nil:
		return nil, err
	}
	for back := range roundsBack + 1 {
		if r-back < 0 {
			break
		}
		docs, err := roundStatus(ctx, rendezvous.DynamicRoundStore(s, runID, r-back))
		if err != nil || len(docs) > 0 {
			return docs, err
		}
	}
	return nil, nil
}

// roundStatus reads the documents of a round's store: node 0's says how
// many nodes there are. A node not published yet is left out.
func roundStatus(ctx context.Context, s rendezvous.Store) ([]NodeStatus, error) {
	var docs []NodeStatus
	for n, nodes := 0, 1; n < nodes; n++ {
		key := statusKey(n)
		ok, err := s.Check(ctx, []string{key})
		if err != nil {
			return nil, fmt.Errorf("elastic: read node %d's status: %w", n, err)
		}
		if !ok {
			continue
		}
		v, err := s.Get(ctx, key)
		if err != nil {
			return nil, fmt.Errorf("elastic: read node %d's status: %w", n, err)
		}
		var d NodeStatus
		if err := json.Unmarshal(v, &d); err != nil {
			return nil, fmt.Errorf("elastic: node %d's status: %w", n, err)
		}
		nodes = max(nodes, d.Nodes)
		docs = append(docs, d)
	}
	return docs, nil
}
