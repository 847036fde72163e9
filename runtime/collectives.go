package runtime

import (
	"context"
	"slices"

	"github.com/gorun/gorun/cuda"
)

// Each collective comes in two forms sharing one implementation, the
// unexported method that checks the arguments and queues the operation:
// the blocking form waits for it, and ctx cancels it; the asynchronous
// form returns its Work at once, and the tensors must be left alone until
// the Work completes.
//
// The blocking forms of the collectives on host tensors first try
// runInline, which runs their host form on the caller's goroutine when
// nothing is queued, allocating nothing; they repeat the host form for
// it, as a closure the queue keeps must be allocated, and one runInline
// calls need not be. Their counts per rank, and the list forms' staging,
// go in the group's inline scratch (inlineCounts, inlineBytes), which
// only the call runInline runs touches.
//
// The implementation gives the operation's host form, on the group's
// host communicator, and its device form, on the group's NCCL
// communicator (see tensorOp). NCCL's forms mirror torch's: a list of
// tensors that are consecutive slices of one device buffer is one NCCL
// call, other lists become a group of sends and receives, or one reduce
// per rank.

// Broadcast copies root's t into every rank's t.
func (pg *ProcessGroup) Broadcast(ctx context.Context, t Tensor, root int) error {
	if ran, err := pg.runInline(ctx, "broadcast", describe(t), t.OnDevice(),
		func() error { return pg.checkRank("root", root) },
		func(ctx context.Context) error { return pg.comm.Broadcast(ctx, t.data, t.dtype, root) }); ran {
		return err
	}
	return pg.broadcast(ctx, t, root).Wait(ctx)
}

// BroadcastAsync is the asynchronous form of Broadcast.
func (pg *ProcessGroup) BroadcastAsync(t Tensor, root int) *Work {
	return pg.broadcast(detached, t, root)
}

func (pg *ProcessGroup) broadcast(ctx context.Context, t Tensor, root int) *Work {
	return pg.tensorOp(ctx, "broadcast", inPlace(&t),
		func() error { return pg.checkRank("root", root) },
		func(ctx context.Context) error { return pg.comm.Broadcast(ctx, t.data, t.dtype, root) },
		func(ctx context.Context, c *cuda.Comm) ([]*cuda.Work, error) {
			return one(c.Broadcast(ctx, t.ptr(), t.ptr(), t.Len(), t.dtype, root))
		})
}

// AllReduce reduces t across the group with op, leaving the result,
// bitwise identical, in every rank's t.
func (pg *ProcessGroup) AllReduce(ctx context.Context, t Tensor, op ReduceOp) error {
	if ran, err := pg.runInline(ctx, "all_reduce", describe(t), t.OnDevice(),
		func() error { return checkReduce(t.dtype, op) },
		func(ctx context.Context) error { return pg.comm.AllReduce(ctx, t.data, t.dtype, op) }); ran {
		return err
	}
	return pg.allReduce(ctx, t, op).Wait(ctx)
}

// AllReduceAsync is the asynchronous form of AllReduce.
func (pg *ProcessGroup) AllReduceAsync(t Tensor, op ReduceOp) *Work {
	return pg.allReduce(detached, t, op)
}

func (pg *ProcessGroup) allReduce(ctx context.Context, t Tensor, op ReduceOp) *Work {
	return pg.tensorOp(ctx, "all_reduce", inPlace(&t),
		func() error { return checkReduce(t.dtype, op) },
		func(ctx context.Context) error { return pg.comm.AllReduce(ctx, t.data, t.dtype, op) },
		func(ctx context.Context, c *cuda.Comm) ([]*cuda.Work, error) {
			return one(c.AllReduce(ctx, t.ptr(), t.ptr(), t.Len(), t.dtype, op))
		})
}

// Reduce reduces t across the group with op into root's t; the other
// ranks' t are left unspecified.
func (pg *ProcessGroup) Reduce(ctx context.Context, t Tensor, root int, op ReduceOp) error {
	if ran, err := pg.runInline(ctx, "reduce", describe(t), t.OnDevice(),
		func() error { return firstError(pg.checkRank("root", root), checkReduce(t.dtype, op)) },
		func(ctx context.Context) error { return pg.comm.Reduce(ctx, t.data, t.dtype, op, root) }); ran {
		return err
	}
	return pg.reduce(ctx, t, root, op).Wait(ctx)
}

// ReduceAsync is the asynchronous form of Reduce.
func (pg *ProcessGroup) ReduceAsync(t Tensor, root int, op ReduceOp) *Work {
	return pg.reduce(detached, t, root, op)
}

func (pg *ProcessGroup) reduce(ctx context.Context, t Tensor, root int, op ReduceOp) *Work {
	return pg.tensorOp(ctx, "reduce", inPlace(&t),
		func() error { return firstError(pg.checkRank("root", root), checkReduce(t.dtype, op)) },
		func(ctx context.Context) error { return pg.comm.Reduce(ctx, t.data, t.dtype, op, root) },
		func(ctx context.Context, c *cuda.Comm) ([]*cuda.Work, error) {
			return one(c.Reduce(ctx, t.ptr(), t.ptr(), t.Len(), t.dtype, op, root))
		})
}

// AllGather copies every rank's in into out[rank] on every rank; out
// holds one tensor per rank, each of in's dtype and length.
func (pg *ProcessGroup) AllGather(ctx context.Context, out []Tensor, in Tensor) error {
	if ran, err := pg.runInline(ctx, "all_gather", describe(in), in.OnDevice() || anyOnDevice(out),
		func() error { return pg.checkList("out", out, in.dtype, in.Len()) },
		func(ctx context.Context) error {
			return pg.allGatherHost(ctx, out, in, pg.inlineBytes(0, len(out)*len(in.data)))
		}); ran {
		return err
	}
	return pg.allGather(ctx, out, in).Wait(ctx)
}

// AllGatherAsync is the asynchronous form of AllGather.
func (pg *ProcessGroup) AllGatherAsync(out []Tensor, in Tensor) *Work {
	return pg.allGather(detached, out, in)
}

func (pg *ProcessGroup) allGather(ctx context.Context, out []Tensor, in Tensor) *Work {
	out = slices.Clone(out)
	return pg.tensorOp(ctx, "all_gather", operands{reads: []*Tensor{&in}, writes: each(out)},
		func() error { return pg.checkList("out", out, in.dtype, in.Len()) },
		func(ctx context.Context) error {
			return pg.allGatherHost(ctx, out, in, make([]byte, len(out)*len(in.data)))
		},
		func(ctx context.Context, c *cuda.Comm) ([]*cuda.Work, error) {
			if whole, ok := span(out); ok {
				return one(c.AllGather(ctx, in.ptr(), whole.ptr(), in.Len(), in.dtype))
			}
			var ops []cuda.P2POp
			for r, o := range out {
				ops = append(ops, sendTo(r, in), recvFrom(r, o))
			}
			return p2pBatch(ctx, c, ops)
		})
}

// allGatherHost is all_gather's host form, through gathered, the
// buffer of every rank's in.
func (pg *ProcessGroup) allGatherHost(ctx context.Context, out []Tensor, in Tensor, gathered []byte) error {
	if err := pg.comm.AllGather(ctx, gathered, in.data, in.dtype); err != nil {
		return err
	}
	unpack(out, gathered)
	return nil
}

// AllGatherInto is AllGather into one tensor: rank i's in lands in
// elements [i*n, (i+1)*n) of out, n being in's length (torch's
// all_gather_into_tensor). It copies nothing on the way.
func (pg *ProcessGroup) AllGatherInto(ctx context.Context, out, in Tensor) error {
	if ran, err := pg.runInline(ctx, "all_gather_into_tensor", describe(in), out.OnDevice() || in.OnDevice(),
		func() error {
			return firstError(checkDType("out", out, in.dtype), checkLen("out", out, pg.Size()*in.Len()))
		},
		func(ctx context.Context) error { return pg.comm.AllGather(ctx, out.data, in.data, in.dtype) }); ran {
		return err
	}
	return pg.allGatherInto(ctx, out, in).Wait(ctx)
}

// AllGatherIntoAsync is the asynchronous form of AllGatherInto.
func (pg *ProcessGroup) AllGatherIntoAsync(out, in Tensor) *Work {
	return pg.allGatherInto(detached, out, in)
}

func (pg *ProcessGroup) allGatherInto(ctx context.Context, out, in Tensor) *Work {
	return pg.tensorOp(ctx, "all_gather_into_tensor", operands{reads: []*Tensor{&in}, writes: []*Tensor{&out}},
		func() error {
			return firstError(checkDType("out", out, in.dtype), checkLen("out", out, pg.Size()*in.Len()))
		},
		func(ctx context.Context) error { return pg.comm.AllGather(ctx, out.data, in.data, in.dtype) },
		func(ctx context.Context, c *cuda.Comm) ([]*cuda.Work, error) {
			return one(c.AllGather(ctx, in.ptr(), out.ptr(), in.Len(), in.dtype))
		})
}

// Gather copies every rank's in into root's out[rank]. On root, out holds
// one tensor per rank, each of in's dtype and length; the other ranks'
// out is ignored and may be nil.
func (pg *ProcessGroup) Gather(ctx context.Context, out []Tensor, in Tensor, root int) error {
	return pg.gather(ctx, out, in, root).Wait(ctx)
}

// GatherAsync is the asynchronous form of Gather.
func (pg *ProcessGroup) GatherAsync(out []Tensor, in Tensor, root int) *Work {
	return pg.gather(detached, out, in, root)
}

func (pg *ProcessGroup) gather(ctx context.Context, out []Tensor, in Tensor, root int) *Work {
	out = slices.Clone(out)
	args := operands{reads: []*Tensor{&in}}
	if pg.rank == root {
		args.writes = each(out) // only root's out matters
	}
	return pg.tensorOp(ctx, "gather", args,
		func() error {
			if err := pg.checkRank("root", root); err != nil || pg.rank != root {
				return err // only root's out matters
			}
			return pg.checkList("out", out, in.dtype, in.Len())
		},
		func(ctx context.Context) error {
			var gathered []byte
			if pg.rank == root {
				gathered = make([]byte, len(out)*len(in.data))
			}
			if err := pg.comm.Gather(ctx, gathered, in.data, in.dtype, root); err != nil {
				return err
			}
			unpack(out, gathered)
			return nil
		},
		func(ctx context.Context, c *cuda.Comm) ([]*cuda.Work, error) {
			ops := []cuda.P2POp{sendTo(root, in)}
			if pg.rank == root {
				for r, o := range out {
					ops = append(ops, recvFrom(r, o))
				}
			}
			return p2pBatch(ctx, c, ops)
		})
}

// Scatter copies root's in[rank] into every rank's out. On root, in holds
// one tensor per rank, each of out's dtype and length; the other ranks' in
// is ignored and may be nil.
func (pg *ProcessGroup) Scatter(ctx context.Context, out Tensor, in []Tensor, root int) error {
	return pg.scatter(ctx, out, in, root).Wait(ctx)
}

// ScatterAsync is the asynchronous form of Scatter.
func (pg *ProcessGroup) ScatterAsync(out Tensor, in []Tensor, root int) *Work {
	return pg.scatter(detached, out, in, root)
}

func (pg *ProcessGroup) scatter(ctx context.Context, out Tensor, in []Tensor, root int) *Work {
	in = slices.Clone(in)
	args := operands{writes: []*Tensor{&out}}
	if pg.rank == root {
		args.reads = each(in) // only root's in matters
	}
	return pg.tensorOp(ctx, "scatter", args,
		func() error {
			if err := pg.checkRank("root", root); err != nil || pg.rank != root {
				return err // only root's in matters
			}
			return pg.checkList("in", in, out.dtype, out.Len())
		},
		func(ctx context.Context) error {
			var scattered []byte
			if pg.rank == root {
				scattered = pack(in)
			}
			return pg.comm.Scatter(ctx, out.data, scattered, out.dtype, root)
		},
		func(ctx context.Context, c *cuda.Comm) ([]*cuda.Work, error) {
			var ops []cuda.P2POp
			if pg.rank == root {
				for r, t := range in {
					ops = append(ops, sendTo(r, t))
				}
			}
			return p2pBatch(ctx, c, append(ops, recvFrom(root, out)))
		})
}

// ReduceScatter reduces the lists in across the group with op and leaves
// the reduction of every rank's in[i] in rank i's out. in holds one tensor
// per rank, of out's dtype; their lengths may differ, but every rank must
// pass the same lengths, and in[rank] must be as long as out.
func (pg *ProcessGroup) ReduceScatter(ctx context.Context, out Tensor, in []Tensor, op ReduceOp) error {
	if ran, err := pg.runInline(ctx, "reduce_scatter", describe(out), out.OnDevice() || anyOnDevice(in),
		func() error { return pg.checkReduceScatter(out, in, op) },
		func(ctx context.Context) error {
			counts, _ := pg.inlineCounts()
			return pg.reduceScatterHost(ctx, out, in, op, pg.inlineBytes(0, totalBytes(in)), counts)
		}); ran {
		return err
	}
	return pg.reduceScatter(ctx, out, in, op).Wait(ctx)
}

// ReduceScatterAsync is the asynchronous form of ReduceScatter.
func (pg *ProcessGroup) ReduceScatterAsync(out Tensor, in []Tensor, op ReduceOp) *Work {
	return pg.reduceScatter(detached, out, in, op)
}

func (pg *ProcessGroup) reduceScatter(ctx context.Context, out Tensor, in []Tensor, op ReduceOp) *Work {
	in = slices.Clone(in)
	return pg.tensorOp(ctx, "reduce_scatter", operands{reads: each(in), writes: []*Tensor{&out}},
		func() error { return pg.checkReduceScatter(out, in, op) },
		func(ctx context.Context) error {
			return pg.reduceScatterHost(ctx, out, in, op, make([]byte, totalBytes(in)), make([]int, len(in)))
		},
		func(ctx context.Context, c *cuda.Comm) ([]*cuda.Work, error) {
			if whole, ok := span(in); ok {
				return one(c.ReduceScatter(ctx, whole.ptr(), out.ptr(), lengths(in), out.dtype, op))
			}
			// One reduce per rank, in rank order on every rank. NCCL
			// writes a reduce's receive buffer on its root only, so the
			// others name their send buffer there.
			var works []*cuda.Work
			for r, t := range in {
				recv := t
				if r == pg.rank {
					recv = out
				}
				w, err := c.Reduce(ctx, t.ptr(), recv.ptr(), t.Len(), t.dtype, op, r)
				if err != nil {
					return works, err
				}
				works = append(works, w)
			}
			return works, nil
		})
}

// reduceScatterHost is reduce_scatter's host form: in goes packed into
// packed, and counts takes its lengths.
func (pg *ProcessGroup) reduceScatterHost(ctx context.Context, out Tensor, in []Tensor, op ReduceOp, packed []byte, counts []int) error {
	return pg.comm.ReduceScatter(ctx, out.data, packInto(packed, in), out.dtype, op, fillLengths(counts, in))
}

// checkReduceScatter checks ReduceScatter's arguments.
func (pg *ProcessGroup) checkReduceScatter(out Tensor, in []Tensor, op ReduceOp) error {
	if err := firstError(checkReduce(out.dtype, op), pg.checkList("in", in, out.dtype, -1)); err != nil {
		return err
	}
	return checkLen("out", out, in[pg.rank].Len())
}

// ReduceScatterFrom is ReduceScatter from one tensor: in holds every
// rank's piece in rank order, each as long as out (torch's
// reduce_scatter_tensor).
func (pg *ProcessGroup) ReduceScatterFrom(ctx context.Context, out, in Tensor, op ReduceOp) error {
	if ran, err := pg.runInline(ctx, "reduce_scatter_tensor", describe(out), out.OnDevice() || in.OnDevice(),
		func() error { return pg.checkReduceScatterFrom(out, in, op) },
		func(ctx context.Context) error {
			counts, _ := pg.inlineCounts()
			return pg.comm.ReduceScatter(ctx, out.data, in.data, out.dtype, op, fillEven(counts, out.Len()))
		}); ran {
		return err
	}
	return pg.reduceScatterFrom(ctx, out, in, op).Wait(ctx)
}

// ReduceScatterFromAsync is the asynchronous form of ReduceScatterFrom.
func (pg *ProcessGroup) ReduceScatterFromAsync(out, in Tensor, op ReduceOp) *Work {
	return pg.reduceScatterFrom(detached, out, in, op)
}

func (pg *ProcessGroup) reduceScatterFrom(ctx context.Context, out, in Tensor, op ReduceOp) *Work {
	return pg.tensorOp(ctx, "reduce_scatter_tensor", operands{reads: []*Tensor{&in}, writes: []*Tensor{&out}},
		func() error { return pg.checkReduceScatterFrom(out, in, op) },
		func(ctx context.Context) error {
			return pg.comm.ReduceScatter(ctx, out.data, in.data, out.dtype, op, repeat(out.Len(), pg.Size()))
		},
		func(ctx context.Context, c *cuda.Comm) ([]*cuda.Work, error) {
			return one(c.ReduceScatter(ctx, in.ptr(), out.ptr(), repeat(out.Len(), pg.Size()), out.dtype, op))
		})
}

// checkReduceScatterFrom checks ReduceScatterFrom's arguments.
func (pg *ProcessGroup) checkReduceScatterFrom(out, in Tensor, op ReduceOp) error {
	return firstError(checkReduce(out.dtype, op), checkDType("in", in, out.dtype), checkLen("in", in, pg.Size()*out.Len()))
}

// AllToAll sends in[i] to rank i and receives rank i's tensor for us into
// out[i]. Both lists hold one tensor per rank, all of one dtype; lengths
// may differ, as long as out[i] is as long as what rank i sends.
func (pg *ProcessGroup) AllToAll(ctx context.Context, out, in []Tensor) error {
	if ran, err := pg.runInline(ctx, "all_to_all", opDesc{peer: -1}, anyOnDevice(out) || anyOnDevice(in),
		func() error { return pg.checkAllToAll(out, in) },
		func(ctx context.Context) error {
			recv, send := pg.inlineCounts()
			return pg.allToAllHost(ctx, out, in, pg.inlineBytes(0, totalBytes(in)), pg.inlineBytes(1, totalBytes(out)), send, recv)
		}); ran {
		return err
	}
	return pg.allToAll(ctx, out, in).Wait(ctx)
}

// AllToAllAsync is the asynchronous form of AllToAll.
func (pg *ProcessGroup) AllToAllAsync(out, in []Tensor) *Work {
	return pg.allToAll(detached, out, in)
}

func (pg *ProcessGroup) allToAll(ctx context.Context, out, in []Tensor) *Work {
	out, in = slices.Clone(out), slices.Clone(in)
	return pg.tensorOp(ctx, "all_to_all", operands{reads: each(in), writes: each(out)},
		func() error { return pg.checkAllToAll(out, in) },
		func(ctx context.Context) error {
			return pg.allToAllHost(ctx, out, in, make([]byte, totalBytes(in)), make([]byte, totalBytes(out)), make([]int, len(in)), make([]int, len(out)))
		},
		func(ctx context.Context, c *cuda.Comm) ([]*cuda.Work, error) {
			var ops []cuda.P2POp
			for r := range in {
				ops = append(ops, sendTo(r, in[r]), recvFrom(r, out[r]))
			}
			return p2pBatch(ctx, c, ops)
		})
}

// allToAllHost is all_to_all's host form: in goes out packed into sent,
// out comes back unpacked from received, and send and recv take the
// counts per rank.
func (pg *ProcessGroup) allToAllHost(ctx context.Context, out, in []Tensor, sent, received []byte, send, recv []int) error {
	err := pg.comm.AllToAll(ctx, received, packInto(sent, in), in[0].dtype, fillLengths(send, in), fillLengths(recv, out))
	if err != nil {
		return err
	}
	unpack(out, received)
	return nil
}

// checkAllToAll checks AllToAll's arguments.
func (pg *ProcessGroup) checkAllToAll(out, in []Tensor) error {
	if err := pg.checkList("in", in, dtypeOfFirst(in), -1); err != nil {
		return err
	}
	return pg.checkList("out", out, in[0].dtype, -1)
}

// AllToAllSingle is AllToAll between single tensors: in is cut into
// pieces of inSplits[i] elements, the i-th going to rank i, and the piece
// from rank i lands in out's i-th piece of outSplits[i] elements. A nil
// split list cuts its tensor into equal pieces.
func (pg *ProcessGroup) AllToAllSingle(ctx context.Context, out, in Tensor, outSplits, inSplits []int) error {
	if ran, err := pg.runInline(ctx, "all_to_all_single", describe(in), out.OnDevice() || in.OnDevice(),
		func() error { return pg.checkAllToAllSingle(out, in, outSplits, inSplits) },
		func(ctx context.Context) error {
			recv, send := pg.inlineCounts()
			return pg.comm.AllToAll(ctx, out.data, in.data, in.dtype, fillSplits(send, inSplits, in), fillSplits(recv, outSplits, out))
		}); ran {
		return err
	}
	return pg.allToAllSingle(ctx, out, in, outSplits, inSplits).Wait(ctx)
}

// AllToAllSingleAsync is the asynchronous form of AllToAllSingle.
func (pg *ProcessGroup) AllToAllSingleAsync(out, in Tensor, outSplits, inSplits []int) *Work {
	return pg.allToAllSingle(detached, out, in, outSplits, inSplits)
}

func (pg *ProcessGroup) allToAllSingle(ctx context.Context, out, in Tensor, outSplits, inSplits []int) *Work {
	// The Work may run after the caller has changed its split lists.
	size := pg.Size()
	sendCounts := fillSplits(make([]int, size), inSplits, in)
	recvCounts := fillSplits(make([]int, size), outSplits, out)
	return pg.tensorOp(ctx, "all_to_all_single", operands{reads: []*Tensor{&in}, writes: []*Tensor{&out}},
		func() error { return pg.checkAllToAllSingle(out, in, outSplits, inSplits) },
		func(ctx context.Context) error {
			return pg.comm.AllToAll(ctx, out.data, in.data, in.dtype, sendCounts, recvCounts)
		},
		func(ctx context.Context, c *cuda.Comm) ([]*cuda.Work, error) {
			return one(c.AllToAll(ctx, in.ptr(), out.ptr(), sendCounts, recvCounts, in.dtype))
		})
}

// Barrier returns once every rank of the group has entered it.
func (pg *ProcessGroup) Barrier(ctx context.Context) error {
	if ran, err := pg.runInline(ctx, "barrier", opDesc{peer: -1}, false, nil,
		func(ctx context.Context) error { return pg.comm.Barrier(ctx) }); ran {
		return err
	}
	return pg.barrier(ctx).Wait(ctx)
}

// BarrierAsync is the asynchronous form of Barrier.
func (pg *ProcessGroup) BarrierAsync() *Work {
	return pg.barrier(detached)
}

func (pg *ProcessGroup) barrier(ctx context.Context) *Work {
	return pg.collective(ctx, "barrier", nil, func(ctx context.Context) error { return pg.comm.Barrier(ctx) })
}

// Argument checks.

// checkRank checks that rank, the argument name, is a rank of the group.
func (pg *ProcessGroup) checkRank(name string, rank int) error {
	if rank < 0 || rank >= pg.Size() {
		return invalid("%s %d is out of range for a group of %d ranks", name, rank, pg.Size())
	}
	return nil
}

// checkList checks that ts, the argument name, has one tensor per rank,
// each of dtype dt and, unless n is negative, of n elements.
func (pg *ProcessGroup) checkList(name string, ts []Tensor, dt DType, n int) error {
	if len(ts) != pg.Size() {
		return invalid("%s has %d tensors, want %d: one per rank", name, len(ts), pg.Size())
	}
	for i, t := range ts {
		if t.dtype != dt {
			return invalid("%s[%d] is %s, want %s", name, i, t.dtype, dt)
		}
		if n >= 0 && t.Len() != n {
			return invalid("%s[%d] has %d elements, want %d", name, i, t.Len(), n)
		}
	}
	return nil
}

// checkSplits checks given, the argument name: the element counts that
// cut t into one piece per rank, or nil for equal pieces.
func (pg *ProcessGroup) checkSplits(name string, given []int, t Tensor) error {
	size := pg.Size()
	if given == nil {
		if t.Len()%size != 0 {
			return invalid("%s is nil, but %d elements do not split evenly among %d ranks", name, t.Len(), size)
		}
		return nil
	}
	if len(given) != size {
		return invalid("%s has %d counts, want %d: one per rank", name, len(given), size)
	}
	sum := 0
	for i, n := range given {
		if n < 0 {
			return invalid("%s[%d] is negative: %d", name, i, n)
		}
		sum += n
	}
	if sum != t.Len() {
		return invalid("%s add up to %d elements, but the tensor has %d", name, sum, t.Len())
	}
	return nil
}

// checkAllToAllSingle checks AllToAllSingle's arguments.
func (pg *ProcessGroup) checkAllToAllSingle(out, in Tensor, outSplits, inSplits []int) error {
	if err := checkDType("out", out, in.dtype); err != nil {
		return err
	}
	if err := pg.checkSplits("outSplits", outSplits, out); err != nil {
		return err
	}
	return pg.checkSplits("inSplits", inSplits, in)
}

// fillSplits fills counts, one per rank, with the elements of t each
// rank's piece holds: given's, or t's cut evenly when given is nil. Lists
// that checkSplits refuses give counts nobody uses.
func fillSplits(counts, given []int, t Tensor) []int {
	if given == nil {
		return fillEven(counts, t.Len()/max(len(counts), 1))
	}
	copy(counts, given)
	return counts
}

// fillEven sets every count to n.
func fillEven(counts []int, n int) []int {
	for i := range counts {
		counts[i] = n
	}
	return counts
}

// inlineStagingMax bounds the staging the group keeps for the list forms
// run inline (inlineBytes): larger calls allocate theirs, at a cost small
// beside their transfer's.
const inlineStagingMax = 256 << 10

// inlineBytes returns n bytes of the group's staging buffer i (0 or 1)
// for the call runInline runs, as inlineCounts does its counts.
func (pg *ProcessGroup) inlineBytes(i, n int) []byte {
	if n > inlineStagingMax {
		return make([]byte, n)
	}
	if cap(pg.staging[i]) < n {
		pg.staging[i] = make([]byte, n)
	}
	return pg.staging[i][:n]
}

// inlineCounts returns the group's two count lists, one count per rank,
// for the call runInline runs: only one runs at a time, and the lists
// do not outlive it.
func (pg *ProcessGroup) inlineCounts() (a, b []int) {
	if pg.counts == nil {
		pg.counts = make([]int, 2*pg.Size())
	}
	n := pg.Size()
	return pg.counts[:n:n], pg.counts[n:]
}

func checkDType(name string, t Tensor, want DType) error {
	if t.dtype != want {
		return invalid("%s is %s, want %s", name, t.dtype, want)
	}
	return nil
}

func checkLen(name string, t Tensor, want int) error {
	if t.Len() != want {
		return invalid("%s has %d elements, want %d", name, t.Len(), want)
	}
	return nil
}

// checkReduce checks that op is an operator that applies to dt.
func checkReduce(dt DType, op ReduceOp) error {
	switch {
	case op > BXor:
		return invalid("unknown reduce op %s", op)
	case op == Avg && !dt.IsFloat():
		return invalid("avg applies to floating-point tensors, not %s", dt)
	case op >= BAnd && dt.IsFloat():
		return invalid("%s applies to integer tensors, not %s", op, dt)
	}
	return nil
}

// firstError returns the first non-nil error.
func firstError(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// Staging between tensor lists and the one buffer a Comm takes.

// pack copies ts, one after the other, into a new buffer.
func pack(ts []Tensor) []byte {
	return packInto(make([]byte, totalBytes(ts)), ts)
}

// packInto copies ts one after another into buf, totalBytes(ts) long.
func packInto(buf []byte, ts []Tensor) []byte {
	at := buf
	for _, t := range ts {
		at = at[copy(at, t.data):]
	}
	return buf
}

// unpack copies consecutive pieces of buf into ts, filling each.
func unpack(ts []Tensor, buf []byte) {
	for _, t := range ts {
		buf = buf[copy(t.data, buf):]
	}
}

func totalBytes(ts []Tensor) int {
	n := 0
	for _, t := range ts {
		n += len(t.data)
	}
	return n
}

// lengths returns the element count of each tensor.
func lengths(ts []Tensor) []int {
	return fillLengths(make([]int, len(ts)), ts)
}

// fillLengths sets counts[i] to the element count of ts[i].
func fillLengths(counts []int, ts []Tensor) []int {
	for i, t := range ts {
		counts[i] = t.Len()
	}
	return counts
}

// anyOnDevice reports whether a tensor of ts is on a GPU.
func anyOnDevice(ts []Tensor) bool {
	for _, t := range ts {
		if t.OnDevice() {
			return true
		}
	}
	return false
}

// repeat returns times counts of n.
func repeat(n, times int) []int {
	return fillEven(make([]int, times), n)
}

// dtypeOfFirst is the dtype the rest of a list must share.
func dtypeOfFirst(ts []Tensor) DType {
	if len(ts) == 0 {
		return 0
	}
	return ts[0].dtype
}
