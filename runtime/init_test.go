package runtime

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync"
	"testing"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/rendezvous"
)

func TestInitEnvironmentErrors(t *testing.T) {
	full := map[string]string{"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
	with := func(changes map[string]string) map[string]string {
		env := make(map[string]string)
		for k, v := range full {
			env[k] = v
		}
		for k, v := range changes {
			if v == "" {
				delete(env, k)
			} else {
				env[k] = v
			}
		}
		return env
	}
	for _, tc := range []struct {
		env  map[string]string
		opts []Option
		want string
	}{
		{with(map[string]string{"RANK": ""}), nil, "runtime: RANK is not set: run under gorun or torchrun, or pass WithRank"},
		{with(map[string]string{"WORLD_SIZE": ""}), nil, "runtime: WORLD_SIZE is not set: run under gorun or torchrun, or pass WithRank"},
		{with(map[string]string{"MASTER_ADDR": ""}), nil, "runtime: MASTER_ADDR is not set: run under gorun or torchrun, or pass WithStore"},
		{with(map[string]string{"MASTER_PORT": ""}), nil, "runtime: MASTER_PORT is not set: run under gorun or torchrun, or pass WithStore"},
		{with(map[string]string{"RANK": "one"}), nil, `runtime: RANK="one" is not an integer`},
		{with(map[string]string{"WORLD_SIZE": "0"}), nil, "runtime: WORLD_SIZE=0 is less than 1"},
		{with(map[string]string{"RANK": "2"}), nil, "runtime: rank 2 is out of range for a world of 2"},
		{with(map[string]string{"MASTER_PORT": "70000"}), nil, "runtime: MASTER_PORT=70000 is not a port"},
		{with(map[string]string{"LOCAL_RANK": "x"}), nil, `runtime: LOCAL_RANK="x" is not an integer`},
		{with(map[string]string{"TORCHELASTIC_USE_AGENT_STORE": "True"}), nil,
			"runtime: TORCHELASTIC_RESTART_COUNT is not set: run under gorun or torchrun, or it goes with TORCHELASTIC_USE_AGENT_STORE=True"},
		{map[string]string{}, []Option{WithRank(0, 1)}, "runtime: MASTER_ADDR is not set: run under gorun or torchrun, or pass WithStore"},
		{with(map[string]string{"GORUN_BACKEND": "gloo"}), nil, `runtime: unknown GORUN_BACKEND=gloo: want auto, tcp or nccl`},
		{full, []Option{WithBackend("mpi")}, `runtime: unknown backend "mpi": want auto, tcp or nccl`},
		{full, []Option{WithTimeout(-1)}, "runtime: timeout -1ns is not positive"},
	} {
		pg, err := Init(t.Context(), append([]Option{withEnv(tc.env)}, tc.opts...)...)
		if err == nil || err.Error() != tc.want {
			t.Errorf("env %v: got %v, want %q", tc.env, err, tc.want)
		}
		if err := pg.Close(); err != nil {
			t.Errorf("Close of the nil group of a failed Init: %v", err)
		}
	}
}

func TestCloseIsIdempotent(t *testing.T) {
	onRanks(t, 2, func(pg *ProcessGroup) error {
		for range 3 {
			if err := pg.Close(); err != nil {
				return err
			}
		}
		return nil
	})
}

// initRanks runs Init on n ranks with the environment env gives each rank,
// through a fake backend whose connector first checks that the ranks
// share the store: each sets a key and waits for the others'.
func initRanks(t *testing.T, n int, env func(rank int) map[string]string, opts ...Option) {
	t.Helper()
	fake := newFakeNet(n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			connect := func(ctx context.Context, store rendezvous.Store) (collective.Comm, error) {
				if err := store.Set(ctx, "hello/"+strconv.Itoa(r), []byte("hi")); err != nil {
					return nil, err
				}
				for peer := range n {
					if _, err := store.Get(ctx, "hello/"+strconv.Itoa(peer)); err != nil {
						return nil, err
					}
				}
				return fake.comm(r), nil
			}
			pg, err := Init(t.Context(), append([]Option{withEnv(env(r)), withConnector(connect)}, opts...)...)
			if err != nil {
				t.Errorf("rank %d: %v", r, err)
				return
			}
			defer pg.Close()
			if pg.Rank() != r || pg.Size() != n || pg.LocalRank() != r%2 || pg.LocalWorldSize() != 2 {
				t.Errorf("rank %d: %s, local rank %d of %d", r, pg, pg.LocalRank(), pg.LocalWorldSize())
			}
			// Rank 0 must not close the store it hosts under the others.
			if err := pg.Barrier(t.Context()); err != nil {
				t.Errorf("rank %d: %v", r, err)
			}
		})
	}
	wg.Wait()
}

func torchrunEnv(rank, world int, addr net.Addr) map[string]string {
	host, port, _ := net.SplitHostPort(addr.String())
	return map[string]string{
		"RANK": strconv.Itoa(rank), "WORLD_SIZE": strconv.Itoa(world),
		"LOCAL_RANK": strconv.Itoa(rank % 2), "LOCAL_WORLD_SIZE": "2",
		"MASTER_ADDR": host, "MASTER_PORT": port,
	}
}

func TestInitRankZeroHostsTheStore(t *testing.T) {
	// A free port: the listener closes before rank 0 takes it.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr()
	l.Close()
	initRanks(t, 3, func(rank int) map[string]string { return torchrunEnv(rank, 3, addr) }, withListenHost("127.0.0.1"))
}

func TestInitJoinsTheAgentStore(t *testing.T) {
	srv, addr := serveStore(t)
	initRanks(t, 4, func(rank int) map[string]string {
		env := torchrunEnv(rank, 4, addr)
		env["TORCHELASTIC_USE_AGENT_STORE"] = "True"
		env["TORCHELASTIC_RESTART_COUNT"] = "3"
		return env
	})
	// torch's env:// layout: the client's "/", then the attempt's prefix.
	if ok, err := srv.Store().Check(t.Context(), []string{"//worker/attempt_3/gorun/hello/3"}); err != nil || !ok {
		t.Errorf("the agent store lacks the job's keys under //worker/attempt_3/gorun/: %v", err)
	}
}

// serveStore serves a store on the loopback interface until the test ends.
func serveStore(t *testing.T) (*rendezvous.Server, net.Addr) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := rendezvous.NewServer(rendezvous.ServerOptions{})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-served; !errors.Is(err, rendezvous.ErrServerClosed) {
			t.Errorf("serve: %v", err)
		}
	})
	return srv, l.Addr()
}

func TestInitOptionsOverrideTheEnvironment(t *testing.T) {
	fake := newFakeNet(1)
	connect := func(context.Context, rendezvous.Store) (collective.Comm, error) { return fake.comm(0), nil }
	pg, err := Init(t.Context(), withEnv(map[string]string{}), WithRank(0, 1),
		WithStore(rendezvous.NewMemoryStore(0)), withConnector(connect))
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	if pg.Size() != 1 || pg.LocalRank() != 0 || pg.LocalWorldSize() != 1 || pg.Timeout() != DefaultTimeout {
		t.Errorf("got %s, local rank %d of %d, timeout %s", pg, pg.LocalRank(), pg.LocalWorldSize(), pg.Timeout())
	}
}
