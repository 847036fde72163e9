package launcher

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

const (
	// outputDrain bounds how long a worker's Exit waits for more output
	// once the worker died and its stream is empty, or once what the
	// stream held then has been read: a process that escaped its group
	// (setsid) can hold the pipe open forever.
	outputDrain = 2 * time.Second
	// killWait bounds the wait after SIGKILL. A SIGKILLed process dies at
	// once unless it is stuck in the kernel (uninterruptible sleep).
	killWait = 10 * time.Second
	// startConcurrency bounds the workers being started at once: every
	// start blocks an OS thread in fork and exec, which take turns
	// anyway (syscall.ForkLock); no launch time was lost at 256 workers.
	startConcurrency = 8
)

// WorkerSpec is one process to start.
type WorkerSpec struct {
	LocalRank, Rank int
	// Argv is the command line; argv[0] without a slash is looked up in the
	// PATH of Env (not the agent's).
	Argv []string
	Env  []string // the whole environment (nil = the agent's)
	Dir  string   // working directory ("" = the agent's)
	// Stdout and Stderr receive the raw byte streams; nil discards. They are
	// written from separate goroutines (so the same writer for both must be
	// safe for concurrent use, as Console writers and files are), and never
	// closed: the caller closes them after the worker's Exit, which arrives
	// once all output has been copied. A failing writer loses the rest of
	// the stream but never blocks the worker.
	Stdout, Stderr io.Writer
	// PTY gives the worker a pseudo-terminal as stdout, so C stdio and
	// Python line-buffer instead of block-buffering; stderr stays a pipe.
	PTY bool
	// CPUs, unless empty, are the only CPUs the worker and everything it
	// starts may run on (Binding.CPUsFor).
	CPUs []int
}

// Exit describes how one worker ended.
type Exit struct {
	LocalRank, Rank, Pid int
	ExitCode             int            // exit status, 128+signal when killed by a signal, -1 if unknown
	Signal               syscall.Signal // 0 unless killed by a signal
	Time                 time.Time      // when the agent observed the exit
}

// Failed reports whether the worker did not exit with status 0.
func (e Exit) Failed() bool { return e.ExitCode != 0 }

// String is "exitcode 3" or "signal 9 (SIGKILL)".
func (e Exit) String() string {
	if e.Signal != 0 {
		return fmt.Sprintf("signal %d (%s)", int(e.Signal), unix.SignalName(e.Signal))
	}
	return fmt.Sprintf("exitcode %d", e.ExitCode)
}

// StartError reports a worker that could not be started.
type StartError struct {
	LocalRank int
	Argv0     string
	Err       error
}

func (e *StartError) Error() string {
	return fmt.Sprintf("launcher: start local rank %d (%q): %v", e.LocalRank, e.Argv0, e.Err)
}

func (e *StartError) Unwrap() error { return e.Err }

// GroupOptions configures StartGroup.
type GroupOptions struct {
	Logger zerolog.Logger
	Now    func() time.Time // stamps Exit.Time (nil = time.Now)
	// Keeper, when set, records every worker's process group so that the
	// group is killed even if the agent is. A keeper started by
	// Containment.StartKeeper also contains the group: everything its
	// workers start is killed once the last of them has exited.
	Keeper *Keeper

	drain time.Duration // outputDrain when 0; tests shorten it
}

// Group is a set of running workers, each the leader of its own process
// group. One goroutine per worker reaps it and sends its Exit.
type Group struct {
	log     zerolog.Logger
	now     func() time.Time
	keeper  *Keeper
	drain   time.Duration // outputDrain, shorter in tests
	cell    *cell         // the group's share of the keeper's Containment
	workers []*worker     // in spec order; fixed once StartGroup returns

	reapers sync.WaitGroup
	exits   chan Exit     // buffered for every worker, so reapers never block
	done    chan struct{} // closed with exits, once every Exit has been sent
}

// worker is one started process.
type worker struct {
	localRank, rank, pid int
	log                  zerolog.Logger
	cmd                  *exec.Cmd
	outputs              []output
	copying              sync.WaitGroup // one per output, done at its EOF

	mu     sync.Mutex
	exited bool // the process is dead: its pid may not be signalled again
}

// StartGroup starts every worker, side by side, each in its own process
// group and bound to die with the agent. If one fails to start, the others
// are killed and the error, a *StartError, names the first local rank that
// failed.
func StartGroup(specs []WorkerSpec, opts GroupOptions) (*Group, error) {
	g := &Group{
		log:    opts.Logger,
		now:    opts.Now,
		keeper: opts.Keeper,
		drain:  cmp.Or(opts.drain, outputDrain),
		exits:  make(chan Exit, len(specs)),
		done:   make(chan struct{}),
	}
	if g.now == nil {
		g.now = time.Now
	}
	var err error
	if g.cell, err = opts.Keeper.containment().newCell(len(specs)); err != nil {
		return nil, err
	}
	// Workers start from fresh goroutines, which no caller can have
	// locked to their OS threads (see workerAttr for why that matters),
	// and most of a start (pipes, the wait for the child's exec, the
	// output goroutines) overlaps with the others': 8 workers of
	// /bin/true, 16.2 to 14.3 ms. At most startConcurrency at once: each
	// start holds an OS thread while it forks and waits for the exec.
	started := make([]*worker, len(specs))
	errs := make([]error, len(specs))
	var starting sync.WaitGroup
	var next atomic.Int64
	for range min(startConcurrency, len(specs)) {
		starting.Go(func() {
			for i := int(next.Add(1) - 1); i < len(specs); i = int(next.Add(1) - 1) {
				started[i], errs[i] = g.start(specs[i])
			}
		})
	}
	starting.Wait()
	var startErr error
	for i, w := range started {
		if w != nil {
			g.workers = append(g.workers, w)
		} else if startErr == nil {
			startErr = &StartError{LocalRank: specs[i].LocalRank, Argv0: argv0(specs[i].Argv), Err: errs[i]}
		}
	}
	go func() {
		g.reapers.Wait()
		g.cell.close()
		close(g.exits)
		close(g.done)
	}()
	if startErr != nil {
		g.log.Error().Err(startErr).Msg("worker failed to start; killing the others")
		g.Stop(syscall.SIGKILL, 0)
		return nil, startErr
	}
	return g, nil
}

// Exits delivers one Exit per worker in the order they end, each after the
// worker's output has been copied; it is closed after the last one.
func (g *Group) Exits() <-chan Exit { return g.exits }

// Pids returns the workers' pids (each also its process group id) in the
// order of the specs.
func (g *Group) Pids() []int {
	pids := make([]int, len(g.workers))
	for i, w := range g.workers {
		pids[i] = w.pid
	}
	return pids
}

// Signal sends sig to the whole process group of every live worker, which
// includes whatever the worker started and left in its group.
func (g *Group) Signal(sig syscall.Signal) error {
	var errs []error
	for _, w := range g.workers {
		errs = append(errs, w.signal(sig))
	}
	return errors.Join(errs...)
}

// SignalWorker sends sig to the process of the worker in slot (its
// WorkerSpec's position) alone, not to its process group, unless the
// worker has exited: once it is reaped its pid may name another process.
// A worker that stops on sig takes its group along when it is reaped.
func (g *Group) SignalWorker(slot int, sig syscall.Signal) error {
	if slot < 0 || slot >= len(g.workers) {
		return fmt.Errorf("launcher: no worker in slot %d", slot)
	}
	w := g.workers[slot]
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.exited {
		return nil
	}
	if err := syscall.Kill(w.pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("launcher: signal local rank %d (pid %d): %w", w.localRank, w.pid, err)
	}
	return nil
}

// Stop sends sig to every live worker's process group, waits up to grace for
// them to end, SIGKILLs the groups still alive, and waits (bounded) until
// every worker has been reaped and its output copied.
func (g *Group) Stop(sig syscall.Signal, grace time.Duration) {
	g.log.Info().Str("signal", unix.SignalName(sig)).Stringer("grace", grace).Msg("stopping workers")
	g.signalAndLog(sig)
	if sig != syscall.SIGKILL && !g.wait(grace) {
		g.log.Warn().Ints("pids", g.livePids()).Msg("workers outlived the grace period; sending SIGKILL")
		g.signalAndLog(syscall.SIGKILL)
	}
	if !g.wait(killWait + g.drain) {
		g.log.Error().Ints("pids", g.livePids()).Msg("workers not reaped after SIGKILL; giving up on them")
	}
}

func (g *Group) signalAndLog(sig syscall.Signal) {
	if err := g.Signal(sig); err != nil {
		g.log.Warn().Err(err).Msg("signalling workers")
	}
}

// wait reports whether every Exit was sent within d.
func (g *Group) wait(d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-g.done:
		return true
	case <-timer.C:
		return false
	}
}

func (g *Group) livePids() []int {
	var pids []int
	for _, w := range g.workers {
		w.mu.Lock()
		if !w.exited {
			pids = append(pids, w.pid)
		}
		w.mu.Unlock()
	}
	return pids
}

// start starts one worker and the goroutines that copy its output and reap it.
func (g *Group) start(spec WorkerSpec) (*worker, error) {
	cmd, outputs, err := startProcess(spec, g.cell)
	if err != nil {
		return nil, err
	}
	w := &worker{
		localRank: spec.LocalRank,
		rank:      spec.Rank,
		pid:       cmd.Process.Pid,
		cmd:       cmd,
		outputs:   outputs,
	}
	w.log = g.log.With().Int("local_rank", w.localRank).Int("rank", w.rank).Int("pid", w.pid).Logger()
	if err := g.keeper.Track(w.pid); err != nil {
		w.log.Warn().Err(err).Msg("keeper lost: the worker's children may outlive a killed agent")
	}
	w.log.Debug().Strs("argv", spec.Argv).Msg("worker started")
	for _, out := range outputs {
		w.copying.Go(func() { out.copy(w.log) })
	}
	g.reapers.Go(func() { g.exits <- g.reap(w) })
	return w, nil
}

// reap waits for w to die, clears its process group (and, after the last
// worker, whatever the group left), and returns its Exit once its output
// has been copied.
func (g *Group) reap(w *worker) Exit {
	if err := awaitExit(w.pid); err != nil {
		w.log.Warn().Err(err).Msg("waitid")
	}
	observed := g.now()
	w.markExited()
	// Before the output is drained: a daemon that holds the worker's
	// output would otherwise make the drain wait its full bound.
	g.cell.exited()
	if err := g.keeper.Untrack(w.pid); err != nil {
		w.log.Warn().Err(err).Msg("keeper lost")
	}
	_ = w.cmd.Wait() // the exit status is in ProcessState
	g.cell.reaped(w.pid)
	w.finishOutput(g.drain)
	exit := w.exitAt(observed)
	level := zerolog.DebugLevel
	if exit.Failed() {
		level = zerolog.WarnLevel
	}
	// The event is the name of the agent's metric of worker exits.
	w.log.WithLevel(level).Str("event", "gorun_worker_exits").Stringer("exit", exit).Msg("worker exited")
	return exit
}

// markExited kills whatever is left in the dead worker's process group and
// forbids signalling it again, before the pid is released by reaping. The
// leader is dead, so nothing legitimate remains in the group: gorun, like
// mpirun, does not leave a worker's children behind.
func (w *worker) markExited() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := syscall.Kill(-w.pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		w.log.Warn().Err(err).Msg("killing the process group of an exited worker")
	}
	w.exited = true
}

func (w *worker) signal(sig syscall.Signal) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.exited {
		return nil
	}
	if err := syscall.Kill(-w.pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("launcher: signal local rank %d (pgid %d): %w", w.localRank, w.pid, err)
	}
	return nil
}

// finishOutput waits for every output to reach EOF. A process that
// escaped the worker's group can hold an output open forever: an output
// found lingering (see lingering) is closed, losing what that process
// writes later, but never what the worker wrote.
func (w *worker) finishOutput(bound time.Duration) {
	copied := make(chan struct{})
	go func() {
		w.copying.Wait()
		close(copied)
	}()
	died := sinceDrainClock()
	backlogs := make([]int64, len(w.outputs))
	for i, out := range w.outputs {
		backlogs[i] = out.backlog()
	}
	tick := time.NewTicker(bound / 4)
	defer tick.Stop()
	for {
		select {
		case <-copied:
			closeSources(w.outputs)
			return
		case <-tick.C:
		}
		now := sinceDrainClock()
		for i, out := range w.outputs {
			if out.closed() {
				continue
			}
			idleSince, read := out.state.idleSince.Load(), out.state.read.Load()
			if lingering(now, died, idleSince, read, backlogs[i], out.held(), bound) {
				w.log.Warn().Str("stream", out.name).Msg("a process outside the worker's group holds its output open; closing it")
				out.close()
			}
		}
	}
}

func (w *worker) exitAt(observed time.Time) Exit {
	exit := Exit{LocalRank: w.localRank, Rank: w.rank, Pid: w.pid, ExitCode: -1, Time: observed}
	if w.cmd.ProcessState == nil {
		w.log.Error().Msg("exit status unknown")
		return exit
	}
	status := w.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if status.Signaled() {
		exit.Signal = status.Signal()
		exit.ExitCode = 128 + int(exit.Signal)
	} else {
		exit.ExitCode = status.ExitStatus()
	}
	return exit
}

// startProcess starts the worker described by spec inside cl (nil: no
// containment) and returns the outputs to copy from.
func startProcess(spec WorkerSpec, cl *cell) (*exec.Cmd, []output, error) {
	if len(spec.Argv) == 0 {
		return nil, nil, errors.New("empty command line")
	}
	env := spec.Env
	if env == nil {
		env = os.Environ()
	}
	path, err := lookPath(spec.Argv[0], env)
	if err != nil {
		return nil, nil, err
	}
	cmd := &exec.Cmd{
		Path:        path,
		Args:        slices.Clone(spec.Argv),
		Env:         env,
		Dir:         spec.Dir,
		SysProcAttr: workerAttr(spec.PTY),
	}
	cl.confine(cmd)
	var s streams
	defer s.closeChildEnds()
	if spec.PTY {
		cmd.Stdout, err = s.terminal("stdout", spec.Stdout)
	} else {
		cmd.Stdout, err = s.pipe("stdout", spec.Stdout)
	}
	if err == nil {
		cmd.Stderr, err = s.pipe("stderr", spec.Stderr)
	}
	if err == nil {
		err = cl.start(cmd, func() error { return startBound(cmd, spec.CPUs) })
	}
	if err != nil {
		closeSources(s.outputs)
		return nil, nil, err
	}
	return cmd, s.outputs, nil
}

// lookPath finds a command name without a slash in the PATH of the worker's
// environment, as execvp in the worker would; exec.LookPath would search the
// agent's PATH instead. Like exec.LookPath, it refuses a match relative to
// the current directory.
func lookPath(file string, env []string) (string, error) {
	if strings.Contains(file, "/") {
		return file, nil
	}
	path, _ := newEnviron(env).lookup("PATH")
	for _, dir := range filepath.SplitList(path) {
		candidate := filepath.Join(dir, file)
		if !isExecutable(candidate) {
			continue
		}
		if !filepath.IsAbs(candidate) {
			return "", &exec.Error{Name: file, Err: exec.ErrDot}
		}
		return candidate, nil
	}
	return "", &exec.Error{Name: file, Err: exec.ErrNotFound}
}

func isExecutable(path string) bool {
	info, err := os.Stat(path)
	return err == nil && info.Mode().IsRegular() && info.Mode().Perm()&0o111 != 0
}

func argv0(argv []string) string {
	if len(argv) == 0 {
		return ""
	}
	return argv[0]
}
