// Package jobstate is the register that every transition of an elastic
// job goes through, the same for every rendezvous backend (the store's
// and etcd's): "<round> <restarts>[ ended|failed]". Moving it from round
// r to r+1, by compare-and-set or in a transaction, supersedes round r.
// Carrying the restart count in it makes spending the budget and opening
// the next round one atomic step, so that the failures of several nodes
// in one round (often one fault seen everywhere) spend a single restart.
package jobstate

import (
	"fmt"
	"strconv"
	"strings"
)

// State is the job's register.
type State struct {
	Round    int
	Restarts int
	End      End
}

// End says whether, and how, the job is over.
type End string

const (
	Running End = ""
	Ended   End = "ended"  // success, or shut down on purpose
	Failed  End = "failed" // the restart budget is spent
)

// String is the register's stored form; Parse reads it back.
func (s State) String() string {
	v := strconv.Itoa(s.Round) + " " + strconv.Itoa(s.Restarts)
	if s.End != Running {
		v += " " + string(s.End)
	}
	return v
}

// Bytes is String as a store value.
func (s State) Bytes() []byte { return []byte(s.String()) }

// next is the state that opens the round after s's.
func (s State) next(restarts int, end End) State {
	return State{Round: s.Round + 1, Restarts: restarts, End: end}
}

// Superseded is the state that ends s's round at no cost to the restart
// budget: a node was lost, left, or waits for a place.
func (s State) Superseded() State { return s.next(s.Restarts, Running) }

// Ending is the state that ends the job after s's round.
func (s State) Ending() State { return s.next(s.Restarts, Ended) }

// AfterFailure is the state that a failure in s's round moves the job
// to: the next round, one restart more, or failed once that is over
// maxRestarts.
func (s State) AfterFailure(maxRestarts int) State {
	if s.Restarts+1 > maxRestarts {
		return s.next(s.Restarts, Failed)
	}
	return s.next(s.Restarts+1, Running)
}

// FailureReason is why a failure of node on host moved the job to s (an
// AfterFailure), as the round it supersedes records it.
func (s State) FailureReason(node, host string, maxRestarts int) string {
	if s.End == Failed {
		return fmt.Sprintf("node %s on %s failed: restart budget of %d spent, job failed", node, host, maxRestarts)
	}
	return fmt.Sprintf("node %s on %s failed: restart %d of %d", node, host, s.Restarts, maxRestarts)
}

// Parse reads a State from its stored form.
func Parse(b []byte) (State, error) {
	f := strings.Fields(string(b))
	if len(f) == 2 || len(f) == 3 {
		r, err1 := strconv.Atoi(f[0])
		k, err2 := strconv.Atoi(f[1])
		s := State{Round: r, Restarts: k}
		if len(f) == 3 {
			s.End = End(f[2])
		}
		if err1 == nil && err2 == nil && r >= 0 && k >= 0 && (s.End == Running || s.End == Ended || s.End == Failed) {
			return s, nil
		}
	}
	return State{}, fmt.Errorf("rendezvous: malformed job state %q", b)
}
