package elastic

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun/gorun/rendezvous"
)

func TestFlightsRoundTrip(t *testing.T) {
	at := time.Unix(1700000000, 123456789)
	ranks := []rankFlight{
		{rank: 3, ops: []flightOp{
			{seq: 5, op: "all_reduce", dtype: "float64", count: 1, peer: -1, state: flightDone, start: at, end: at.Add(time.Millisecond)},
			{seq: 6, op: "recv", peer: 2, state: flightRunning, start: at.Add(time.Second)},
		}},
		{rank: 4}, // recorded nothing
	}
	b, err := encodeFlights(ranks)
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeFlights(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, ranks) {
		t.Errorf("round trip:\n got %+v\nwant %+v", got, ranks)
	}
	if _, err := decodeFlights([]byte("{")); err == nil || !strings.HasPrefix(err.Error(), "elastic: ") {
		t.Errorf("bad records: err %v", err)
	}
}

// in is a rank whose last operation, seq, is running or done.
func in(rank int, seq uint64, running bool) rankFlight {
	o := flightOp{seq: seq, op: "all_reduce", peer: -1, state: flightDone, start: time.Unix(100, 0), end: time.Unix(101, 0)}
	if running {
		o.state, o.end = flightRunning, time.Time{}
	}
	return rankFlight{rank: rank, ops: []flightOp{o}}
}

func share(store rendezvous.Store, node, nodes int, ranks ...rankFlight) *flightShare {
	return &flightShare{store: store, restart: 1, node: node, nodes: nodes,
		read: func() []rankFlight { return ranks }, log: zerolog.Nop(), period: 10 * time.Millisecond}
}

// The agent that finds the hang gets every node's ranks: from one that
// found it too and published, and from one that answers the request
// only; a node that never answers is named, and costs the wait once.
func TestGatherFlights(t *testing.T) {
	store := rendezvous.NewMemoryStore(time.Minute)
	ctx := t.Context()
	// Node 1 found the hang on its own: its records are there.
	if err := share(store, 1, 4, in(2, 6, true), in(3, 5, false)).publish(ctx); err != nil {
		t.Fatal(err)
	}
	// Node 2 answers at its next check only.
	n2 := share(store, 2, 4, in(4, 6, true))
	if ok, _, err := n2.answer(ctx); ok || err != nil {
		t.Fatalf("an agent answered a request nobody made: %v %v", ok, err)
	}
	if ok, _ := store.Check(ctx, []string{flightKey(1, 2)}); ok {
		t.Fatal("node 2 published unasked")
	}
	analysed := make(chan struct{})
	n2.onAnswer = func(hang bool) { // the answering node analyses too
		if !hang {
			t.Error("a hang's request was answered as a failure's")
		}
		close(analysed)
	}
	n2.start(ctx)
	defer n2.close()
	// Node 3 never answers.
	wait := 300 * time.Millisecond
	start := time.Now()
	all, missing := share(store, 0, 4, in(0, 6, true), in(1, 6, true)).gather(ctx, []rankFlight{in(0, 6, true), in(1, 6, true)}, false, wait)
	if took := time.Since(start); took > wait+time.Second {
		t.Errorf("gather took %s, over its wait %s", took, wait)
	}
	var ranks []int
	for _, r := range all {
		ranks = append(ranks, r.rank)
	}
	if !reflect.DeepEqual(ranks, []int{0, 1, 2, 3, 4}) || !reflect.DeepEqual(missing, []int{3}) {
		t.Errorf("gathered ranks %v, missing nodes %v; want [0 1 2 3 4] and [3]", ranks, missing)
	}
	lines, laggards := analyzeHang(all, time.Unix(200, 0))
	if !reflect.DeepEqual(laggards, []int{3}) {
		t.Errorf("laggards %v, want [3]:\n%s", laggards, strings.Join(lines, "\n"))
	}
	select {
	case <-analysed:
	case <-time.After(10 * time.Second):
		t.Error("node 2 answered without making the analysis")
	}
	// Answering is once per attempt.
	if ok, _, err := n2.answer(ctx); ok || err != nil {
		t.Errorf("node 2 answered twice: %v %v", ok, err)
	}
}

// Without a store to share through, or when the store fails, the
// analysis is of this node's ranks alone.
func TestGatherFlightsAlone(t *testing.T) {
	var none *flightShare
	own := []rankFlight{in(0, 6, true)}
	if all, missing := none.gather(t.Context(), own, false, time.Second); !reflect.DeepEqual(all, own) || missing != nil {
		t.Errorf("no share: %v %v", all, missing)
	}
	store := rendezvous.NewMemoryStore(time.Minute)
	store.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if all, missing := share(store, 0, 2).gather(ctx, own, false, time.Second); !reflect.DeepEqual(all, own) || missing != nil {
		t.Errorf("closed store: %v %v", all, missing)
	}
}

// A request that explains a failure is answered as one, not as a hang:
// the answering node labels its analysis so and dumps no stacks.
func TestAnswerTellsAFailureFromAHang(t *testing.T) {
	for _, failure := range []bool{false, true} {
		store := rendezvous.NewMemoryStore(time.Minute)
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		asking, answering := share(store, 0, 2, in(0, 6, true)), share(store, 1, 2, in(1, 5, false))
		got := make(chan bool, 1)
		answering.onAnswer = func(hang bool) { got <- hang }
		answering.start(ctx)
		if _, missing := asking.gather(ctx, []rankFlight{in(0, 6, true)}, failure, 5*time.Second); missing != nil {
			t.Errorf("failure %v: node 1 did not answer", failure)
		}
		select {
		case hang := <-got:
			if hang == failure {
				t.Errorf("a request for a failure (%v) was answered as a hang (%v)", failure, hang)
			}
		case <-ctx.Done():
			t.Errorf("failure %v: no answer", failure)
		}
		answering.close()
		cancel()
		store.Close()
	}
}
