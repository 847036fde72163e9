package runtime

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// End-to-end tests on the TCP backend: goroutine ranks, real sockets on
// the loopback interface.

func TestTCPEveryCollective(t *testing.T) {
	for _, mode := range []struct {
		name string
		opts []Option
	}{{"lazy", nil}, {"eager", []Option{WithEagerConnect()}}} {
		t.Run(mode.name, func(t *testing.T) { everyOperationOnTCP(t, mode.opts) })
	}
}

func everyOperationOnTCP(t *testing.T, opts []Option) {
	onTCPRanks(t, 4, func(pg *ProcessGroup) error {
		ctx := t.Context()
		if err := everyCollective(ctx, pg); err != nil {
			return err
		}
		// Point-to-point: a ring, both ways at once.
		rank, size := pg.Rank(), pg.Size()
		next, prev := (rank+1)%size, (rank+size-1)%size
		fromPrev, fromNext := []int64{-1}, []int64{-1}
		works := pg.BatchISendIRecv([]P2POp{
			{Op: SendOp, Tensor: Of([]int64{int64(rank)}), Peer: next, Tag: 1},
			{Op: SendOp, Tensor: Of([]int64{int64(rank)}), Peer: prev, Tag: 2},
			{Op: RecvOp, Tensor: Of(fromPrev), Peer: prev, Tag: 1},
			{Op: RecvOp, Tensor: Of(fromNext), Peer: AnySource, Tag: 2},
		})
		for _, w := range works {
			if err := w.Wait(ctx); err != nil {
				return err
			}
		}
		if fromPrev[0] != int64(prev) || fromNext[0] != int64(next) || works[3].Source() != next {
			return fmt.Errorf("ring: %d from prev, %d from rank %d", fromPrev[0], fromNext[0], works[3].Source())
		}
		if err := pg.MonitoredBarrier(ctx, 10*time.Second, true); err != nil {
			return err
		}
		all, err := AllGatherObject(ctx, pg, map[string]int{"rank": rank})
		if err != nil {
			return err
		}
		if all[size-1]["rank"] != size-1 {
			return fmt.Errorf("all_gather_object: %v", all)
		}
		return nil
	}, opts...)
}

func TestTCPGroupsRunConcurrently(t *testing.T) {
	onTCPRanks(t, 4, func(world *ProcessGroup) error {
		ctx := t.Context()
		trio, err := world.NewGroup(ctx, []int{0, 2, 3})
		if err != nil {
			return err
		}
		parity, err := world.Split(ctx, world.Rank()%2, world.Rank())
		if err != nil {
			return err
		}
		// Each group sums its members' global ranks, over and over, all
		// groups at once: results from one group leaking into another
		// would show.
		sums := map[*ProcessGroup]float64{world: 6, trio: 5, parity: []float64{2, 4}[world.Rank()%2]}
		var wg sync.WaitGroup
		errs := make(chan error, len(sums))
		for g, want := range sums {
			if !g.IsMember() {
				continue
			}
			wg.Go(func() {
				for i := range 50 {
					x := []float64{float64(world.Rank()), float64(i)}
					if err := g.AllReduce(ctx, Of(x), Sum); err != nil {
						errs <- err
						return
					}
					if x[0] != want || x[1] != float64(i*g.Size()) {
						errs <- fmt.Errorf("%s, round %d: %v", g, i, x)
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		return errors.Join(<-errs)
	})
}

func TestTCPDeviceMesh(t *testing.T) {
	onTCPRanks(t, 4, func(world *ProcessGroup) error {
		ctx := t.Context()
		m, err := NewDeviceMesh(ctx, world, []int{2, 2}, []string{"dp", "tp"})
		if err != nil {
			return err
		}
		r := int64(world.Rank())
		want := map[string][]int64{ // the sum of the global ranks in each group
			"dp": {r%2 + (r%2 + 2)},     // {0,2} or {1,3}
			"tp": {r/2*2 + (r/2*2 + 1)}, // {0,1} or {2,3}
		}
		// In the same order on every rank: a rank blocked in one group
		// holds up the other groups it belongs to.
		for _, dim := range m.DimNames() {
			sum := want[dim]
			x := []int64{int64(world.Rank())}
			if err := m.Group(dim).AllReduce(ctx, Of(x), Sum); err != nil {
				return err
			}
			if err := expect(dim, x, sum); err != nil {
				return err
			}
		}
		return nil
	})
}

func TestTCPMonitoredBarrierNamesADeadRank(t *testing.T) {
	// Rank 0 stays until the others have their answer: its exit would be
	// the news they report.
	var others sync.WaitGroup
	others.Add(2)
	onTCPRanks(t, 4, func(pg *ProcessGroup) error {
		switch pg.Rank() {
		case 0:
			defer others.Wait()
		case 2:
			return nil // and closes, which its peers learn at once
		default:
			defer others.Done()
		}
		// The death fails the communicator, and so every rank's
		// messages, but each names the rank that died.
		err := pg.MonitoredBarrier(t.Context(), time.Minute, true)
		const want = "runtime: monitored_barrier: rank 2 did not arrive within 1m0s"
		if err == nil || err.Error() != want {
			return fmt.Errorf("got %v, want %q", err, want)
		}
		return nil
	})
}

// childEnv marks the test binary run as a worker of
// TestInitFromTorchrunEnvironment.
const childEnv = "GORUN_RUNTIME_TEST_CHILD"

// TestInitFromTorchrunEnvironment runs four workers as child processes
// (this test binary again) with torchrun's environment and the launcher's
// store, as gorun starts them.
func TestInitFromTorchrunEnvironment(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		torchrunWorker(t)
		return
	}
	srv, addr := serveStore(t)
	const world = 4
	var wg sync.WaitGroup
	for r := range world {
		wg.Go(func() {
			cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestInitFromTorchrunEnvironment$", "-test.count=1")
			// The child's Init reads the process's environment: give it
			// torchrun's, without the shell's settings for the runtime.
			cmd.Env = append(withoutRuntimeEnv(os.Environ()), childEnv+"=1", "TORCHELASTIC_USE_AGENT_STORE=True", "TORCHELASTIC_RESTART_COUNT=2")
			for k, v := range torchrunEnv(r, world, addr) {
				cmd.Env = append(cmd.Env, k+"="+v)
			}
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("worker %d: %v\n%s", r, err, out)
			}
		})
	}
	wg.Wait()
	// The workers met under this attempt's prefix in the launcher's store.
	n, err := srv.Store().NumKeys(t.Context())
	if ok, _ := srv.Store().Check(t.Context(), []string{"init/"}); err != nil || n == 0 || !ok {
		t.Errorf("the launcher's store holds %d keys (%v); want the workers' and torch's init/ count", n, err)
	}
}

// torchrunWorker is the body of a child of TestInitFromTorchrunEnvironment.
func torchrunWorker(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	pg, err := Init(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	rank, _ := strconv.Atoi(os.Getenv("RANK"))
	x := []int32{int32(rank)}
	if err := pg.AllReduce(ctx, Of(x), Sum); err != nil {
		t.Fatal(err)
	}
	if pg.Rank() != rank || pg.LocalRank() != rank%2 || x[0] != 6 {
		t.Fatalf("rank %d (local %d): sum %d, want 6", pg.Rank(), pg.LocalRank(), x[0])
	}
}

// withoutRuntimeEnv is environ less the variables Init reads, so that a
// child's Init sees only what its test gives it.
func withoutRuntimeEnv(environ []string) []string {
	read := func(name string) bool {
		for _, prefix := range []string{"GORUN_", "TORCHELASTIC_", "GLOO_", "CUDA_", "MASTER_", "RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "LOCAL_WORLD_SIZE="} {
			if strings.HasPrefix(name, prefix) {
				return true
			}
		}
		return false
	}
	return slices.DeleteFunc(slices.Clone(environ), read)
}
