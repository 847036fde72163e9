package cuda

import (
	"context"
	"errors"
	"fmt"

	"github.com/gorun/gorun/collective/elem"
)

// The operations of a communicator. Buffers are device pointers (on the
// communicator's GPU), counts are in elements of dt, and ranks are ranks
// in the communicator, as in collective.Comm. Each operation is queued on
// the communicator's stream; wait for the returned Work before using its
// buffers. A send and a receive buffer may be the same (in place) where
// NCCL allows it: AllReduce, Broadcast, Reduce, and AllGather and
// ReduceScatter when the small buffer is the rank's own slice of the big one.

// AllReduce reduces count elements of send across all ranks into recv on
// every rank.
func (c *Comm) AllReduce(ctx context.Context, send, recv DevicePtr, count int, dt elem.DType, op elem.Op) (*Work, error) {
	const name = "all_reduce"
	t, o, err := c.reduction(name, dt, op)
	if err != nil {
		return nil, err
	}
	if err := c.checkCount(name, count); err != nil {
		return nil, err
	}
	return c.launch(ctx, name, func(h uintptr) (string, ncclResult) {
		return "ncclAllReduce", c.nccl.api.ncclAllReduce(send, recv, uintptr(count), t, o, h, c.stream)
	})
}

// Broadcast copies root's count elements of send into recv on every rank.
func (c *Comm) Broadcast(ctx context.Context, send, recv DevicePtr, count int, dt elem.DType, root int) (*Work, error) {
	const name = "broadcast"
	t, err := c.dataType(name, dt)
	if err == nil {
		err = errors.Join(c.checkCount(name, count), c.checkRank(name, "root", root))
	}
	if err != nil {
		return nil, err
	}
	return c.launch(ctx, name, func(h uintptr) (string, ncclResult) {
		return "ncclBroadcast", c.nccl.api.ncclBroadcast(send, recv, uintptr(count), t, int32(root), h, c.stream)
	})
}

// Reduce reduces count elements of send across all ranks into root's recv.
func (c *Comm) Reduce(ctx context.Context, send, recv DevicePtr, count int, dt elem.DType, op elem.Op, root int) (*Work, error) {
	const name = "reduce"
	t, o, err := c.reduction(name, dt, op)
	if err == nil {
		err = errors.Join(c.checkCount(name, count), c.checkRank(name, "root", root))
	}
	if err != nil {
		return nil, err
	}
	return c.launch(ctx, name, func(h uintptr) (string, ncclResult) {
		return "ncclReduce", c.nccl.api.ncclReduce(send, recv, uintptr(count), t, o, int32(root), h, c.stream)
	})
}

// AllGather concatenates every rank's count elements of send into recv
// (Size()*count elements), in rank order.
func (c *Comm) AllGather(ctx context.Context, send, recv DevicePtr, count int, dt elem.DType) (*Work, error) {
	const name = "all_gather"
	t, err := c.dataType(name, dt)
	if err == nil {
		err = c.checkCount(name, count)
	}
	if err != nil {
		return nil, err
	}
	return c.launch(ctx, name, func(h uintptr) (string, ncclResult) {
		return "ncclAllGather", c.nccl.api.ncclAllGather(send, recv, uintptr(count), t, h, c.stream)
	})
}

// ReduceScatter reduces send (the sum of counts elements) across ranks and
// leaves the i-th slice of the result, counts[i] elements, in rank i's
// recv. Equal counts are one ncclReduceScatter; unequal ones a group of
// ncclReduce, one per rank, as torch does.
func (c *Comm) ReduceScatter(ctx context.Context, send, recv DevicePtr, counts []int, dt elem.DType, op elem.Op) (*Work, error) {
	const name = "reduce_scatter"
	t, o, err := c.reduction(name, dt, op)
	if err == nil {
		err = c.checkCounts(name, "counts", counts)
	}
	if err != nil {
		return nil, err
	}
	if equal(counts) {
		return c.launch(ctx, name, func(h uintptr) (string, ncclResult) {
			return "ncclReduceScatter", c.nccl.api.ncclReduceScatter(send, recv, uintptr(counts[0]), t, o, h, c.stream)
		})
	}
	offsets := byteOffsets(counts, dt)
	return c.launch(ctx, name, func(h uintptr) (string, ncclResult) {
		return c.grouped(len(counts), func(i int) (string, ncclResult) {
			return "ncclReduce", c.nccl.api.ncclReduce(send+offsets[i], recv, uintptr(counts[i]), t, o, int32(i), h, c.stream)
		})
	})
}

// Gather gathers every rank's count elements of send into root's recv
// (Size()*count elements), in rank order; recv is unused elsewhere. It is
// a group of sends to root and, on root, receives from every rank.
func (c *Comm) Gather(ctx context.Context, send, recv DevicePtr, count int, dt elem.DType, root int) (*Work, error) {
	const name = "gather"
	_, err := c.dataType(name, dt)
	if err == nil {
		err = errors.Join(c.checkCount(name, count), c.checkRank(name, "root", root))
	}
	if err != nil {
		return nil, err
	}
	ops := []P2POp{{Peer: root, Buf: send, Count: count, DType: dt}}
	if c.rank == root {
		for i := range c.size {
			ops = append(ops, P2POp{Recv: true, Peer: i, Buf: recv + DevicePtr(i*count*dt.Size()), Count: count, DType: dt})
		}
	}
	return c.launch(ctx, name, c.p2pGroup(ops))
}

// Scatter gives rank i the i-th count-element slice of root's send, in its
// recv; send is unused elsewhere.
func (c *Comm) Scatter(ctx context.Context, send, recv DevicePtr, count int, dt elem.DType, root int) (*Work, error) {
	const name = "scatter"
	_, err := c.dataType(name, dt)
	if err == nil {
		err = errors.Join(c.checkCount(name, count), c.checkRank(name, "root", root))
	}
	if err != nil {
		return nil, err
	}
	var ops []P2POp
	if c.rank == root {
		for i := range c.size {
			ops = append(ops, P2POp{Peer: i, Buf: send + DevicePtr(i*count*dt.Size()), Count: count, DType: dt})
		}
	}
	ops = append(ops, P2POp{Recv: true, Peer: root, Buf: recv, Count: count, DType: dt})
	return c.launch(ctx, name, c.p2pGroup(ops))
}

// AllToAll sends the i-th slice of send (sendCounts[i] elements) to rank i
// and receives rank i's slice for us into the i-th slice of recv
// (recvCounts[i] elements), as one group of sends and receives.
func (c *Comm) AllToAll(ctx context.Context, send, recv DevicePtr, sendCounts, recvCounts []int, dt elem.DType) (*Work, error) {
	const name = "all_to_all"
	_, err := c.dataType(name, dt)
	if err == nil {
		err = errors.Join(c.checkCounts(name, "sendCounts", sendCounts), c.checkCounts(name, "recvCounts", recvCounts))
	}
	if err != nil {
		return nil, err
	}
	sendAt, recvAt := byteOffsets(sendCounts, dt), byteOffsets(recvCounts, dt)
	var ops []P2POp
	for i := range c.size {
		// Empty slices are skipped on both sides, as torch does.
		if sendCounts[i] > 0 {
			ops = append(ops, P2POp{Peer: i, Buf: send + sendAt[i], Count: sendCounts[i], DType: dt})
		}
		if recvCounts[i] > 0 {
			ops = append(ops, P2POp{Recv: true, Peer: i, Buf: recv + recvAt[i], Count: recvCounts[i], DType: dt})
		}
	}
	return c.launch(ctx, name, c.p2pGroup(ops))
}

// Barrier is a one-element AllReduce on the communicator's own scratch
// memory: it completes once every rank has reached it.
func (c *Comm) Barrier(ctx context.Context) (*Work, error) {
	return c.launch(ctx, "barrier", func(h uintptr) (string, ncclResult) {
		return "ncclAllReduce", c.nccl.api.ncclAllReduce(c.scratch, c.scratch, 1, int32(elem.Int32), int32(elem.Sum), h, c.stream)
	})
}

// Send sends count elements of buf to peer, which must Recv them.
func (c *Comm) Send(ctx context.Context, buf DevicePtr, count int, dt elem.DType, peer int) (*Work, error) {
	return c.BatchP2P(ctx, []P2POp{{Peer: peer, Buf: buf, Count: count, DType: dt}})
}

// Recv receives count elements from peer into buf. NCCL has no receive
// from any source: peer is a rank.
func (c *Comm) Recv(ctx context.Context, buf DevicePtr, count int, dt elem.DType, peer int) (*Work, error) {
	return c.BatchP2P(ctx, []P2POp{{Recv: true, Peer: peer, Buf: buf, Count: count, DType: dt}})
}

// P2POp is one send or receive of a BatchP2P.
type P2POp struct {
	Recv  bool // receive into Buf from Peer; otherwise send Buf to Peer
	Peer  int
	Buf   DevicePtr
	Count int
	DType elem.DType
}

// BatchP2P runs sends and receives as one NCCL group, so that they proceed
// together and need no particular order between the ranks (torch's
// batch_isend_irecv). One operation alone needs no group.
func (c *Comm) BatchP2P(ctx context.Context, ops []P2POp) (*Work, error) {
	name := "batch_p2p"
	if len(ops) == 1 {
		name = "send"
		if ops[0].Recv {
			name = "recv"
		}
	}
	if len(ops) == 0 {
		return nil, &OpError{Op: name, Rank: c.rank, Err: errors.New("no operations")}
	}
	for _, op := range ops {
		_, err := c.dataType(name, op.DType)
		if err == nil {
			err = errors.Join(c.checkCount(name, op.Count), c.checkRank(name, "peer", op.Peer))
		}
		if err != nil {
			return nil, err
		}
	}
	return c.launch(ctx, name, c.p2pGroup(ops))
}

// p2pGroup returns an enqueue function that makes the NCCL calls of ops,
// whose types are checked, in a group when there is more than one.
func (c *Comm) p2pGroup(ops []P2POp) func(uintptr) (string, ncclResult) {
	one := func(h uintptr, op P2POp) (string, ncclResult) {
		t := int32(op.DType)
		if op.Recv {
			return "ncclRecv", c.nccl.api.ncclRecv(op.Buf, uintptr(op.Count), t, int32(op.Peer), h, c.stream)
		}
		return "ncclSend", c.nccl.api.ncclSend(op.Buf, uintptr(op.Count), t, int32(op.Peer), h, c.stream)
	}
	return func(h uintptr) (string, ncclResult) {
		if len(ops) == 1 {
			return one(h, ops[0])
		}
		return c.grouped(len(ops), func(i int) (string, ncclResult) { return one(h, ops[i]) })
	}
}

// grouped makes n calls between ncclGroupStart and ncclGroupEnd and
// returns the first failure, or ncclGroupEnd's result. ncclGroupEnd runs
// even after a failure, so that NCCL drops the group. Device thread only.
func (c *Comm) grouped(n int, call func(i int) (string, ncclResult)) (string, ncclResult) {
	if res := c.nccl.api.ncclGroupStart(); res != ncclSuccess {
		return "ncclGroupStart", res
	}
	failed, failure := "", ncclSuccess
	for i := range n {
		if name, res := call(i); res != ncclSuccess && res != ncclInProgress {
			failed, failure = name, res
			break
		}
	}
	res := c.nccl.api.ncclGroupEnd()
	if failure != ncclSuccess {
		return failed, failure
	}
	return "ncclGroupEnd", res
}

// dataType maps dt to NCCL's ncclDataType_t, which numbers the types as
// collective does.
func (c *Comm) dataType(name string, dt elem.DType) (int32, error) {
	if dt.Size() == 0 {
		return 0, &OpError{Op: name, Rank: c.rank, Err: fmt.Errorf("unknown data type %v", dt)}
	}
	if dt == elem.BFloat16 && c.nccl.version.Less(ncclAvgAndBF16) {
		return 0, c.tooOld(name, dt.String(), ncclAvgAndBF16)
	}
	return int32(dt), nil
}

// tooOld refuses what, which the loaded NCCL is older than since to have.
func (c *Comm) tooOld(op, what string, since Version) *OpError {
	return &OpError{Op: op, Rank: c.rank, Err: fmt.Errorf("%s: %w by NCCL %v (it came with %v)", what, errors.ErrUnsupported, c.nccl.version, since)}
}

// reduction maps dt and op to NCCL's enums, which number them as
// collective does; NCCL has no bitwise reductions.
func (c *Comm) reduction(name string, dt elem.DType, op elem.Op) (int32, int32, error) {
	t, err := c.dataType(name, dt)
	if err != nil {
		return 0, 0, err
	}
	switch op {
	case elem.Sum, elem.Product, elem.Max, elem.Min:
	case elem.Avg:
		if c.nccl.version.Less(ncclAvgAndBF16) {
			return 0, 0, c.tooOld(name, "reduction "+op.String(), ncclAvgAndBF16)
		}
	case elem.BAnd, elem.BOr, elem.BXor:
		return 0, 0, &OpError{Op: name, Rank: c.rank, Err: fmt.Errorf("reduction %v: %w: NCCL has no bitwise reductions", op, errors.ErrUnsupported)}
	default:
		return 0, 0, &OpError{Op: name, Rank: c.rank, Err: fmt.Errorf("unknown reduction %v", op)}
	}
	return t, int32(op), nil
}

func (c *Comm) checkCount(name string, count int) error {
	if count < 0 {
		return &OpError{Op: name, Rank: c.rank, Err: fmt.Errorf("negative count %d", count)}
	}
	return nil
}

func (c *Comm) checkCounts(name, what string, counts []int) error {
	if len(counts) != c.size {
		return &OpError{Op: name, Rank: c.rank, Err: fmt.Errorf("%d %s for %d ranks", len(counts), what, c.size)}
	}
	for _, n := range counts {
		if err := c.checkCount(name, n); err != nil {
			return err
		}
	}
	return nil
}

func (c *Comm) checkRank(name, what string, r int) error {
	if r < 0 || r >= c.size {
		return &OpError{Op: name, Rank: c.rank, Err: fmt.Errorf("%s %d is not a rank of %d", what, r, c.size)}
	}
	return nil
}

func equal(counts []int) bool {
	for _, n := range counts[1:] {
		if n != counts[0] {
			return false
		}
	}
	return true
}

// byteOffsets returns where each slice of counts elements starts.
func byteOffsets(counts []int, dt elem.DType) []DevicePtr {
	offsets := make([]DevicePtr, len(counts))
	at := 0
	for i, n := range counts {
		offsets[i] = DevicePtr(at)
		at += n * dt.Size()
	}
	return offsets
}
