package runtime

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

func TestWorkRunsInCallOrder(t *testing.T) {
	onRanks(t, 2, func(pg *ProcessGroup) error {
		const n = 50
		bufs := make([][]int64, n)
		works := make([]*Work, n)
		for i := range works {
			bufs[i] = []int64{int64(i)}
			works[i] = pg.AllReduceAsync(Of(bufs[i]), Sum)
		}
		if err := works[n-1].Wait(t.Context()); err != nil {
			return err
		}
		for i, w := range works {
			// The fake pairs the ranks' calls by their order: a
			// reordered queue would sum different buffers.
			if !w.IsCompleted() || w.Err() != nil || bufs[i][0] != int64(2*i) {
				return fmt.Errorf("work %d: completed %v, err %v, sum %d", i, w.IsCompleted(), w.Err(), bufs[i][0])
			}
		}
		return nil
	})
}

func TestWorkPendingUntilEveryRankJoins(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		joined := make(chan struct{})
		join := sync.OnceFunc(func() { close(joined) })
		onRanks(t, 2, func(pg *ProcessGroup) error {
			x := []float32{1}
			if pg.Rank() == 1 {
				<-joined
				return pg.AllReduce(t.Context(), Of(x), Sum)
			}
			defer join() // on every path, lest rank 1 wait forever
			w := pg.AllReduceAsync(Of(x), Sum)
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			defer cancel()
			err := w.Wait(ctx)
			if !errors.Is(err, context.DeadlineExceeded) || w.IsCompleted() || w.Err() != nil {
				return fmt.Errorf("waiting alone: err %v, completed %v, Err %v", err, w.IsCompleted(), w.Err())
			}
			join()
			if err := w.Wait(t.Context()); err != nil || x[0] != 2 {
				return fmt.Errorf("after rank 1 joined: err %v, sum %v", err, x[0])
			}
			return nil
		})
	})
}

func TestGroupTimeoutEndsAnOperation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		onRanks(t, 2, func(pg *ProcessGroup) error {
			if pg.Rank() == 1 {
				return nil // never joins
			}
			start := time.Now()
			err := pg.Barrier(t.Context())
			if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) != 5*time.Second {
				return fmt.Errorf("barrier alone: %v after %s, want a deadline after 5s", err, time.Since(start))
			}
			return nil
		}, WithTimeout(5*time.Second))
	})
}

func TestCloseFailsPendingWork(t *testing.T) {
	onRanks(t, 2, func(pg *ProcessGroup) error {
		if pg.Rank() == 1 {
			return nil // never joins
		}
		running := pg.BarrierAsync()
		queued := pg.AllReduceAsync(Of([]float32{1}), Sum)
		if err := pg.Close(); err != nil {
			return err
		}
		after := pg.BarrierAsync()
		for name, w := range map[string]*Work{"running": running, "queued": queued, "after close": after} {
			if err := w.Wait(t.Context()); !errors.Is(err, ErrClosed) {
				return fmt.Errorf("%s work: %v, want ErrClosed", name, err)
			}
		}
		if err := pg.Send(t.Context(), Of([]float32{1}), 1, 0); !errors.Is(err, ErrClosed) {
			return fmt.Errorf("send after close: %v, want ErrClosed", err)
		}
		return pg.Close()
	})
}

// A blocking call with a context that never ends runs inline under the
// group's reused context: its timeout must still end it, and the next
// call's too, on a fresh deadline.
func TestInlineCallTimesOutAndSoDoesTheNext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		onRanks(t, 2, func(pg *ProcessGroup) error {
			if pg.Rank() == 1 {
				return nil // never joins
			}
			for i := range 2 {
				start := time.Now()
				err := pg.Barrier(context.Background())
				var opErr *OpError
				if !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &opErr) || opErr.Op != "barrier" || time.Since(start) != 5*time.Second {
					return fmt.Errorf("barrier %d alone: %v after %s, want the barrier's deadline after 5s", i, err, time.Since(start))
				}
			}
			return nil
		}, WithTimeout(5*time.Second))
	})
}

// Close ends a blocking call running inline with ErrClosed.
func TestCloseEndsAnInlineCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		onRanks(t, 2, func(pg *ProcessGroup) error {
			if pg.Rank() == 1 {
				return nil // never joins
			}
			result := make(chan error, 1)
			go func() { result <- pg.AllReduce(context.Background(), Of([]float32{1}), Sum) }()
			synctest.Wait() // the all_reduce waits for rank 1
			if err := pg.Close(); err != nil {
				return err
			}
			if err := <-result; !errors.Is(err, ErrClosed) {
				return fmt.Errorf("all_reduce running at Close: %v, want ErrClosed", err)
			}
			if err := pg.AllReduce(context.Background(), Of([]float32{1}), Sum); !errors.Is(err, ErrClosed) {
				return fmt.Errorf("all_reduce after Close: %v, want ErrClosed", err)
			}
			return nil
		})
	})
}
