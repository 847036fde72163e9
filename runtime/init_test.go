package runtime

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
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
		{with(map[string]string{"GORUN_TCP_STREAMS": "four"}), nil, `runtime: GORUN_TCP_STREAMS="four" is not an integer`},
		{with(map[string]string{"GORUN_TCP_STREAMS": "0"}), nil, "runtime: GORUN_TCP_STREAMS=0 is less than 1"},
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

// TestSettingsPrecedence is the table of runtime's package documentation:
// an option in code wins over its environment variable, which wins over
// the default; GORUN_TCP_ONLY=1 wins over GORUN_TRANSPORT, and
// WithTransport over both.
func TestSettingsPrecedence(t *testing.T) {
	// settings is what Init hands the backends, less the logger.
	type settings struct {
		backend, host, ifname, storeAddr, transport, algorithm, hostID string
		streams                                                        int
	}
	none := settings{backend: "auto"}
	with := func(change func(*settings)) settings { s := none; change(&s); return s }
	for _, tc := range []struct {
		name string
		env  map[string]string
		opts []Option
		want settings
	}{
		{"defaults", nil, nil, none},

		{"backend from the environment", map[string]string{"GORUN_BACKEND": "nccl"}, nil, with(func(s *settings) { s.backend = "nccl" })},
		{"WithBackend beats GORUN_BACKEND", map[string]string{"GORUN_BACKEND": "nccl"}, []Option{WithBackend("tcp")}, with(func(s *settings) { s.backend = "tcp" })},

		{"transport from GORUN_TRANSPORT", map[string]string{"GORUN_TRANSPORT": "unix"}, nil, with(func(s *settings) { s.transport = "unix" })},
		{"GORUN_TCP_ONLY=1 beats GORUN_TRANSPORT", map[string]string{"GORUN_TRANSPORT": "unix", "GORUN_TCP_ONLY": "1"}, nil, with(func(s *settings) { s.transport = "tcp" })},
		{"GORUN_TCP_ONLY other than 1 is unset", map[string]string{"GORUN_TRANSPORT": "unix", "GORUN_TCP_ONLY": "0"}, nil, with(func(s *settings) { s.transport = "unix" })},
		{"WithTransport beats GORUN_TCP_ONLY", map[string]string{"GORUN_TCP_ONLY": "1"}, []Option{WithTransport("unix")}, with(func(s *settings) { s.transport = "unix" })},
		{"WithTransport beats GORUN_TRANSPORT", map[string]string{"GORUN_TRANSPORT": "tcp"}, []Option{WithTransport("auto")}, with(func(s *settings) { s.transport = "auto" })},

		{"streams from GORUN_TCP_STREAMS", map[string]string{"GORUN_TCP_STREAMS": "2"}, nil, with(func(s *settings) { s.streams = 2 })},
		{"WithTCPStreams beats GORUN_TCP_STREAMS", map[string]string{"GORUN_TCP_STREAMS": "2"}, []Option{WithTCPStreams(8)}, with(func(s *settings) { s.streams = 8 })},

		{"GORUN_SOCKET_IFNAME beats GLOO_SOCKET_IFNAME", map[string]string{"GORUN_SOCKET_IFNAME": "eth1", "GLOO_SOCKET_IFNAME": "eth2"}, nil, with(func(s *settings) { s.ifname = "eth1" })},
		{"GLOO_SOCKET_IFNAME alone", map[string]string{"GLOO_SOCKET_IFNAME": "eth2"}, nil, with(func(s *settings) { s.ifname = "eth2" })},
		{"the route to the store", map[string]string{"MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "1234"}, nil, with(func(s *settings) { s.storeAddr = "10.1.2.3:1234" })},
		{"the route to the store, torchrun's port", map[string]string{"MASTER_ADDR": "fd00::1"}, nil, with(func(s *settings) { s.storeAddr = "[fd00::1]:29500" })},
		{"WithHost beats the interface and the route", map[string]string{"GORUN_SOCKET_IFNAME": "eth1", "MASTER_ADDR": "10.1.2.3"}, []Option{WithHost("10.0.0.7")}, with(func(s *settings) { s.host = "10.0.0.7" })},

		{"algorithm and host identity from the environment only", map[string]string{"GORUN_ALGO": "ring", "GORUN_HOST_ID": "h1"}, nil, with(func(s *settings) { s.algorithm, s.hostID = "ring", "h1" })},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := newConfig(append([]Option{withEnv(tc.env)}, tc.opts...))
			backend, err := cfg.backendName()
			if err != nil {
				t.Fatal(err)
			}
			opts, err := cfg.tcpOptions()
			if err != nil {
				t.Fatal(err)
			}
			got := settings{backend, opts.Host, opts.Ifname, opts.StoreAddr, opts.Transport, opts.Algorithm, opts.HostID, opts.Streams}
			if got != tc.want {
				t.Errorf("env %v, %d options:\n got  %+v\n want %+v", tc.env, len(tc.opts), got, tc.want)
			}
		})
	}
}

// TestSettingsReachTheBackend: what tcpOptions resolves is what NewTCP
// gets, as its own checks show.
func TestSettingsReachTheBackend(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		opts []Option
		want string
	}{
		{map[string]string{"GORUN_TCP_STREAMS": "99"}, nil, "collective: 99 TCP streams per peer: want 1 to 16"},
		{map[string]string{"GORUN_TCP_STREAMS": "99"}, []Option{WithTCPStreams(17)}, "collective: 17 TCP streams per peer: want 1 to 16"},
		{map[string]string{"GORUN_TRANSPORT": "shm"}, nil, `collective: unknown transport "shm"`},
		{map[string]string{"GORUN_TCP_ONLY": "1"}, []Option{WithTransport("carrier-pigeon")}, `collective: unknown transport "carrier-pigeon"`},
		{map[string]string{"GORUN_ALGO": "bogo"}, nil, `collective: unknown algorithm "bogo"`},
	} {
		opts := append([]Option{withEnv(tc.env), WithRank(0, 1), WithStore(rendezvous.NewMemoryStore(0)), WithHost("127.0.0.1")}, tc.opts...)
		pg, err := Init(t.Context(), opts...)
		if err == nil {
			pg.Close()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("env %v, %d options: got %v, want an error saying %q", tc.env, len(tc.opts), err, tc.want)
		}
	}
}
