package runtime

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/cuda"
	"github.com/gorun/gorun/rendezvous"
	"github.com/rs/zerolog"
)

// DefaultTimeout bounds each operation of a group unless WithTimeout says
// otherwise: ten minutes, as NCCL's default in torch.
const DefaultTimeout = 10 * time.Minute

// jobPrefix namespaces the job's keys in the store it shares with the
// launcher.
const jobPrefix = "gorun"

// An Option configures Init.
type Option func(*config)

type config struct {
	backend   string
	timeout   time.Duration
	store     rendezvous.Store // given by WithStore; nil: from the environment
	rank      int
	worldSize int // positive when given by WithRank
	host      string
	transport string // WithTransport; "" leaves it to the environment
	streams   int    // WithTCPStreams; 0 leaves it to the environment
	eager     bool
	log       zerolog.Logger
	// lookupEnv is the only way the package reads the environment
	// (os.LookupEnv unless WithLookupEnv).
	lookupEnv func(string) (string, bool)

	// Seams for tests, which may not listen beyond the loopback
	// interface, and may bring a backend.
	listenHost string    // where rank 0 hosts the store; "" is every interface
	connect    connector // replaces the backend when not nil
}

// WithBackend chooses the backend, instead of the BackendEnv variable:
//
//   - "auto" (the default): NCCL for device tensors when every rank has a
//     GPU of its own and NCCL loads, else TCP. A rank that has a GPU but
//     cannot use NCCL logs why in one warning (naming the files it tried
//     to load, or what they lack), and the job goes on with TCP.
//   - "nccl": NCCL for device tensors, or Init fails saying why.
//   - "tcp": TCP only; Init touches no GPU, and device tensors (made by
//     the caller's own cuda.Device) are staged through host memory.
//
// Host tensors always travel over TCP and shared memory. Each rank uses
// the GPU numbered LOCAL_RANK, modulo the GPUs it sees.
func WithBackend(name string) Option { return func(c *config) { c.backend = name } }

// WithTimeout bounds each operation of the groups, and Init itself when
// its context has no deadline (default DefaultTimeout).
func WithTimeout(d time.Duration) Option { return func(c *config) { c.timeout = d } }

// WithStore makes the ranks meet through store instead of the one the
// environment names (MASTER_ADDR and MASTER_PORT). Close leaves it open.
func WithStore(store rendezvous.Store) Option { return func(c *config) { c.store = store } }

// WithRank gives this process's rank and the number of ranks, instead of
// RANK and WORLD_SIZE.
func WithRank(rank, worldSize int) Option {
	return func(c *config) { c.rank, c.worldSize = rank, worldSize }
}

// WithHost gives the address the TCP backend listens on and tells its
// peers. By default the backend picks the address of the interface named
// by GORUN_SOCKET_IFNAME or GLOO_SOCKET_IFNAME, else the one that routes
// to MASTER_ADDR, else one the host name resolves to.
func WithHost(host string) Option { return func(c *config) { c.host = host } }

// WithTransport chooses how ranks on one host talk, instead of
// GORUN_TRANSPORT and GORUN_TCP_ONLY: "auto" (shared memory when every
// rank shares the host, Unix sockets between same-host peers otherwise),
// "unix" (Unix sockets, no shared memory) or "tcp" (TCP between all
// peers). See collective.TCPOptions.Transport.
func WithTransport(mode string) Option { return func(c *config) { c.transport = mode } }

// WithTCPStreams sets how many TCP connections each way a rank asks for
// with each peer on another host, 1 to 16 (default 4 for a rank alone on
// its host, else 4 shared among the host's connections to the other
// hosts, at least 1: collective.TCPOptions.Streams), instead of
// GORUN_TCP_STREAMS.
func WithTCPStreams(n int) Option { return func(c *config) { c.streams = n } }

// WithLookupEnv makes Init and RecordError read the variables through
// lookup instead of the process's environment (os.LookupEnv): for ranks
// run as goroutines of one process, or a program that keeps its settings
// elsewhere. A variable lookup does not know is unset.
func WithLookupEnv(lookup func(name string) (string, bool)) Option {
	return func(c *config) { c.lookupEnv = lookup }
}

// WithEagerConnect makes Init connect to every peer at once, so that a
// network problem shows at start-up rather than at the first collective
// that needs the peer; by default connections are made on first use.
func WithEagerConnect() Option { return func(c *config) { c.eager = true } }

// WithLogger makes the runtime log to log (default: nowhere).
func WithLogger(log zerolog.Logger) Option { return func(c *config) { c.log = log } }

// withListenHost makes rank 0 host the store on host only.
func withListenHost(host string) Option { return func(c *config) { c.listenHost = host } }

// withConnector makes Init build its communicator with connect.
func withConnector(connect connector) Option { return func(c *config) { c.connect = connect } }

// Init joins the job this process is a rank of and returns the group of
// all its ranks, reading the environment gorun and torchrun give their
// workers, as torch's init_process_group("env://") does:
//
//   - RANK and WORLD_SIZE, unless WithRank gives them; LOCAL_RANK and
//     LOCAL_WORLD_SIZE when set.
//   - MASTER_ADDR and MASTER_PORT, unless WithStore gives the store: with
//     TORCHELASTIC_USE_AGENT_STORE=True the ranks share the launcher's
//     store there, under "/worker/attempt_<TORCHELASTIC_RESTART_COUNT>";
//     otherwise rank 0 hosts a store on MASTER_PORT, on every interface.
//   - GORUN_PROGRESS_FILE when set (gorun --hang-timeout): the counter of
//     completed operations the launcher watches (see ProgressFileEnv).
//   - GORUN_STACKS_SOCKET when set: where the launcher asks for the
//     worker's stacks (see StacksSocketEnv).
//   - GORUN_BACKEND, unless WithBackend chooses the backend; with NCCL,
//     GORUN_CUDA_LIBRARY and GORUN_NCCL_LIBRARY to name the libraries'
//     files (see package cuda), and NCCL_HOSTID, which NCCL also reads,
//     to tell hosts apart as NCCL does.
//   - for the TCP backend (package collective, which reads no environment
//     itself): GORUN_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, GORUN_TRANSPORT,
//     GORUN_TCP_ONLY, GORUN_TCP_STREAMS, GORUN_ALGO, GORUN_HOST_ID.
//
// An option wins over its variable; the package documentation has the
// table. Every rank must call Init, and Close the group it returns.
func Init(ctx context.Context, opts ...Option) (*ProcessGroup, error) {
	cfg := newConfig(opts)
	if cfg.timeout <= 0 {
		return nil, fmt.Errorf("runtime: timeout %s is not positive", cfg.timeout)
	}
	backend, err := cfg.backendName()
	if err != nil {
		return nil, err
	}
	env, err := cfg.readEnv()
	if err != nil {
		return nil, err
	}
	log := cfg.log.With().Int("rank", env.rank).Logger()
	connect, err := cfg.hostBackend(env, log)
	if err != nil {
		return nil, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.timeout)
		defer cancel()
	}

	var release cleanups // what the world's Close releases, or a failure now
	progress := cfg.openProgress(log, &release)
	cfg.serveStacks(log, &release)
	store, err := cfg.openStore(ctx, env, log, &release)
	if err != nil {
		release.run()
		return nil, err
	}
	store = rendezvous.NewPrefixStore(jobPrefix, store)
	comm, p2p, err := connectWorld(ctx, connect, store, env)
	if err != nil {
		release.run()
		return nil, err
	}
	var (
		g     *gpu
		nccl  *ncclComms
		using = backendTCP
	)
	// A test's connector stands in for every backend.
	if backend != backendTCP && cfg.connect == nil {
		g, nccl, err = cfg.startNCCL(ctx, backend, env, store, comm, log, &release)
		if err != nil {
			err = errors.Join(err, comm.Close(), p2p.Close())
			release.run()
			return nil, err
		}
		if nccl != nil {
			using = backendNCCL
		}
	}
	progress.add() // joining is the first progress
	j := &job{
		localRank: env.localRank, localWorldSize: env.localWorldSize,
		timeout: cfg.timeout, log: log, release: release.run, progress: progress,
		backend: using, gpu: g, gpuSearch: cuda.Search{LookupEnv: cfg.lookupEnv},
	}
	log.Debug().Int("world_size", env.worldSize).Str("backend", using).Msg("joined")
	return newMember(j, worldID, everyRank(env.worldSize), comm, p2p, nccl), nil
}

// newConfig is the defaults, then opts in order.
func newConfig(opts []Option) config {
	cfg := config{timeout: DefaultTimeout, log: zerolog.Nop(), lookupEnv: os.LookupEnv}
	for _, opt := range opts {
		opt(&cfg)
	}
	return cfg
}

// connectWorld builds the world's communicators: one for collectives and
// one for point-to-point messages.
func connectWorld(ctx context.Context, connect connector, store rendezvous.Store, env launchEnv) (comm, p2p collective.Comm, err error) {
	comm, err = connect(ctx, store)
	if err != nil {
		return nil, nil, fmt.Errorf("runtime: connect rank %d of %d: %w", env.rank, env.worldSize, err)
	}
	p2p, err = comm.Split(ctx, everyRank(env.worldSize), "p2p")
	if err != nil {
		comm.Close()
		return nil, nil, fmt.Errorf("runtime: connect rank %d of %d for point-to-point messages: %w", env.rank, env.worldSize, err)
	}
	return comm, p2p, nil
}

// launchEnv is what Init learns from the launcher's environment.
type launchEnv struct {
	rank, worldSize           int
	localRank, localWorldSize int
	masterAddr                string
	masterPort                int
	agentStore                bool
	restartCount              int
}

// readEnv reads the variables that options do not replace.
func (c *config) readEnv() (launchEnv, error) {
	r := envReader{lookup: c.lookupEnv}
	var e launchEnv
	if c.worldSize > 0 {
		e.rank, e.worldSize = c.rank, c.worldSize
	} else {
		e.rank = r.int("RANK", "pass WithRank", 0)
		e.worldSize = r.int("WORLD_SIZE", "pass WithRank", 1)
	}
	e.localRank = r.optionalInt("LOCAL_RANK", e.rank, 0)
	e.localWorldSize = r.optionalInt("LOCAL_WORLD_SIZE", e.worldSize, 1)
	if c.store == nil {
		e.masterAddr = r.string("MASTER_ADDR", "pass WithStore")
		e.masterPort = r.int("MASTER_PORT", "pass WithStore", 1)
		if e.agentStore = r.optionalString("TORCHELASTIC_USE_AGENT_STORE") == "True"; e.agentStore {
			e.restartCount = r.int("TORCHELASTIC_RESTART_COUNT", "it goes with TORCHELASTIC_USE_AGENT_STORE=True", 0)
		}
	}
	if r.err != nil {
		return launchEnv{}, r.err
	}
	if e.rank < 0 || e.rank >= e.worldSize {
		return launchEnv{}, fmt.Errorf("runtime: rank %d is out of range for a world of %d", e.rank, e.worldSize)
	}
	if e.masterPort > 65535 {
		return launchEnv{}, fmt.Errorf("runtime: MASTER_PORT=%d is not a port", e.masterPort)
	}
	return e, nil
}

// envReader reads variables, keeping the first error.
type envReader struct {
	lookup func(string) (string, bool)
	err    error
}

// string reads a required variable; remedy tells how to do without.
func (r *envReader) string(name, remedy string) string {
	v, ok := r.lookup(name)
	if !ok || v == "" {
		r.fail(fmt.Errorf("runtime: %s is not set: run under gorun or torchrun, or %s", name, remedy))
	}
	return v
}

func (r *envReader) optionalString(name string) string {
	v, _ := r.lookup(name)
	return v
}

// int reads a required integer variable of at least min.
func (r *envReader) int(name, remedy string, min int) int {
	v := r.string(name, remedy)
	if v == "" {
		return 0
	}
	return r.parse(name, v, min)
}

// optionalInt reads an integer variable of at least min, def when unset.
func (r *envReader) optionalInt(name string, def, min int) int {
	v, ok := r.lookup(name)
	if !ok || v == "" {
		return def
	}
	return r.parse(name, v, min)
}

func (r *envReader) parse(name, v string, min int) int {
	n, err := strconv.Atoi(v)
	switch {
	case err != nil:
		r.fail(fmt.Errorf("runtime: %s=%q is not an integer", name, v))
	case n < min:
		r.fail(fmt.Errorf("runtime: %s=%d is less than %d", name, n, min))
	}
	return n
}

func (r *envReader) fail(err error) {
	if r.err == nil {
		r.err = err
	}
}

// A connector builds the host communicator of every rank, meeting the
// other ranks through store.
type connector func(ctx context.Context, store rendezvous.Store) (collective.Comm, error)

// hostBackend returns the connector of the TCP and shared-memory
// backend, which every group has for host tensors, or a test's.
func (c *config) hostBackend(env launchEnv, log zerolog.Logger) (connector, error) {
	if c.connect != nil {
		return c.connect, nil
	}
	opts, err := c.tcpOptions()
	if err != nil {
		return nil, err
	}
	opts.Logger = log
	return func(ctx context.Context, store rendezvous.Store) (collective.Comm, error) {
		return collective.NewTCP(ctx, store, env.rank, env.worldSize, opts)
	}, nil
}

// defaultMasterPort is torchrun's MASTER_PORT when it is not set.
const defaultMasterPort = "29500"

// tcpOptions are the TCP backend's settings: each from its option, else
// from its variable, else collective's default (the table in doc.go).
func (c *config) tcpOptions() (collective.TCPOptions, error) {
	r := envReader{lookup: c.lookupEnv}
	opts := collective.TCPOptions{
		Host:      c.host,
		Eager:     c.eager,
		Transport: c.transport,
		Streams:   c.streams,
		Algorithm: r.optionalString("GORUN_ALGO"),
		HostID:    r.optionalString("GORUN_HOST_ID"),
	}
	if opts.Host == "" {
		opts.Ifname = cmp.Or(r.optionalString("GORUN_SOCKET_IFNAME"), r.optionalString("GLOO_SOCKET_IFNAME"))
		if addr := r.optionalString("MASTER_ADDR"); addr != "" {
			opts.StoreAddr = net.JoinHostPort(addr, cmp.Or(r.optionalString("MASTER_PORT"), defaultMasterPort))
		}
	}
	if opts.Transport == "" {
		// GORUN_TCP_ONLY=1 says TCP whatever GORUN_TRANSPORT says, as
		// TCPOptions.TCPOnly does of Transport; WithTransport beats both.
		if r.optionalString("GORUN_TCP_ONLY") == "1" {
			opts.Transport = "tcp"
		} else {
			opts.Transport = r.optionalString("GORUN_TRANSPORT")
		}
	}
	if opts.Streams == 0 {
		opts.Streams = r.optionalInt("GORUN_TCP_STREAMS", 0, 1)
	}
	return opts, r.err
}

// openStore returns the store the ranks meet through, adding what must be
// closed with the job to release.
func (c *config) openStore(ctx context.Context, env launchEnv, log zerolog.Logger, release *cleanups) (rendezvous.Store, error) {
	if c.store != nil {
		return c.store, nil
	}
	addr := net.JoinHostPort(env.masterAddr, strconv.Itoa(env.masterPort))
	if env.agentStore {
		// The launcher's store outlives the attempts of the job; torch's
		// env:// keeps each attempt's keys apart by this prefix.
		client, err := c.dial(ctx, addr, env)
		if err != nil {
			return nil, err
		}
		release.add(client.Close)
		return rendezvous.NewPrefixStore("/worker/attempt_"+strconv.Itoa(env.restartCount), client), nil
	}
	if env.rank != 0 {
		client, err := c.dial(ctx, addr, env)
		if err != nil {
			return nil, err
		}
		release.add(client.Close)
		return client, nil
	}
	return c.hostStore(env, log, release)
}

func (c *config) dial(ctx context.Context, addr string, env launchEnv) (*rendezvous.Client, error) {
	client, err := rendezvous.Dial(ctx, addr, rendezvous.ClientOptions{Timeout: c.timeout, WorldSize: env.worldSize})
	if err != nil {
		return nil, fmt.Errorf("runtime: join the store at %s: %w", addr, err)
	}
	return client, nil
}

// hostStore serves the job's store on MASTER_PORT, as torch's rank 0
// does, and returns rank 0's own view of it, which sees the keys as the
// other ranks' clients do.
func (c *config) hostStore(env launchEnv, log zerolog.Logger, release *cleanups) (rendezvous.Store, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(c.listenHost, strconv.Itoa(env.masterPort)))
	if err != nil {
		return nil, fmt.Errorf("runtime: host the store on MASTER_PORT: %w", err)
	}
	srv := rendezvous.NewServer(rendezvous.ServerOptions{Logger: log})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	release.add(func() error {
		err := srv.Close()
		if serveErr := <-served; !errors.Is(serveErr, rendezvous.ErrServerClosed) {
			err = errors.Join(err, serveErr)
		}
		return err
	})
	view := srv.Store()
	release.add(view.Close)
	return rendezvous.NewPrefixStore("", view), nil
}

// cleanups closes, in reverse order, what was opened.
type cleanups []func() error

func (c *cleanups) add(f func() error) { *c = append(*c, f) }

func (c cleanups) run() error {
	var errs []error
	for i := len(c) - 1; i >= 0; i-- {
		errs = append(errs, c[i]())
	}
	return errors.Join(errs...)
}
