package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/gorun/gorun/rendezvous/internal/jobstate"
)

// ErrNoJob says a store holds no dynamic rendezvous of the run id asked.
var ErrNoJob = errors.New("rendezvous: no such job in the store")

// DynamicRound reads, without writing anything, the current round of the
// dynamic rendezvous of runID in the job's store s (as a Client sees it),
// and returns that round's number and a view of its store: the Round.Store
// its agents share. An observer such as gorun status uses it from outside
// the job.
func DynamicRound(ctx context.Context, s Store, runID string) (int, Store, error) {
	job := NewPrefixStore("rdzv/"+runID, s)
	ok, err := job.Check(ctx, []string{keyState})
	if err != nil {
		return 0, nil, fmt.Errorf("rendezvous: read the job's state: %w", err)
	}
	if !ok {
		return 0, nil, fmt.Errorf("%w (run id %q)", ErrNoJob, runID)
	}
	v, err := job.Get(ctx, keyState)
	if err != nil {
		return 0, nil, fmt.Errorf("rendezvous: read the job's state: %w", err)
	}
	st, err := jobstate.Parse(v)
	if err != nil {
		return 0, nil, err
	}
	return st.Round, DynamicRoundStore(s, runID, st.Round), nil
}

// DynamicRoundStore is the view of round r's store of runID's dynamic
// rendezvous in the job's store s.
func DynamicRoundStore(s Store, runID string, r int) Store {
	return NewPrefixStore(strconv.Itoa(r), NewPrefixStore("rdzv/"+runID, s))
}

// StaticRoundStore is the view a static rendezvous's agents share of
// node 0's store s.
func StaticRoundStore(s Store, runID string) Store {
	return NewPrefixStore(runID, s)
}
