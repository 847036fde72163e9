package elastic

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The flight recorder the runtime keeps after the progress counter (see
// runtime/flight.go, whose layout this mirrors: this side of the module
// does not import the runtime): each worker's last operations. When the
// group hangs, the agent reads its workers' records and tells which
// operation each rank is in and which ranks the others wait for. It sees
// the workers of its own node only: on several nodes, each agent tells
// what its ranks are doing.
const (
	flightMagic    = 0x67726631
	flightHeader   = 64
	flightSlotSize = 80

	flightRunning = 1
	flightDone    = 2
	flightFailed  = 3
)

// flightOp is one recorded operation.
type flightOp struct {
	seq         uint64
	op, dtype   string
	count, peer int64
	state       uint64
	start, end  time.Time
}

// rankFlight is a rank's recorded operations, oldest first.
type rankFlight struct {
	rank int
	ops  []flightOp
}

// decodeFlight returns the operations recorded in a progress file's
// bytes, oldest first; none when the file has no recorder (a worker that
// does not use the runtime, or an older one).
func decodeFlight(b []byte) []flightOp {
	if len(b) < flightHeader || binary.NativeEndian.Uint32(b[8:]) != flightMagic {
		return nil
	}
	slots := int(binary.NativeEndian.Uint32(b[12:]))
	u := func(off int) uint64 { return binary.NativeEndian.Uint64(b[off:]) }
	name := func(b []byte) string { return string(bytes.TrimRight(b, "\x00")) }
	var ops []flightOp
	for i := range slots {
		base := flightHeader + i*flightSlotSize
		if base+flightSlotSize > len(b) || u(base) == 0 {
			continue // a short file, an empty slot, or one being written
		}
		o := flightOp{
			seq: u(base), start: time.Unix(0, int64(u(base+8))),
			count: int64(u(base + 24)), peer: int64(u(base + 32)), state: u(base + 40),
			op: name(b[base+48 : base+72]), dtype: name(b[base+72 : base+80]),
		}
		if e := int64(u(base + 16)); e != 0 {
			o.end = time.Unix(0, e)
		}
		ops = append(ops, o)
	}
	slices.SortFunc(ops, func(a, b flightOp) int { return cmp.Compare(a.seq, b.seq) })
	return ops
}

// describe is how people read op: "all_reduce #1043 (float32 x 1000000)",
// "recv #7 (src=5, int32 x 2)".
func (o flightOp) describe() string {
	var args []string
	switch {
	case o.peer >= 0 && o.op == "send":
		args = append(args, "dst="+strconv.FormatInt(o.peer, 10))
	case o.peer >= 0:
		args = append(args, "src="+strconv.FormatInt(o.peer, 10))
	}
	if o.dtype != "" {
		args = append(args, o.dtype+" x "+strconv.FormatInt(o.count, 10))
	}
	s := o.op + " #" + strconv.FormatUint(o.seq, 10)
	if len(args) > 0 {
		s += " (" + strings.Join(args, ", ") + ")"
	}
	return s
}

// flightState is where a rank stands: in an operation, past its last
// one, or before any.
type flightState struct {
	last    *flightOp // nil: none recorded
	running bool
}

// reach orders states by how far the rank got: in operation n is past
// every operation before n, and past n once n ended.
func (s flightState) reach() uint64 {
	switch {
	case s.last == nil:
		return 0
	case s.running:
		return 2 * s.last.seq // in n: past n-1, not past n
	}
	return 2*s.last.seq + 1
}

// key groups ranks that stand at the same place.
func (s flightState) key() string {
	if s.last == nil {
		return ""
	}
	return fmt.Sprint(s.last.seq, s.last.op, s.running)
}

// tell says, for the ranks in a group, where they stand at now.
func (s flightState) tell(ranks []int, now time.Time) string {
	who, are := rankList(ranks), "are"
	if len(ranks) == 1 {
		are = "is"
	}
	switch {
	case s.last == nil:
		return who + " recorded no operation"
	case s.running:
		return fmt.Sprintf("%s %s in %s since %s", who, are, s.last.describe(), roundIdle(now.Sub(s.last.start)))
	}
	ended := "completed"
	if s.last.state == flightFailed {
		ended = "failed"
	}
	return fmt.Sprintf("%s %s %s and %s in no operation since %s", who, ended, s.last.describe(), are, roundIdle(now.Sub(s.last.end)))
}

// analyzeHang tells, from the ranks' records at now, where the ranks
// stand and which hold the others up: those that got least far (the
// laggards), or, when all got as far, those in another operation than
// most. It returns the analysis, one line per group of ranks, the
// waiting ones first, and the laggards' ranks.
func analyzeHang(ranks []rankFlight, now time.Time) (lines []string, laggards []int) {
	if len(ranks) == 0 {
		return nil, nil
	}
	type group struct {
		state flightState
		ranks []int
	}
	var groups []*group
	byKey := map[string]*group{}
	for _, r := range ranks {
		var s flightState
		if n := len(r.ops); n > 0 {
			s = flightState{last: &r.ops[n-1], running: r.ops[n-1].state == flightRunning}
		}
		g := byKey[s.key()]
		if g == nil {
			g = &group{state: s}
			byKey[s.key()] = g
			groups = append(groups, g)
		}
		g.ranks = append(g.ranks, r.rank)
	}
	for _, g := range groups {
		slices.Sort(g.ranks)
	}
	// The laggards: every rank behind the farthest, lowest sequence
	// number last; when all reach as far, the smaller groups beside the
	// largest (ties broken by the lowest rank).
	slices.SortFunc(groups, func(a, b *group) int {
		return cmp.Or(cmp.Compare(b.state.reach(), a.state.reach()), cmp.Compare(len(b.ranks), len(a.ranks)),
			cmp.Compare(a.ranks[0], b.ranks[0]))
	})
	farthest := groups[0].state.reach()
	split := slices.IndexFunc(groups, func(g *group) bool { return g.state.reach() < farthest })
	if split < 0 {
		split = min(1, len(groups))
	}
	for _, g := range groups[split:] {
		laggards = append(laggards, g.ranks...)
	}
	slices.Sort(laggards)
	for i, g := range groups {
		line := g.state.tell(g.ranks, now)
		switch {
		case i < split && len(laggards) > 0:
			line += ", waiting for " + rankList(laggards)
		case i < split && len(ranks) > 1:
			line += ": no rank of this node holds the others up"
		}
		lines = append(lines, line)
	}
	return lines, laggards
}

// rankList names ranks, ranges compressed: "rank 3", "ranks 0-2,5".
func rankList(ranks []int) string {
	var parts []string
	for i := 0; i < len(ranks); {
		j := i
		for j+1 < len(ranks) && ranks[j+1] == ranks[j]+1 {
			j++
		}
		if j > i {
			parts = append(parts, fmt.Sprintf("%d-%d", ranks[i], ranks[j]))
		} else {
			parts = append(parts, strconv.Itoa(ranks[i]))
		}
		i = j + 1
	}
	if len(ranks) == 1 {
		return "rank " + parts[0]
	}
	return "ranks " + strings.Join(parts, ",")
}
