package etcd

import (
	"cmp"
	"slices"
	"strconv"
)

// The handler keeps a job's state under "<prefix>/<run id>/" in these keys.
// Liveness is etcd's: a node's keys are bound to its lease, and go when it
// lapses. Every transition is one transaction; every wait is a watch.
//
//	state                       the job's register: "<round> <restarts>[ ended|failed]"
//	round/<r>/node/<id>         a joiner's member JSON, on its lease; the key's
//	                            create revision is its arrival order
//	round/<r>/arrivals          put by every joiner as it joins: its version
//	                            counts the joins, its previous version is
//	                            the joiner's arrival index
//	round/<r>/call/last         created by the first joiner that sees MinNodes
//	                            (below MaxNodes): the last call is open
//	round/<r>/call/short        "<arrivals> <found>": when arrivals had joined,
//	                            a decider found only found of them there (the
//	                            others withdrew); every joiner counts from it
//	round/<r>/decider           the node deciding the round now, on its lease:
//	                            only its holder reads the members and writes
//	                            their seats, O(n), where every joiner that
//	                            saw the round full did, O(n²)
//	round/<r>/call/final        the decision, created once by a transaction:
//	                            who decided, how many take part (0 voids the
//	                            round), from which revision; O(1) bytes, since
//	                            every joiner watches it and reads it
//	round/<r>/seat/<by>/<id>    the place of member id, written by the node by
//	                            that decided the round, before the decision:
//	                            each member reads its own, O(1) bytes, where a
//	                            roster read by everyone cost the round O(n²)
//	round/<r>/call/superseded   why round r ended, put with the state that ends
//	                            it: under call/, so that a joiner needs one
//	                            watch for the round's news and the job's
//	round/<r>/weighing/<id>     on its lease: the node weighs a failure
//	round/<r>/done/<id>         the node's workers all succeeded
//	round/<r>/complete          put by the last of them: the exit barrier
//	round/<r>/store/...         the round's agents' Store (Round.Store)
//	failures/<r>/<id>           failure reports, one JSON line each
const (
	keyState    = "state"
	keyFailures = "failures/"
)

func roundKey(r int, name string) string { return "round/" + strconv.Itoa(r) + "/" + name }

func nodesKey(r int) string           { return roundKey(r, "node/") }
func arrivalsKey(r int) string        { return roundKey(r, "arrivals") }
func nodeKey(r int, id string) string { return nodesKey(r) + id }
func callKey(r int) string            { return roundKey(r, "call/") }
func lastCallKey(r int) string        { return callKey(r) + "last" }
func finalKey(r int) string           { return callKey(r) + "final" }
func shortKey(r int) string           { return callKey(r) + "short" }
func supersededKey(r int) string      { return callKey(r) + "superseded" }
func claimKey(r int) string           { return roundKey(r, "decider") }

// member is what a node publishes when it joins a round.
type member struct {
	ID    string `json:"id"`
	Host  string `json:"host"`
	Addr  string `json:"addr,omitempty"`
	NProc int    `json:"nproc"`
	// Rank is the node rank the node asked for, or -1.
	Rank int `json:"rank"`
	// Since is the create revision of the node's key in the first round
	// it took part in (0: none yet): ordering by it keeps the nodes that
	// stay in the same relative order from round to round.
	Since int64 `json:"since"`
	// arrival is the create revision of the node's key in this round.
	arrival int64
}

func seatsKey(r int, by string) string    { return roundKey(r, "seat/"+by+"/") }
func seatKey(r int, by, id string) string { return seatsKey(r, by) + id }

// roster is a decided round as its decider sees it: the members in
// group-rank order, and the revision at which they were read.
type roster struct {
	Rev   int64
	Nodes []member
}

// decision is what the final key says of a decided round.
type decision struct {
	// Rev is the revision at which the decider read the members: a
	// member's key deleted after it means the member is gone.
	Rev int64 `json:"rev"`
	// By is the decider, under whose name the seats are.
	By string `json:"by"`
	// N is the number of members; 0 voids the round.
	N int `json:"n"`
	// World is the sum of the members' NProc.
	World int `json:"world"`
}

// seat is a member's place in a decided round, with what it published.
type seat struct {
	member
	GroupRank int `json:"group_rank"`
	FirstRank int `json:"first_rank"`
}

// decide makes the decision and the seats of roster ro, decided by by.
func (ro roster) decide(by string) (decision, []seat) {
	d := decision{Rev: ro.Rev, By: by, N: len(ro.Nodes)}
	seats := make([]seat, len(ro.Nodes))
	for i, m := range ro.Nodes {
		seats[i] = seat{member: m, GroupRank: i, FirstRank: d.World}
		d.World += m.NProc
	}
	return d, seats
}

// order sorts the members of a round into group ranks: by requested node
// rank when every one asked for one, else by where each first took part,
// then by arrival. Every node reads the same roster, so all agree.
func order(ms []member) []member {
	byRequest := !slices.ContainsFunc(ms, func(m member) bool { return m.Rank < 0 })
	ms = slices.Clone(ms)
	since := func(m member) int64 {
		if m.Since == 0 {
			return m.arrival
		}
		return m.Since
	}
	slices.SortStableFunc(ms, func(a, b member) int {
		c := cmp.Or(cmp.Compare(since(a), since(b)), cmp.Compare(a.arrival, b.arrival))
		if byRequest {
			c = cmp.Or(cmp.Compare(a.Rank, b.Rank), c)
		}
		return c
	})
	return ms
}

// view is what a joiner of a round sees at one revision.
type view struct {
	moved    bool // the job's state is no longer the one joined
	arrivals int  // node keys in the round
	decided  bool // the round is decided (or void)
	size     int  // its members, once decided
	member   bool // this node is one of them
	// lastCallDue: MinNodes arrived LastCallTimeout ago, on this node's
	// clock; pastDeadline: its join timeout passed.
	lastCallDue, pastDeadline bool
	minNodes, maxNodes        int
}

// step is what a joiner does next.
type step int

const (
	stepWait     step = iota // for news, or the last call, or the deadline
	stepRetry                // the job moved on: join its current round
	stepTakePart             // the round was decided with this node
	stepDecide               // decide the round with the nodes there (up to max)
	stepVoid                 // at the deadline with too few nodes: void it and give up
	stepSpare                // decided full without this node: wait for the next
	stepOpenNext             // decided below max without it: open the next round
	stepTimedOut             // decided without it, at its deadline: give up
)

var stepNames = [...]string{"wait", "retry", "take part", "decide", "void", "spare", "open next", "timed out"}

func (s step) String() string { return stepNames[s] }

// nextStep decides a joiner's next step from what it sees: a round is
// decided at MaxNodes at once, or with whoever came LastCallTimeout after
// MinNodes did, or at a joiner's deadline; a node left out of a decided
// round below MaxNodes opens the next one (the late joiner's new round),
// while one left out of a full round waits as a spare.
func nextStep(v view) step {
	switch {
	case v.moved:
		return stepRetry
	case v.decided && v.member:
		return stepTakePart
	case v.decided && v.size >= v.maxNodes:
		return stepSpare
	case v.decided && v.pastDeadline:
		return stepTimedOut
	case v.decided:
		return stepOpenNext
	case v.arrivals >= v.maxNodes:
		return stepDecide
	case v.pastDeadline && v.arrivals >= v.minNodes:
		return stepDecide
	case v.pastDeadline:
		return stepVoid
	case v.lastCallDue && v.arrivals >= v.minNodes:
		return stepDecide
	}
	return stepWait
}
