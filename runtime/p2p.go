package runtime

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/cuda"
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
//
// Device tensors travel on NCCL where the group has it, which queues each
// message on the GPU when it is started, and matches the messages between
// two ranks in the order they were queued: it has no tags, and a receive
// must name its sender. A send waits on the GPU for its receive, so two
// ranks that send to each other must receive in the same order they send
// or use one BatchISendIRecv, as with torch's NCCL backend.
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
	w := newWork(ctx, "send", nil)
	w.desc = describe(t)
	w.desc.peer = dst
	return pg.startP2P(w, operands{reads: []*Tensor{&t}}, lane{send: true, peer: dst, tag: tag},
		func(ctx context.Context) error { return pg.p2p.Send(ctx, t.data, t.dtype, dst, tag) },
		func(ctx context.Context, c *cuda.Comm) ([]*cuda.Work, error) {
			return one(c.Send(ctx, t.ptr(), t.Len(), t.dtype, dst))
		})
}

func (pg *ProcessGroup) recv(ctx context.Context, t Tensor, src, tag int) *Work {
	w := newWork(ctx, "recv", nil)
	w.desc = describe(t)
	w.desc.peer = src
	return pg.startP2P(w, operands{writes: []*Tensor{&t}}, lane{peer: src, tag: tag},
		func(ctx context.Context) (err error) {
			w.source, err = pg.p2p.Recv(ctx, t.data, t.dtype, src, tag)
			return err
		},
		func(ctx context.Context, c *cuda.Comm) ([]*cuda.Work, error) {
			w.source = src // a named rank: NCCL has no other kind
			return one(c.Recv(ctx, t.ptr(), t.Len(), t.dtype, src))
		})
}

// startP2P starts w, a message of args's tensor, once the group, the
// lane's peer and tag and the tensor pass the checks; host and device are
// its forms, as in tensorOp. On the host and staged over TCP, it runs on
// lane l; on NCCL it is queued at once (see queueOnNCCL).
func (pg *ProcessGroup) startP2P(w *Work, args operands, l lane, host func(context.Context) error, device deviceOp) *Work {
	var nccl bool
	err := pg.admit(func() (err error) {
		if err = pg.checkP2P("", l); err != nil {
			return err
		}
		nccl, err = pg.onNCCL(args)
		switch {
		case err != nil:
			return err
		case !nccl:
			w.run, err = route(args, nil, host, nil)
			return err
		case !l.send && l.peer == AnySource:
			return anySourceOnNCCL("")
		}
		return args.onGPUOf(pg.nccl.messages())
	})
	if err != nil {
		w.finish(err)
		return w
	}
	if nccl {
		return pg.queueOnNCCL(w, device)
	}
	return pg.lanes.start(l, w)
}

// onNCCL reports whether messages of args go on NCCL: device tensors, in
// a group that has it.
func (pg *ProcessGroup) onNCCL(args operands) (bool, error) {
	onDevice, err := args.onDevice()
	return err == nil && onDevice && pg.nccl != nil, err
}

// anySourceOnNCCL refuses a receive from AnySource on NCCL; where names
// it in a batch.
func anySourceOnNCCL(where string) error {
	return invalid("%sAnySource with a device tensor: NCCL receives from a named rank only", where)
}

// queueOnNCCL queues w's device form on the group's NCCL communicator for
// messages now, in the caller's goroutine: NCCL matches the messages
// between two ranks in the order they are queued, which is then the order
// of the calls, as in torch. w waits for the GPU to run them.
func (pg *ProcessGroup) queueOnNCCL(w *Work, device deviceOp) *Work {
	works, err := device(w.ctx, pg.nccl.messages())
	w.run = func(ctx context.Context) error { return waitAll(ctx, works, err) }
	return pg.lanes.now(w)
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
// that error, so that no peer is left with half a batch. The tensors must
// all be on the host or all on GPUs; on NCCL, device tensors go as one
// NCCL group, whose Works complete together, and need no particular order
// between the ranks.
func (pg *ProcessGroup) BatchISendIRecv(ops []P2POp) []*Work {
	works := make([]*Work, len(ops))
	var nccl bool
	err := pg.admit(func() (err error) {
		if err = pg.checkBatch(ops); err != nil {
			return err
		}
		nccl, err = pg.batchOnNCCL(ops)
		return err
	})
	if err != nil {
		for i := range works {
			works[i] = failedWork("batch_isend_irecv", err)
		}
		return works
	}
	if nccl {
		return pg.ncclBatch(ops)
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

// batchOnNCCL reports whether ops go on NCCL, refusing a mix of host and
// device tensors and what NCCL cannot do.
func (pg *ProcessGroup) batchOnNCCL(ops []P2POp) (bool, error) {
	var all operands
	for i := range ops {
		if ops[i].Op == SendOp {
			all.reads = append(all.reads, &ops[i].Tensor)
		} else {
			all.writes = append(all.writes, &ops[i].Tensor)
		}
	}
	nccl, err := pg.onNCCL(all)
	if !nccl || err != nil {
		return false, err
	}
	if err := all.onGPUOf(pg.nccl.messages()); err != nil {
		return false, err
	}
	for i, op := range ops {
		if op.Op == RecvOp && op.Peer == AnySource {
			return false, anySourceOnNCCL(fmt.Sprintf("ops[%d] ", i))
		}
	}
	return true, nil
}

// ncclBatch queues ops, device tensors, as one NCCL group on the group's
// NCCL communicator for messages. Their Works finish when the group does.
func (pg *ProcessGroup) ncclBatch(ops []P2POp) []*Work {
	batch := pg.queueOnNCCL(newWork(context.Background(), "batch_isend_irecv", nil),
		func(ctx context.Context, c *cuda.Comm) ([]*cuda.Work, error) {
			msgs := make([]cuda.P2POp, len(ops))
			for i, op := range ops {
				if op.Op == SendOp {
					msgs[i] = sendTo(op.Peer, op.Tensor)
				} else {
					msgs[i] = recvFrom(op.Peer, op.Tensor)
				}
			}
			return p2pBatch(ctx, c, msgs)
		})
	works := make([]*Work, len(ops))
	for i, op := range ops {
		works[i] = newWork(context.Background(), []string{"send", "recv"}[op.Op], nil)
	}
	go func() {
		<-batch.done
		var cause error
		if opErr := (*OpError)(nil); errors.As(batch.err, &opErr) {
			cause = opErr.Err // each Work names its own operation
		}
		for i, w := range works {
			if cause == nil && ops[i].Op == RecvOp {
				w.source = ops[i].Peer
			}
			w.finish(cause)
		}
	}()
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
