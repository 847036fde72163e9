package runtime

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/gorun/gorun/collective"
)

// everyCollective exercises every collective on pg, whose ranks must be
// 0..n-1, checking each result; the fake and the TCP backend both run it.
func everyCollective(ctx context.Context, pg *ProcessGroup) error {
	rank, size := pg.Rank(), pg.Size()
	check := func(name string, err error) error {
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		return nil
	}

	// all_reduce: sum of rank+1 over the ranks.
	sum := []float32{float32(rank + 1), 1}
	if err := check("all_reduce", pg.AllReduce(ctx, Of(sum), Sum)); err != nil {
		return err
	}
	total := float32(size * (size + 1) / 2)
	if err := expect("all_reduce", sum, []float32{total, float32(size)}); err != nil {
		return err
	}
	maxes := []int64{int64(rank)}
	if err := check("all_reduce max", pg.AllReduce(ctx, Of(maxes), Max)); err != nil {
		return err
	}
	if err := expect("all_reduce max", maxes, []int64{int64(size - 1)}); err != nil {
		return err
	}

	// The half-precision types, summed in float32 and rounded back.
	half, brain := []uint16{ToFloat16(float32(rank))}, []uint16{ToBFloat16(float32(rank))}
	if err := check("all_reduce float16", pg.AllReduce(ctx, Float16s(half), Sum)); err != nil {
		return err
	}
	if err := check("all_reduce bfloat16", pg.AllReduce(ctx, BFloat16s(brain), Sum)); err != nil {
		return err
	}
	if want := float32(size * (size - 1) / 2); FromFloat16(half[0]) != want || FromBFloat16(brain[0]) != want {
		return fmt.Errorf("half sums: float16 %v, bfloat16 %v, want %v", FromFloat16(half[0]), FromBFloat16(brain[0]), want)
	}

	// broadcast from the last rank.
	root := size - 1
	b := []int32{int32(rank), int32(rank)}
	if err := check("broadcast", pg.Broadcast(ctx, Of(b), root)); err != nil {
		return err
	}
	if err := expect("broadcast", b, []int32{int32(root), int32(root)}); err != nil {
		return err
	}

	// reduce to rank 0.
	r := []float64{float64(rank)}
	if err := check("reduce", pg.Reduce(ctx, Of(r), 0, Sum)); err != nil {
		return err
	}
	if rank == 0 {
		if err := expect("reduce", r, []float64{float64(size * (size - 1) / 2)}); err != nil {
			return err
		}
	}

	// all_gather, list and single tensor.
	in := []int32{int32(rank), int32(10 * rank)}
	out := make([][]int32, size)
	outs := make([]Tensor, size)
	for i := range out {
		out[i] = make([]int32, 2)
		outs[i] = Of(out[i])
	}
	if err := check("all_gather", pg.AllGather(ctx, outs, Of(in))); err != nil {
		return err
	}
	flat := make([]int32, 2*size)
	if err := check("all_gather_into", pg.AllGatherInto(ctx, Of(flat), Of(in))); err != nil {
		return err
	}
	for i := range size {
		want := []int32{int32(i), int32(10 * i)}
		if err := expect(fmt.Sprint("all_gather out ", i), out[i], want); err != nil {
			return err
		}
		if err := expect(fmt.Sprint("all_gather_into piece ", i), flat[2*i:2*i+2], want); err != nil {
			return err
		}
	}

	// gather to rank 1 (or 0 alone).
	gatherRoot := min(1, size-1)
	gathered := make([]uint8, size)
	var pieces []Tensor
	if rank == gatherRoot {
		for i := range size {
			pieces = append(pieces, Of(gathered[i:i+1]))
		}
	}
	if err := check("gather", pg.Gather(ctx, pieces, Of([]uint8{uint8(rank + 100)}), gatherRoot)); err != nil {
		return err
	}
	if rank == gatherRoot {
		for i, g := range gathered {
			if g != uint8(i+100) {
				return fmt.Errorf("gather: got %v", gathered)
			}
		}
	}

	// scatter from rank 0.
	var scattered []Tensor
	if rank == 0 {
		for i := range size {
			scattered = append(scattered, Of([]int64{int64(i * i)}))
		}
	}
	mine := []int64{-1}
	if err := check("scatter", pg.Scatter(ctx, Of(mine), scattered, 0)); err != nil {
		return err
	}
	if err := expect("scatter", mine, []int64{int64(rank * rank)}); err != nil {
		return err
	}

	// reduce_scatter with uneven pieces: piece i has i+1 elements, all
	// ones, so every element of the result is the group size.
	var rsIn []Tensor
	for i := range size {
		rsIn = append(rsIn, Of(filled(i+1, int32(1))))
	}
	rsOut := make([]int32, rank+1)
	if err := check("reduce_scatter", pg.ReduceScatter(ctx, Of(rsOut), rsIn, Sum)); err != nil {
		return err
	}
	if err := expect("reduce_scatter", rsOut, filled(rank+1, int32(size))); err != nil {
		return err
	}
	rsFlat := make([]float32, 2*size)
	for i := range rsFlat {
		rsFlat[i] = float32(i)
	}
	rsMine := make([]float32, 2)
	if err := check("reduce_scatter_from", pg.ReduceScatterFrom(ctx, Of(rsMine), Of(rsFlat), Avg)); err != nil {
		return err
	}
	if err := expect("reduce_scatter_from", rsMine, []float32{float32(2 * rank), float32(2*rank + 1)}); err != nil {
		return err
	}

	// all_to_all with uneven pieces: rank s sends s+1 copies of 100*s+d
	// to rank d.
	var a2aIn, a2aOut []Tensor
	got := make([][]int64, size)
	for peer := range size {
		a2aIn = append(a2aIn, Of(filled(rank+1, int64(100*rank+peer))))
		got[peer] = make([]int64, peer+1)
		a2aOut = append(a2aOut, Of(got[peer]))
	}
	if err := check("all_to_all", pg.AllToAll(ctx, a2aOut, a2aIn)); err != nil {
		return err
	}
	for peer := range size {
		if err := expect(fmt.Sprint("all_to_all from ", peer), got[peer], filled(peer+1, int64(100*peer+rank))); err != nil {
			return err
		}
	}

	// all_to_all_single, equal and uneven splits.
	single := make([]int32, size)
	for i := range single {
		single[i] = int32(10*rank + i)
	}
	singleOut := make([]int32, size)
	if err := check("all_to_all_single", pg.AllToAllSingle(ctx, Of(singleOut), Of(single), nil, nil)); err != nil {
		return err
	}
	for s, v := range singleOut {
		if v != int32(10*s+rank) {
			return fmt.Errorf("all_to_all_single: got %v", singleOut)
		}
	}
	inSplits, outSplits := make([]int, size), make([]int, size)
	var send []int32
	for peer := range size {
		inSplits[peer] = peer + 1 // rank s sends d+1 elements to d
		outSplits[peer] = rank + 1
		send = append(send, filled(peer+1, int32(rank))...)
	}
	recv := make([]int32, size*(rank+1))
	if err := check("all_to_all_single uneven", pg.AllToAllSingle(ctx, Of(recv), Of(send), outSplits, inSplits)); err != nil {
		return err
	}
	for s := range size {
		if err := expect(fmt.Sprint("all_to_all_single uneven from ", s), recv[s*(rank+1):(s+1)*(rank+1)], filled(rank+1, int32(s))); err != nil {
			return err
		}
	}

	return check("barrier", pg.Barrier(ctx))
}

func TestEveryCollective(t *testing.T) {
	for _, n := range []int{1, 2, 4} {
		t.Run(fmt.Sprint(n, " ranks"), func(t *testing.T) {
			onRanks(t, n, func(pg *ProcessGroup) error { return everyCollective(t.Context(), pg) })
		})
	}
}

func TestAsyncFormsShareTheImplementation(t *testing.T) {
	onRanks(t, 2, func(pg *ProcessGroup) error {
		x := []float64{float64(pg.Rank())}
		gathered := make([]float64, 2)
		works := []*Work{
			pg.AllReduceAsync(Of(x), Sum),
			pg.BroadcastAsync(Of(x), 0),
			pg.AllGatherIntoAsync(Of(gathered), Of(x)),
			pg.BarrierAsync(),
		}
		for _, w := range works {
			if err := w.Wait(t.Context()); err != nil {
				return err
			}
		}
		return expect("gathered", gathered, []float64{1, 1})
	})
}

func TestArgumentValidation(t *testing.T) {
	onRanks(t, 2, func(pg *ProcessGroup) error {
		ctx := t.Context()
		f32, i32 := Of(make([]float32, 2)), Of(make([]int32, 2))
		for _, tc := range []struct {
			err  error
			want string
		}{
			{pg.Broadcast(ctx, f32, 2), "runtime: broadcast: invalid argument: root 2 is out of range for a group of 2 ranks"},
			{pg.Reduce(ctx, f32, -1, Sum), "root -1 is out of range"},
			{pg.AllReduce(ctx, i32, Avg), "runtime: all_reduce: invalid argument: avg applies to floating-point tensors, not int32"},
			{pg.AllReduce(ctx, f32, BXor), "bxor applies to integer tensors, not float32"},
			{pg.AllReduce(ctx, f32, ReduceOp(42)), "unknown reduce op"},
			{pg.AllGather(ctx, []Tensor{f32}, f32), "runtime: all_gather: invalid argument: out has 1 tensors, want 2: one per rank"},
			{pg.AllGather(ctx, []Tensor{f32, i32}, f32), "out[1] is int32, want float32"},
			{pg.AllGather(ctx, []Tensor{f32, f32.Slice(0, 1)}, f32), "out[1] has 1 elements, want 2"},
			{pg.AllGatherInto(ctx, f32, f32), "out has 2 elements, want 4"},
			{pg.AllGatherInto(ctx, Of(make([]float64, 4)), f32), "out is float64, want float32"},
			{pg.Gather(ctx, nil, f32, 5), "root 5 is out of range"},
			{pg.Scatter(ctx, f32, []Tensor{f32}, pg.Rank()), "in has 1 tensors, want 2"},
			{pg.ReduceScatter(ctx, f32, []Tensor{f32, i32}, Sum), "in[1] is int32, want float32"},
			{pg.ReduceScatter(ctx, f32, []Tensor{f32.Slice(0, 1), f32.Slice(0, 1)}, Sum), "out has 2 elements, want 1"},
			{pg.ReduceScatterFrom(ctx, f32, f32, Sum), "in has 2 elements, want 4"},
			{pg.AllToAll(ctx, []Tensor{f32, f32}, []Tensor{f32, i32}), "in[1] is int32, want float32"},
			{pg.AllToAll(ctx, []Tensor{f32}, []Tensor{f32, f32}), "out has 1 tensors, want 2"},
			{pg.AllToAllSingle(ctx, Of(make([]float32, 3)), Of(make([]float32, 3)), nil, nil), "outSplits is nil, but 3 elements do not split evenly among 2 ranks"},
			{pg.AllToAllSingle(ctx, f32, f32, []int{1, 1}, []int{2, 1}), "inSplits add up to 3 elements, but the tensor has 2"},
			{pg.AllToAllSingle(ctx, f32, f32, []int{3, -1}, nil), "outSplits[1] is negative"},
			{pg.AllToAllSingle(ctx, f32, i32, nil, nil), "out is float32, want int32"},
		} {
			if !errors.Is(tc.err, ErrInvalidArgument) || !strings.Contains(tc.err.Error(), tc.want) {
				return fmt.Errorf("got %v, want an invalid argument error containing %q", tc.err, tc.want)
			}
		}
		// Nothing was sent: the group still works.
		return pg.AllReduce(ctx, f32, Sum)
	})
}

func TestMismatchedCollectivesFailEveryRank(t *testing.T) {
	onRanks(t, 2, func(pg *ProcessGroup) error {
		var err error
		if pg.Rank() == 0 {
			err = pg.AllReduce(t.Context(), Of([]float32{1}), Sum)
		} else {
			err = pg.Broadcast(t.Context(), Of([]float32{1}), 0)
		}
		var opErr *OpError
		if !errors.Is(err, collective.ErrMismatch) || !errors.As(err, &opErr) {
			return fmt.Errorf("got %v, want an OpError wrapping collective.ErrMismatch", err)
		}
		return nil
	})
}
