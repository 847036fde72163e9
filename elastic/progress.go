package elastic

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/gorun/gorun/rendezvous"
)

// arrivalsKey lists, one JSON line per node, the nodes of a static job
// that reached the store: what a waiting node's progress report reads in
// one request.
const arrivalsKey = "gorun/arrivals"

// arrival is one line of arrivalsKey.
type arrival struct {
	Rank int    `json:"rank"`
	Host string `json:"host"`
}

// awaitNodes waits until every node of a static job published its role
// info (keys), at most m.timeout, reporting every rendezvous.ProgressPeriod
// who is there and who is not; past the timeout it fails naming the nodes
// missing. One goroutine, this one, owns the wait: a store client sends
// one request at a time, so the wait gives way to the report.
func (m *staticMembership) awaitNodes(ctx context.Context, store rendezvous.Store, groupRank, nnodes int, keys []string) error {
	line, err := json.Marshal(arrival{Rank: groupRank, Host: m.spec.Host})
	if err == nil {
		err = store.Append(ctx, arrivalsKey, append(line, '\n'))
	}
	if err != nil {
		// Reports then name fewer nodes; the wait is the same.
		m.log.Debug().Err(err).Msg("could not record this node's arrival")
	}
	start := time.Now()
	deadline := start.Add(m.timeout)
	var reported time.Time
	for {
		until := rendezvous.NextProgress(start, reported)
		if deadline.Before(until) {
			until = deadline
		}
		wctx, cancel := context.WithDeadline(ctx, until)
		err := store.Wait(wctx, keys)
		expired := wctx.Err() != nil
		cancel()
		switch {
		case err == nil:
			return nil
		case ctx.Err() != nil || !expired:
			return fmt.Errorf("wait for the role info of %d nodes: %w", nnodes, err)
		}
		now := time.Now()
		w := m.waiting(ctx, store, nnodes, deadline.Sub(now))
		if !now.Before(deadline) {
			return fmt.Errorf("%w after %v: %d of %d nodes joined; missing: %s",
				rendezvous.ErrJoinTimeout, m.timeout, w.Joined, nnodes, w.MissingText())
		}
		w.Log(m.log)
		reported = now
	}
}

// waiting reads who arrived, in one request, bounded: a store that does
// not answer makes a report that names no one.
func (m *staticMembership) waiting(ctx context.Context, store rendezvous.Store, nnodes int, left time.Duration) rendezvous.Waiting {
	rctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	raw, err := store.Get(rctx, arrivalsKey)
	if err != nil {
		raw = nil
	}
	return staticWaiting(raw, nnodes, left)
}

// staticWaiting is the progress report of a static job of nnodes nodes
// whose arrivals (arrivalsKey's value) are raw, left before the timeout.
func staticWaiting(raw []byte, nnodes int, left time.Duration) rendezvous.Waiting {
	hosts := map[int]string{}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		var a arrival
		// A node that restarted arrives again: once per rank.
		if json.Unmarshal(sc.Bytes(), &a) == nil && a.Rank >= 0 && a.Rank < nnodes {
			hosts[a.Rank] = a.Host
		}
	}
	ranks := make([]int, 0, len(hosts))
	for r := range hosts {
		ranks = append(ranks, r)
	}
	slices.Sort(ranks)
	w := rendezvous.Waiting{Joined: len(ranks), Min: nnodes, Max: nnodes, Left: max(left, 0), Until: "timeout"}
	for _, r := range ranks {
		w.Names = append(w.Names, fmt.Sprintf("%s (node rank %d)", hosts[r], r))
	}
	if len(ranks) > 0 {
		// Without arrivals (a store without Append), the missing are
		// unknown.
		w.Missing = rendezvous.MissingRanks(nnodes, ranks)
	}
	return w
}
