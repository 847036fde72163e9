package main

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun/gorun/elastic"
	"github.com/gorun/gorun/launcher"
	"github.com/gorun/gorun/rendezvous"
	rendezvousetcd "github.com/gorun/gorun/rendezvous/etcd"
)

// The command line becomes the agent's Spec in one pure step, resolve: the
// flags' raw values, the environment and what was probed of the machine go
// in; the Spec, the logger's settings and the notes to log come out. Each
// concern (rendezvous, output, program, placement) is a part of its own,
// table-tested; reading the process, the terminal or NVML stays in main.

// flagValues is what resolve reads of the command line: urfave/cli's
// Context, or a table in tests.
type flagValues interface {
	String(name string) string
	Bool(name string) bool
	IsSet(name string) bool
}

// machine is what resolve may know of the process and the node, each
// looked up by main and passed in.
type machine struct {
	lookupEnv func(string) (string, bool)
	// environ is the environment workers inherit.
	environ []string
	// countGPUs counts the GPUs workers may use (--nproc-per-node gpu, auto).
	countGPUs func() (int, error)
	// cpusFor lists the CPUs of each of n workers under a binding
	// (launcher.Binding.CPUsFor, which reads the affinity and topology).
	cpusFor func(b launcher.Binding, n int) ([][]int, error)
	// stdoutIsTerminal decides --pty auto.
	stdoutIsTerminal bool
	hostname         string
	// randomID names a run that needs a fresh id (--standalone).
	randomID func() string
	// maxFiles and maxProcs are this process's limits on open files and
	// on the user's processes (RLIMIT_NOFILE, RLIMIT_NPROC); 0 is none.
	maxFiles, maxProcs uint64
	// lookPath finds a program as exec does; nil skips the check (tests).
	lookPath func(file string) (string, error)
}

// Each worker holds open files in gorun for as long as it runs: the read
// ends of its stdout and stderr (a terminal's master, or pipes) and, while
// it starts, their other ends. gorun keeps filesReserve for its store,
// logs and the rendezvous.
const (
	filesPerWorker = 6
	filesReserve   = 256
)

// note is a message for the log, which exists only once resolve is done.
type note struct {
	level zerolog.Level
	msg   string
}

// resolution is what the command line asks for.
type resolution struct {
	spec                elastic.Spec
	logFormat, logLevel string
	notes               []note
}

// resolve turns the command line (flags, then the program and its
// arguments) into the agent's Spec, with every malformed flag named in one
// usageError.
func resolve(f flagValues, program []string, m machine) (resolution, error) {
	r := &resolver{f: f, m: m}
	res := resolution{logFormat: f.String("log-format"), logLevel: cmp.Or(f.String("log-level"), r.env("LOGLEVEL"), "info")}
	s := &res.spec
	r.basics(s)
	r.nproc(s)
	r.rendezvous(s)
	r.signals(s)
	r.output(s)
	r.placement(s)
	r.program(s, program)
	if len(r.errs) == 0 {
		r.storeFiles(s)
	}
	if len(r.errs) == 0 {
		if err := s.Validate(); err != nil {
			r.fail(err)
		}
	}
	res.notes = r.notes
	switch {
	case len(r.errs) > 0:
		return res, usageError{errors.Join(r.errs...)}
	case r.missing != nil:
		return res, r.missing
	case r.scarce != nil:
		return res, r.scarce
	}
	return res, nil
}

// missingProgramError is a program that cannot be run here; gorun exits
// 127 for it, as a shell does.
type missingProgramError struct {
	program string
	err     error
}

func (e *missingProgramError) Error() string {
	return fmt.Sprintf("%s: cannot run it: %v", e.program, e.err)
}
func (e *missingProgramError) Unwrap() error { return e.err }

// resolver gathers the errors and notes of one resolution.
type resolver struct {
	f     flagValues
	m     machine
	errs  []error
	notes []note
	// inSlurmStep is set once the rendezvous found an srun step.
	inSlurmStep bool
	// missing is set when the program cannot be found.
	missing *missingProgramError
	// scarce is set when this process's limits cannot hold the job: not
	// the user's typing (exit 2) but the machine's resources (exit 71).
	scarce error
}

func (r *resolver) fail(err error) { r.errs = append(r.errs, err) }

func (r *resolver) note(level zerolog.Level, format string, args ...any) {
	r.notes = append(r.notes, note{level, fmt.Sprintf(format, args...)})
}

func (r *resolver) env(name string) string {
	v, _ := r.m.lookupEnv(name)
	return v
}

func (r *resolver) int(name string) int {
	n, err := strconv.Atoi(strings.TrimSpace(r.f.String(name)))
	if err != nil {
		r.fail(fmt.Errorf("--%s %q: want an integer", name, r.f.String(name)))
	}
	return n
}

// maxDuration bounds every duration gorun takes: a year is beyond any
// timeout that means something, and far below where a float of seconds
// overflows a time.Duration into a negative one.
const maxDuration = 366 * 24 * time.Hour

// seconds parses a number of seconds, named what for the error.
func (r *resolver) seconds(what, value string) time.Duration {
	d, err := parseSeconds(value)
	if err != nil {
		r.fail(fmt.Errorf("%s %q: %w", what, value, err))
	}
	return d
}

// parseSeconds reads a finite number of seconds from 0 to maxDuration.
func parseSeconds(value string) (time.Duration, error) {
	f, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
	if err != nil || math.IsNaN(f) || f < 0 || f > maxDuration.Seconds() {
		return 0, fmt.Errorf("want a number of seconds from 0 to %.0f", maxDuration.Seconds())
	}
	return time.Duration(f * float64(time.Second)), nil
}

// oneOf checks a flag against its choices.
func (r *resolver) oneOf(name string, choices ...string) string {
	v := r.f.String(name)
	if !slices.Contains(choices, v) {
		r.fail(fmt.Errorf("--%s %q: want %s", name, v, orList(choices)))
	}
	return v
}

// orList writes "a, b or c".
func orList(words []string) string {
	if len(words) < 2 {
		return strings.Join(words, "")
	}
	return strings.Join(words[:len(words)-1], ", ") + " or " + words[len(words)-1]
}

// basics are the settings that need no other part.
func (r *resolver) basics(s *elastic.Spec) {
	f := r.f
	s.Role = f.String("role")
	s.RunID = f.String("rdzv-id")
	s.MasterAddr = f.String("master-addr")
	s.LocalAddr = f.String("local-addr")
	s.MaxRestarts = r.int("max-restarts")
	s.NodeRank = r.int("node-rank")
	if interval := f.String("monitor-interval"); interval != "" {
		var err error
		if s.MonitorInterval, err = parseSeconds(interval); err != nil || s.MonitorInterval == 0 {
			r.fail(fmt.Errorf("--monitor-interval %q: want a positive number of seconds", interval))
		}
	}
	s.ShutdownTimeout = r.seconds("--shutdown-timeout", cmp.Or(f.String("shutdown-timeout"), r.env("TORCH_ELASTIC_SHUTDOWN_TIMEOUT"), "30"))
	s.VirtualLocalRank = f.Bool("virtual-local-rank")
	s.ShareStore = r.env("TORCH_DISABLE_SHARE_RDZV_TCP_STORE") != "1"
	s.StoreTimeout = 900 * time.Second
	s.Env = slices.Clip(r.m.environ)
	s.Host = r.m.hostname

	if f.IsSet("start-method") {
		r.oneOf("start-method", "spawn", "fork", "forkserver")
		r.note(zerolog.InfoLevel, "--start-method %s: gorun always starts every worker as a fresh process (as spawn does)", f.String("start-method"))
	}
	if f.Bool("use-env") {
		r.note(zerolog.DebugLevel, "--use-env: workers always read their ranks from the environment")
	}
	switch mode := r.env("GORUN_CONTAINMENT"); launcher.ContainMode(mode) {
	case "", launcher.ContainAuto, launcher.ContainCgroup, launcher.ContainSubreaper:
	default:
		r.fail(fmt.Errorf("GORUN_CONTAINMENT=%q: want auto, cgroup or subreaper", mode))
	}
	switch backend := f.String("backend"); backend {
	case "":
	case "auto", "nccl", "tcp":
		s.Env = append(s.Env, "GORUN_BACKEND="+backend)
	default:
		r.fail(fmt.Errorf("--backend %q: want auto, nccl or tcp", backend))
	}
	if v := strings.TrimSpace(f.String("hang-timeout")); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			d, err = parseSeconds(v)
		}
		if err != nil || d < 0 || d > maxDuration {
			r.fail(fmt.Errorf("--hang-timeout %q: want seconds or a duration like 5m, at most a year", v))
		}
		s.HangTimeout = d
	}
}

// signals resolves --signals-to-handle.
func (r *resolver) signals(s *elastic.Spec) {
	signals := r.f.String("signals-to-handle")
	if r.inSlurmStep && !r.f.IsSet("signals-to-handle") {
		// Slurm warns of preemption or a time limit (--signal) with USR1
		// or USR2, which workers want in order to checkpoint.
		signals += ",SIGUSR1,SIGUSR2"
	}
	var err error
	if s.Signals, err = elastic.ParseSignals(signals); err != nil {
		r.fail(err)
	}
}

// nproc resolves --nproc-per-node.
func (r *resolver) nproc(s *elastic.Spec) {
	nproc := r.f.String("nproc-per-node")
	if headMode(r.f) && !isNumber(nproc) {
		// Every host counts its own GPUs or CPUs (see planHead); the head
		// may have none.
		s.NProcPerNode = 1
		return
	}
	var err error
	if s.NProcPerNode, err = elastic.ResolveNProc(nproc, r.m.countGPUs); err != nil {
		r.fail(err)
		return
	}
	// Found out now, not 27 s and hundreds of workers later.
	if files := r.m.maxFiles; files > 0 && uint64(s.NProcPerNode) > (files-min(files, filesReserve))/filesPerWorker {
		r.fail(fmt.Errorf("--nproc-per-node %d: this process may hold %d open files (ulimit -n), enough for %d workers",
			s.NProcPerNode, files, (files-min(files, filesReserve))/filesPerWorker))
	}
	if procs := r.m.maxProcs; procs > 0 && uint64(s.NProcPerNode) >= procs {
		r.fail(fmt.Errorf("--nproc-per-node %d: this user may run %d processes (ulimit -u)", s.NProcPerNode, procs))
	}
}

// storeFiles checks, on a node that may host the store the workers join,
// that its open-files limit holds a connection from every rank of the
// job, one from every agent, the store's reserve of descriptors and this
// node's own workers' files: at the smallest --nnodes (else the job
// cannot start: an error, before anything starts, for exit 71), and at
// the largest (else a warning: the job fails once that many nodes come).
// With c10d and etcd the node that becomes group rank 0 hosts it, which
// is any node until --node-rank says otherwise. Each rank is one
// connection, as torch 2.x's client opens; torch 1.13's opens a second,
// idle one, which the store closes once its handshake times out.
func (r *resolver) storeFiles(s *elastic.Spec) {
	files := r.m.maxFiles
	if files == 0 || !s.ShareStore || headMode(r.f) || s.NodeRank > 0 {
		return
	}
	need := func(nodes int) uint64 {
		ranks := uint64(nodes) * uint64(s.NProcPerNode)
		reserve := min(uint64(rendezvous.DefaultFDReserve), files/4)
		return ranks + uint64(nodes) + reserve + uint64(s.NProcPerNode)*filesPerWorker + filesReserve
	}
	at := func(nodes int) string {
		return fmt.Sprintf("%d nodes of %d workers need about %d open files for the store this node may host (a connection per rank and per agent, its reserve of %d, and this node's workers' %d)",
			nodes, s.NProcPerNode, need(nodes), min(uint64(rendezvous.DefaultFDReserve), files/4), uint64(s.NProcPerNode)*filesPerWorker+filesReserve)
	}
	switch {
	case need(s.MinNodes) > files:
		r.scarce = fmt.Errorf("%s; this process may hold %d (ulimit -n; raise its hard limit): %w", at(s.MinNodes), files, syscall.EMFILE)
	case need(s.MaxNodes) > files:
		r.note(zerolog.WarnLevel, "%s; this process may hold %d (ulimit -n): the job fails if that many nodes join", at(s.MaxNodes), files)
	}
}

// rendezvous resolves how this node meets the others: --nnodes, the
// backend and its endpoint, --rdzv-conf, --standalone and, inside an srun
// step, what Slurm says.
func (r *resolver) rendezvous(s *elastic.Spec) {
	f := r.f
	var err error
	if s.MinNodes, s.MaxNodes, err = elastic.ParseNNodes(f.String("nnodes")); err != nil {
		r.fail(err)
	}
	if f.String("master-port") != "" {
		s.MasterPort = r.int("master-port")
	}
	conf, err := elastic.ParseRdzvConf(f.String("rdzv-conf"))
	if err != nil {
		r.fail(err)
	}
	c := &rdzvConf{r: r, kv: conf}
	s.Backend = f.String("rdzv-backend")
	if s.Backend == "etcd-v2" {
		s.Backend = "etcd"
	}
	endpoint := f.String("rdzv-endpoint")
	if hosts := f.String("node-hosts"); hosts != "" {
		// The head's names of the hosts, for reports of who is missing.
		s.NodeHosts = strings.Split(hosts, ",")
	}
	nodeRankFromSlurm := r.slurm(s, &endpoint)
	if s.Backend == "" {
		// torchrun's default is static, with --rdzv-endpoint standing for
		// --master-addr:--master-port; a range of nodes needs c10d.
		s.Backend = "static"
		if s.MinNodes != s.MaxNodes {
			s.Backend = "c10d"
		}
	}
	_, timeoutSet := conf["timeout"]
	s.StoreTimeout = c.seconds("timeout", s.StoreTimeout)
	s.ExitBarrierTimeout = c.seconds("exit_barrier_timeout", 60*time.Second)
	switch s.Backend {
	case "static":
		if endpoint != "" {
			host, port, err := splitEndpoint(endpoint, s.MasterPort)
			if err != nil {
				r.fail(err)
			}
			s.MasterAddr, s.MasterPort = host, port
			for _, inert := range []string{"master-addr", "master-port"} {
				if f.IsSet(inert) {
					r.note(zerolog.WarnLevel, "--%s has no effect: --rdzv-endpoint %s names the store", inert, endpoint)
				}
			}
		}
		if rank, ok := c.int("rank"); ok {
			switch {
			case !f.IsSet("node-rank") && !nodeRankFromSlurm:
				s.NodeRank = rank
			case rank != s.NodeRank:
				r.fail(fmt.Errorf("--rdzv-conf rank=%d: this node's rank is --node-rank %d", rank, s.NodeRank))
			}
		}
	case "c10d":
		s.Dynamic = c.dynamic(endpoint)
		if !f.IsSet("node-rank") && !nodeRankFromSlurm {
			s.NodeRank = -1
		}
		for _, inert := range []string{"master-addr", "master-port"} {
			if f.IsSet(inert) {
				r.note(zerolog.WarnLevel, "--%s has no effect with --rdzv-backend c10d: the store is at --rdzv-endpoint", inert)
			}
		}
	case "etcd":
		// torch's etcd rendezvous reads timeout as its join timeout.
		s.Dynamic, s.Etcd = c.etcd(endpoint, s.StoreTimeout, timeoutSet)
		if s.RunID == "none" && !f.Bool("standalone") && !headMode(f) {
			// A job's state stays in etcd after it ends: a second job
			// under the same id would find it over and do nothing.
			r.fail(errors.New("--rdzv-backend etcd needs a --rdzv-id of the job's own: its state stays in etcd after it ends"))
		}
		if !f.IsSet("node-rank") && !nodeRankFromSlurm {
			s.NodeRank = -1
		}
		for _, inert := range []string{"master-addr", "master-port"} {
			if f.IsSet(inert) {
				r.note(zerolog.WarnLevel, "--%s has no effect with --rdzv-backend etcd: the rendezvous is in etcd at --rdzv-endpoint", inert)
			}
		}
	default:
		r.fail(fmt.Errorf("--rdzv-backend %q: want static, c10d or etcd", s.Backend))
	}
	c.rest(s.Backend)
	if f.Bool("standalone") {
		s.Backend, s.MinNodes, s.MaxNodes, s.NodeRank, s.MasterPort = "static", 1, 1, 0, 0
		s.MasterAddr = "127.0.0.1"
		if s.RunID == "none" {
			s.RunID = r.m.randomID()
		}
	}
}

// slurm applies what an srun step says, unless the user said otherwise:
// how many nodes there are, which one this is and where the store is;
// with --slurm-direct it also places every worker. It reports whether the
// node rank is Slurm's.
func (r *resolver) slurm(s *elastic.Spec, endpoint *string) (nodeRankFromSlurm bool) {
	f := r.f
	step, inStep, err := launcher.DetectSlurm(r.m.lookupEnv)
	if err != nil {
		r.fail(err)
		return false
	}
	r.inSlurmStep = inStep
	switch {
	case f.Bool("slurm-direct"):
		if err := r.slurmDirect(s, step, inStep); err != nil {
			r.fail(err)
			return false
		}
		r.note(zerolog.InfoLevel, "inside Slurm step of job %s: this task is worker %d of %d", step.JobID, s.NodeRank, s.MaxNodes)
	case inStep && !f.IsSet("nnodes") && *endpoint == "" && !f.Bool("standalone"):
		s.MinNodes, s.MaxNodes = step.NNodes, step.NNodes
		s.NodeHosts = step.Nodes
		*endpoint = net.JoinHostPort(step.Nodes[0], strconv.Itoa(step.Port()))
		s.Backend = "c10d"
		if !f.IsSet("node-rank") {
			// Group ranks follow Slurm's node order, not the order nodes
			// happen to join in.
			s.NodeRank, nodeRankFromSlurm = step.NodeRank, true
		}
		if !f.IsSet("rdzv-id") {
			s.RunID = "slurm-" + step.JobID
		}
		if f.String("nproc-per-node") == "auto" && step.GPUsOnNode > 0 {
			s.NProcPerNode = step.GPUsOnNode
		}
		r.note(zerolog.InfoLevel, "inside Slurm step of job %s: node %d of %d, store at %s", step.JobID, step.NodeRank, step.NNodes, *endpoint)
	}
	return nodeRankFromSlurm
}

// slurmDirect makes this Slurm task one worker: a static rendezvous of one
// "node" per task on the step's first node, with the worker's local rank
// and node as Slurm placed it. inStep is false outside an srun step.
func (r *resolver) slurmDirect(s *elastic.Spec, step launcher.SlurmStep, inStep bool) error {
	f := r.f
	if !inStep {
		return errors.New("--slurm-direct runs inside an srun step, and SLURM_JOB_ID or SLURM_STEP_ID is not set")
	}
	task, err := launcher.SlurmTaskOf(step, r.m.lookupEnv)
	if err != nil {
		return fmt.Errorf("--slurm-direct: %w", err)
	}
	for _, placed := range []string{"nnodes", "node-rank", "rdzv-endpoint", "rdzv-backend", "master-addr", "master-port", "standalone"} {
		if f.IsSet(placed) {
			return fmt.Errorf("--slurm-direct takes the job's shape from Slurm: drop --%s", placed)
		}
	}
	if f.IsSet("nproc-per-node") && f.String("nproc-per-node") != "1" {
		return errors.New("--slurm-direct runs one worker per Slurm task: ask srun for tasks (--ntasks-per-node) instead of --nproc-per-node")
	}
	s.Backend, s.NProcPerNode = "static", 1
	s.MinNodes, s.MaxNodes, s.NodeRank = task.Tasks, task.Tasks, task.Rank
	s.MasterAddr, s.MasterPort = task.Nodes[0], task.Port()
	if !f.IsSet("rdzv-id") {
		s.RunID = "slurm-" + task.JobID
	}
	s.Placement = &elastic.Placement{
		LocalRank: task.LocalRank, LocalWorldSize: task.LocalTasks,
		NodeRank: task.NodeRank, NNodes: task.NNodes,
	}
	return nil
}

// localRanks is how many local ranks --redirects, --tee and the filters
// may name: a placed worker's is Slurm's, among the step's tasks on its node.
func localRanks(s *elastic.Spec) int {
	if s.Placement != nil {
		return s.Placement.LocalWorldSize
	}
	return s.NProcPerNode
}

// output resolves where the workers' output goes and how its lines look.
func (r *resolver) output(s *elastic.Spec) {
	f := r.f
	n := localRanks(s)
	var err error
	if s.Redirects, err = launcher.ParseStd(f.String("redirects"), n); err != nil {
		r.fail(fmt.Errorf("--redirects: %w", err))
	}
	if s.Tee, err = launcher.ParseStd(f.String("tee"), n); err != nil {
		r.fail(fmt.Errorf("--tee: %w", err))
	}
	if filter := f.String("local-ranks-filter"); filter != "" {
		if s.ConsoleRanks, err = launcher.ParseRankFilter(filter, n); err != nil {
			r.fail(fmt.Errorf("--local-ranks-filter: %w", err))
		}
	}
	s.DuplicateStdout = launcher.ParseLineFilters(f.String("duplicate-stdout-filters"))
	s.DuplicateStderr = launcher.ParseLineFilters(f.String("duplicate-stderr-filters"))
	switch specs := f.String("logs-specs"); specs {
	case "", "default", "DefaultLogsSpecs":
	default:
		r.fail(fmt.Errorf("--logs-specs %q: gorun writes torchrun's default log layout and loads no torchrun.logs_specs plugin; use --log-dir, --redirects, --tee and --local-ranks-filter", specs))
	}
	// An empty template, given on the command line or in the environment,
	// turns the prefix off.
	s.PrefixTemplate = launcher.DefaultPrefixTemplate
	if f.IsSet("log-line-prefix-template") {
		s.PrefixTemplate = f.String("log-line-prefix-template")
	} else if t, ok := r.m.lookupEnv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"); ok {
		s.PrefixTemplate = t
	}
	s.Timestamps = f.Bool("timestamps")
	switch mode := f.String("pty"); mode {
	case "auto":
		s.PTY = r.m.stdoutIsTerminal
	case "always", "never":
		s.PTY = mode == "always"
	default:
		r.fail(fmt.Errorf("--pty %q: want auto, always or never", mode))
	}
	s.LogDir = f.String("log-dir")
	s.MetricsAddr = f.String("metrics-addr")
	if s.Report = f.String("report"); s.Report != "" {
		if ext := strings.ToLower(filepath.Ext(s.Report)); ext != ".html" && ext != ".svg" {
			r.fail(fmt.Errorf("--report %q: want a FILE.html or FILE.svg", s.Report))
		}
	}
	// torch's LocalElasticAgent serves its file-timer watchdog on these.
	s.FileTimer = r.env("TORCHELASTIC_ENABLE_FILE_TIMER") == "1"
	s.TimerFile = r.env("TORCHELASTIC_TIMER_FILE")
	switch handler := f.String("event-log-handler"); handler {
	case "", "null", "console":
		s.EventLog = handler == "console"
	default:
		r.fail(fmt.Errorf("--event-log-handler %q: want null or console", handler))
	}
}

// placement resolves which CPUs each worker is bound to: --bind-to, as
// mpirun, or --numa-binding, as torchrun.
func (r *resolver) placement(s *elastic.Spec) {
	f := r.f
	binding, err := launcher.ParseBinding(f.String("bind-to"))
	if err != nil {
		r.fail(fmt.Errorf("--bind-to %w", err))
		return
	}
	flag := "--bind-to"
	if numa := f.String("numa-binding"); numa != "" {
		if binding != launcher.BindNone {
			r.fail(errors.New("--bind-to and --numa-binding exclude each other"))
			return
		}
		if binding, err = launcher.ParseNUMABinding(numa); err != nil {
			r.fail(fmt.Errorf("--numa-binding %w", err))
			return
		}
		flag = "--numa-binding"
	}
	if binding == launcher.BindNone {
		return
	}
	if s.CPUs, err = r.m.cpusFor(binding, localRanks(s)); err != nil {
		r.fail(fmt.Errorf("%s %s: %w", flag, binding, err))
	}
}

// program resolves the worker command line and the name reports give it.
func (r *resolver) program(s *elastic.Spec, argv []string) {
	if len(argv) == 0 {
		r.fail(errors.New("no program given: gorun [flags] PROGRAM [ARGS...]"))
		return
	}
	f := r.f
	program, args := argv[0], argv[1:]
	module, noPython, runPath := f.Bool("module"), f.Bool("no-python"), f.Bool("run-path")
	if module && noPython {
		r.fail(errors.New("--module and --no-python exclude each other"))
	}
	python := cmp.Or(f.String("python"), r.env("PYTHON_EXEC"), launcher.DefaultPython)
	if runPath {
		s.Argv = append([]string{python, "-u", program}, args...)
	} else {
		s.Argv = launcher.Argv(program, args, python, module, noPython)
	}
	s.Python = s.Argv[0] == python && !noPython
	// Workers run here (the head's run on the hosts): a program that is
	// not here is named now, before any rendezvous.
	if r.m.lookPath != nil && !headMode(f) {
		if _, err := r.m.lookPath(s.Argv[0]); err != nil {
			r.missing = &missingProgramError{program: s.Argv[0], err: err}
		}
	}
	// Reports name the script or module, as torchrun's do, not the
	// interpreter that runs it.
	s.Name = program
}

// rdzvConf takes --rdzv-conf's keys out as the backend reads them, so
// that what is left can be named.
type rdzvConf struct {
	r  *resolver
	kv map[string]string
}

// take removes key and returns its value; alias is torch's other name
// for it, which must not disagree.
func (c *rdzvConf) take(key string, aliases ...string) (string, bool) {
	v, ok := c.kv[key]
	delete(c.kv, key)
	for _, alias := range aliases {
		if w, has := c.kv[alias]; has {
			delete(c.kv, alias)
			if ok && w != v {
				c.r.fail(fmt.Errorf("--rdzv-conf %s=%s and %s=%s: the same setting, two values", key, v, alias, w))
			}
			v, ok = w, true
		}
	}
	return v, ok
}

func (c *rdzvConf) seconds(key string, def time.Duration, aliases ...string) time.Duration {
	if v, ok := c.take(key, aliases...); ok {
		return c.r.seconds("--rdzv-conf "+key, v)
	}
	return def
}

func (c *rdzvConf) int(key string, aliases ...string) (int, bool) {
	v, ok := c.take(key, aliases...)
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		c.r.fail(fmt.Errorf("--rdzv-conf %s=%q: want a non-negative integer", key, v))
		return 0, false
	}
	return n, true
}

// dynamic reads the c10d settings, torch's names beside gorun's own.
func (c *rdzvConf) dynamic(endpoint string) elastic.DynamicSpec {
	var d elastic.DynamicSpec
	var err error
	if d.Host, d.Port, err = splitEndpoint(cmp.Or(endpoint, "localhost"), rendezvous.DefaultEndpointPort); err != nil {
		c.r.fail(err)
	}
	d.JoinTimeout = c.seconds("join_timeout", rendezvous.DefaultJoinTimeout)
	d.LastCallTimeout = c.seconds("last_call_timeout", rendezvous.DefaultLastCallTimeout)
	d.CloseTimeout = c.seconds("close_timeout", rendezvous.DefaultCloseTimeout)
	d.ReadTimeout = c.seconds("read_timeout", 60*time.Second)
	// torch's keep-alives are gorun's heartbeats: a node is dead after
	// keep_alive_max_attempt intervals without one.
	d.HeartbeatInterval = c.seconds("heartbeat_interval", rendezvous.DefaultHeartbeatInterval, "keep_alive_interval")
	d.HeartbeatTimeout = c.seconds("heartbeat_timeout", 0)
	d.HeartbeatMisses = rendezvous.DefaultHeartbeatMisses
	if n, ok := c.int("heartbeat_misses", "keep_alive_max_attempt"); ok {
		if n < 1 {
			c.r.fail(fmt.Errorf("--rdzv-conf heartbeat_misses=%d: want a positive integer", n))
		}
		d.HeartbeatMisses = n
	}
	d.FailureGrace = c.seconds("failure_grace", d.HeartbeatInterval*time.Duration(d.HeartbeatMisses+1))
	if v, ok := c.take("is_host"); ok {
		isHost, err := strconv.ParseBool(v)
		if err != nil {
			c.r.fail(fmt.Errorf("--rdzv-conf is_host=%q: want true or false", v))
		}
		d.IsHost = &isHost
	}
	if v, ok := c.take("store_type"); ok && strings.ToLower(v) != "tcp" {
		c.r.fail(fmt.Errorf("--rdzv-conf store_type=%q: gorun's c10d store is a TCPStore; want tcp", v))
	}
	// torch 2.x picks its store's server; gorun serves its own.
	c.take("use_libuv")
	// gorun's own: the file of the job's secret (main reads it).
	d.TokenFile, _ = c.take("token_file")
	return d
}

// etcd reads the etcd settings: the members (--rdzv-endpoint, any number,
// comma-separated, port 2379 by default), torch's protocol, cacert, cert
// and key, the rendezvous timeouts (join_timeout, else timeout as torch's
// etcd rendezvous reads it), and lease_ttl.
func (c *rdzvConf) etcd(endpoint string, timeout time.Duration, timeoutSet bool) (elastic.DynamicSpec, elastic.EtcdSpec) {
	var e elastic.EtcdSpec
	for _, ep := range strings.Split(cmp.Or(endpoint, "localhost:2379"), ",") {
		host, port, err := splitEndpoint(strings.TrimSpace(ep), 2379)
		if err != nil {
			c.r.fail(err)
			continue
		}
		e.Endpoints = append(e.Endpoints, net.JoinHostPort(host, strconv.Itoa(port)))
	}
	switch p, _ := c.take("protocol"); strings.ToLower(p) {
	case "", "http":
	case "https":
		e.TLS = true
	default:
		c.r.fail(fmt.Errorf("--rdzv-conf protocol=%q: want http or https", p))
	}
	e.CACert, _ = c.take("cacert")
	e.Cert, _ = c.take("cert")
	e.Key, _ = c.take("key")
	if (e.Cert == "") != (e.Key == "") {
		c.r.fail(errors.New("--rdzv-conf cert and key: a client certificate needs both"))
	}
	if !e.TLS && (e.CACert != "" || e.Cert != "") {
		c.r.fail(errors.New("--rdzv-conf cacert, cert and key need protocol=https"))
	}
	e.LeaseTTL = c.seconds("lease_ttl", rendezvousetcd.DefaultLeaseTTL, "ttl")
	if e.LeaseTTL < time.Second {
		c.r.fail(fmt.Errorf("--rdzv-conf lease_ttl=%v: etcd counts leases in whole seconds; want at least 1", e.LeaseTTL))
	}
	join := rendezvous.DefaultJoinTimeout
	if timeoutSet {
		join = timeout
	}
	var d elastic.DynamicSpec
	d.JoinTimeout = c.seconds("join_timeout", join)
	d.LastCallTimeout = c.seconds("last_call_timeout", rendezvous.DefaultLastCallTimeout)
	d.CloseTimeout = c.seconds("close_timeout", rendezvous.DefaultCloseTimeout)
	d.ReadTimeout = c.seconds("read_timeout", rendezvousetcd.DefaultRequestTimeout)
	// A lost node is known one lease TTL after it died; a failure its
	// death caused elsewhere must wait that long before it spends a
	// restart.
	d.FailureGrace = c.seconds("failure_grace", 2*e.LeaseTTL)
	return d, e
}

// etcdKeys are the --rdzv-conf keys only etcd reads.
var etcdKeys = []string{"protocol", "cacert", "cert", "key", "lease_ttl", "ttl"}

// c10dKeys are the --rdzv-conf keys only c10d reads, torch's and gorun's.
var c10dKeys = []string{
	"join_timeout", "last_call_timeout", "close_timeout", "read_timeout", "is_host", "store_type", "use_libuv",
	"keep_alive_interval", "keep_alive_max_attempt", "heartbeat_timeout",
	"heartbeat_interval", "heartbeat_misses", "failure_grace", "token_file",
}

// rest names the keys no part took: a key of another backend has no
// effect here; an unknown one is listed with the names gorun knows.
func (c *rdzvConf) rest(backend string) {
	for _, key := range slices.Sorted(maps.Keys(c.kv)) {
		switch {
		case slices.Contains(etcdKeys, key):
			c.r.note(zerolog.WarnLevel, "--rdzv-conf %s has no effect with --rdzv-backend %s: it configures etcd", key, backend)
		case slices.Contains(c10dKeys, key):
			c.r.note(zerolog.WarnLevel, "--rdzv-conf %s has no effect with --rdzv-backend %s: it configures c10d", key, backend)
		case key == "rank":
			c.r.note(zerolog.WarnLevel, "--rdzv-conf rank has no effect with --rdzv-backend %s: the rendezvous decides ranks (use --node-rank to ask for one)", backend)
		default:
			c.r.note(zerolog.WarnLevel, "--rdzv-conf %s is not a rendezvous setting; gorun knows timeout, exit_barrier_timeout, rank (static), %s (c10d) and %s (etcd)", key, strings.Join(c10dKeys, ", "), strings.Join(etcdKeys, ", "))
		}
	}
}

// splitEndpoint parses HOST[:PORT], with IPv6 hosts in brackets; a missing
// port is defaultPort.
func splitEndpoint(endpoint string, defaultPort int) (string, int, error) {
	host, portText := endpoint, ""
	if i := strings.LastIndex(endpoint, ":"); i >= 0 && !strings.HasSuffix(endpoint, "]") {
		host, portText = endpoint[:i], endpoint[i+1:]
	}
	bracketed := strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]")
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if err := checkEndpointHost(host, bracketed); err != nil {
		return "", 0, fmt.Errorf("--rdzv-endpoint %q: %w", endpoint, err)
	}
	if portText == "" {
		return host, defaultPort, nil
	}
	port, err := strconv.Atoi(portText)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("--rdzv-endpoint %q: bad port %q", endpoint, portText)
	}
	return host, port, nil
}

// checkEndpointHost accepts a host name or an address that can be dialled:
// an IPv6 address only in brackets (else its colons and the port's are one
// string), no unspecified address (0.0.0.0, ::), no stray characters.
func checkEndpointHost(host string, bracketed bool) error {
	if host == "" {
		return errors.New("no host")
	}
	if ip := net.ParseIP(host); ip != nil {
		switch {
		case ip.IsUnspecified():
			return fmt.Errorf("%s is no host to reach: name the store's host", host)
		case ip.To4() == nil && !bracketed:
			return fmt.Errorf("write an IPv6 address in brackets: [%s]:PORT", host)
		}
		return nil
	}
	for i, c := range host {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-' && i > 0
		if !ok {
			return fmt.Errorf("%q is not a host name or address", host)
		}
	}
	return nil
}

// isNumber reports whether s is a decimal integer.
func isNumber(s string) bool {
	_, err := strconv.Atoi(s)
	return err == nil
}
