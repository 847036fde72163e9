package elastic

import (
	"context"
	"errors"
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
	// OpenRendezvous, when Rendezvous is nil, opens it: a step that may
	// wait (for a store that is not up yet), which a signal cuts short.
	OpenRendezvous func(ctx context.Context) (rendezvous.Handler, error)
	// Signals delivers the signals that stop the agent, and the notices
	// it forwards to its workers (isNotice). A stop signal acts at once in
	// every phase: the agent stops its workers, leaves the rendezvous and
	// returns the interrupted result; a second one, while the first is
	// acted on, kills the workers or gives up leaving at once.
	Signals <-chan os.Signal
	// Keeper, when set, kills whatever workers leave behind if the agent dies.
	Keeper *launcher.Keeper
	// StatusDir, when set, holds the agent's status socket (gorun
	// status); with it, the agent publishes its node's status to the
	// round's store every second.
	StatusDir string
	// Metrics, when set, receives the agent's Prometheus metrics.
	Metrics *Metrics
	// Timeline, when set, records the agent's events (gorun --report).
	Timeline *Timeline
}

// Agent runs one node's worker group through restarts until the job ends.
type Agent struct {
	spec Spec
	opts Options
	log  zerolog.Logger
	now  func() time.Time
	// board is the workers' status (status.go).
	board *statusBoard
}

// NewAgent returns an agent for spec; spec must have passed Validate.
func NewAgent(spec Spec, opts Options) *Agent {
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	a := &Agent{spec: spec, opts: opts, log: opts.Logger, now: now}
	a.board = newStatusBoard(&a.spec, a.log, now, opts.Metrics)
	return a
}

// Run rendezvouses, starts the workers and supervises them until the job
// ends: after a failure the group restarts while the restart budget lasts,
// and with the dynamic rendezvous it also restarts, without spending the
// budget, whenever the job's nodes change. It returns the job's result on
// this node; an error means the agent itself failed (for example the
// rendezvous), not the workers. A stop signal (Options.Signals) ends it
// in any phase with the interrupted result.
func (a *Agent) Run(ctx context.Context) (*Result, error) {
	h := a.opts.Rendezvous
	if h == nil {
		err := a.during(ctx, func(ctx context.Context) (err error) {
			h, err = a.opts.OpenRendezvous(ctx)
			return err
		})
		if sig := stopSignal(err); sig != 0 {
			return a.interrupted(sig, 0), nil
		}
		if err != nil {
			return nil, &RendezvousError{err}
		}
	}
	m := a.membership(h)
	defer m.close()
	logs, err := newLogRoot(a.spec, a.opts.Keeper)
	if err != nil {
		return nil, err
	}
	defer logs.cleanup(a.log)
	defer a.startStatus(ctx)()

	restarts := 0 // the job's, as of the last round
	for attempt := 0; ; attempt++ {
		var r *round
		began := a.now()
		err := a.during(ctx, func(ctx context.Context) (err error) {
			r, err = m.next(ctx)
			return err
		})
		switch sig := stopSignal(err); {
		case sig != 0:
			return a.stop(m, sig, restarts), nil
		case errors.Is(err, rendezvous.ErrJobFailed):
			return a.jobFailed(ctx, m, restarts)
		case errors.Is(err, rendezvous.ErrJobEnded):
			a.log.Info().Err(err).Msg("the job ended before this node got a place")
			return &Result{}, nil
		case err != nil && attempt > 0:
			return nil, &RendezvousError{fmt.Errorf("elastic: cannot rejoin the job: %w", err)}
		case err != nil:
			return nil, &RendezvousError{err}
		}
		restarts = r.restarts
		a.board.begin(r)
		a.opts.Timeline.round(a.now(), r)
		a.opts.Metrics.round(a.now().Sub(began), r.ranks.GroupWorldSize)
		a.log.Info().Str("event", eventRound).Int("round", r.number).Int("node_rank", r.ranks.GroupRank).Int("nodes", r.ranks.GroupWorldSize).
			Int("world_size", r.ranks.WorldSize).Int("nproc_per_node", a.spec.NProcPerNode).
			Int("restarts", r.restarts).Str("run_id", a.spec.RunID).Msg("rendezvous complete")

		out, err := a.runRound(ctx, r, attempt, logs)
		switch {
		case stopSignal(err) != 0:
			return a.stop(m, stopSignal(err), r.restarts), nil
		case err != nil:
			return nil, err
		case out.signal != 0:
			return a.stop(m, out.signal, r.restarts), nil
		case out.err != nil:
			return nil, out.err
		case out.changed:
			a.board.stopped(true)
			a.log.Warn().Str("reason", r.reason()).Msg("the job's round changed; stopped the workers to rejoin")
		case len(out.failures) > 0:
			// Give heartbeats time to tell a lost node first: its death
			// kills workers elsewhere too, and that must not spend the
			// budget. A report on a round already superseded spends nothing.
			superseded, sig, endWeighing := a.roundChangesWithin(ctx, m, r, a.spec.Dynamic.FailureGrace)
			if sig != 0 {
				endWeighing()
				return a.stop(m, sig, r.restarts), nil
			}
			for i := range out.failures {
				out.failures[i].Round = r.number
			}
			sortRootCauseFirst(out.failures)
			var restart bool
			err := a.during(ctx, func(ctx context.Context) (err error) {
				restart, err = m.fail(ctx, out.failures)
				return err
			})
			endWeighing()
			if sig := stopSignal(err); sig != 0 {
				return a.stop(m, sig, r.restarts), nil
			}
			if err != nil && !errors.Is(err, rendezvous.ErrJobFailed) {
				return nil, &RendezvousError{fmt.Errorf("elastic: report the failure: %w", err)}
			}
			if !restart {
				return a.jobFailed(ctx, m, r.restarts)
			}
			a.board.stopped(true)
			f := out.failures[0]
			if superseded {
				a.log.Warn().Int("rank", f.Rank).Str("status", f.Exit.String()).Str("reason", r.reason()).
					Msg("workers failed as the job's round changed; rejoining")
			} else {
				a.log.Warn().Str("event", eventRestart).Int("rank", f.Rank).Str("status", f.Exit.String()).
					Msgf("worker group failed; restarting (%d/%d)", r.restarts+1, a.spec.MaxRestarts)
			}
		default:
			err := a.during(ctx, m.done)
			switch {
			case stopSignal(err) != 0:
				return a.stop(m, stopSignal(err), r.restarts), nil
			case errors.Is(err, rendezvous.ErrRoundChanged):
				a.log.Warn().Str("reason", r.reason()).Msg("another node's round changed after this one finished; running again")
				continue
			case errors.Is(err, rendezvous.ErrJobFailed):
				return a.jobFailed(ctx, m, r.restarts)
			case err != nil:
				a.log.Warn().Err(err).Msg("exit barrier")
			}
			a.log.Info().Int("restarts", r.restarts).Msg("all workers succeeded")
			return &Result{Restarts: r.restarts}, nil
		}
	}
}

// roundChangesWithin waits up to grace for the round to change. A node's
// death kills its peers' workers too, inside collectives, sooner than
// heartbeats can tell; such failures must not spend the restart budget,
// which is for the workers' own faults. The wait ends early once every
// other node has heartbeated since the failure (none was lost), and a
// signal cuts it short. While it waits, this node counts as weighing a
// failure (membership.weigh): call endWeighing once the failure is
// reported.
func (a *Agent) roundChangesWithin(ctx context.Context, m membership, r *round, grace time.Duration) (superseded bool, sig syscall.Signal, endWeighing func()) {
	if r.ranks.GroupWorldSize <= 1 || grace <= 0 {
		return false, 0, func() {}
	}
	endWeighing = m.weigh(ctx)
	a.log.Info().Stringer("grace", grace).Msg("workers failed; checking that no node was lost before spending a restart")
	t := time.NewTimer(grace)
	defer t.Stop()
	aliveCtx, stopAlive := context.WithCancel(ctx)
	defer stopAlive()
	alive := m.awaitAlive(aliveCtx)
	for {
		select {
		case <-r.changed:
			return true, 0, endWeighing
		case <-alive:
			a.log.Info().Msg("every node is alive: the failure is the workers' own")
			return false, 0, endWeighing
		case s := <-a.opts.Signals:
			if sig, _ := s.(syscall.Signal); !isNotice(sig) {
				return false, sig, endWeighing
			}
		case <-t.C:
			return false, 0, endWeighing
		case <-ctx.Done():
			return false, 0, endWeighing
		}
	}
}

// RendezvousError is a failure to join, or stay in, the job's rendezvous:
// the store, a peer or the job itself was not there, as opposed to a
// fault of the agent's own or of its workers.
type RendezvousError struct{ Err error }

func (e *RendezvousError) Error() string { return e.Err.Error() }
func (e *RendezvousError) Unwrap() error { return e.Err }

// stopError reports that a signal stopped the agent in a step that waits
// on the rendezvous (during).
type stopError struct{ sig syscall.Signal }

func (e *stopError) Error() string { return "elastic: stopped by " + signalName(e.sig) }

// stopSignal returns the signal that stopped the agent, if err says one
// did, else 0.
func stopSignal(err error) syscall.Signal {
	var s *stopError
	if errors.As(err, &s) {
		return s.sig
	}
	return 0
}

// leaveTimeout bounds what a stopped agent still says to the rendezvous:
// the store answers in milliseconds, or is gone, and the agent must exit
// within a second of the signal, its workers' grace aside.
const leaveTimeout = 500 * time.Millisecond

// during runs fn, a step that waits on the rendezvous, until it returns
// or a stop signal comes: fn's context is then canceled, and during
// returns a *stopError once fn has returned, which it does at once. The
// agent's goroutine stays the one that reads the signals, here as in
// watch; notices find no workers to warn, and are dropped. A second stop
// signal is left for stop, which acts on it.
func (a *Agent) during(ctx context.Context, fn func(ctx context.Context) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	signals, stopped := a.opts.Signals, syscall.Signal(0)
	for {
		select {
		case err := <-done:
			if stopped != 0 {
				return &stopError{stopped}
			}
			return err
		case s := <-signals:
			sig, _ := s.(syscall.Signal)
			if isNotice(sig) {
				a.log.Info().Str("signal", signalName(sig)).Msg("no workers to forward a notice to")
				continue
			}
			a.log.Warn().Str("signal", signalName(sig)).Msg("stopping: leaving the rendezvous")
			stopped, signals = sig, nil
			a.opts.Timeline.signalled(a.now(), sig)
			cancel()
		}
	}
}

// stop leaves the rendezvous after sig stopped the agent, so that the
// other nodes go on without this one or learn at once that it left, and
// returns the interrupted result. It says no more than leaveTimeout allows
// to the store, which may be gone, and a second stop signal cuts it short.
func (a *Agent) stop(m membership, sig syscall.Signal, restarts int) *Result {
	ctx, cancel := context.WithTimeout(context.Background(), leaveTimeout)
	defer cancel()
	left := make(chan error, 1)
	go func() { left <- m.leave(ctx, "stopped by "+signalName(sig)) }()
	signals := a.opts.Signals
	for {
		select {
		case err := <-left:
			if err != nil {
				a.log.Warn().Err(err).Msg("could not tell the other nodes that this one left")
			}
			return a.interrupted(sig, restarts)
		case s := <-signals:
			if second, _ := s.(syscall.Signal); !isNotice(second) {
				a.log.Warn().Str("signal", signalName(second)).Msg("second signal: leaving at once")
				signals = nil
				cancel()
			}
		}
	}
}

// interrupted is the result of a job stopped by sig.
func (a *Agent) interrupted(sig syscall.Signal, restarts int) *Result {
	name := signalName(sig)
	a.log.Warn().Str("signal", name).Msg("stopped on a signal")
	a.opts.Timeline.signalled(a.now(), sig)
	return &Result{ExitCode: 128 + int(sig), Restarts: restarts, Interrupted: name}
}

// membership wraps the agent's rendezvous handler: any elastic one
// (c10d, etcd, or another backend) by what rendezvous.Elastic promises,
// any other as the static rendezvous.
func (a *Agent) membership(h rendezvous.Handler) membership {
	if e, ok := h.(rendezvous.Elastic); ok {
		return &elasticMembership{d: e, exitTimeout: a.spec.ExitBarrierTimeout}
	}
	return newStaticMembership(h, &a.spec, a.log)
}

// jobFailed ends the job with the failures every node reported in the
// last round that failed, root cause first, and its exit status. Other
// nodes may still be weighing their own failures (roundChangesWithin), so
// it gives them that long, at most, to report first.
func (a *Agent) jobFailed(ctx context.Context, m membership, restarts int) (*Result, error) {
	var fs []Failure
	err := a.during(ctx, func(ctx context.Context) (err error) {
		fs, err = m.failures(ctx, a.spec.Dynamic.FailureGrace)
		return err
	})
	if sig := stopSignal(err); sig != 0 {
		return a.stop(m, sig, restarts), nil
	}
	if err != nil {
		return nil, &RendezvousError{fmt.Errorf("elastic: read the job's failures: %w", err)}
	}
	if len(fs) == 0 {
		return nil, errors.New("elastic: the job failed without a failure report")
	}
	last := fs[:0:0]
	for _, f := range fs {
		if len(last) > 0 && f.Round > last[0].Round {
			last = last[:0]
		}
		if len(last) == 0 || f.Round == last[0].Round {
			last = append(last, f)
		}
	}
	sortRootCauseFirst(last)
	return &Result{Failures: last, ExitCode: last[0].ExitCode, Restarts: restarts}, nil
}

// runRound starts this node's workers for round r and supervises them
// until they end or the round changes.
func (a *Agent) runRound(ctx context.Context, r *round, attempt int, logs *logRoot) (outcome, error) {
	master, release, err := a.workerStore(ctx, r)
	if err != nil {
		return outcome{}, &RendezvousError{err}
	}
	defer release()
	if attempt == 0 {
		a.warnHangTimeoutBlind()
	}
	att, err := a.startAttempt(r.ranks, r.restarts, attempt, master, logs)
	if err != nil {
		return outcome{}, err
	}
	att.round = r
	out := a.watch(ctx, att, r.changed)
	att.closeOutput()
	return out, nil
}

// workerEndpoint is the store that workers bootstrap through.
type workerEndpoint struct {
	host       string
	port       int
	agentStore bool
}

// workerStore tells where this attempt's workers meet. With the static
// rendezvous, in agent-store mode, that is the rendezvous store itself
// (workers keep attempts apart by their restart count). With the dynamic
// one, group rank 0 hosts a fresh store for every round, so that no key of
// an earlier round leaks into the next even when the restart count stays
// the same. Otherwise group rank 0 picks a free port for worker rank 0 to
// host a store on. Non-zero group ranks learn the endpoint from the round's
// store. release stops a store this agent hosts.
func (a *Agent) workerStore(ctx context.Context, r *round) (workerEndpoint, func(), error) {
	nothing := func() {}
	if a.spec.ShareStore && r.agentStore != nil {
		return workerEndpoint{host: r.agentStore.host, port: r.agentStore.port, agentStore: true}, nothing, nil
	}
	// The round's store is the round's alone; within it, restarts of the
	// static rendezvous's one round each need a key of their own.
	key := "gorun/worker_store/" + strconv.Itoa(r.restarts)
	release := nothing
	if r.ranks.GroupRank == 0 {
		host := r.storeHost
		var port int
		var err error
		if a.spec.ShareStore {
			port, release, err = a.hostWorkerStore(ctx, host, r)
		} else {
			port, err = freePort(host)
		}
		if err != nil {
			return workerEndpoint{}, nil, fmt.Errorf("elastic: a store for the workers on %s: %w", host, err)
		}
		err = a.during(ctx, func(ctx context.Context) error {
			return r.store.Set(ctx, key, []byte(net.JoinHostPort(host, strconv.Itoa(port))))
		})
		if err != nil {
			release()
			return workerEndpoint{}, nil, fmt.Errorf("elastic: publish the workers' store: %w", err)
		}
	}
	// Group rank 0 may be slow to publish it, or gone.
	var v []byte
	err := a.during(ctx, func(ctx context.Context) (err error) {
		v, err = r.store.Get(ctx, key)
		return err
	})
	if err != nil {
		release()
		return workerEndpoint{}, nil, fmt.Errorf("elastic: read the workers' store: %w", err)
	}
	host, portText, err := net.SplitHostPort(string(v))
	port, perr := strconv.Atoi(portText)
	if err != nil || perr != nil {
		release()
		return workerEndpoint{}, nil, fmt.Errorf("elastic: the workers' store %q is not host:port", v)
	}
	return workerEndpoint{host: host, port: port, agentStore: a.spec.ShareStore}, release, nil
}

// hostWorkerStore serves a new store on an ephemeral port of host, to
// the round's nodes and this machine only (workersListener).
func (a *Agent) hostWorkerStore(ctx context.Context, host string, r *round) (int, func(), error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, nil, err
	}
	if l, err = a.workersListener(ctx, l, r); err != nil {
		return 0, nil, err
	}
	srv := rendezvous.NewServer(rendezvous.ServerOptions{Logger: a.log})
	go srv.Serve(l)
	forget := a.opts.Metrics.HostStore(StoreWorkers, func() *rendezvous.Server { return srv })
	return l.Addr().(*net.TCPAddr).Port, func() { forget(); srv.Close() }, nil
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
	changed  bool // the round changed under the workers
	err      error
}

// watch supervises one attempt until every worker has been reaped. The
// first failure stops the others; so does a signal, which is forwarded
// first. Exits that follow a stop are its consequence, not failures. With
// --hang-timeout, a hang is a failure too: the stuck workers' exits, after
// they dumped their stacks, are the failures, and the group stops once
// they have all exited or had hangDumpWait to. With the file-timer
// watchdog, a worker whose scope expired is signalled, and its exit, if it
// fails, is a failure that names the scope.
func (a *Agent) watch(ctx context.Context, att *attempt, changed <-chan struct{}) outcome {
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
	hang := a.startHangCheck(ctx, att)
	defer hang.stop()
	timers := a.startFileTimer(att)
	defer timers.stop()
	done := ctx.Done()
	for exits := att.group.Exits(); exits != nil; {
		select {
		case e, ok := <-exits:
			if !ok {
				exits = nil
				continue
			}
			a.board.exited(e)
			a.opts.Timeline.exited(e)
			reaped, byWatchdog := timers.exited(e.LocalRank)
			if stuck, all := hang.exited(e.LocalRank); stuck {
				out.failures = append(out.failures, hang.failure(e.LocalRank, att.failure(e, a.spec.Host)))
				if all {
					stop(syscall.SIGTERM)
				}
			} else if byWatchdog && e.Failed() {
				out.failures = append(out.failures, reaped.failure(att.failure(e, a.spec.Host)))
				stop(syscall.SIGTERM)
			} else if e.Failed() && !hang.hung() && (!stopping || failedOnItsOwn(e, out)) {
				out.failures = append(out.failures, att.failure(e, a.spec.Host))
				if !stopping {
					hang.explainFailure()
				}
				stop(syscall.SIGTERM)
			}
		case <-hang.tick():
			if !stopping {
				hang.check()
				if hang.hung() {
					a.opts.Timeline.hung(a.now(), hang)
				}
			}
		case <-hang.dumped():
			stop(syscall.SIGTERM)
		case r := <-timers.requests():
			timers.handle(r)
		case <-timers.due():
			if !stopping {
				timers.check()
			}
		case s := <-a.opts.Signals:
			sig, _ := s.(syscall.Signal)
			if isNotice(sig) {
				a.log.Info().Str("signal", signalName(sig)).Msg("forwarding a notice to the workers")
				_ = att.group.Signal(sig)
				continue
			}
			if stopping && out.signal != 0 {
				a.log.Warn().Str("signal", signalName(sig)).Msg("second signal: killing the workers now")
				_ = att.group.Signal(syscall.SIGKILL)
				continue
			}
			out.signal = sig
			a.opts.Timeline.signalled(a.now(), sig)
			if stopping {
				_ = att.group.Signal(sig)
			}
			stop(sig)
		case <-changed:
			changed = nil
			if !stopping {
				out.changed = true
				stop(syscall.SIGTERM)
			}
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

// isNotice tells the signals that warn workers (Slurm's preemption and
// time-limit notices) from those that stop them: notices are forwarded and
// the job goes on.
func isNotice(sig syscall.Signal) bool {
	return sig == syscall.SIGUSR1 || sig == syscall.SIGUSR2
}

// failedOnItsOwn tells, once a failure has begun to stop the group,
// whether another failed exit is a failure of its own rather than the
// stop's doing: workers that fail together (one rank exits, its peers'
// collectives fail) are seen in any order, and the one that failed first
// must not be lost among the others. Exits by the stop's SIGTERM or
// SIGKILL, and any exit after a signal or a round change stopped the
// group, are the stop's doing.
func failedOnItsOwn(e launcher.Exit, out outcome) bool {
	return len(out.failures) > 0 && out.signal == 0 && !out.changed && out.err == nil &&
		e.Signal != syscall.SIGTERM && e.Signal != syscall.SIGKILL
}

func signalName(sig syscall.Signal) string {
	if name := unix.SignalName(sig); name != "" {
		return name
	}
	return "signal " + strconv.Itoa(int(sig))
}
