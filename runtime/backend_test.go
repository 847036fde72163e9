package runtime

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/cuda"
	"github.com/gorun/gorun/cuda/cudatest"
	"github.com/rs/zerolog"
)

// The NCCL backend against the fake libraries, which move data for one
// rank: every operation at world size 1, and what a world of several
// ranks can check without moving data (initialisation, errors). The TCP
// backend's staging of device tensors runs on several ranks.

func TestNCCLEveryCollectiveMatchesTheHost(t *testing.T) {
	g := newFakeGPU(t)
	mustInit(t, initGPURanks(t, 1, func(int) map[string]string { return g.env() }, func(pg *ProcessGroup) error {
		if pg.Backend() != "nccl" || pg.Device() == nil {
			return fmt.Errorf("backend %q, device %v; want nccl on the fake GPU", pg.Backend(), pg.Device())
		}
		return compareWithHost(t.Context(), pg, pg.Device(), deviceCases())
	}, WithBackend("nccl")))

	// Each form reached NCCL as the call that does its work.
	log := g.ncclLog(t)
	lines := strings.Split(log, "\n")
	for _, call := range []string{
		"CommInitRankConfig nranks=1 rank=0 blocking=0", "CommSplit color=0 key=0",
		"AllReduce count=5 dtype=7 op=0", "AllReduce count=3 dtype=4 op=2", "AllReduce count=4 dtype=8 op=4", "AllReduce count=2 dtype=9 op=0",
		"Broadcast count=6 dtype=2 root=0", "Reduce count=4 dtype=8 op=0 root=0",
		// Into or from one tensor, or a list, which at world size 1 is
		// always one piece of one buffer.
		"AllGather sendcount=3 dtype=1", "AllGather sendcount=2 dtype=2",
		"ReduceScatter recvcount=2 dtype=7 op=0", "ReduceScatter recvcount=1 dtype=8 op=2",
		"Send count=2 dtype=7 peer=0", "Recv count=2 dtype=7 peer=0", // gather
		"Send count=3 dtype=4 peer=0", // scatter
		"Recv count=1 dtype=4 peer=0", // all_to_all_single
		"GroupStart", "GroupEnd", "CommFinalize", "CommDestroy",
	} {
		if !slices.Contains(lines, call) {
			t.Errorf("NCCL never saw %q; its log:\n%s", call, log)
		}
	}
	// Two communicators, for collectives and messages, both destroyed.
	if n := strings.Count(log, "CommDestroy\n"); n != 2 {
		t.Errorf("%d communicators destroyed, want 2", n)
	}
	g.expectReleased(t)
}

func TestNCCLGroupsSplitTheCommunicator(t *testing.T) {
	g := newFakeGPU(t)
	mustInit(t, initGPURanks(t, 1, func(int) map[string]string { return g.env() }, func(world *ProcessGroup) error {
		ctx := t.Context()
		sub, err := world.NewGroup(ctx, []int{0})
		if err != nil {
			return err
		}
		split, err := world.Split(ctx, 3, 0)
		if err != nil {
			return err
		}
		mesh, err := NewDeviceMesh(ctx, world, []int{1}, []string{"dp"})
		if err != nil {
			return err
		}
		for _, pg := range []*ProcessGroup{sub, split, mesh.Group("dp")} {
			if pg.nccl == nil || pg.Backend() != "nccl" {
				return fmt.Errorf("%s has no NCCL communicator", pg)
			}
			if err := compareWithHost(ctx, pg, world.Device(), deviceCases()[:1]); err != nil {
				return fmt.Errorf("%s: %w", pg, err)
			}
		}
		return nil
	}))
	log := g.ncclLog(t)
	// The world and three groups, each with its communicator for messages.
	if splits, destroyed := strings.Count(log, "CommSplit color=0 key=0\n"), strings.Count(log, "CommDestroy\n"); splits != 7 || destroyed != 8 {
		t.Errorf("%d splits and %d communicators destroyed, want 7 and 8; NCCL's log:\n%s", splits, destroyed, log)
	}
	g.expectReleased(t)
}

func TestNCCLGroupKeepsHostTensorsOnTCP(t *testing.T) {
	g := newFakeGPU(t)
	mustInit(t, initGPURanks(t, 1, func(int) map[string]string { return g.env() }, func(pg *ProcessGroup) error {
		before := strings.Count(g.ncclLog(t), "AllReduce")
		if err := everyCollective(t.Context(), pg); err != nil {
			return err
		}
		if after := strings.Count(g.ncclLog(t), "AllReduce"); after != before {
			return fmt.Errorf("host tensors reached NCCL: %d all-reduces became %d", before, after)
		}
		return nil
	}))
}

func TestNCCLRefusals(t *testing.T) {
	g := newFakeGPU(t)
	t.Setenv("FAKE_CUDA_DEVICES", "2")
	other := g.openDevice(t, 1)
	mustInit(t, initGPURanks(t, 1, func(int) map[string]string { return g.env() }, func(pg *ProcessGroup) error {
		ctx := t.Context()
		dev, err := NewDeviceTensor(pg.Device(), Float32, 4)
		if err != nil {
			return err
		}
		defer dev.DeviceBuffer().Free()
		elsewhere, err := NewDeviceTensor(other, Float32, 4)
		if err != nil {
			return err
		}
		defer elsewhere.DeviceBuffer().Free()
		freed, err := NewDeviceTensor(pg.Device(), Float32, 4)
		if err != nil {
			return err
		}
		freed.DeviceBuffer().Free()
		host := Of(make([]float32, 4))
		_, recvErr := pg.Recv(ctx, dev, AnySource, 0)
		batchErr := pg.BatchISendIRecv([]P2POp{{Op: RecvOp, Tensor: dev, Peer: AnySource}})[0].Wait(ctx)
		for _, tc := range []struct {
			err  error
			want string
		}{
			{pg.AllGatherInto(ctx, dev, host), "runtime: all_gather_into_tensor: invalid argument: Tensor(float32, 4) is on the host and Tensor(float32, 4, cuda:0) on a GPU: an operation's tensors must all be on the host or all on GPUs"},
			{pg.AllReduce(ctx, elsewhere, Sum), "runtime: all_reduce: invalid argument: Tensor(float32, 4, cuda:1) is on GPU 1, but the group's NCCL communicator on GPU 0"},
			{pg.Broadcast(ctx, freed, 0), "runtime: broadcast: invalid argument: Tensor(float32, 4, cuda:0) views freed device memory"},
			{recvErr, "runtime: recv: invalid argument: AnySource with a device tensor: NCCL receives from a named rank only"},
			{batchErr, "runtime: batch_isend_irecv: invalid argument: ops[0] AnySource with a device tensor"},
		} {
			if !errors.Is(tc.err, ErrInvalidArgument) || !strings.Contains(fmt.Sprint(tc.err), tc.want) {
				return fmt.Errorf("got %v, want an invalid argument error containing %q", tc.err, tc.want)
			}
		}
		// What NCCL cannot do fails on the rank, naming the operation.
		i32, err := NewDeviceTensor(pg.Device(), Int32, 2)
		if err != nil {
			return err
		}
		defer i32.DeviceBuffer().Free()
		const want = "runtime: all_reduce: cuda: nccl all_reduce on rank 0: reduction bxor: unsupported operation: NCCL has no bitwise reductions"
		if err := pg.AllReduce(ctx, i32, BXor); !errors.Is(err, errors.ErrUnsupported) || err.Error() != want {
			return fmt.Errorf("got %v, want %q", err, want)
		}
		// The communicator still works.
		return pg.AllReduce(ctx, dev, Sum)
	}))
}

func TestDeviceTensorHostAccessorsPanic(t *testing.T) {
	g := newFakeGPU(t)
	dev := g.openDevice(t, 0)
	d, err := NewDeviceTensor(dev, Float16, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer d.DeviceBuffer().Free()
	if !d.OnDevice() || d.Device() != dev || d.Len() != 4 || d.Slice(1, 3).Len() != 2 || d.Slice(1, 3).String() != "Tensor(float16, 2, cuda:0)" {
		t.Errorf("device tensor %s, a slice %s", d, d.Slice(1, 3))
	}
	for name, use := range map[string]func(){
		"Bytes":    func() { d.Bytes() },
		"Elems":    func() { Elems[int8](DeviceTensor(d.DeviceBuffer(), Int8, 8)) },
		"HalfBits": func() { d.HalfBits() },
	} {
		func() {
			defer func() {
				want := "runtime: " + name + " of a device tensor on GPU 0: copy it to the host with Copy"
				if got := recover(); got != want {
					t.Errorf("%s: panic %v, want %q", name, got, want)
				}
			}()
			use()
		}()
	}
	// Copy goes both ways, and between slices of device memory.
	src := Float16s([]uint16{1, 2, 3, 4})
	back := Float16s(make([]uint16, 2))
	if err := errors.Join(Copy(d, src), Copy(d.Slice(0, 2), d.Slice(2, 4)), Copy(back, d.Slice(0, 2))); err != nil {
		t.Fatal(err)
	}
	if err := expect("copied back", back.HalfBits(), []uint16{3, 4}); err != nil {
		t.Error(err)
	}
	if err := Copy(back, d); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("copy of 4 elements into 2: %v", err)
	}
	if _, err := NewDeviceTensor(nil, Float32, 1); err == nil {
		t.Error("a device tensor without a GPU")
	}
}

func TestNCCLTimeoutNamesTheOperationAndRank(t *testing.T) {
	g := newFakeGPU(t)
	mustInit(t, initGPURanks(t, 1, func(int) map[string]string { return g.env() }, func(pg *ProcessGroup) error {
		ctx := t.Context()
		x, err := NewDeviceTensor(pg.Device(), Float32, 2)
		if err != nil {
			return err
		}
		defer x.DeviceBuffer().Free()
		t.Setenv("FAKE_CUDA_EVENTS_NEVER_READY", "1") // the GPU never gets past the collective
		err = pg.AllReduce(ctx, x, Sum)
		var opErr *cuda.OpError
		if !errors.Is(err, cuda.ErrAborted) || !errors.As(err, &opErr) || opErr.Op != "all_reduce" || opErr.Rank != 0 ||
			!strings.HasPrefix(err.Error(), "runtime: all_reduce: cuda: nccl all_reduce on rank 0: not complete") {
			return fmt.Errorf("got %v, want the all_reduce on rank 0 aborted", err)
		}
		// The communicator is gone; host tensors still travel.
		if err := pg.Broadcast(ctx, x, 0); !errors.Is(err, cuda.ErrAborted) {
			return fmt.Errorf("broadcast after the abort: %v", err)
		}
		return pg.AllReduce(ctx, Of([]float32{1}), Sum)
	}, WithTimeout(time.Second)))
	g.expectReleased(t)
}

func TestAutoFallsBackToTCPWithOneWarning(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "libnccl.so.2")
	for _, tc := range []struct {
		name string
		env  func(t *testing.T) map[string]string
		want string // in the warning
	}{
		{"no NCCL", func(t *testing.T) map[string]string {
			return map[string]string{"GORUN_CUDA_LIBRARY": fakes.CUDA(t), "GORUN_NCCL_LIBRARY": missing}
		}, "cuda: no usable libnccl.so.2 (set GORUN_NCCL_LIBRARY to its path); not found (GORUN_NCCL_LIBRARY): " + missing},
		{"old NCCL", func(t *testing.T) map[string]string {
			return newFakeGPU(t, "-DFAKE_DEFAULT_VERSION=2603").env()
		}, "(GORUN_NCCL_LIBRARY): NCCL 2.6.3 is too old: gorun needs 2.7.0 or newer (ncclSend/ncclRecv)"},
		{"NCCL without a function", func(t *testing.T) map[string]string {
			return newFakeGPU(t, "-DNO_SEND").env()
		}, "(GORUN_NCCL_LIBRARY): missing ncclSend, ncclRecv (need NCCL 2.7.0 or newer)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			log, lines := logTo(zerolog.InfoLevel)
			env := tc.env(t)
			mustInit(t, initGPURanks(t, 1, func(int) map[string]string { return env }, func(pg *ProcessGroup) error {
				if pg.Backend() != "tcp" || pg.Device() == nil {
					return fmt.Errorf("backend %q, device %v; want tcp, and the GPU for staging", pg.Backend(), pg.Device())
				}
				return compareWithHost(t.Context(), pg, pg.Device(), deviceCases()[:2])
			}, WithLogger(log)))
			got := lines()
			if len(got) != 1 || !strings.Contains(got[0], `"level":"warn"`) || !strings.Contains(got[0], tc.want) ||
				!strings.Contains(got[0], "NCCL is unavailable: using the TCP backend") {
				t.Errorf("logged %q; want one warning with %q", got, tc.want)
			}
		})
	}
}

func TestAutoWithoutAGPUIsQuiet(t *testing.T) {
	for _, tc := range []struct {
		name    string
		env     func(t *testing.T) map[string]string
		devices string
	}{
		{"no driver", func(t *testing.T) map[string]string {
			return map[string]string{"GORUN_CUDA_LIBRARY": filepath.Join(t.TempDir(), "libcuda.so.1")}
		}, "1"},
		{"no GPU", func(t *testing.T) map[string]string { return newFakeGPU(t).env() }, "0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("FAKE_CUDA_DEVICES", tc.devices)
			log, lines := logTo(zerolog.DebugLevel)
			env := tc.env(t)
			mustInit(t, initGPURanks(t, 2, func(int) map[string]string { return env }, func(pg *ProcessGroup) error {
				if pg.Backend() != "tcp" || pg.Device() != nil {
					return fmt.Errorf("backend %q, device %v; want tcp and none", pg.Backend(), pg.Device())
				}
				return nil
			}, WithLogger(log)))
			for _, line := range lines() {
				if !strings.Contains(line, `"level":"debug"`) {
					t.Errorf("logged %s; want debug lines only", line)
				}
			}
			if got := lines(); !slices.ContainsFunc(got, func(l string) bool { return strings.Contains(l, "no GPU: using the TCP backend") }) {
				t.Errorf("logged %q; want the debug line that says why not NCCL", got)
			}
		})
	}
}

func TestNCCLWithoutTheLibrariesFailsInit(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		env  func(t *testing.T) map[string]string
		want string
	}{
		{"no driver", func(t *testing.T) map[string]string {
			return map[string]string{"GORUN_CUDA_LIBRARY": filepath.Join(dir, "libcuda.so.1")}
		}, "runtime: backend nccl on rank 0: cuda: no usable libcuda.so.1 (set GORUN_CUDA_LIBRARY to its path); not found (GORUN_CUDA_LIBRARY): " + filepath.Join(dir, "libcuda.so.1")},
		{"no NCCL", func(t *testing.T) map[string]string {
			return map[string]string{"GORUN_CUDA_LIBRARY": fakes.CUDA(t), "GORUN_NCCL_LIBRARY": filepath.Join(dir, "libnccl.so.2")}
		}, "runtime: backend nccl on rank 0: cuda: no usable libnccl.so.2 (set GORUN_NCCL_LIBRARY to its path); not found (GORUN_NCCL_LIBRARY): " + filepath.Join(dir, "libnccl.so.2")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := tc.env(t)
			env[BackendEnv] = "nccl" // as gorun --backend nccl passes it
			errs := initGPURanks(t, 1, func(int) map[string]string { return env }, func(*ProcessGroup) error {
				return errors.New("Init succeeded")
			})
			if errs[0] == nil || !strings.HasPrefix(errs[0].Error(), tc.want) {
				t.Errorf("got %v, want %q...", errs[0], tc.want)
			}
		})
	}
}

func TestTCPBackendTouchesNoGPU(t *testing.T) {
	g := newFakeGPU(t)
	mustInit(t, initGPURanks(t, 1, func(int) map[string]string { return g.env(BackendEnv, "tcp") }, func(pg *ProcessGroup) error {
		if pg.Backend() != "tcp" || pg.Device() != nil {
			return fmt.Errorf("backend %q, device %v; want tcp and none", pg.Backend(), pg.Device())
		}
		return nil
	}))
	if n := cudatest.CUDALive(t, g.cuda, "contexts"); n != 0 {
		t.Errorf("%d contexts", n)
	}
	if log := g.ncclLog(t); log != "" {
		t.Errorf("NCCL was called:\n%s", log)
	}
}

// The ranks agree on a backend: NCCL for all, or TCP for all.

func TestAutoFallsBackWhenOneRankCannot(t *testing.T) {
	t.Setenv("FAKE_CUDA_DEVICES", "2")
	g := newFakeGPU(t)
	missing := filepath.Join(t.TempDir(), "libnccl.so.2")
	envOf := func(rank int) map[string]string {
		if rank == 1 {
			return g.env("GORUN_NCCL_LIBRARY", missing)
		}
		return g.env()
	}
	log, lines := logTo(zerolog.WarnLevel)
	mustInit(t, initGPURanks(t, 2, envOf, func(pg *ProcessGroup) error {
		if pg.Backend() != "tcp" {
			return fmt.Errorf("backend %q, want tcp", pg.Backend())
		}
		return compareWithHost(t.Context(), pg, pg.Device(), deviceCases()[:1])
	}, WithLogger(log)))
	got := strings.Join(lines(), "\n")
	for _, want := range []string{`"rank":1,"error":"cuda: no usable libnccl.so.2`, `"rank":0,"error":"ranks [1] cannot use NCCL (they say why)"`} {
		if !strings.Contains(got, want) {
			t.Errorf("logged\n%s\nwant a line with %s", got, want)
		}
	}

	errs := initGPURanks(t, 2, envOf, func(*ProcessGroup) error { return errors.New("Init succeeded") }, WithBackend("nccl"))
	for r, want := range []string{"runtime: backend nccl on rank 0: ranks [1] cannot use NCCL", "runtime: backend nccl on rank 1: cuda: no usable libnccl.so.2"} {
		if errs[r] == nil || !strings.HasPrefix(errs[r].Error(), want) {
			t.Errorf("rank %d: got %v, want %q...", r, errs[r], want)
		}
	}
}

func TestRanksSharingAGPUStageOverTCP(t *testing.T) {
	g := newFakeGPU(t) // one GPU for four ranks
	log, lines := logTo(zerolog.WarnLevel)
	mustInit(t, initGPURanks(t, 4, func(int) map[string]string { return g.env() }, func(pg *ProcessGroup) error {
		if pg.Backend() != "tcp" || pg.Device() == nil {
			return fmt.Errorf("backend %q, device %v; want tcp on the shared GPU", pg.Backend(), pg.Device())
		}
		return compareWithHost(t.Context(), pg, pg.Device(), deviceCases()[:1])
	}, WithLogger(log)))
	if got := lines(); len(got) != 4 || !strings.Contains(got[0], "ranks [0 1 2 3] share one GPU of this host, and NCCL needs a GPU per rank") {
		t.Errorf("logged %q; want one warning per rank that they share a GPU", got)
	}
	// No rank tried NCCL, which would hang on the others' duplicates.
	if log := g.ncclLog(t); strings.Contains(log, "CommInit") {
		t.Errorf("NCCL was initialised:\n%s", log)
	}
	g.expectReleased(t)
}

// TestRanksOfDistinctNCCLHostsChooseNCCL: NCCL tells hosts apart by
// NCCL_HOSTID where it is set, and GPUs by their PCI address, so ranks on
// one GPU whose NCCL_HOSTIDs differ pass its check for duplicates, and
// Init's too (which mirrors it): auto chooses NCCL without a warning.
func TestRanksOfDistinctNCCLHostsChooseNCCL(t *testing.T) {
	g := newFakeGPU(t) // one GPU
	log, lines := logTo(zerolog.WarnLevel)
	mustInit(t, initGPURanks(t, 2, func(r int) map[string]string {
		return g.env("NCCL_HOSTID", fmt.Sprintf("emulated-host-%d", r))
	}, func(pg *ProcessGroup) error {
		if pg.Backend() != "nccl" || pg.Device().BusID() != "0000:10:00.0" {
			return fmt.Errorf("backend %q on GPU %s, want nccl on 0000:10:00.0", pg.Backend(), pg.Device().BusID())
		}
		return nil
	}, WithLogger(log)))
	if got := lines(); len(got) != 0 {
		t.Errorf("logged %q, want nothing", got)
	}
	g.expectReleased(t)
}

func TestNCCLErrorsNameTheOperationAndRank(t *testing.T) {
	// Two ranks, each with fakes of its own, meet through the store and
	// make a communicator; the fake cannot move their data, and says so
	// on each rank.
	t.Setenv("FAKE_CUDA_DEVICES", "2")
	gpus := []fakeGPU{newFakeGPU(t), newFakeGPU(t)}
	mustInit(t, initGPURanks(t, 2, func(r int) map[string]string { return gpus[r].env() }, func(pg *ProcessGroup) error {
		x, err := NewDeviceTensor(pg.Device(), Float64, 3)
		if err != nil {
			return err
		}
		defer x.DeviceBuffer().Free()
		rank, peer := pg.Rank(), 1-pg.Rank()
		batch := pg.BatchISendIRecv([]P2POp{{Op: SendOp, Tensor: x, Peer: peer}, {Op: RecvOp, Tensor: x.Slice(0, 1), Peer: peer}})
		for _, tc := range []struct {
			err  error
			want string
		}{
			{pg.AllReduce(t.Context(), x, Sum), fmt.Sprintf("runtime: all_reduce: cuda: nccl all_reduce on rank %d: ncclAllReduce: ncclInvalidUsage: ", rank)},
			// The fake splits off one-rank communicators, which have no
			// peer 1 either.
			{pg.Send(t.Context(), x, peer, 0), fmt.Sprintf("runtime: send: cuda: nccl send on rank %d: ncclSend: ", rank)},
			{batch[1].Wait(t.Context()), fmt.Sprintf("runtime: recv: cuda: nccl batch_p2p on rank %d: nccl", rank)},
		} {
			var opErr *cuda.OpError
			if !errors.As(tc.err, &opErr) || !strings.HasPrefix(tc.err.Error(), tc.want) {
				return fmt.Errorf("got %v, want %q...", tc.err, tc.want)
			}
		}
		return nil
	}, WithBackend("nccl")))
	if log0, log1 := gpus[0].ncclLog(t), gpus[1].ncclLog(t); !strings.Contains(log0, "GetUniqueId\nCommInitRankConfig nranks=2 rank=0") ||
		!strings.HasPrefix(log1, "CommInitRankConfig nranks=2 rank=1") {
		t.Errorf("want rank 0 to make the unique id, and rank 1 to read it from the store; their NCCL logs:\n%s\n%s", log0, log1)
	}
	for _, g := range gpus {
		g.expectReleased(t)
	}
}

// TCP staging with the program's own GPU: every operation, device vs host.

func TestTCPStagesDeviceTensors(t *testing.T) {
	g := newFakeGPU(t)
	t.Cleanup(func() { g.expectReleased(t) }) // once the GPUs are closed
	const world = 4
	mustInit(t, initGPURanks(t, world, func(int) map[string]string { return g.env() }, func(pg *ProcessGroup) error {
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		// The tcp backend opens the GPU when asked; Close closes it.
		dev, err := pg.OpenDevice(ctx)
		if err != nil {
			return err
		}
		if again, _ := pg.OpenDevice(ctx); again != dev || pg.Device() != dev {
			return fmt.Errorf("OpenDevice gave %v, then %v; Device gives %v", dev, again, pg.Device())
		}
		return compareWithHost(ctx, pg, dev, append(deviceCases(), messageCases()...))
	}, WithBackend("tcp")))
}
