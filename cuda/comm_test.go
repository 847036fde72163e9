package cuda

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/collective/elem"
	"github.com/gorun/gorun/rendezvous"
)

func float32s(v ...float32) []byte {
	b := make([]byte, 4*len(v))
	for i, f := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(f))
	}
	return b
}

func TestInitPassesTheUniqueIDByValue(t *testing.T) {
	g := newGPU(t)
	store := rendezvous.NewMemoryStore(time.Minute)
	c := g.comm(CommConfig{Store: store, Key: "nccl/job"})
	if c.Rank() != 0 || c.Size() != 1 || c.Device() != g.dev {
		t.Errorf("rank %d of %d", c.Rank(), c.Size())
	}
	// Rank 0 published the id it made; the fake's init checked all 128
	// bytes it received against the same pattern.
	id, err := store.Get(context.Background(), "nccl/job")
	if err != nil || len(id) != 128 || id[0] != 0xA5 || id[127] != 0xA5^byte(127*7%256) {
		t.Errorf("the store holds % x, %v; want the fake's 128-byte id", id, err)
	}
	want := []string{"GetUniqueId", "CommInitRankConfig nranks=1 rank=0 blocking=0"}
	if got := logLines(g.ncclLog(), "GetUniqueId", "CommInit"); !slices.Equal(got, want) {
		t.Errorf("NCCL calls %q; want %q", got, want)
	}
}

// fakeID is the unique id the fake NCCL makes.
func fakeID(t *testing.T, n *NCCL) []byte {
	var id uniqueID
	if res := n.api.ncclGetUniqueId(&id); res != ncclSuccess {
		t.Fatal(res.name())
	}
	return id.internal[:]
}

func TestOtherRanksReadTheIDFromTheStore(t *testing.T) {
	g := newGPU(t)
	ctx := context.Background()
	store := rendezvous.NewMemoryStore(time.Minute)
	id := fakeID(t, g.nccl)
	if err := store.Set(ctx, "nccl/0", id); err != nil {
		t.Fatal(err)
	}
	c := g.comm(CommConfig{Rank: 1, Size: 2, Store: store})
	if c.Rank() != 1 || c.Size() != 2 {
		t.Errorf("rank %d of %d; want 1 of 2", c.Rank(), c.Size())
	}
	if got := logLines(g.ncclLog(), "CommInit"); !slices.Equal(got, []string{"CommInitRankConfig nranks=2 rank=1 blocking=0"}) {
		t.Errorf("NCCL calls %q", got)
	}

	// A damaged id reaches NCCL, which refuses it: the error has NCCL's
	// words and the fake's detail, and names the operation and the rank.
	id[5] ^= 0xff
	store.Set(ctx, "nccl/bad", id)
	_, err := g.nccl.NewComm(ctx, g.dev, CommConfig{Rank: 1, Size: 2, Store: store, Key: "nccl/bad"})
	want := "cuda: nccl init on rank 1: ncclCommInitRankConfig: ncclInvalidArgument: invalid argument (run with NCCL_DEBUG=WARN for details): fake: unique id byte 5 is 0x79, want 0x86"
	if err == nil || err.Error() != want {
		t.Errorf("got  %v\nwant %s", err, want)
	}

	// A value of the wrong size never reaches NCCL.
	store.Set(ctx, "nccl/short", []byte("1234567"))
	_, err = g.nccl.NewComm(ctx, g.dev, CommConfig{Rank: 1, Size: 2, Store: store, Key: "nccl/short"})
	if err == nil || !strings.HasSuffix(err.Error(), `store key "nccl/short" holds 7 bytes, not a 128-byte ncclUniqueId`) {
		t.Errorf("got %v", err)
	}

	// Rank 0 never publishing is a timeout, naming the key.
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err = g.nccl.NewComm(short, g.dev, CommConfig{Rank: 1, Size: 2, Store: store, Key: "nccl/never"})
	if !errors.Is(err, rendezvous.ErrTimeout) || !strings.Contains(err.Error(), `reading rank 0's unique id under "nccl/never"`) {
		t.Errorf("got %v", err)
	}
	if _, err := g.nccl.NewComm(ctx, g.dev, CommConfig{Rank: 2, Size: 2, Store: store, Key: "x"}); err == nil {
		t.Error("rank 2 of 2 was accepted")
	}
}

func TestCollectivesMapToNCCL(t *testing.T) {
	g := newGPU(t)
	c := g.comm(CommConfig{})
	ctx := context.Background()
	in := float32s(1, 2, 3, 4)
	src := g.buffer(in)
	dst := g.buffer(make([]byte, len(in)))

	// Each call, the NCCL call it becomes (the enums as numbers, which the
	// fake also range-checks), and what lands in dst.
	cases := []struct {
		name string
		run  func() (*Work, error)
		want []string
	}{
		{"all_reduce", func() (*Work, error) {
			return c.AllReduce(ctx, src.Ptr(), dst.Ptr(), 4, elem.Float32, elem.Sum)
		}, []string{"AllReduce count=4 dtype=7 op=0"}},
		{"all_reduce avg bfloat16", func() (*Work, error) {
			return c.AllReduce(ctx, src.Ptr(), dst.Ptr(), 8, elem.BFloat16, elem.Avg)
		}, []string{"AllReduce count=8 dtype=9 op=4"}},
		{"reduce", func() (*Work, error) {
			return c.Reduce(ctx, src.Ptr(), dst.Ptr(), 2, elem.Int64, elem.Max, 0)
		}, []string{"Reduce count=2 dtype=4 op=2 root=0"}},
		{"broadcast", func() (*Work, error) {
			return c.Broadcast(ctx, src.Ptr(), dst.Ptr(), 16, elem.Uint8, 0)
		}, []string{"Broadcast count=16 dtype=1 root=0"}},
		{"all_gather", func() (*Work, error) {
			return c.AllGather(ctx, src.Ptr(), dst.Ptr(), 4, elem.Int32)
		}, []string{"AllGather sendcount=4 dtype=2"}},
		{"reduce_scatter", func() (*Work, error) {
			return c.ReduceScatter(ctx, src.Ptr(), dst.Ptr(), []int{8}, elem.Float16, elem.Min)
		}, []string{"ReduceScatter recvcount=8 dtype=6 op=3"}},
		{"gather", func() (*Work, error) {
			return c.Gather(ctx, src.Ptr(), dst.Ptr(), 2, elem.Float64, 0)
		}, []string{"GroupStart", "Send count=2 dtype=8 peer=0", "Recv count=2 dtype=8 peer=0", "GroupEnd"}},
		{"scatter", func() (*Work, error) {
			return c.Scatter(ctx, src.Ptr(), dst.Ptr(), 16, elem.Int8, 0)
		}, []string{"GroupStart", "Send count=16 dtype=0 peer=0", "Recv count=16 dtype=0 peer=0", "GroupEnd"}},
		{"all_to_all", func() (*Work, error) {
			return c.AllToAll(ctx, src.Ptr(), dst.Ptr(), []int{4}, []int{4}, elem.Float32)
		}, []string{"GroupStart", "Send count=4 dtype=7 peer=0", "Recv count=4 dtype=7 peer=0", "GroupEnd"}},
		{"batch_p2p", func() (*Work, error) {
			return c.BatchP2P(ctx, []P2POp{
				{Recv: true, Peer: 0, Buf: dst.Ptr(), Count: 4, DType: elem.Float32},
				{Peer: 0, Buf: src.Ptr(), Count: 4, DType: elem.Float32},
			})
		}, []string{"GroupStart", "Recv count=4 dtype=7 peer=0", "Send count=4 dtype=7 peer=0", "GroupEnd"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := dst.WriteAt(make([]byte, len(in)), 0); err != nil {
				t.Fatal(err)
			}
			before := len(logLines(g.ncclLog(), ""))
			w, err := tc.run()
			wait(t, w, err)
			if got := logLines(g.ncclLog(), "")[before:]; !slices.Equal(got, tc.want) {
				t.Errorf("NCCL calls %q; want %q", got, tc.want)
			}
			if got := g.read(dst); !bytes.Equal(got, in) {
				t.Errorf("the result is % x; want % x", got, in)
			}
			// Waiting again gives the same answer.
			if err := w.Wait(ctx); err != nil {
				t.Error(err)
			}
		})
	}

	before := len(logLines(g.ncclLog(), ""))
	w, err := c.Barrier(ctx)
	wait(t, w, err)
	if got := logLines(g.ncclLog(), "")[before:]; !slices.Equal(got, []string{"AllReduce count=1 dtype=2 op=0"}) {
		t.Errorf("Barrier made NCCL calls %q", got)
	}
	if g.live("events") != 0 {
		t.Errorf("%d events left after every Work was waited for", g.live("events"))
	}
}

func TestUnequalSplitsBecomeGroupedCalls(t *testing.T) {
	// A communicator of two ranks, of which this process is rank 0: the
	// fake logs each call and fails the group at ncclGroupEnd, as it moves
	// data for one rank only. The calls are what this test is about.
	g := newGPU(t)
	ctx := context.Background()
	store := rendezvous.NewMemoryStore(time.Minute)
	c := g.comm(CommConfig{Rank: 0, Size: 2, Store: store})
	src := g.buffer(make([]byte, 64))
	dst := g.buffer(make([]byte, 64))

	moves := []string{"GroupStart", "GroupEnd", "Reduce", "Send", "Recv", "AllReduce"}
	before := len(logLines(g.ncclLog(), moves...))
	_, err := c.ReduceScatter(ctx, src.Ptr(), dst.Ptr(), []int{3, 5}, elem.Float32, elem.Sum)
	want := "cuda: nccl reduce_scatter on rank 0: ncclGroupEnd: ncclInvalidUsage: invalid usage (run with NCCL_DEBUG=WARN for details): fake: world size 2: the fake moves data for one rank only"
	if err == nil || err.Error() != want {
		t.Errorf("got  %v\nwant %s", err, want)
	}
	calls := logLines(g.ncclLog(), moves...)
	if got := calls[before:]; !slices.Equal(got, []string{"GroupStart", "Reduce count=3 dtype=7 op=0 root=0", "Reduce count=5 dtype=7 op=0 root=1", "GroupEnd"}) {
		t.Errorf("NCCL calls %q", got)
	}

	// Empty slices of an all_to_all are skipped on both sides.
	before = len(calls)
	_, err = c.AllToAll(ctx, src.Ptr(), dst.Ptr(), []int{0, 2}, []int{3, 0}, elem.Int32)
	if err == nil {
		t.Error("the fake moved data for two ranks")
	}
	calls = logLines(g.ncclLog(), moves...)
	if got := calls[before:]; !slices.Equal(got, []string{"GroupStart", "Recv count=3 dtype=2 peer=0", "Send count=2 dtype=2 peer=1", "GroupEnd"}) {
		t.Errorf("NCCL calls %q", got)
	}
	// Synchronous errors leave the communicator usable.
	if _, err := c.AllReduce(ctx, src.Ptr(), dst.Ptr(), 1, elem.Float32, elem.Sum); errors.Is(err, ErrAborted) {
		t.Errorf("an argument error aborted the communicator: %v", err)
	}
}

func TestNCCLErrorsNameTheOperationAndRank(t *testing.T) {
	g := newGPU(t)
	c := g.comm(CommConfig{})
	ctx := context.Background()
	b := g.buffer(make([]byte, 8))
	_, err := c.AllReduce(ctx, b.Ptr(), b.Ptr(), 0xBAD, elem.Float32, elem.Sum)
	want := "cuda: nccl all_reduce on rank 0: ncclAllReduce: ncclInvalidArgument: invalid argument (run with NCCL_DEBUG=WARN for details): fake: count 2989 is the magic bad count"
	if err == nil || err.Error() != want {
		t.Fatalf("got  %v\nwant %s", err, want)
	}
	var ncclErr *NCCLError
	var opErr *OpError
	if !errors.As(err, &ncclErr) || ncclErr.Code != 4 || !errors.As(err, &opErr) || opErr.Aborted {
		t.Errorf("got %#v", err)
	}
	// The communicator is still usable.
	w, err := c.AllReduce(ctx, b.Ptr(), b.Ptr(), 2, elem.Float32, elem.Sum)
	wait(t, w, err)
}

func TestArgumentsAreCheckedBeforeNCCL(t *testing.T) {
	g := newGPU(t)
	c := g.comm(CommConfig{})
	ctx := context.Background()
	b := g.buffer(make([]byte, 8))
	before := g.ncclLog()
	for _, op := range []elem.Op{elem.BAnd, elem.BOr, elem.BXor} {
		_, err := c.AllReduce(ctx, b.Ptr(), b.Ptr(), 2, elem.Int32, op)
		if !errors.Is(err, errors.ErrUnsupported) || !strings.Contains(err.Error(), "all_reduce on rank 0: reduction "+op.String()+": unsupported operation: NCCL has no bitwise reductions") {
			t.Errorf("%v: %v", op, err)
		}
	}
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"dtype", func() error {
			_, err := c.AllReduce(ctx, b.Ptr(), b.Ptr(), 2, elem.DType(3), elem.Sum)
			return err
		}(), "unknown data type dtype(3)"},
		{"root", func() error { _, err := c.Broadcast(ctx, b.Ptr(), b.Ptr(), 2, elem.Int32, 1); return err }(), "root 1 is not a rank of 1"},
		{"count", func() error { _, err := c.Send(ctx, b.Ptr(), -1, elem.Int32, 0); return err }(), "send on rank 0: negative count -1"},
		{"counts", func() error {
			_, err := c.AllToAll(ctx, b.Ptr(), b.Ptr(), []int{1, 1}, []int{1}, elem.Int32)
			return err
		}(), "2 sendCounts for 1 ranks"},
		{"any source", func() error { _, err := c.Recv(ctx, b.Ptr(), 1, elem.Int32, -1); return err }(), "recv on rank 0: peer -1 is not a rank of 1"},
		{"empty batch", func() error { _, err := c.BatchP2P(ctx, nil); return err }(), "no operations"},
	} {
		if tc.err == nil || !strings.Contains(tc.err.Error(), tc.want) {
			t.Errorf("%s: got %v; want %q", tc.name, tc.err, tc.want)
		}
	}
	if g.ncclLog() != before {
		t.Errorf("refused calls reached NCCL:\n%s", strings.TrimPrefix(g.ncclLog(), before))
	}
}

func TestOldNCCLHasNoAvgOrBFloat16(t *testing.T) {
	t.Setenv("FAKE_NCCL_VERSION", "2804")
	g := newGPU(t)
	c := g.comm(CommConfig{})
	b := g.buffer(make([]byte, 8))
	_, err := c.AllReduce(context.Background(), b.Ptr(), b.Ptr(), 2, elem.Float32, elem.Avg)
	if !errors.Is(err, errors.ErrUnsupported) || !strings.Contains(err.Error(), "reduction avg: unsupported operation by NCCL 2.8.4 (it came with 2.10.0)") {
		t.Errorf("avg: %v", err)
	}
	_, err = c.AllReduce(context.Background(), b.Ptr(), b.Ptr(), 2, elem.BFloat16, elem.Sum)
	if !errors.Is(err, errors.ErrUnsupported) || !strings.Contains(err.Error(), "bfloat16: unsupported operation by NCCL 2.8.4") {
		t.Errorf("bfloat16: %v", err)
	}
}

func TestNonblockingCallsSettle(t *testing.T) {
	t.Setenv("FAKE_NCCL_INPROGRESS", "3")
	g := newGPU(t)
	c := g.comm(CommConfig{})
	polls := testFunc[func() int64](t, g.nccl.lib, "fake_nccl_inprogress_reports")
	if n := polls(); n != 3 {
		t.Errorf("init was polled in progress %d times; want 3", n)
	}
	in := float32s(5, 6)
	src, dst := g.buffer(in), g.buffer(make([]byte, len(in)))
	w, err := c.AllReduce(context.Background(), src.Ptr(), dst.Ptr(), 2, elem.Float32, elem.Sum)
	wait(t, w, err)
	if n := polls(); n != 6 {
		t.Errorf("%d in-progress polls after init and all_reduce; want 6", n)
	}
	if !bytes.Equal(g.read(dst), in) {
		t.Error("the all_reduce did not run")
	}
	// Grouped calls settle after ncclGroupEnd.
	w, err = c.Gather(context.Background(), src.Ptr(), dst.Ptr(), 2, elem.Float32, 0)
	wait(t, w, err)
	if n := polls(); n != 9 {
		t.Errorf("%d in-progress polls after a grouped call; want 9", n)
	}
}

func TestAHangIsAbortedAtTheDeadline(t *testing.T) {
	g := newGPU(t)
	c := g.comm(CommConfig{})
	b := g.buffer(make([]byte, 8))
	t.Setenv("FAKE_NCCL_INPROGRESS", "-1") // the next call never settles
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := c.AllReduce(ctx, b.Ptr(), b.Ptr(), 2, elem.Float32, elem.Sum)
	if !errors.Is(err, ErrAborted) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v; want an abort at the deadline", err)
	}
	if msg := err.Error(); !strings.HasPrefix(msg, "cuda: nccl all_reduce on rank 0: still in progress after ") || !strings.HasSuffix(msg, ": context deadline exceeded; communicator aborted") {
		t.Errorf("the error %q does not name the operation, the rank and the abort", msg)
	}
	if !slices.Contains(logLines(g.ncclLog(), "CommAbort"), "CommAbort") {
		t.Error("ncclCommAbort was not called")
	}

	// Every later call fails at once, saying why.
	_, err = c.Barrier(context.Background())
	want := "cuda: nccl barrier on rank 0: the communicator was aborted when all_reduce failed: still in progress after"
	if !errors.Is(err, ErrAborted) || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("got %v; want %q...", err, want)
	}
	// Close frees the stream and memory without touching the aborted
	// communicator (the fake counts any call on it).
	if err := c.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if got := logLines(g.ncclLog(), "CommFinalize", "CommDestroy"); len(got) != 0 {
		t.Errorf("Close of an aborted communicator called %q", got)
	}
}

func TestAHungKernelIsAbortedByWait(t *testing.T) {
	g := newGPU(t)
	c := g.comm(CommConfig{})
	b := g.buffer(make([]byte, 8))
	t.Setenv("FAKE_CUDA_EVENTS_NEVER_READY", "1") // the GPU never gets past the collective
	ctx := context.Background()
	first, err := c.AllReduce(ctx, b.Ptr(), b.Ptr(), 2, elem.Float32, elem.Sum)
	if err != nil {
		t.Fatal(err)
	}
	second, err := c.Broadcast(ctx, b.Ptr(), b.Ptr(), 2, elem.Float32, 0)
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	err = first.Wait(short)
	if !errors.Is(err, ErrAborted) || !errors.Is(err, context.DeadlineExceeded) ||
		!strings.HasPrefix(err.Error(), "cuda: nccl all_reduce on rank 0: not complete ") {
		t.Fatalf("got %v", err)
	}
	// The abort failed the other unfinished work too.
	if err := second.Wait(ctx); !errors.Is(err, ErrAborted) || !strings.HasPrefix(err.Error(), "cuda: nccl broadcast on rank 0: the communicator was aborted when all_reduce failed") {
		t.Errorf("the other work: %v", err)
	}
	if g.live("events") != 0 {
		t.Errorf("%d events left", g.live("events"))
	}
}

func TestAnAsyncErrorAborts(t *testing.T) {
	g := newGPU(t)
	c := g.comm(CommConfig{})
	b := g.buffer(make([]byte, 8))
	t.Setenv("FAKE_CUDA_EVENTS_NEVER_READY", "1")
	w, err := c.AllReduce(context.Background(), b.Ptr(), b.Ptr(), 2, elem.Float32, elem.Sum)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("FAKE_NCCL_ASYNC_ERROR", "6") // a peer died
	err = w.Wait(context.Background())
	want := "cuda: nccl all_reduce on rank 0: ncclCommGetAsyncError: ncclRemoteError: remote process exited or there was a network error"
	if !errors.Is(err, ErrAborted) || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("got  %v\nwant %s...", err, want)
	}
}

func TestCloseFinalizesThenDestroys(t *testing.T) {
	t.Setenv("FAKE_NCCL_INPROGRESS", "2")
	g := newGPU(t)
	c := g.comm(CommConfig{})
	b := g.buffer(make([]byte, 8))
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if got := logLines(g.ncclLog(), "CommFinalize", "CommDestroy", "CommAbort"); !slices.Equal(got, []string{"CommFinalize", "CommDestroy"}) {
		t.Errorf("Close called %q", got)
	}
	if err := c.Close(); err != nil {
		t.Errorf("a second Close: %v", err)
	}
	if _, err := c.AllReduce(context.Background(), b.Ptr(), b.Ptr(), 2, elem.Float32, elem.Sum); !errors.Is(err, ErrClosed) {
		t.Errorf("a call after Close: %v", err)
	}
	if g.live("streams") != 1 { // the device's own copy stream is all that is left
		t.Errorf("%d streams left after Close", g.live("streams"))
	}
}

func TestCloseAbortsAHungFinalize(t *testing.T) {
	g := newGPU(t)
	c := g.comm(CommConfig{Timeout: 100 * time.Millisecond})
	t.Setenv("FAKE_NCCL_INPROGRESS", "-1")
	err := c.Close()
	if !errors.Is(err, ErrAborted) || !strings.HasPrefix(err.Error(), "cuda: nccl close on rank 0: still in progress after") {
		t.Errorf("got %v", err)
	}
	if got := logLines(g.ncclLog(), "CommFinalize", "CommDestroy", "CommAbort"); !slices.Equal(got, []string{"CommFinalize", "CommAbort"}) {
		t.Errorf("Close called %q", got)
	}
}

func TestSplitWithNCCLCommSplit(t *testing.T) {
	g := newGPU(t)
	store := rendezvous.NewMemoryStore(time.Minute)
	c := g.comm(CommConfig{Store: store})
	ctx := context.Background()

	sub, err := c.Split(ctx, []int{0}, "tp")
	if err != nil || sub == nil {
		t.Fatalf("Split: %v, %v", sub, err)
	}
	defer sub.Close()
	if sub.Rank() != 0 || sub.Size() != 1 {
		t.Errorf("rank %d of %d", sub.Rank(), sub.Size())
	}
	in := float32s(7)
	src, dst := g.buffer(in), g.buffer(make([]byte, 4))
	w, err := sub.AllReduce(ctx, src.Ptr(), dst.Ptr(), 1, elem.Float32, elem.Sum)
	wait(t, w, err)
	if !bytes.Equal(g.read(dst), in) {
		t.Error("the split communicator did not run the all_reduce")
	}

	none, err := c.Split(ctx, []int{}, "nobody")
	if none != nil || err != nil {
		t.Errorf("a split without this rank: %v, %v", none, err)
	}
	if got := logLines(g.ncclLog(), "CommSplit", "GetUniqueId"); !slices.Equal(got, []string{"GetUniqueId", "CommSplit color=0 key=0", "CommSplit color=-1 key=0"}) {
		t.Errorf("NCCL calls %q", got)
	}
	for _, ranks := range [][]int{{1}, {0, 0}, {-1}} {
		if _, err := c.Split(ctx, ranks, "bad"); err == nil || !strings.Contains(err.Error(), "each must be in [0, 1) and listed once") {
			t.Errorf("Split(%v): %v", ranks, err)
		}
	}
}

func TestSplitWithoutNCCLCommSplit(t *testing.T) {
	g := newGPU(t, "-DNO_SPLIT")
	store := rendezvous.NewMemoryStore(time.Minute)
	c := g.comm(CommConfig{Store: store, Key: "nccl/world"})
	ctx := context.Background()
	sub, err := c.Split(ctx, []int{0}, "tp")
	if err != nil || sub == nil {
		t.Fatalf("Split: %v, %v", sub, err)
	}
	defer sub.Close()
	if id, err := store.Get(ctx, "nccl/world/split/tp"); err != nil || len(id) != 128 {
		t.Errorf("the new communicator's id: %d bytes, %v", len(id), err)
	}
	want := []string{"GetUniqueId", "CommInitRankConfig nranks=1 rank=0 blocking=0", "GetUniqueId", "CommInitRankConfig nranks=1 rank=0 blocking=0"}
	if got := logLines(g.ncclLog(), "CommSplit", "GetUniqueId", "CommInit"); !slices.Equal(got, want) {
		t.Errorf("NCCL calls %q; want %q", got, want)
	}
	if none, err := c.Split(ctx, []int{}, "nobody"); none != nil || err != nil {
		t.Errorf("a split without this rank: %v, %v", none, err)
	}
}

func TestLegacyNCCLIsBlocking(t *testing.T) {
	g := newGPU(t, "-DLEGACY")
	c := g.comm(CommConfig{})
	in := float32s(1, 2)
	src, dst := g.buffer(in), g.buffer(make([]byte, 8))
	w, err := c.AllReduce(context.Background(), src.Ptr(), dst.Ptr(), 2, elem.Float32, elem.Sum)
	wait(t, w, err)
	if !bytes.Equal(g.read(dst), in) {
		t.Error("the all_reduce did not run")
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if got := logLines(g.ncclLog(), "CommInit", "CommFinalize", "CommDestroy"); !slices.Equal(got, []string{"CommInitRank nranks=1 rank=0", "CommDestroy"}) {
		t.Errorf("NCCL calls %q", got)
	}
}

func TestConcurrentCallsReachNCCLOneAtATime(t *testing.T) {
	g := newGPU(t)
	c := g.comm(CommConfig{})
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 16 {
		in := float32s(float32(i), float32(i+1))
		src, dst := g.buffer(in), g.buffer(make([]byte, len(in)))
		wg.Go(func() {
			w, err := c.AllReduce(ctx, src.Ptr(), dst.Ptr(), 2, elem.Float32, elem.Sum)
			if err == nil {
				err = w.Wait(ctx)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

func TestConfigLayout(t *testing.T) {
	// ncclConfig_t up to splitShare, as a 64-bit C compiler lays it out;
	// the fake checks each field's value through its own declaration.
	c := newConfig(false)
	if c.size != 48 || c.magic != 0xcafebeef || c.version != 21800 || c.blocking != 0 || c.minCTAs != math.MinInt32 {
		t.Errorf("%+v", *c)
	}
}
