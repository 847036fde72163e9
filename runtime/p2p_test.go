package runtime

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestSendRecv(t *testing.T) {
	onRanks(t, 3, func(pg *ProcessGroup) error {
		ctx := t.Context()
		if pg.Rank() != 0 {
			return pg.Send(ctx, Of([]int64{int64(10 * pg.Rank())}), 0, 7)
		}
		// Receive from whoever sends first, then from the other one.
		got := []int64{0}
		first, err := pg.Recv(ctx, Of(got), AnySource, 7)
		if err != nil {
			return err
		}
		if first < 1 || first > 2 || got[0] != int64(10*first) {
			return fmt.Errorf("AnySource: %d from rank %d", got[0], first)
		}
		w := pg.IRecv(Of(got), 3-first, 7)
		if err := w.Wait(ctx); err != nil {
			return err
		}
		if w.Source() != 3-first || got[0] != int64(10*(3-first)) {
			return fmt.Errorf("IRecv: %d from rank %d", got[0], w.Source())
		}
		return nil
	})
}

func TestSendsOnOneLaneKeepTheirOrder(t *testing.T) {
	onRanks(t, 2, func(pg *ProcessGroup) error {
		const n = 100
		ctx := t.Context()
		if pg.Rank() == 0 {
			var works []*Work
			for i := range n {
				works = append(works, pg.ISend(Of([]int32{int32(i)}), 1, 3))
			}
			for _, w := range works {
				if err := w.Wait(ctx); err != nil {
					return err
				}
			}
			return nil
		}
		got := make([]int32, n)
		var works []*Work
		for i := range got {
			works = append(works, pg.IRecv(Of(got[i:i+1]), 0, 3))
		}
		for _, w := range works {
			if err := w.Wait(ctx); err != nil {
				return err
			}
		}
		for i, v := range got {
			if v != int32(i) {
				return fmt.Errorf("message %d holds %d", i, v)
			}
		}
		return nil
	})
}

func TestPointToPointBypassesTheQueue(t *testing.T) {
	onRanks(t, 2, func(pg *ProcessGroup) error {
		ctx := t.Context()
		x := []float32{1}
		if pg.Rank() == 0 {
			// Rank 1 joins this all_reduce only after our message: a send
			// queued behind it would deadlock.
			w := pg.AllReduceAsync(Of(x), Sum)
			if err := pg.Send(ctx, Of([]float32{5}), 1, 0); err != nil {
				return err
			}
			return w.Wait(ctx)
		}
		msg := []float32{0}
		if _, err := pg.Recv(ctx, Of(msg), 0, 0); err != nil {
			return err
		}
		return pg.AllReduce(ctx, Of(x), Sum)
	})
}

func TestBatchISendIRecvRing(t *testing.T) {
	onRanks(t, 4, func(pg *ProcessGroup) error {
		rank, size := pg.Rank(), pg.Size()
		next, prev := (rank+1)%size, (rank+size-1)%size
		got := []int32{-1}
		works := pg.BatchISendIRecv([]P2POp{
			{Op: RecvOp, Tensor: Of(got), Peer: prev},
			{Op: SendOp, Tensor: Of([]int32{int32(rank)}), Peer: next},
		})
		for _, w := range works {
			if err := w.Wait(t.Context()); err != nil {
				return err
			}
		}
		return expect("from the previous rank", got, []int32{int32(prev)})
	})
}

func TestPointToPointValidation(t *testing.T) {
	onRanks(t, 2, func(pg *ProcessGroup) error {
		ctx := t.Context()
		x := Of([]float32{1})
		_, recvErr := pg.Recv(ctx, x, 9, 0)
		for _, tc := range []struct {
			err  error
			want string
		}{
			{pg.Send(ctx, x, pg.Rank(), 0), fmt.Sprintf("runtime: send: invalid argument: peer %d is this rank", pg.Rank())},
			{pg.Send(ctx, x, AnySource, 0), "peer -1 is out of range"},
			{pg.Send(ctx, x, 1-pg.Rank(), -4), "tag -4 is outside [0, 2147483647]"},
			{recvErr, "runtime: recv: invalid argument: peer 9 is out of range for a group of 2 ranks"},
			{pg.BatchISendIRecv([]P2POp{{Op: SendOp, Tensor: x, Peer: 1 - pg.Rank()}, {Op: RecvOp, Tensor: x, Peer: 5}})[0].Wait(ctx),
				"runtime: batch_isend_irecv: invalid argument: ops[1] peer 5 is out of range"},
			{pg.BatchISendIRecv([]P2POp{{Op: 7, Tensor: x}})[0].Wait(ctx), "ops[0] kind 7 is neither SendOp nor RecvOp"},
		} {
			if !errors.Is(tc.err, ErrInvalidArgument) || !strings.Contains(tc.err.Error(), tc.want) {
				return fmt.Errorf("got %v, want an invalid argument error containing %q", tc.err, tc.want)
			}
		}
		return nil
	})
}

// A message sent is delivered even when its sender closes at once, before
// the receiver asks for it, as over any socket.
func TestSendThenCloseIsDelivered(t *testing.T) {
	closed := make(chan struct{})
	onTCPRanks(t, 2, func(pg *ProcessGroup) error {
		ctx := t.Context()
		if pg.Rank() == 0 {
			defer close(closed)
			if err := pg.Send(ctx, Of([]int64{42}), 1, 0); err != nil {
				return err
			}
			return pg.Close()
		}
		<-closed
		got := []int64{0}
		if _, err := pg.Recv(ctx, Of(got), 0, 0); err != nil {
			return err
		}
		return expect("message", got, []int64{42})
	})
}
