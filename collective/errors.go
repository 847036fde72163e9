package collective

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// Errors of every communicator.
var (
	// ErrClosed is returned by calls on a closed communicator, and by the
	// calls that were pending when it was closed.
	ErrClosed = errors.New("collective: communicator closed")
	// ErrMismatch is wrapped by the errors reporting that ranks called
	// different collectives, or the same one with different shapes.
	ErrMismatch = errors.New("collective: mismatched calls")
)

// PeerError reports an operation that failed because of one peer: it died,
// closed its connections, broke the protocol, or did not answer before the
// context was done. Rank is the peer's rank in the communicator the
// operation ran on.
type PeerError struct {
	Rank int
	Op   string // the operation and its sequence number: "all_reduce seq 7"
	Err  error
}

func (e *PeerError) Error() string {
	var wt *waitTimeout
	if errors.As(e.Err, &wt) {
		// The timeout names its ranks itself.
		return "collective: " + e.Op + ": " + e.Err.Error()
	}
	return fmt.Sprintf("collective: %s: rank %d: %v", e.Op, e.Rank, e.Err)
}

func (e *PeerError) Unwrap() error { return e.Err }

// waitTimeout is the cause of a PeerError whose context ended while the
// operation still waited on ranks.
type waitTimeout struct {
	ranks  []int // comm ranks still awaited, ascending
	action string
	cause  error // ctx's error (context.DeadlineExceeded or Canceled)
	hint   string
}

func (e *waitTimeout) Error() string {
	var b strings.Builder
	if errors.Is(e.cause, context.Canceled) {
		b.WriteString("canceled")
	} else {
		b.WriteString("timed out")
	}
	b.WriteString(" " + e.action + " ")
	b.WriteString(rankList(e.ranks))
	if e.hint != "" {
		b.WriteString(" (" + e.hint + ")")
	}
	return b.String()
}

func (e *waitTimeout) Unwrap() error { return e.cause }

// rankList names ranks as "rank 3" or "ranks 1, 3 and 4".
func rankList(ranks []int) string {
	switch len(ranks) {
	case 0:
		return "no rank"
	case 1:
		return fmt.Sprintf("rank %d", ranks[0])
	}
	var b strings.Builder
	b.WriteString("ranks ")
	for i, r := range ranks {
		switch {
		case i == len(ranks)-1:
			b.WriteString(" and ")
		case i > 0:
			b.WriteString(", ")
		}
		fmt.Fprint(&b, r)
	}
	return b.String()
}

// remoteError is a failure another rank reported to us in an abort frame.
type remoteError struct {
	reporter int
	msg      string
}

func (e *remoteError) Error() string {
	return fmt.Sprintf("reported by rank %d: %s", e.reporter, e.msg)
}

// MismatchError reports two ranks that called different collectives at
// the same point of their sequence. It wraps ErrMismatch. The rank that
// detects it sends it to every rank of the communicator, so each of them
// returns it from its current or next call; Viewer is the rank that
// returns it, and its text says "this rank" when Viewer is one of the two.
type MismatchError struct {
	Viewer       int
	RankA, RankB int
	CallA, CallB Call

	hdrA, hdrB header // the frames' headers, sent on in abort notes
	detail     string
}

// fill derives the calls from the headers.
func (e *MismatchError) fill() {
	e.CallA, e.CallB = e.hdrA.call(), e.hdrB.call()
}

// Call describes one rank's collective call as its frames announce it.
type Call struct {
	Op                      string // "all_reduce", "broadcast", ...
	DType                   DType
	Count                   uint64 // elements (all_to_all and p2p: of the message)
	Reduce                  Op     // for the reducing collectives
	Root                    int    // for the rooted collectives
	Seq                     uint64
	Algo                    string
	Tag                     int // for send/recv
	reduces, rooted, tagged bool
}

func (c Call) String() string {
	var b strings.Builder
	b.WriteString(c.Op)
	b.WriteByte('(')
	if c.Op == "barrier" || c.Op == "split" {
		fmt.Fprintf(&b, "seq %d", c.Seq)
		if c.Op == "split" {
			fmt.Fprintf(&b, ", key %#x", c.Count)
		}
		b.WriteByte(')')
		return b.String()
	}
	fmt.Fprintf(&b, "%v x %d", c.DType, c.Count)
	if c.reduces {
		fmt.Fprintf(&b, ", %v", c.Reduce)
	}
	if c.rooted {
		fmt.Fprintf(&b, ", root %d", c.Root)
	}
	if c.tagged {
		fmt.Fprintf(&b, ", tag %d", c.Tag)
	} else {
		fmt.Fprintf(&b, ", seq %d", c.Seq)
	}
	b.WriteByte(')')
	return b.String()
}

func (e *MismatchError) Error() string {
	self, other := e.RankA, e.RankB
	selfCall, otherCall := e.CallA, e.CallB
	if e.Viewer == e.RankB {
		self, other = other, self
		selfCall, otherCall = otherCall, selfCall
	}
	withAlgo := selfCall.Algo != otherCall.Algo
	describe := func(c Call) string {
		if withAlgo {
			return c.String() + " using " + c.Algo
		}
		return c.String()
	}
	var s string
	if e.Viewer == self {
		s = fmt.Sprintf("collective: mismatch with rank %d: this rank called %s, rank %d called %s",
			other, describe(selfCall), other, describe(otherCall))
	} else {
		s = fmt.Sprintf("collective: mismatch between rank %d and rank %d: rank %d called %s, rank %d called %s",
			self, other, self, describe(selfCall), other, describe(otherCall))
	}
	if e.detail != "" {
		s += " (" + e.detail + ")"
	}
	return s
}

func (e *MismatchError) Unwrap() error { return ErrMismatch }
