package collective

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// When a collective times out, the ranks it waited for are often waiting
// themselves: in a ring, everyone waits on a neighbour once one rank
// stops. To name the rank that stopped, the timed-out rank asks every
// member what it is doing (a query frame, answered by the member's reader
// goroutine from a few atomics, whatever its user code is up to) and
// reports the ranks that never reached this call.

// diagnoseWait bounds how long a timed-out op waits for the answers.
const diagnoseWait = 500 * time.Millisecond

// statusNote is a status frame's payload.
type statusNote struct {
	Known   bool   `json:"known"`   // the communicator exists there
	Seq     uint64 `json:"seq"`     // its latest collective
	Op      string `json:"op"`      // that collective's name
	Active  bool   `json:"active"`  // still in it
	Waiting int    `json:"waiting"` // the rank it blocks on, or -1
}

// status is what a communicator tells queries; its op writes the
// atomics, the transport's readers read them.
func (c *comm) status() statusNote {
	seq, coll, active := unpackProgress(c.progress.Load())
	if seq == 0 {
		return statusNote{Known: true, Waiting: -1}
	}
	return statusNote{Known: true, Seq: seq, Op: coll.String(), Active: active, Waiting: int(c.waitingOn.Load())}
}

// A collective's public state is one word, so that publishing it
// allocates nothing: the sequence number in the high 48 bits, then the
// collective, then whether it is still running.
func packProgress(seq uint64, coll collKind, active bool) uint64 {
	v := seq<<16 | uint64(coll)<<1
	if active {
		v |= 1
	}
	return v
}

func unpackProgress(v uint64) (seq uint64, coll collKind, active bool) {
	return v >> 16, collKind(v >> 1), v&1 == 1
}

// diagnose asks the members what they are doing and explains the wait:
// the ranks that have not reached o's call (the culprits, if any), else on
// whom the ranks o waits for are waiting themselves.
func (c *comm) diagnose(o *op, waitingFor []int) (hint string, culprits []int) {
	if o.hdr.coll == collSend || c.size() < 3 || c.parent != nil {
		// With two ranks, or tags, there is no one else to blame; a view
		// (hierarchy.go) does not know what its members' other views do.
		return "", nil
	}
	answers := c.t.query(c, c.size()-1)
	var behind, chain []string
	for _, peer := range slices.Sorted(maps.Keys(answers)) {
		s := answers[peer]
		switch {
		case !s.Known:
			culprits = append(culprits, peer)
			behind = append(behind, fmt.Sprintf("rank %d has not created this communicator", peer))
		case s.Seq < o.hdr.seq:
			culprits = append(culprits, peer)
			last := "it has called no collective yet"
			if s.Seq > 0 {
				last = fmt.Sprintf("its last call was %s seq %d", s.Op, s.Seq)
			}
			behind = append(behind, fmt.Sprintf("rank %d has not called %s: %s", peer, o.label(), last))
		case slices.Contains(waitingFor, peer) && s.Active && s.Waiting >= 0:
			chain = append(chain, fmt.Sprintf("rank %d waits for rank %d", peer, s.Waiting))
		}
	}
	if len(behind) > 0 {
		return strings.Join(behind, "; "), culprits
	}
	return strings.Join(chain, "; "), nil
}

// query sends a query to every other member of c and collects up to want
// answers within diagnoseWait, keyed by comm rank.
func (t *transport) query(c *comm, want int) map[int]statusNote {
	replies := make(chan statusReply, c.size())
	m := t.match
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.queries[c.id] = replies
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		delete(m.queries, c.id)
		m.mu.Unlock()
	}()
	h := header{kind: kindQuery, comm: c.id}
	for peer, dst := range c.world {
		if peer != c.rank {
			t.spawn(func() { t.sendControl(dst, &h, nil) })
		}
	}
	answers := make(map[int]statusNote, want)
	timer := time.NewTimer(diagnoseWait)
	defer timer.Stop()
	for len(answers) < want {
		select {
		case r := <-replies:
			if peer := c.commRank(r.src, -1); peer >= 0 {
				answers[peer] = r.note
			}
		case <-timer.C:
			return answers
		}
	}
	return answers
}

type statusReply struct {
	src  int // world rank
	note statusNote
}

// spawn runs f in a goroutine the transport waits for on close, unless it
// is closed already.
func (t *transport) spawn(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		go f() // it fails at once on the closed transport
		return
	}
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		f()
	}()
}

// diagnosisFrame answers a query, or hands a status to the query waiting
// for it.
func (t *transport) diagnosisFrame(src int, h *header, payload []byte) {
	t.match.mu.Lock()
	c := t.match.comms[h.comm]
	replies := t.match.queries[h.comm]
	t.match.mu.Unlock()
	switch h.kind {
	case kindQuery:
		note := statusNote{Waiting: -1}
		if c != nil {
			note = c.status()
		}
		body, err := json.Marshal(note)
		if err != nil {
			return
		}
		reply := header{kind: kindStatus, comm: h.comm, length: uint32(len(body))}
		t.spawn(func() { t.sendControl(src, &reply, body) })
	case kindStatus:
		var note statusNote
		if replies == nil || json.Unmarshal(payload, &note) != nil {
			return
		}
		select {
		case replies <- statusReply{src, note}:
		default:
		}
	}
}
