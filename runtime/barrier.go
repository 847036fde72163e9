package runtime

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/gorun/gorun/collective"
)

// Tags of the monitored barrier's messages, below those users may give.
const (
	arrivalTag = -2
	verdictTag = -3
)

// MonitoredBarrier is a barrier that names the ranks that do not reach
// it, as torch's monitored_barrier does: every rank reports its arrival
// to rank 0 with a point-to-point message, and rank 0 waits up to timeout
// for them. With waitAll, the error names every rank that did not arrive.
// Without, rank 0 stops at the first failure, which may come before the
// timeout when a rank dies, and the error names that rank only (the
// lowest, when the timeout fails several at once).
//
// Rank 0 sends its verdict to the ranks that arrived, so they report the
// same error; they wait up to twice timeout for it, since rank 0 may
// arrive late itself. A zero timeout is the group's.
//
// A rank that arrives after rank 0 gave up leaves its report unread; the
// next monitored barrier takes it for an arrival, as in torch.
func (pg *ProcessGroup) MonitoredBarrier(ctx context.Context, timeout time.Duration, waitAll bool) error {
	const op = "monitored_barrier"
	if err := pg.admit(nil); err != nil {
		return &OpError{Op: op, Err: err}
	}
	if timeout <= 0 {
		timeout = pg.Timeout()
	}
	w := newWork(ctx, op, func(ctx context.Context) error {
		if pg.rank == 0 {
			return pg.awaitArrivals(ctx, timeout, waitAll)
		}
		return pg.arrive(ctx, timeout)
	})
	// The barrier keeps its own deadlines (twice timeout at most); the
	// operation's is only a safety net, which must not strike first.
	w.timeout = 3 * timeout
	// It runs beside the group's collectives, as point-to-point messages
	// do.
	return pg.lanes.start(lane{peer: AnySource, tag: arrivalTag}, w).Wait(ctx)
}

// awaitArrivals is rank 0's side of MonitoredBarrier.
func (pg *ProcessGroup) awaitArrivals(ctx context.Context, timeout time.Duration, waitAll bool) error {
	type arrival struct {
		rank int
		err  error
	}
	arrivals := make(chan arrival, pg.Size())
	waiting, stopWaiting := context.WithTimeout(ctx, timeout)
	defer stopWaiting()
	for r := 1; r < pg.Size(); r++ {
		go func() {
			_, err := pg.p2p.Recv(waiting, make([]byte, 1), Uint8, r, arrivalTag)
			arrivals <- arrival{r, err}
		}()
	}
	var arrived, missing []int // missing: in the order rank 0 learned of it
	for range pg.Size() - 1 {
		a := <-arrivals
		if a.err == nil {
			arrived = append(arrived, a.rank)
			continue
		}
		if r := culprit(a.err, a.rank); !slices.Contains(missing, r) {
			missing = append(missing, r)
		}
		if !waitAll {
			stopWaiting()
		}
	}
	if !waitAll && len(missing) > 0 {
		// The first failure, unless the deadline struck them all at once:
		// then the lowest rank, which torch, waiting for the ranks in
		// order, reports.
		first := missing[0]
		if errors.Is(waiting.Err(), context.DeadlineExceeded) {
			first = slices.Min(missing)
		}
		missing = []int{first}
	}
	verdict := make([]int32, pg.Size()) // 1 for each rank reported missing
	for _, r := range missing {
		verdict[r] = 1
	}

	// The deadline may have passed: the verdict gets a timeout of its own.
	telling, stopTelling := context.WithTimeout(ctx, timeout)
	defer stopTelling()
	done := make(chan struct{}, len(arrived))
	for _, r := range arrived {
		go func() {
			// A rank that misses the verdict reports rank 0 missing.
			pg.p2p.Send(telling, Of(verdict).data, Int32, r, verdictTag)
			done <- struct{}{}
		}()
	}
	for range arrived {
		<-done
	}
	if ctx.Err() != nil {
		return context.Cause(ctx) // not the ranks' fault
	}
	return barrierError(verdict, timeout)
}

// arrive is the side of MonitoredBarrier of every rank but 0.
func (pg *ProcessGroup) arrive(ctx context.Context, timeout time.Duration) error {
	waiting, cancel := context.WithTimeout(ctx, 2*timeout)
	defer cancel()
	verdict := make([]int32, pg.Size())
	err := pg.p2p.Send(waiting, make([]byte, 1), Uint8, 0, arrivalTag)
	if err == nil {
		_, err = pg.p2p.Recv(waiting, Of(verdict).data, Int32, 0, verdictTag)
	}
	switch {
	case ctx.Err() != nil:
		return context.Cause(ctx) // not rank 0's fault
	case err != nil:
		return &BarrierError{Missing: []int{culprit(err, 0)}, Timeout: timeout}
	}
	return barrierError(verdict, timeout)
}

// culprit returns the rank whose failure failed a message exchanged with
// peer: the one the backend names, since the death of one rank may fail
// the messages of others, else peer.
func culprit(err error, peer int) int {
	var pe *collective.PeerError
	if errors.As(err, &pe) {
		return pe.Rank
	}
	return peer
}

// barrierError returns the error naming the ranks the verdict marks, or
// nil when it marks none.
func barrierError(verdict []int32, timeout time.Duration) error {
	var missing []int
	for r, m := range verdict {
		if m != 0 {
			missing = append(missing, r)
		}
	}
	if missing == nil {
		return nil
	}
	return &BarrierError{Missing: missing, Timeout: timeout}
}
