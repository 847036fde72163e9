package elastic

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/launcher"
	"github.com/gorun/gorun/rendezvous"
)

// Options are the agent's collaborators, injected so that tests can see and
// drive everything the agent does.
type Options struct {
	Logger zerolog.Logger
	// Now is the clock (nil = time.Now).
	Now func() time.Time
	// Stdout and Stderr receive the workers' console output.
	Stdout, Stderr io.Writer
	// Rendezvous yields rounds; the agent closes it when Run returns.
	Rendezvous rendezvous.Handler
	// Signals delivers the signals the agent must forward to its workers.
	Signals <-chan os.Signal
	// Keeper, when set, kills whatever workers leave behind if the agent dies.
	Keeper *launcher.Keeper
}

// Agent runs one node's worker group through restarts until the job ends.
type Agent struct {
	spec Spec
	opts Options
	log  zerolog.Logger
	now  func() time.Time
}

// NewAgent returns an agent for spec; spec must have passed Validate.
func NewAgent(spec Spec, opts Options) *Agent {
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	return &Agent{spec: spec, opts: opts, log: opts.Logger, now: now}
}

// Run rendezvouses, starts the workers and supervises them, restarting the
// group after a failure while the restart budget lasts. It returns the
// job's result on this node; an error means the agent itself failed (for
// example the rendezvous), not the workers.
func (a *Agent) Run(ctx context.Context) (*Result, error) {
	defer a.opts.Rendezvous.Close()
	round, err := a.opts.Rendezvous.Next(ctx)
	if err != nil {
		return nil, err
	}
	rk, err := assignRanks(ctx, round.Store, round.GroupRank, round.GroupWorldSize, a.spec.Role, a.spec.NProcPerNode)
	if err != nil {
		return nil, fmt.Errorf("elastic: assign ranks: %w", err)
	}
	logs, err := newLogRoot(a.spec)
	if err != nil {
		return nil, err
	}
	defer logs.cleanup(a.log)
	a.log.Info().Int("node_rank", rk.GroupRank).Int("nodes", rk.GroupWorldSize).
		Int("world_size", rk.WorldSize).Int("nproc_per_node", a.spec.NProcPerNode).
		Str("run_id", a.spec.RunID).Msg("rendezvous complete")

	for restart := 0; ; restart++ {
		master, err := a.workerStore(ctx, round, restart)
		if err != nil {
			return nil, err
		}
		att, err := a.startAttempt(rk, restart, master, logs)
		if err != nil {
			return nil, err
		}
		out := a.watch(ctx, att)
		att.closeOutput()
		switch {
		case out.signal != 0:
			name := signalName(out.signal)
			a.log.Warn().Str("signal", name).Msg("stopped the workers on a signal")
			return &Result{ExitCode: 128 + int(out.signal), Restarts: restart, Interrupted: name}, nil
		case out.err != nil:
			return nil, out.err
		case len(out.failures) == 0:
			if err := exitBarrier(ctx, round, a.spec.StoreTimeout); err != nil {
				a.log.Warn().Err(err).Msg("exit barrier")
			}
			a.log.Info().Int("restarts", restart).Msg("all workers succeeded")
			return &Result{Restarts: restart}, nil
		case restart < a.spec.MaxRestarts:
			sortRootCauseFirst(out.failures)
			f := out.failures[0]
			a.log.Warn().Int("rank", f.Rank).Str("status", f.Exit.String()).
				Msgf("worker group failed; restarting (%d/%d)", restart+1, a.spec.MaxRestarts)
		default:
			sortRootCauseFirst(out.failures)
			return &Result{Failures: out.failures, ExitCode: out.failures[0].ExitCode, Restarts: restart}, nil
		}
	}
}

// workerEndpoint is the store that workers bootstrap through.
type workerEndpoint struct {
	host       string
	port       int
	agentStore bool
}

// workerStore tells where this attempt's workers meet. In agent-store mode
// it is the rendezvous store itself; otherwise node 0 picks a free port for
// worker rank 0 to host a store on, and publishes it to the other nodes.
func (a *Agent) workerStore(ctx context.Context, round *rendezvous.Round, restart int) (workerEndpoint, error) {
	if a.spec.ShareStore {
		return workerEndpoint{host: round.StoreHost, port: round.StorePort, agentStore: true}, nil
	}
	key := "gorun/worker_master/" + strconv.Itoa(restart)
	if round.GroupRank == 0 {
		port, err := freePort(round.StoreHost)
		if err != nil {
			return workerEndpoint{}, fmt.Errorf("elastic: pick a port for worker rank 0: %w", err)
		}
		if err := round.Store.Set(ctx, key, []byte(strconv.Itoa(port))); err != nil {
			return workerEndpoint{}, fmt.Errorf("elastic: publish worker store port: %w", err)
		}
	}
	v, err := round.Store.Get(ctx, key)
	if err != nil {
		return workerEndpoint{}, fmt.Errorf("elastic: read worker store port: %w", err)
	}
	port, err := strconv.Atoi(string(v))
	if err != nil {
		return workerEndpoint{}, fmt.Errorf("elastic: worker store port %q: %w", v, err)
	}
	return workerEndpoint{host: round.StoreHost, port: port}, nil
}

// freePort asks the kernel for a port that is free on host right now.
func freePort(host string) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// outcome is how one attempt of the worker group ended.
type outcome struct {
	failures []Failure
	signal   syscall.Signal
	err      error
}

// watch supervises one attempt until every worker has been reaped. The
// first failure stops the others; so does a signal, which is forwarded
// first. Exits that follow a stop are its consequence, not failures.
func (a *Agent) watch(ctx context.Context, att *attempt) outcome {
	var out outcome
	stopping, stopped := false, make(chan struct{})
	stop := func(sig syscall.Signal) {
		if stopping {
			return
		}
		stopping = true
		go func() {
			att.group.Stop(sig, a.spec.ShutdownTimeout)
			close(stopped)
		}()
	}
	done := ctx.Done()
	for exits := att.group.Exits(); exits != nil; {
		select {
		case e, ok := <-exits:
			if !ok {
				exits = nil
				continue
			}
			if e.Failed() && !stopping {
				out.failures = append(out.failures, att.failure(e, a.spec.Host))
				stop(syscall.SIGTERM)
			}
		case s := <-a.opts.Signals:
			sig, _ := s.(syscall.Signal)
			if stopping && out.signal != 0 {
				a.log.Warn().Str("signal", signalName(sig)).Msg("second signal: killing the workers now")
				_ = att.group.Signal(syscall.SIGKILL)
				continue
			}
			out.signal = sig
			if stopping {
				_ = att.group.Signal(sig)
			}
			stop(sig)
		case <-done:
			done = nil
			out.err = ctx.Err()
			stop(syscall.SIGTERM)
		}
	}
	if stopping {
		<-stopped
	}
	return out
}

// exitBarrier keeps this node's agent (and the store it may host) alive
// until every node's workers have finished, so no node loses the store
// while another still needs it.
func exitBarrier(ctx context.Context, round *rendezvous.Round, timeout time.Duration) error {
	if round.GroupWorldSize <= 1 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	const prefix = "torchelastic/agent/terminal_state/"
	n, err := round.Store.Add(ctx, prefix+"num_members", 1)
	if err != nil {
		return err
	}
	if int(n) == round.GroupWorldSize {
		if err := round.Store.Set(ctx, prefix+"last_member", []byte("<val_ignored>")); err != nil {
			return err
		}
	}
	return round.Store.Wait(ctx, []string{prefix + "last_member"})
}

func signalName(sig syscall.Signal) string {
	if name := unix.SignalName(sig); name != "" {
		return name
	}
	return "signal " + strconv.Itoa(int(sig))
}
