package elastic

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun/gorun/rendezvous"
)

// Cross-node hang analysis. A hang holds every node up, but each agent
// sees only its own workers' flight records, and the rank that holds the
// others up is often on another node. So the agent that finds a hang
// publishes its ranks' records under a key of the round's store, asks
// the other agents for theirs through a request key, and waits up to
// hangGatherWait for them before it analyses every rank at once. The
// other agents, which find the same hang at about the same time, do the
// same; one that does not (its ranks progressed more lately) answers the
// request at its next hang check, a store Check each tick while
// --hang-timeout is on and nothing else, and then dumps the stacks of
// its workers that made no progress for a check period, before the stop
// of the job that the other node fails reaches them. A request that
// explains a failure says so, and is answered with the analysis only.
// Keys carry the restart count: restarts within a round share its store.
const hangGatherWait = 2 * time.Second

// flightKey is the round store's key of node's flight records, in the
// attempt of restart.
func flightKey(restart, node int) string {
	return "gorun/flight/" + strconv.Itoa(restart) + "/" + strconv.Itoa(node)
}

// flightRequestKey is set by an agent that found a hang, or explains a
// failure, to ask the others for their records; its value is the node
// and, for a failure, failureRequest after it.
func flightRequestKey(restart int) string {
	return "gorun/flight/" + strconv.Itoa(restart) + "/request"
}

const failureRequest = " failure"

// flightDoc is a rank's records as published, compact.
type flightDoc struct {
	Rank int           `json:"r"`
	Ops  []flightOpDoc `json:"o,omitempty"`
}

type flightOpDoc struct {
	Seq   uint64 `json:"s"`
	Op    string `json:"o"`
	DType string `json:"d,omitempty"`
	Count int64  `json:"c,omitempty"`
	Peer  int64  `json:"p"`
	State uint64 `json:"t"`
	Start int64  `json:"b"`           // Unix nanoseconds
	End   int64  `json:"e,omitempty"` // Unix nanoseconds; 0: running
}

// encodeFlights is the published form of ranks.
func encodeFlights(ranks []rankFlight) ([]byte, error) {
	docs := make([]flightDoc, len(ranks))
	for i, r := range ranks {
		docs[i].Rank = r.rank
		for _, o := range r.ops {
			d := flightOpDoc{Seq: o.seq, Op: o.op, DType: o.dtype, Count: o.count, Peer: o.peer, State: o.state, Start: o.start.UnixNano()}
			if !o.end.IsZero() {
				d.End = o.end.UnixNano()
			}
			docs[i].Ops = append(docs[i].Ops, d)
		}
	}
	return json.Marshal(docs)
}

// decodeFlights reads what encodeFlights wrote.
func decodeFlights(b []byte) ([]rankFlight, error) {
	var docs []flightDoc
	if err := json.Unmarshal(b, &docs); err != nil {
		return nil, fmt.Errorf("elastic: flight records: %w", err)
	}
	ranks := make([]rankFlight, len(docs))
	for i, d := range docs {
		ranks[i].rank = d.Rank
		for _, o := range d.Ops {
			op := flightOp{seq: o.Seq, op: o.Op, dtype: o.DType, count: o.Count, peer: o.Peer, state: o.State, start: time.Unix(0, o.Start)}
			if o.End != 0 {
				op.end = time.Unix(0, o.End)
			}
			ranks[i].ops = append(ranks[i].ops, op)
		}
	}
	return ranks, nil
}

// flightShare is this node's part in the cross-node analysis of one
// attempt. A nil *flightShare (one node, no store) shares nothing.
type flightShare struct {
	store       rendezvous.Store
	restart     int
	node, nodes int
	read        func() []rankFlight // this node's records, now
	log         zerolog.Logger
	period      time.Duration // of the answer checks
	answered    atomic.Bool   // this node's records are published
	stop        func()        // the answering goroutine
	// onAnswer, when set, runs after the goroutine answered a request,
	// which was for a hang or, when hang is false, to explain a failure:
	// the analysis, which this node makes too, and for a hang its dumps.
	onAnswer func(hang bool)
}

// publish puts this node's records in the store.
func (s *flightShare) publish(ctx context.Context) error {
	v, err := encodeFlights(s.read())
	if err != nil {
		return err
	}
	if err := s.store.Set(ctx, flightKey(s.restart, s.node), v); err != nil {
		return fmt.Errorf("elastic: publish flight records: %w", err)
	}
	return nil
}

// answer publishes this node's records if another agent asked for them
// and they were not published yet; it reports whether it published, and
// whether the request was for a hang (else to explain a failure).
func (s *flightShare) answer(ctx context.Context) (published, hang bool, err error) {
	if s == nil || s.answered.Load() {
		return false, false, nil
	}
	asked, err := s.store.Check(ctx, []string{flightRequestKey(s.restart)})
	if err != nil || !asked {
		return false, false, err
	}
	request, err := s.store.Get(ctx, flightRequestKey(s.restart))
	if err != nil {
		return false, false, err
	}
	if err := s.publish(ctx); err != nil {
		return false, false, err
	}
	s.answered.Store(true)
	return true, !strings.HasSuffix(string(request), failureRequest), nil
}

// start answers, every period, another agent's request, until the
// records are published or close is called.
func (s *flightShare) start(ctx context.Context) {
	if s == nil {
		return
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	s.stop = func() { cancel(); <-done }
	go func() {
		defer close(done)
		t := time.NewTicker(s.period)
		defer t.Stop()
		for !s.answered.Load() {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			actx, acancel := context.WithTimeout(ctx, s.period)
			ok, hang, err := s.answer(actx)
			if err != nil && ctx.Err() == nil {
				s.log.Debug().Err(err).Msg("answering a hang analysis")
			}
			acancel()
			if ok {
				if hang {
					s.log.Info().Msg("another node found the job hung: published this node's flight records")
				} else {
					s.log.Info().Msg("another node explains a failure: published this node's flight records")
				}
				if s.onAnswer != nil {
					s.onAnswer(hang)
				}
			}
		}
	}()
}

// close stops answering.
func (s *flightShare) close() {
	if s != nil && s.stop != nil {
		s.stop()
	}
}

// gather publishes this node's records, own, asks the other nodes for
// theirs, for a hang or to explain a failure, and returns every rank's
// records that came within wait, by rank, and the nodes whose records did
// not.
func (s *flightShare) gather(ctx context.Context, own []rankFlight, failure bool, wait time.Duration) (ranks []rankFlight, missing []int) {
	if s == nil {
		return own, nil
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	ranks = own
	err := s.publish(ctx)
	if err == nil {
		request := strconv.Itoa(s.node)
		if failure {
			request += failureRequest
		}
		err = s.store.Set(ctx, flightRequestKey(s.restart), []byte(request))
	}
	if err != nil {
		s.log.Warn().Err(err).Msg("the hang analysis sees this node's ranks only")
		return ranks, nil
	}
	s.answered.Store(true)
	// One deadline for all: a node that does not answer costs the wait
	// once, not once per node. Past it, the records of the nodes after
	// that one may be there already: a last look, with one short
	// deadline for all.
	late, lateCancel := context.WithTimeout(context.WithoutCancel(ctx), wait+250*time.Millisecond)
	defer lateCancel()
	for n := range s.nodes {
		if n == s.node {
			continue
		}
		theirs, err := s.fetch(ctx, n)
		if err != nil && ctx.Err() != nil {
			if ok, cerr := s.store.Check(late, []string{flightKey(s.restart, n)}); cerr == nil && ok {
				theirs, err = s.fetch(late, n)
			}
		}
		if err != nil {
			missing = append(missing, n)
			continue
		}
		ranks = append(ranks, theirs...)
	}
	slices.SortFunc(ranks, func(a, b rankFlight) int { return a.rank - b.rank })
	return ranks, missing
}

// fetch reads node's records, waiting for them while ctx lasts.
func (s *flightShare) fetch(ctx context.Context, node int) ([]rankFlight, error) {
	v, err := s.store.Get(ctx, flightKey(s.restart, node))
	if err != nil {
		return nil, fmt.Errorf("elastic: flight records of node %d: %w", node, err)
	}
	return decodeFlights(v)
}
