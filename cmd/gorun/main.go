// Command gorun launches distributed workers with torchrun's contract.
//
//	gorun --nproc-per-node 4 ./worker --lr 0.1
//	gorun --nproc-per-node 4 train.py
package main

import (
	"bufio"
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/elastic"
	"github.com/gorun/gorun/internal/route"
	"github.com/gorun/gorun/launcher"
	"github.com/gorun/gorun/rendezvous"
	rendezvousetcd "github.com/gorun/gorun/rendezvous/etcd"
)

// Exit statuses of gorun itself; a finished job exits with its root
// cause's status instead. gorun's own failures take sysexits.h's codes,
// which workers seldom use, so that a script can tell them from a
// worker's status.
const (
	exitUsage = 2
	// exitUnavailable: a host, the store or the job's peers could not be
	// reached or joined (EX_UNAVAILABLE).
	exitUnavailable = 69
	// exitInternal: gorun failed on its own (EX_SOFTWARE).
	exitInternal = 70
	// exitResources: the system refused gorun files, memory or processes
	// (EX_OSERR).
	exitResources = 71
	// exitMissingProgram is a shell's status for a command not found.
	exitMissingProgram = 127
)

// usageError marks errors in what the user typed.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func main() {
	if launcher.MaybeRunKeeper(os.LookupEnv) {
		return
	}
	os.Exit(run(os.Args, os.Stdout, os.Stderr))
}

// run is main without the process exit, so that the status is decided in one
// place: the job's result, or gorun's own (see failureStatus).
func run(args []string, stdout, stderr io.Writer) int {
	status := 0
	app := newApp(stdout, stderr, &status)
	err := app.Run(args)
	var ue usageError
	var missing *missingProgramError
	switch {
	case err == nil:
		return status
	case errors.As(err, &missing):
		fmt.Fprintf(stderr, "gorun: %v\n", missing)
		return exitMissingProgram
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "gorun: %v\nRun 'gorun --help' for usage.\n", ue.err)
		return exitUsage
	case isFlagError(err):
		fmt.Fprintf(stderr, "gorun: %s\nRun 'gorun --help' for usage.\n", flagErrorAsTyped(err, args[1:]))
		return exitUsage
	default:
		fmt.Fprintf(stderr, "gorun: %v\n", err)
		return failureStatus(err)
	}
}

// failureStatus is gorun's status when it failed on its own: out of
// resources, unable to reach what the job needs, or else internal.
func failureStatus(err error) int {
	for _, errno := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOMEM, syscall.EAGAIN, syscall.ENOSPC} {
		if errors.Is(err, errno) {
			return exitResources
		}
	}
	var ssh *launcher.SSHError
	var launch *launcher.LaunchError
	var rdzv *elastic.RendezvousError
	if errors.As(err, &ssh) || errors.As(err, &launch) || errors.As(err, &rdzv) {
		return exitUnavailable
	}
	return exitInternal
}

// isFlagError recognises urfave/cli's own parse errors, which it returns as
// plain errors from the standard flag package.
func isFlagError(err error) bool {
	msg := err.Error()
	return strings.HasPrefix(msg, "flag provided but not defined") ||
		strings.HasPrefix(msg, "invalid value") ||
		strings.HasPrefix(msg, "flag needs an argument") ||
		strings.HasPrefix(msg, "Cannot use two forms of the same flag")
}

// flagErrorAsTyped rewrites the standard flag package's message, which
// names every flag with one dash ("-start-method"), with the flag as the
// user typed it ("--start-method"): the first argument that spells it.
func flagErrorAsTyped(err error, args []string) string {
	msg := err.Error()
	i := strings.Index(msg, ": -")
	if i < 0 {
		return msg
	}
	bare, rest, _ := strings.Cut(msg[i+3:], " ")
	name := "-" + bare
	for _, a := range args {
		if a == "--" {
			break
		}
		typed, _, _ := strings.Cut(a, "=")
		if strings.HasPrefix(typed, "-") && strings.TrimLeft(typed, "-") == bare {
			name = typed
			break
		}
	}
	if rest != "" {
		rest = " " + rest
	}
	return msg[:i+2] + name + rest
}

func newApp(stdout, stderr io.Writer, status *int) *cli.App {
	return &cli.App{
		Name:      "gorun",
		Usage:     "launch distributed workers with torchrun's contract",
		UsageText: "gorun [flags] PROGRAM [ARGS...]",
		Version:   version(),
		Description: "Starts --nproc-per-node workers of PROGRAM on this node, hosts the rendezvous store\n" +
			"(PyTorch TCPStore protocol), gives every worker torchrun's environment (RANK, WORLD_SIZE,\n" +
			"MASTER_ADDR...), supervises and restarts them, and exits with the root cause's exit code.\n" +
			"Every flag also reads PET_<NAME> from the environment, as torchrun does.",
		Flags:    append(flags(), headFlags()...),
		Commands: []*cli.Command{doctorCommand(stdout), statusCommand(stdout)},
		// -x A=1,2 sets A to "1,2".
		DisableSliceFlagSeparator: true,
		HideHelpCommand:           true,
		Writer:                    stdout,
		ErrWriter:                 stderr,
		ExitErrHandler:            func(*cli.Context, error) {},
		// A malformed command line gets one line naming what is wrong
		// (see run), not the help on stdout.
		OnUsageError: func(_ *cli.Context, err error, _ bool) error { return err },
		Action: func(c *cli.Context) error {
			if c.Bool(sshRelayFlag) {
				code, err := runRelay(c.Context, os.Stdin, stdout, stderr)
				*status = code
				return err
			}
			if c.NArg() == 0 {
				return usageError{errors.New("no program given: gorun [flags] PROGRAM [ARGS...]")}
			}
			spec, log, err := specFromFlags(c, stderr)
			if err != nil {
				return err
			}
			// One reader for what the head writes on stdin (the secret's
			// line, then the host list's) and the EOF that ends the job.
			stdin := bufio.NewReader(os.Stdin)
			secret, err := rdzvSecret(c, &spec, stdin, os.LookupEnv, func(msg string) { log.Warn().Msg(msg) })
			if err != nil {
				return err
			}
			if c.Bool(nodeHostsStdinFlag) {
				if spec.NodeHosts, err = readNodeHosts(stdin); err != nil {
					return err
				}
			}
			if headMode(c) {
				plan, err := planHead(c, spec, secret, log, stdout, stderr)
				if err != nil {
					return err
				}
				code, err := runHead(c.Context, plan, spec)
				*status = code
				return err
			}
			var eofStops io.Reader
			if c.Bool("exit-on-stdin-eof") {
				eofStops = stdin
			}
			code, err := launch(c.Context, spec, log, stdout, stderr, eofStops)
			*status = code
			return err
		},
	}
}

// launch runs the agent for spec and returns the exit status of the job.
// EOF on eofStops, if not nil, stops the job as SIGTERM would: a remote
// agent's stdin is its SSH session, which ends when the head is gone.
func launch(ctx context.Context, spec elastic.Spec, log zerolog.Logger, stdout, stderr io.Writer, eofStops io.Reader) (int, error) {
	osSignals := make(chan os.Signal, 4)
	for _, s := range spec.Signals {
		signal.Notify(osSignals, s)
	}
	defer signal.Stop(osSignals)
	signals := (<-chan os.Signal)(osSignals)
	if eofStops != nil {
		signals = stopOnStdinEOF(ctx, eofStops, osSignals, log)
	}

	exe, err := os.Executable()
	if err != nil {
		return 0, fmt.Errorf("find own executable for the keeper: %w", err)
	}
	// GORUN_CONTAINMENT=subreaper forces the fallback that holds without
	// cgroups (the tests use it); cgroup makes a missing cgroup an error.
	contain, err := launcher.Contain(launcher.ContainOptions{Mode: launcher.ContainMode(os.Getenv("GORUN_CONTAINMENT")), Logger: log})
	if err != nil {
		return 0, err
	}
	keeper, err := contain.StartKeeper(exe)
	if err != nil {
		return 0, err
	}
	defer keeper.Close()

	// The agent opens the rendezvous, which may wait for a store that is
	// not up yet, so that a signal stops that wait as it stops the others.
	release := func(bool) {}
	metrics, stopMetrics, err := serveMetrics(spec.MetricsAddr, log)
	if err != nil {
		return 0, err
	}
	defer stopMetrics()
	report, err := openReport(spec.Report)
	if err != nil {
		return 0, err
	}
	timeline := elastic.NewTimeline()
	agent := elastic.NewAgent(spec, elastic.Options{
		Logger: log, Stdout: stdout, Stderr: stderr,
		Signals: signals, Keeper: keeper,
		StatusDir: statusDir(), Metrics: metrics, Timeline: timeline,
		OpenRendezvous: func(ctx context.Context) (rendezvous.Handler, error) {
			h, rel, err := newRendezvous(ctx, &spec, log, metrics)
			if err == nil {
				release = rel
			}
			return h, err
		},
	})
	result, err := agent.Run(ctx)
	if rerr := writeReport(report, spec, timeline, result, err); rerr != nil {
		log.Error().Err(rerr).Msg("the job's timeline was not written")
	}
	if err != nil {
		release(false)
		return 0, err
	}
	elastic.WriteReport(stderr, cmp.Or(spec.Name, spec.Argv[0]), result)
	if spec.EventLog {
		elastic.WriteEvents(stderr, spec, result, time.Now())
	}
	// A job that ended, rather than this agent being stopped, leaves the
	// store up while other agents still read how it ended.
	release(result.Interrupted == "")
	return result.ExitCode, nil
}

// newLogger builds the launcher's own logger: human-readable by default,
// JSON with --log-format json.
func newLogger(w io.Writer, format, level string) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(strings.ToLower(level))
	if err != nil || level == "" {
		return zerolog.Logger{}, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	switch format {
	case "json":
		return zerolog.New(w).Level(lvl).With().Timestamp().Str("component", "gorun").Logger(), nil
	case "console", "":
		cw := zerolog.ConsoleWriter{Out: w, TimeFormat: "15:04:05", NoColor: !isTerminal(w)}
		return zerolog.New(cw).Level(lvl).With().Timestamp().Logger(), nil
	}
	return zerolog.Logger{}, fmt.Errorf("--log-format %q: want console or json", format)
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	// A terminal answers TCGETS; /dev/null, a character device too, does
	// not, and output thrown away needs no terminal per worker.
	raw, err := f.SyscallConn()
	if err != nil {
		return false
	}
	var termErr error
	if err := raw.Control(func(fd uintptr) { _, termErr = unix.IoctlGetTermios(int(fd), unix.TCGETS) }); err != nil {
		return false
	}
	return termErr == nil
}

// leaveLinger is how long the store's host, leaving on a signal or an
// error, keeps it up for the other agents to read that the job ended.
const leaveLinger = 300 * time.Millisecond

// newRendezvous returns the handler for spec's rendezvous backend, and
// what to release once the job is over; release(true) lets the other
// agents finish with a store this one hosts first. The figures of a store
// this node hosts go to metrics.
func newRendezvous(ctx context.Context, spec *elastic.Spec, log zerolog.Logger, metrics *elastic.Metrics) (rendezvous.Handler, func(jobOver bool), error) {
	switch spec.Backend {
	case "c10d":
		return newDynamic(ctx, spec, log, metrics)
	case "etcd":
		return newEtcd(spec, log)
	}
	host := spec.MasterAddr
	if spec.MaxNodes == 1 && spec.LocalAddr != "" {
		// A single node hosts the store where it says workers reach it.
		host = spec.LocalAddr
	}
	static := rendezvous.NewStatic(rendezvous.StaticOptions{
		RunID:    spec.RunID,
		NodeRank: spec.NodeRank,
		NNodes:   spec.MaxNodes,
		Host:     host,
		Port:     spec.MasterPort,
		Timeout:  spec.StoreTimeout,
		Logger:   log,
	})
	metrics.HostStore(elastic.StoreRendezvous, static.Server)
	return static, func(bool) {}, nil
}

// newDynamic hosts or joins the c10d store and returns the elastic
// rendezvous on it. This node advertises --local-addr, else the address
// it reaches the store from, which its peers can reach too.
func newDynamic(ctx context.Context, spec *elastic.Spec, log zerolog.Logger, metrics *elastic.Metrics) (rendezvous.Handler, func(jobOver bool), error) {
	d := spec.Dynamic
	ep, err := rendezvous.OpenEndpoint(ctx, rendezvous.EndpointOptions{
		Host: d.Host, Port: d.Port, IsHost: d.IsHost, Timeout: d.ReadTimeout, Auth: d.Auth, Logger: log,
	})
	if err != nil {
		return nil, nil, err
	}
	if ep.Hosting {
		metrics.HostStore(elastic.StoreRendezvous, ep.Server)
	}
	addr := spec.LocalAddr
	if addr == "" {
		if addr, err = route.SourceAddr(ctx, net.JoinHostPort(d.Host, strconv.Itoa(d.Port))); err != nil {
			ep.Close(0)
			return nil, nil, err
		}
	}
	h := rendezvous.NewDynamic(ep.Store, rendezvous.DynamicOptions{
		ElasticOptions:    elasticOptions(spec, addr, log),
		HeartbeatInterval: d.HeartbeatInterval,
		HeartbeatMisses:   d.HeartbeatMisses,
		HeartbeatTimeout:  d.HeartbeatTimeout,
		HeartbeatStore:    ep.Heartbeats,
		HostsStore:        ep.Hosting,
	})
	return h, func(jobOver bool) {
		// Leaving ended the job (HostsStore): the others, woken, read that
		// at once and hang up; a stopped agent must not wait longer.
		linger := min(leaveLinger, d.CloseTimeout)
		if jobOver {
			linger = d.CloseTimeout
		}
		ep.Close(linger)
	}, nil
}

// newEtcd returns the elastic rendezvous in the etcd cluster at
// --rdzv-endpoint. This node advertises --local-addr, else the address it
// reaches the first member from; as the round's group rank 0, it hosts the
// workers' store there.
func newEtcd(spec *elastic.Spec, log zerolog.Logger) (rendezvous.Handler, func(jobOver bool), error) {
	e, d := spec.Etcd, spec.Dynamic
	var tlsConfig *tls.Config
	if e.TLS {
		var err error
		if tlsConfig, err = rendezvousetcd.TLSConfig(e.CACert, e.Cert, e.Key); err != nil {
			return nil, nil, err
		}
	}
	addr := spec.LocalAddr
	if addr == "" {
		var err error
		if addr, err = route.SourceAddr(context.Background(), e.Endpoints[0]); err != nil {
			return nil, nil, err
		}
	}
	cli, err := rendezvousetcd.Dial(e.Endpoints, tlsConfig)
	if err != nil {
		return nil, nil, err
	}
	h := rendezvousetcd.New(cli, rendezvousetcd.Options{
		ElasticOptions: elasticOptions(spec, addr, log),
		LeaseTTL:       e.LeaseTTL,
		RequestTimeout: d.ReadTimeout,
	})
	// The handler owns the client; Close closes both.
	return h, func(bool) {}, nil
}

// stopOnStdinEOF returns the agent's signal channel: the signals of in,
// plus SIGTERM once stdin reaches EOF. The head stops a remote agent by
// closing its stdin and sending SIGTERM, which must count as one request,
// not two (a second signal kills the workers at once): EOF after a signal
// adds nothing, and the first SIGTERM after EOF is taken as the same request.
func stopOnStdinEOF(ctx context.Context, stdin io.Reader, in <-chan os.Signal, log zerolog.Logger) <-chan os.Signal {
	out := make(chan os.Signal, 4)
	eof := make(chan struct{})
	go func() {
		io.Copy(io.Discard, stdin)
		close(eof)
	}()
	go func() {
		requested, fromEOF := false, false
		for {
			select {
			case <-ctx.Done():
				return
			case s := <-in:
				if fromEOF && s == syscall.SIGTERM {
					fromEOF = false
					continue
				}
				requested = true
				out <- s
			case <-eof:
				eof = nil
				if requested {
					continue
				}
				log.Warn().Msg("stdin closed: the head is gone; stopping the workers")
				requested, fromEOF = true, true
				out <- syscall.SIGTERM
			}
		}
	}()
	return out
}

// elasticOptions are this node's part in an elastic rendezvous, whichever
// the backend: it advertises addr, where it hosts the workers' store
// when it is the round's group rank 0.
func elasticOptions(spec *elastic.Spec, addr string, log zerolog.Logger) rendezvous.ElasticOptions {
	d := spec.Dynamic
	return rendezvous.ElasticOptions{
		RunID:    spec.RunID,
		MinNodes: spec.MinNodes, MaxNodes: spec.MaxNodes,
		Host: spec.Host, Addr: addr,
		NProc:           spec.NProcPerNode,
		NodeRank:        spec.NodeRank,
		StoreHost:       addr,
		JoinTimeout:     d.JoinTimeout,
		LastCallTimeout: d.LastCallTimeout,
		CloseTimeout:    d.CloseTimeout,
		Expected:        spec.NodeHosts,
		MaxRestarts:     spec.MaxRestarts,
		Logger:          log,
	}
}
