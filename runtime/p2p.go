package runtime

import (
	"context"
	"fmt"
	"math"

	"github.com/gorun/gorun/collective"
)

// AnySource lets Recv take a message from whichever rank sends first.
const AnySource = collective.AnySource

// Send sends t to rank dst, to be matched by dst's Recv with the same
// tag. It returns once the backend has taken the message, which may be
// before or after the peer's Recv starts. Ranks are ranks in the group;
// tags are from 0 to math.MaxInt32.
//
// Point-to-point messages travel on a communicator of their own, beside
// the group's collectives rather than queued behind them: a Send never
// waits for the group's collectives, nor they for it. Messages overlap
// with each other too, each on its own goroutine, except that those in
// one direction with one peer and one tag keep their order: they are
// matched in the order they were started, on both sides. So ISends on
// different tags or to different peers progress independently (a peer
// may receive them in any order), and ISends of one tag to one peer
// arrive in order.
func (pg *ProcessGroup) Send(ctx context.Context, t Tensor, dst, tag int) error {
	return pg.send(ctx, t, dst, tag).Wait(ctx)
}

// ISend is the asynchronous form of Send.
func (pg *ProcessGroup) ISend(t Tensor, dst, tag int) *Work {
	return pg.send(context.Background(), t, dst, tag)
}

// Recv fills t with a message sent with tag by rank src, or by any rank
// when src is AnySource, and returns the sender's rank.
func (pg *ProcessGroup) Recv(ctx context.Context, t Tensor, src, tag int) (int, error) {
	w := pg.recv(ctx, t, src, tag)
	err := w.Wait(ctx)
	return w.Source(), err
}

// IRecv is the asynchronous form of Recv; the Work's Source is the
// sender once it completes.
func (pg *ProcessGroup) IRecv(t Tensor, src, tag int) *Work {
	return pg.recv(context.Background(), t, src, tag)
}

func (pg *ProcessGroup) send(ctx context.Context, t Tensor, dst, tag int) *Work {
	w := newWork(ctx, "send", func(ctx context.Context) error {
		return pg.p2p.Send(ctx, t.data, t.dtype, dst, tag)
	})
	return pg.startP2P(w, lane{send: true, peer: dst, tag: tag})
}

func (pg *ProcessGroup) recv(ctx context.Context, t Tensor, src, tag int) *Work {
	w := newWork(ctx, "recv", nil)
	w.run = func(ctx context.Context) (err error) {
		w.source, err = pg.p2p.Recv(ctx, t.data, t.dtype, src, tag)
		return err
	}
	return pg.startP2P(w, lane{peer: src, tag: tag})
}

// startP2P starts w on its lane, once the group and the lane's peer and
// tag pass the checks.
func (pg *ProcessGroup) startP2P(w *Work, l lane) *Work {
	if err := pg.admit(func() error { return pg.checkP2P("", l) }); err != nil {
		w.finish(err)
		return w
	}
	return pg.lanes.start(l, w)
}

// checkP2P checks a message's peer and tag; where names the message in a
// batch.
func (pg *ProcessGroup) checkP2P(where string, l lane) error {
	if l.tag < 0 || l.tag > math.MaxInt32 {
		return invalid("%stag %d is outside [0, %d]", where, l.tag, math.MaxInt32)
	}
	if !l.send && l.peer == AnySource {
		return nil
	}
	if err := pg.checkRank(where+"peer", l.peer); err != nil {
		return err
	}
	if l.peer == pg.rank {
		return invalid("%speer %d is this rank", where, l.peer)
	}
	return nil
}

// P2PKind tells a P2POp's direction.
type P2PKind int

// The directions of a P2POp.
const (
	SendOp P2PKind = iota
	RecvOp
)

// P2POp is one message of BatchISendIRecv: a Send to Peer, or a Recv from
// Peer (or AnySource).
type P2POp struct {
	Op     P2PKind
	Tensor Tensor
	Peer   int
	Tag    int
}

// BatchISendIRecv starts every operation of ops and returns their Works,
// in the same order (torch's batch_isend_irecv). The operations are
// checked first: when one is invalid, none starts and every Work reports
// that error, so that no peer is left with half a batch.
func (pg *ProcessGroup) BatchISendIRecv(ops []P2POp) []*Work {
	works := make([]*Work, len(ops))
	if err := pg.admit(func() error { return pg.checkBatch(ops) }); err != nil {
		for i := range works {
			works[i] = failedWork("batch_isend_irecv", err)
		}
		return works
	}
	for i, op := range ops {
		if op.Op == SendOp {
			works[i] = pg.ISend(op.Tensor, op.Peer, op.Tag)
		} else {
			works[i] = pg.IRecv(op.Tensor, op.Peer, op.Tag)
		}
	}
	return works
}

func (pg *ProcessGroup) checkBatch(ops []P2POp) error {
	for i, op := range ops {
		where := fmt.Sprintf("ops[%d] ", i)
		if op.Op != SendOp && op.Op != RecvOp {
			return invalid("%skind %d is neither SendOp nor RecvOp", where, op.Op)
		}
		if err := pg.checkP2P(where, lane{send: op.Op == SendOp, peer: op.Peer, tag: op.Tag}); err != nil {
			return err
		}
	}
	return nil
}
