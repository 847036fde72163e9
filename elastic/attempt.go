package elastic

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/rs/zerolog"

	"github.com/gorun/gorun/internal/shmname"
	"github.com/gorun/gorun/internal/workerenv"
	"github.com/gorun/gorun/launcher"
)

// attempt is one start of the worker group and the output sinks it owns.
type attempt struct {
	group      WorkerGroup
	errorFiles map[int]string // by slot (launcher.Exit.LocalRank)
	progress   []progressFile // with --hang-timeout
	stacks     map[int]string // the workers' stacks sockets, by slot
	round      *round         // that the attempt runs in
	// timerPipe is the file-timer watchdog's pipe (Spec.FileTimer), also
	// among the closers.
	timerPipe *timerPipe
	// faultHandler: the workers are Python with faulthandler on.
	faultHandler bool
	closers      []io.Closer
	// firstLocalRank is the local rank of slot 0: non-zero when a
	// scheduler placed this node's one worker (Spec.Placement).
	firstLocalRank int
	// baseRank is the global rank of slot 0.
	baseRank int
}

// startAttempt builds every worker's environment and output sinks and
// starts the group: restart is the job's restart count, number counts
// this node's starts (membership changes included) and names the log
// folder.
func (a *Agent) startAttempt(rk ranks, restart, number int, master workerEndpoint, logs *logRoot) (*attempt, error) {
	s := a.spec
	att := &attempt{errorFiles: make(map[int]string, s.NProcPerNode), stacks: make(map[int]string), baseRank: rk.BaseRank}
	stdout := launcher.NewConsole(a.opts.Stdout, launcher.ConsoleOptions{Timestamps: s.Timestamps, Now: a.now})
	stderr := launcher.NewConsole(a.opts.Stderr, launcher.ConsoleOptions{Timestamps: s.Timestamps, Now: a.now})
	// Where the workers sit as they see it: in the node the rendezvous
	// gave, unless a scheduler placed the one worker (Spec.Placement).
	localWorldSize := s.NProcPerNode
	groupRank, groupWorldSize := rk.GroupRank, rk.GroupWorldSize
	if p := s.Placement; p != nil {
		att.firstLocalRank, localWorldSize = p.LocalRank, p.LocalWorldSize
		groupRank, groupWorldSize = p.NodeRank, p.NNodes
	}
	// Workers of an earlier start (or job) killed while setting up
	// shared memory leave their segments behind; their creators are
	// gone by now.
	if removed, err := shmname.Sweep(launcher.ShmDir); err != nil {
		a.log.Debug().Err(err).Msg("sweeping shared memory left behind")
	} else if len(removed) > 0 {
		a.log.Info().Strs("segments", removed).Msg("removed shared memory left by dead workers")
	}
	base := s.Env
	// The attempt's folder, <log-dir>/<run-id>/attempt_<number>, holds
	// the workers' folders, the duplicates' files and the watchdog's pipe.
	attDir, err := logs.root.MkdirAll(filepath.Join(s.RunID, "attempt_"+strconv.Itoa(number)))
	if err != nil {
		return nil, fmt.Errorf("elastic: log folder of attempt %d: %w", number, err)
	}
	defer attDir.Close()
	if s.FileTimer {
		var p *timerPipe
		if s.TimerFile != "" {
			p, err = openTimerPipe(s.TimerFile, a.log)
		} else {
			p, err = openTimerPipeIn(attDir, timerFileName, a.log)
		}
		if err != nil {
			return nil, err
		}
		att.timerPipe, att.closers = p, append(att.closers, p)
		base = append(slices.Clip(s.Env), timerFileEnv+"="+p.path)
		// Python prints every thread's traceback on SIGABRT with
		// faulthandler on, which the watchdog asks for before SIGKILL;
		// PYTHONFAULTHANDLER set, even empty (off), is the user's say.
		if s.Python {
			v, set := envValue(s.Env, "PYTHONFAULTHANDLER")
			if !set {
				base, v = append(base, "PYTHONFAULTHANDLER=1"), "1"
			}
			att.faultHandler = v != ""
		}
	}
	dupOut, err := att.duplicates(s.DuplicateStdout, attDir, "filtered_stdout.log")
	var dupErr *launcher.Console
	if err == nil {
		dupErr, err = att.duplicates(s.DuplicateStderr, attDir, "filtered_stderr.log")
	}
	if err != nil {
		att.closeOutput()
		return nil, err
	}
	specs := make([]launcher.WorkerSpec, s.NProcPerNode)
	stamps := make([]*atomic.Int64, s.NProcPerNode) // last output, for gorun status
	// The group knows its workers by slot (WorkerSpec.LocalRank, which
	// errorFiles, the progress files and Group.Pids go by); lr is the
	// local rank the worker sees, which names its log folder and picks
	// where its output goes (--redirects, --tee, --local-ranks-filter).
	for slot := range specs {
		rank, lr := rk.BaseRank+slot, att.firstLocalRank+slot
		dir, _, _, errorFile := launcher.LogPaths(logs.dir, s.RunID, number, lr)
		// Emptied as torchrun does, and made by gorun, 0700, for the
		// worker's error file (TORCHELASTIC_ERROR_FILE) as for its logs.
		rankDir, err := attDir.Reset(strconv.Itoa(lr))
		if err != nil {
			att.closeOutput()
			return nil, fmt.Errorf("elastic: log folder of local rank %d: %w", lr, err)
		}
		att.closers = append(att.closers, rankDir)
		att.errorFiles[slot] = errorFile
		env := launcher.Env{
			Base:      base,
			LocalRank: lr, Rank: rank, LocalWorldSize: localWorldSize, WorldSize: rk.WorldSize,
			GroupRank: groupRank, GroupWorldSize: groupWorldSize,
			RoleName: s.Role, RoleRank: rk.BaseRoleRank + slot, RoleWorldSize: rk.RoleSize,
			MasterAddr: master.host, MasterPort: master.port,
			RestartCount: restart, MaxRestarts: s.MaxRestarts,
			RunID:            s.RunID,
			UseAgentStore:    master.agentStore,
			ErrorFile:        errorFile,
			VirtualLocalRank: s.VirtualLocalRank,
			Python:           s.Python,
			Extra: map[string]string{
				"GORUN_HOST":      s.Host,
				"GORUN_LOG_DIR":   dir,
				"GORUN_NODE_RANK": strconv.Itoa(groupRank),
			},
		}
		if s.HangTimeout > 0 {
			p, err := createProgressFile(rankDir, slot, rank)
			if err != nil {
				att.closeOutput()
				return nil, err
			}
			att.progress = append(att.progress, p)
			env.Extra[workerenv.ProgressFile] = p.path
		}
		if dir := a.board.stacksDir; dir != "" && !s.Python {
			sock := stacksSocket(dir, os.Getpid(), lr)
			socketCloser(sock).Close() // left by a worker that was killed
			att.stacks[slot] = sock
			att.closers = append(att.closers, socketCloser(sock))
			env.Extra[workerenv.StacksSocket] = sock
		}
		if err := env.Validate(); err != nil {
			att.closeOutput()
			return nil, fmt.Errorf("elastic: environment of local rank %d: %w", lr, err)
		}
		prefix := launcher.FormatPrefix(s.PrefixTemplate, s.Role, rank, lr, s.Host)
		outW, err := att.sink(a.sinkFor(lr, true, logs), stdout, dupOut, prefix, rankDir, "stdout.log")
		var errW io.Writer
		if err == nil {
			errW, err = att.sink(a.sinkFor(lr, false, logs), stderr, dupErr, prefix, rankDir, "stderr.log")
		}
		if err != nil {
			att.closeOutput()
			return nil, fmt.Errorf("elastic: output of local rank %d: %w", lr, err)
		}
		stamps[slot] = new(atomic.Int64)
		specs[slot] = launcher.WorkerSpec{
			LocalRank: slot, Rank: rank,
			Argv: s.Argv, Env: env.Environ(), Dir: s.Dir,
			Stdout: stamp(outW, stamps[slot], a.now), Stderr: stamp(errW, stamps[slot], a.now), PTY: s.PTY,
		}
		if slot < len(s.CPUs) {
			specs[slot].CPUs = s.CPUs[slot]
		}
	}
	group, err := a.opts.StartGroup(specs, launcher.GroupOptions{Logger: a.log, Now: a.now, Keeper: a.opts.Keeper})
	if err != nil {
		att.closeOutput()
		return nil, err
	}
	att.group = group
	a.board.started(att, stamps)
	a.opts.Timeline.started(a.now(), att)
	started := a.log.Info().Str("event", eventStarted).Int("restart", restart).Int("attempt", number).Ints("pids", group.Pids())
	if s.CPUs != nil {
		started = started.Interface("cpus", s.CPUs[:min(len(specs), len(s.CPUs))])
	}
	started.Msgf("started %d workers", len(specs))
	return att, nil
}

// destination says where one stream of one worker goes; a tee'd stream
// is also copied to the duplicates' file (--duplicate-*-filters).
type destination struct{ console, file, teed bool }

// sinkFor applies torchrun's rules: a redirected stream goes to its file
// only, a tee'd one to file and console; --log-dir keeps files of every
// stream; --local-ranks-filter hides the other ranks from the console.
func (a *Agent) sinkFor(localRank int, stdout bool, logs *logRoot) destination {
	pick := func(m map[int]launcher.Std) bool {
		std := m[localRank]
		if stdout {
			return std.Stdout()
		}
		return std.Stderr()
	}
	redirected, teed := pick(a.spec.Redirects), pick(a.spec.Tee)
	shown := a.spec.ConsoleRanks == nil || a.spec.ConsoleRanks[localRank]
	return destination{
		console: shown && (teed || !redirected),
		file:    logs.keepAll || redirected || teed,
		teed:    teed,
	}
}

// sink opens the writer for one stream: the console's prefixed line writer,
// the log file, both, or nothing; and the duplicates' writer when the
// stream is tee'd and duplicates is set.
func (att *attempt) sink(d destination, console, duplicates *launcher.Console, prefix string, dir *launcher.LogDir, name string) (io.Writer, error) {
	var ws []io.Writer
	if d.console {
		w := console.Writer(prefix)
		att.closers = append(att.closers, w)
		ws = append(ws, w)
	}
	if d.teed && duplicates != nil {
		w := duplicates.Writer(prefix)
		att.closers = append(att.closers, w)
		ws = append(ws, w)
	}
	if d.file {
		f, err := dir.Create(name)
		if err != nil {
			return nil, err
		}
		att.closers = append(att.closers, f)
		ws = append(ws, f)
	}
	switch len(ws) {
	case 0:
		return io.Discard, nil
	case 1:
		return ws[0], nil
	}
	return io.MultiWriter(ws...), nil
}

// duplicates opens the attempt's file of the lines that contain any of
// filters, as torchrun's --duplicate-*-filters: a console of every local
// rank's tee'd stream, prefixed as on the console. It is nil without filters.
func (att *attempt) duplicates(filters []string, dir *launcher.LogDir, name string) (*launcher.Console, error) {
	if len(filters) == 0 {
		return nil, nil
	}
	f, err := dir.Create(name)
	if err != nil {
		return nil, fmt.Errorf("elastic: %s: %w", name, err)
	}
	// Closed after the writers that write to it (closeOutput goes
	// backwards), which flush their partial lines.
	att.closers = append(att.closers, f)
	return launcher.NewConsole(f, launcher.ConsoleOptions{Keep: func(line []byte) bool {
		for _, s := range filters {
			if bytes.Contains(line, []byte(s)) {
				return true
			}
		}
		return false
	}}), nil
}

// closeOutput flushes partial console lines and closes the log files and
// the watchdog's pipe.
func (att *attempt) closeOutput() {
	for _, c := range slices.Backward(att.closers) {
		c.Close()
	}
	att.closers = nil
}

// failure turns a failed exit into a report entry with its error file.
// The entry names the local rank the worker saw, not its slot.
func (att *attempt) failure(e launcher.Exit, host string) Failure {
	path := att.errorFiles[e.LocalRank]
	e.LocalRank += att.firstLocalRank
	f := Failure{Exit: e, Host: host}
	if info, err := launcher.ReadErrorFile(path); err == nil && info != nil {
		f.Error, f.ErrorFile = info, path
	}
	return f
}

// logRoot is the folder that receives per-rank logs and error files.
type logRoot struct {
	dir string
	// root is dir, open: everything under it is made through it, never
	// following a link (launcher.LogDir).
	root *launcher.LogDir
	// keepAll is set when the user chose the folder: every stream is kept.
	keepAll bool
	// temporary folders hold only error files unless a stream is redirected.
	temporary bool
}

// newLogRoot opens --log-dir, or makes the job's private temporary
// folder, which keeper removes if the agent dies without doing so.
func newLogRoot(s Spec, keeper *launcher.Keeper) (*logRoot, error) {
	if s.LogDir != "" {
		root, err := launcher.OpenLogDir(s.LogDir)
		if err != nil {
			return nil, fmt.Errorf("elastic: --log-dir: %w", err)
		}
		return &logRoot{dir: s.LogDir, root: root, keepAll: true}, nil
	}
	// MkdirTemp makes a new folder, 0700, of a name no one could plant.
	dir, err := os.MkdirTemp("", "gorun-"+filepath.Base(s.RunID)+"-")
	if err != nil {
		return nil, fmt.Errorf("elastic: log folder: %w", err)
	}
	if err := keeper.RemoveOnExit(dir); err != nil {
		launcher.RemoveTree(dir)
		return nil, err
	}
	root, err := launcher.OpenLogDir(dir)
	if err != nil {
		launcher.RemoveTree(dir)
		return nil, fmt.Errorf("elastic: log folder: %w", err)
	}
	return &logRoot{dir: dir, root: root, temporary: true}, nil
}

// cleanup removes a temporary folder unless a stream was sent to it.
func (l *logRoot) cleanup(log zerolog.Logger) {
	l.root.Close()
	if !l.temporary {
		return
	}
	if launcher.HasLogFiles(l.dir) {
		log.Info().Str("log_dir", l.dir).Msg("worker logs kept")
		return
	}
	if err := launcher.RemoveTree(l.dir); err != nil {
		log.Warn().Err(err).Msg("temporary folder left behind")
	}
}

// envValue is the value of key in env (KEY=value entries, the last one
// winning, as exec passes them), and whether it is set.
func envValue(env []string, key string) (string, bool) {
	for _, kv := range slices.Backward(env) {
		if v, ok := strings.CutPrefix(kv, key+"="); ok {
			return v, true
		}
	}
	return "", false
}
