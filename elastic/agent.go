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
	// StartGroup starts a worker group (nil = launcher.StartGroup); tests
	// give the agent workers that are not processes.
	StartGroup func(specs []launcher.WorkerSpec, opts launcher.GroupOptions) (WorkerGroup, error)
}

// WorkerGroup is a started worker group as the agent drives it:
// *launcher.Group's methods, which document them.
type WorkerGroup interface {
	Exits() <-chan launcher.Exit
	Pids() []int
	Signal(sig syscall.Signal) error
	SignalWorker(slot int, sig syscall.Signal) error
	Stop(sig syscall.Signal, grace time.Duration)
}

var _ WorkerGroup = (*launcher.Group)(nil)

// startProcesses is the production Options.StartGroup.
func startProcesses(specs []launcher.WorkerSpec, opts launcher.GroupOptions) (WorkerGroup, error) {
	g, err := launcher.StartGroup(specs, opts)
	if err != nil {
		return nil, err // not a nil *launcher.Group in an interface
	}
	return g, nil
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
	if opts.StartGroup == nil {
		opts.StartGroup = startProcesses
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
		v := decide(news{step: joined, err: err, restarts: restarts, rejoining: attempt > 0})
		if v.do != runWorkers {
			return a.end(ctx, m, v, restarts)
		}
		restarts = r.restarts
		a.board.begin(r)
		a.opts.Timeline.round(a.now(), r)
		a.opts.Metrics.round(a.now().Sub(began), r.ranks.GroupWorldSize)
		a.log.Info().Str("event", eventRound).Int("round", r.number).Int("node_rank", r.ranks.GroupRank).Int("nodes", r.ranks.GroupWorldSize).
			Int("world_size", r.ranks.WorldSize).Int("nproc_per_node", a.spec.NProcPerNode).
			Int("restarts", r.restarts).Str("run_id", a.spec.RunID).Msg("rendezvous complete")

		out, err := a.runRound(ctx, r, attempt, logs)
		v = decide(news{step: workersEnded, err: err, restarts: restarts, out: out})
		switch v.do {
		case reportFailures:
			for i := range out.failures {
				out.failures[i].Round = r.number
			}
			sortRootCauseFirst(out.failures)
			superseded, restart, err := a.reportFailures(ctx, m, r, out.failures)
			v = decide(news{step: failureReported, err: err, restarts: restarts, restart: restart, superseded: superseded})
		case awaitExit:
			v = decide(news{step: barrierPassed, err: a.during(ctx, m.done), restarts: restarts})
		}
		if v.do != rejoin {
			return a.end(ctx, m, v, restarts)
		}
		a.rejoin(r, v.why, out)
	}
}

// rejoin tells why the agent joins the next round after round r, whose
// workers ended as out.
func (a *Agent) rejoin(r *round, why cause, out outcome) {
	switch why {
	case roundChanged:
		a.board.stopped(true)
		a.log.Warn().Str("reason", r.reason()).Msg("the job's round changed; stopped the workers to rejoin")
	case failedAsRoundChanged:
		a.board.stopped(true)
		f := out.failures[0]
		a.log.Warn().Int("rank", f.Rank).Str("status", f.Exit.String()).Str("reason", r.reason()).
			Msg("workers failed as the job's round changed; rejoining")
	case workersFailed:
		a.board.stopped(true)
		f := out.failures[0]
		a.log.Warn().Str("event", eventRestart).Int("rank", f.Rank).Str("status", f.Exit.String()).
			Msgf("worker group failed; restarting (%d/%d)", r.restarts+1, a.spec.MaxRestarts)
	case runAgain:
		a.log.Warn().Str("reason", r.reason()).Msg("another node's round changed after this one finished; running again")
	}
}

// end carries out a verdict that ends Run: it stops on a signal, reads
// the job's failures when the job failed, or returns the verdict's
// result or error.
func (a *Agent) end(ctx context.Context, m membership, v verdict, restarts int) (*Result, error) {
	if v.do == failJob {
		v = a.jobFailed(ctx, m, restarts)
	}
	if v.do == stopOnSignal {
		return a.stop(m, v.sig, restarts), nil
	}
	switch v.why {
	case jobEnded:
		a.log.Info().Err(v.note).Msg("the job ended before this node got a place")
	case succeeded:
		if v.note != nil {
			a.log.Warn().Err(v.note).Msg("exit barrier")
		}
		a.log.Info().Int("restarts", restarts).Msg("all workers succeeded")
	}
	return v.result, v.err
}

// reportFailures reports the workers' failures in round r, and tells
// whether the job restarts. Among several nodes it first gives
// heartbeats time to tell a lost node (roundChangesWithin): its death
// kills workers elsewhere too, and that must not spend the budget; a
// report on a round already superseded spends nothing. A stop signal
// while it weighs is returned as a *stopError.
func (a *Agent) reportFailures(ctx context.Context, m membership, r *round, fs []Failure) (superseded, restart bool, err error) {
	grace := a.spec.Dynamic.FailureGrace
	if weighsFailures(r.ranks.GroupWorldSize, grace) {
		// Until the report is in, the other nodes count this one as
		// weighing a failure, and wait for it before they read the job's.
		endWeighing := m.weigh(ctx)
		defer endWeighing()
		var sig syscall.Signal
		if superseded, sig = a.roundChangesWithin(ctx, m, r, grace); sig != 0 {
			return superseded, false, &stopError{sig}
		}
	}
	err = a.during(ctx, func(ctx context.Context) (err error) {
		restart, err = m.fail(ctx, fs)
		return err
	})
	return superseded, restart, err
}

// roundChangesWithin waits up to grace for the round to change. A node's
// death kills its peers' workers too, inside collectives, sooner than
// heartbeats can tell; such failures must not spend the restart budget,
// which is for the workers' own faults. The wait ends early once every
// other node has heartbeated since the failure (none was lost), and a
// stop signal cuts it short.
func (a *Agent) roundChangesWithin(ctx context.Context, m membership, r *round, grace time.Duration) (superseded bool, sig syscall.Signal) {
	a.log.Info().Stringer("grace", grace).Msg("workers failed; checking that no node was lost before spending a restart")
	t := time.NewTimer(grace)
	defer t.Stop()
	aliveCtx, stopAlive := context.WithCancel(ctx)
	defer stopAlive()
	alive := m.awaitAlive(aliveCtx)
	for {
		select {
		case <-r.changed:
			return true, 0
		case <-alive:
			a.log.Info().Msg("every node is alive: the failure is the workers' own")
			return false, 0
		case s := <-a.opts.Signals:
			if sig, _ := s.(syscall.Signal); !isNotice(sig) {
				return false, sig
			}
		case <-t.C:
			return false, 0
		case <-ctx.Done():
			return false, 0
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

// jobFailed reads the failures every node reported, for the verdict on
// the failed job (decide). Other nodes may still be weighing their own
// failures (roundChangesWithin), so it gives them that long, at most, to
// report first.
func (a *Agent) jobFailed(ctx context.Context, m membership, restarts int) verdict {
	var fs []Failure
	err := a.during(ctx, func(ctx context.Context) (err error) {
		fs, err = m.failures(ctx, a.spec.Dynamic.FailureGrace)
		return err
	})
	return decide(news{step: failuresRead, err: err, failures: fs, restarts: restarts})
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
	// look runs one of hang's checks, and puts a hang it finds on the
	// timeline.
	look := func(check func()) {
		check()
		if hang.hung() {
			a.opts.Timeline.hung(a.now(), hang)
		}
	}
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
			stuck, allStuck := hang.exited(e.LocalRank)
			v := judgeExit(exitNews{exit: e, stuck: stuck, allStuck: allStuck, byWatchdog: byWatchdog,
				hung: hang.hung(), stopping: stopping, out: out})
			switch v.failure {
			case hangFailure:
				out.failures = append(out.failures, hang.failure(e.LocalRank, att.failure(e, a.spec.Host)))
			case watchdogFailure:
				out.failures = append(out.failures, reaped.failure(att.failure(e, a.spec.Host)))
			case workerFailure:
				out.failures = append(out.failures, att.failure(e, a.spec.Host))
			}
			if v.explain {
				hang.explainFailure()
			}
			if v.stop {
				stop(syscall.SIGTERM)
			}
		case <-hang.tick():
			if !stopping {
				look(hang.check)
			}
		case <-hang.foundElsewhere():
			if !stopping {
				look(hang.checkElsewhere)
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
			switch judgeSignal(sig, stopping, out.signal) {
			case forwardNotice:
				a.log.Info().Str("signal", signalName(sig)).Msg("forwarding a notice to the workers")
				_ = att.group.Signal(sig)
			case killWorkers:
				a.log.Warn().Str("signal", signalName(sig)).Msg("second signal: killing the workers now")
				_ = att.group.Signal(syscall.SIGKILL)
			case stopWorkers:
				out.signal = sig
				a.opts.Timeline.signalled(a.now(), sig)
				if stopping {
					_ = att.group.Signal(sig)
				}
				stop(sig)
			}
		case <-changed:
			changed = nil
			if !stopping {
				out.changed = true
				// A node that found the job hung ends the round at once:
				// the stalled workers here dump their stacks first, even
				// where the answer to its request is still being analysed.
				if hang.foundByAnother() && !hang.hung() {
					look(hang.checkElsewhere)
				}
				if !hang.dumping() {
					stop(syscall.SIGTERM)
				}
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

func signalName(sig syscall.Signal) string {
	if name := unix.SignalName(sig); name != "" {
		return name
	}
	return "signal " + strconv.Itoa(int(sig))
}
