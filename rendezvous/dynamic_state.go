package rendezvous

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/gorun/gorun/rendezvous/internal/jobstate"
)

// The dynamic rendezvous keeps its state under "rdzv/<run id>/" in these
// keys. Every key but "state" is written once per round or is a counter, so
// that a join costs O(1) requests however many nodes contend:
//
//	state                   the job's register: "<round> <restarts>[ ended|failed]"
//	round/<r>/arrivals      counter; a joiner's arrival index is its Add - 1
//	round/<r>/node/<i>      descriptor JSON of the node that arrived i-th
//	round/<r>/final         participant count N, decided once by CompareSet;
//	                        arrivals 0..N-1 take part, "0" voids the round
//	round/<r>/place/<i>     the place of arrival i in the round, published by
//	                        the node that decided it
//	round/<r>/superseded    why round r ended (first writer wins)
//	round/<r>/done          counter of nodes whose workers all succeeded
//	round/<r>/complete      set by the last of them: the exit barrier
//	round/<r>/weighing      counter of nodes deciding whether a worker
//	                        failure is a lost node's doing (Weigh)
//	hb/<node id>            heartbeat counter
//	failures                failure reports, one JSON line each
//
// The agents of round r share the store "rdzv/<run id>/<r>/" (Round.Store).
const (
	keyState    = "state"
	keyFailures = "failures"
	// keyWeighing counts the nodes weighing a failure (Dynamic.Weigh).
	keyWeighing = "weighing"
)

func roundKey(r int, name string) string { return "round/" + strconv.Itoa(r) + "/" + name }

func nodeKey(r, i int) string { return roundKey(r, "node/"+strconv.Itoa(i)) }

func placeKey(r, i int) string { return roundKey(r, "place/"+strconv.Itoa(i)) }

func heartbeatKey(id string) string { return "hb/" + id }

// descriptor is what a node publishes when it joins a round.
type descriptor struct {
	ID    string `json:"id"`
	Host  string `json:"host"`
	Addr  string `json:"addr,omitempty"`
	PID   int    `json:"pid"`
	NProc int    `json:"nproc"`
	// Rank is the node rank the node asked for, or -1.
	Rank int `json:"rank"`
	// Since is where the node first took part: round and arrival index.
	// Ordering by it keeps the group ranks of the nodes that stay in the
	// same relative order from round to round.
	Since [2]int `json:"since"`
}

// NodeInfo describes one participant of a round.
type NodeInfo struct {
	ID         string
	Host, Addr string
	PID        int
	// NProc is the number of workers the node runs.
	NProc int
	// GroupRank is the node's rank in the round, FirstRank the global rank
	// of its local rank 0: nodes hold contiguous global ranks in
	// group-rank order.
	GroupRank, FirstRank int
}

// roster orders the participants of a round, given by arrival, and gives
// them group ranks and global rank offsets: by requested node rank when
// every participant asked for one, else by where each first took part
// (arrival order in a new job). Every node computes it from the same
// descriptors, so all agree. rankOf maps arrival index to group rank.
func roster(ds []descriptor) (nodes []NodeInfo, rankOf []int) {
	byRequest := !slices.ContainsFunc(ds, func(d descriptor) bool { return d.Rank < 0 })
	order := make([]int, len(ds)) // arrival indexes in group-rank order
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(i, j int) int {
		a, b := ds[i], ds[j]
		c := cmp.Or(cmp.Compare(a.Since[0], b.Since[0]), cmp.Compare(a.Since[1], b.Since[1]), cmp.Compare(i, j))
		if byRequest {
			c = cmp.Or(cmp.Compare(a.Rank, b.Rank), c)
		}
		return c
	})
	nodes = make([]NodeInfo, len(ds))
	rankOf = make([]int, len(ds))
	first := 0
	for rank, i := range order {
		d := ds[i]
		nodes[rank] = NodeInfo{ID: d.ID, Host: d.Host, Addr: d.Addr, PID: d.PID, NProc: d.NProc, GroupRank: rank, FirstRank: first}
		rankOf[i] = rank
		first += d.NProc
	}
	return nodes, rankOf
}

// place is a participant's place in a round. The node that decides the
// round computes every place from the descriptors, and each participant
// reads its own: O(1) bytes for each, where reading the roster would be
// O(n) for each and O(n²) for the store.
type place struct {
	GroupRank int `json:"rank"`
	FirstRank int `json:"first"`
	WorldSize int `json:"world"`
	// Next is the node after this one in group-rank order, round the
	// ring: the one whose heartbeats this one watches.
	Next     string `json:"next"`
	NextHost string `json:"next_host"`
}

// places returns the place of every participant, by arrival.
func places(ds []descriptor) []place {
	nodes, rankOf := roster(ds)
	world := 0
	for _, n := range nodes {
		world += n.NProc
	}
	ps := make([]place, len(ds))
	for i, g := range rankOf {
		next := nodes[(g+1)%len(nodes)]
		ps[i] = place{GroupRank: g, FirstRank: nodes[g].FirstRank, WorldSize: world, Next: next.ID, NextHost: next.Host}
	}
	return ps
}

func decodeDescriptors(values [][]byte) ([]descriptor, error) {
	ds := make([]descriptor, len(values))
	for i, v := range values {
		if err := json.Unmarshal(v, &ds[i]); err != nil {
			return nil, fmt.Errorf("rendezvous: descriptor of arrival %d: %w", i, err)
		}
	}
	return ds, nil
}

// jobStore is one job's view of the store (under "rdzv/<run id>"), with the
// steps of the protocol.
type jobStore struct{ Store }

// state reads the job's state, opening round 0 if the job is new: the
// CompareSet reply is the current value either way.
func (s jobStore) state(ctx context.Context) (jobstate.State, error) {
	v, err := s.CompareSet(ctx, keyState, nil, jobstate.State{}.Bytes())
	if err != nil {
		return jobstate.State{}, err
	}
	return jobstate.Parse(v)
}

// advance moves the job from state from to state to, unless it has moved
// already, and then records why round from.Round ended (the first reason
// recorded stays). It returns the state now current: to when this call, or
// another one with the same aim, made the move.
func (s jobStore) advance(ctx context.Context, from, to jobstate.State, reason string) (jobstate.State, error) {
	v, err := s.CompareSet(ctx, keyState, from.Bytes(), to.Bytes())
	if err != nil {
		return jobstate.State{}, err
	}
	cur, err := jobstate.Parse(v)
	if err != nil || cur != to {
		return cur, err
	}
	_, err = s.CompareSet(ctx, roundKey(from.Round, "superseded"), nil, []byte(reason))
	return cur, err
}

// reason returns why round r ended, waiting up to wait for the node that
// ended it to say so.
func (s jobStore) reason(ctx context.Context, r int, now jobstate.State, wait time.Duration) string {
	if v, ok, _ := s.await(ctx, roundKey(r, "superseded"), wait); ok {
		return string(v)
	}
	return fmt.Sprintf("round %d was superseded by round %d", r, now.Round)
}

// decide fixes the participant count of round r at n unless it is fixed
// already, and returns the count that stands.
func (s jobStore) decide(ctx context.Context, r, n int) (int, error) {
	v, err := s.CompareSet(ctx, roundKey(r, "final"), nil, []byte(strconv.Itoa(n)))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(string(v))
}

// counter reads a counter without changing it.
func (s jobStore) counter(ctx context.Context, key string) (int, error) {
	n, err := s.Add(ctx, key, 0)
	return int(n), err
}

// await returns key's value once it exists, or ok false once wait has
// passed without it.
func (s jobStore) await(ctx context.Context, key string, wait time.Duration) (value []byte, ok bool, err error) {
	if wait <= 0 {
		return nil, false, nil
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	value, err = s.Get(wctx, key)
	switch {
	case err == nil:
		return value, true, nil
	case ctx.Err() == nil && wctx.Err() != nil:
		// Timed out: in the wait (ErrTimeout), or in the read after it.
		return nil, false, nil
	}
	return nil, false, err
}
