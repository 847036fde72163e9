package main

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"github.com/urfave/cli/v2"

	"github.com/gorun/gorun/elastic"
	"github.com/gorun/gorun/launcher"
	"github.com/gorun/gorun/rendezvous"
)

// torchrunFlag names a flag the way torchrun does: dashed, with the
// underscored spelling as an alias and PET_<NAME> as the environment
// fallback.
func torchrunFlag(name string) (string, []string, []string) {
	var aliases []string
	if alt := strings.ReplaceAll(name, "-", "_"); alt != name {
		aliases = append(aliases, alt)
	}
	env := "PET_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
	return name, aliases, []string{env}
}

func stringFlag(name, value, usage string, short ...string) cli.Flag {
	n, aliases, env := torchrunFlag(name)
	f := &cli.StringFlag{Name: n, Aliases: append(aliases, short...), EnvVars: env, Value: value, Usage: usage}
	return namedString{f, f.Names()}
}

func boolFlag(name, usage string, short ...string) cli.Flag {
	n, aliases, env := torchrunFlag(name)
	f := &cli.BoolFlag{Name: n, Aliases: append(aliases, short...), EnvVars: env, Usage: usage}
	return namedBool{f, f.Names()}
}

// hiddenBoolFlag is a flag gorun sets for itself (on remote agents): no
// torchrun spelling, no PET_ variable, not in --help.
func hiddenBoolFlag(name, usage string) cli.Flag {
	f := &cli.BoolFlag{Name: name, Hidden: true, Usage: usage}
	return namedBool{f, f.Names()}
}

func stringSliceFlag(name, usage string) cli.Flag {
	f := &cli.StringSliceFlag{Name: name, Usage: usage}
	return namedStringSlice{f, f.Names()}
}

// urfave/cli works a flag's names out anew, a regular expression per
// name, whenever it looks a flag up, and every run looks every flag up
// by each of its names (runFlagActions): with gorun's fifty flags, 2 ms
// of a 13 ms launch. These answer from the list made once.
type (
	namedString struct {
		*cli.StringFlag
		names []string
	}
	namedBool struct {
		*cli.BoolFlag
		names []string
	}
	namedStringSlice struct {
		*cli.StringSliceFlag
		names []string
	}
)

func (f namedString) Names() []string      { return f.names }
func (f namedBool) Names() []string        { return f.names }
func (f namedStringSlice) Names() []string { return f.names }

func flags() []cli.Flag {
	return []cli.Flag{
		stringFlag("nproc-per-node", "1", "workers on this node: an integer, auto, cpu or gpu"),
		stringFlag("nnodes", "1:1", "number of nodes, N or MIN:MAX"),
		stringFlag("node-rank", "0", "rank of this node (static rendezvous)"),
		stringFlag("master-addr", "127.0.0.1", "address of the node that hosts the store (static rendezvous)"),
		stringFlag("master-port", "", "port of the store (static rendezvous); one node and none given: an ephemeral port"),
		stringFlag("rdzv-backend", "", "rendezvous backend: static or c10d (default: c10d when --nnodes is a range or --rdzv-endpoint is given, else static)"),
		stringFlag("rdzv-endpoint", "", "rendezvous store HOST[:PORT] (c10d: default port 29400; static: instead of --master-addr/--master-port)"),
		stringFlag("rdzv-id", "none", "job id shared by all nodes (TORCHELASTIC_RUN_ID)"),
		stringFlag("rdzv-conf", "", "rendezvous settings k1=v1,...: join_timeout, last_call_timeout, close_timeout, heartbeat_interval, heartbeat_misses, failure_grace, is_host, read_timeout, exit_barrier_timeout, timeout (seconds)"),
		boolFlag("standalone", "single-node job: store on an ephemeral loopback port, random run id"),
		stringFlag("backend", "", "what carries Go workers' GPU tensors: auto (NCCL when every rank has a GPU of its own, else TCP), nccl or tcp; sets GORUN_BACKEND"),
		boolFlag("slurm-direct", "inside an srun step, run every Slurm task as one worker placed by Slurm (RANK=$SLURM_PROCID, LOCAL_RANK=$SLURM_LOCALID)"),
		stringFlag("max-restarts", "0", "restarts of the worker group allowed after a failure"),
		stringFlag("monitor-interval", "0.1", "seconds between health checks of the workers"),
		stringFlag("role", "default", "role of the workers (ROLE_NAME)"),
		boolFlag("module", "run PROGRAM as a Python module (python -m)", "m"),
		boolFlag("no-python", "execute PROGRAM directly, even if it ends in .py"),
		boolFlag("run-path", "run PROGRAM as a Python file whatever its name"),
		stringFlag("python", "", "Python interpreter for .py programs (default $PYTHON_EXEC or python3)"),
		stringFlag("log-dir", "", "folder for <run_id>/attempt_<k>/<local_rank>/{stdout,stderr}.log"),
		stringFlag("redirects", "0", "streams sent to log files only: 0 none, 1 stdout, 2 stderr, 3 both, or per local rank 0:1,1:2", "r"),
		stringFlag("tee", "0", "streams sent to log files and the console (same syntax as --redirects)", "t"),
		stringFlag("local-ranks-filter", "", "local ranks shown on the console, e.g. 0,2 (files keep all)"),
		stringFlag("local-addr", "", "address this node advertises to workers and peers"),
		stringFlag("signals-to-handle", "SIGTERM,SIGINT,SIGHUP,SIGQUIT", "signals forwarded to every worker's process group"),
		stringFlag("hang-timeout", "", "restart (or fail) the worker group when a worker using gorun's runtime makes no collective progress for this long: seconds or a duration like 5m; 0 or empty: off"),
		stringFlag("shutdown-timeout", "", "seconds between a forwarded signal and SIGKILL (default $TORCH_ELASTIC_SHUTDOWN_TIMEOUT or 30)"),
		boolFlag("virtual-local-rank", "every worker gets LOCAL_RANK=0 and one GPU in CUDA_VISIBLE_DEVICES"),
		stringFlag("log-line-prefix-template", "", "console prefix of worker lines; ${rank}, ${local_rank}, ${role_name}, ${host} (default [rank${rank}]: or $TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE)"),
		boolFlag("timestamps", "start every worker line on the console with the time"),
		stringFlag("bind-to", "none", "pin workers to CPUs: none; core (worker i on the i-th CPU gorun may use, wrapping around); numa (worker i on the CPUs of the i-th NUMA node); as mpirun --bind-to"),
		stringFlag("pty", "auto", "give workers a pseudo-terminal as stdout: auto (when gorun's stdout is one), always, never"),
		stringFlag("log-format", "console", "launcher log format: console or json"),
		stringFlag("log-level", "", "launcher log level: debug, info, warn, error (default $LOGLEVEL or info)"),
	}
}

// specFromFlags turns the command line into the agent's Spec, with an error
// naming the flag for anything malformed.
func specFromFlags(c *cli.Context, stderr io.Writer) (elastic.Spec, zerolog.Logger, error) {
	var errs []error
	fail := func(err error) { errs = append(errs, err) }
	intFlag := func(name string) int {
		n, err := strconv.Atoi(strings.TrimSpace(c.String(name)))
		if err != nil {
			fail(fmt.Errorf("--%s %q: want an integer", name, c.String(name)))
		}
		return n
	}
	secondsFlag := func(name, value string) time.Duration {
		f, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil || f < 0 {
			fail(fmt.Errorf("--%s %q: want a number of seconds", name, value))
		}
		return time.Duration(f * float64(time.Second))
	}

	level := c.String("log-level")
	if level == "" {
		level = cmp.Or(os.Getenv("LOGLEVEL"), "info")
	}
	log, err := newLogger(stderr, c.String("log-format"), level)
	if err != nil {
		fail(err)
	}

	s := elastic.Spec{
		Role:             c.String("role"),
		RunID:            c.String("rdzv-id"),
		MasterAddr:       c.String("master-addr"),
		LocalAddr:        c.String("local-addr"),
		MaxRestarts:      intFlag("max-restarts"),
		NodeRank:         intFlag("node-rank"),
		MonitorInterval:  secondsFlag("monitor-interval", c.String("monitor-interval")),
		ShutdownTimeout:  secondsFlag("shutdown-timeout", cmp.Or(c.String("shutdown-timeout"), os.Getenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT"), "30")),
		VirtualLocalRank: c.Bool("virtual-local-rank"),
		Timestamps:       c.Bool("timestamps"),
		PrefixTemplate:   cmp.Or(c.String("log-line-prefix-template"), os.Getenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"), launcher.DefaultPrefixTemplate),
		ShareStore:       os.Getenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE") != "1",
		StoreTimeout:     900 * time.Second,
		Env:              os.Environ(),
		Host:             elastic.Hostname(),
	}
	if nproc := c.String("nproc-per-node"); headMode(c) && !isNumber(nproc) {
		// Every host counts its own GPUs or CPUs (see planHead); the head
		// may have none.
		s.NProcPerNode = 1
	} else if s.NProcPerNode, err = elastic.ResolveNProc(nproc, visibleGPUs); err != nil {
		fail(err)
	}
	if s.MinNodes, s.MaxNodes, err = elastic.ParseNNodes(c.String("nnodes")); err != nil {
		fail(err)
	}
	if port := c.String("master-port"); port != "" {
		s.MasterPort = intFlag("master-port")
	}
	conf, err := elastic.ParseRdzvConf(c.String("rdzv-conf"))
	if err != nil {
		fail(err)
	}
	confSeconds := func(key string, def time.Duration) time.Duration {
		if v, ok := conf[key]; ok {
			delete(conf, key)
			return secondsFlag("rdzv-conf "+key, v)
		}
		return def
	}
	s.Backend = c.String("rdzv-backend")
	endpoint := c.String("rdzv-endpoint")
	slurm, inSlurm, slurmErr := launcher.DetectSlurm(os.LookupEnv)
	nodeRankFromSlurm := false
	if slurmErr != nil {
		fail(slurmErr)
	}
	// Inside an srun step, with no say of the user's, Slurm says how many
	// nodes there are, which one this is, and where the store is; with
	// --slurm-direct it also places every worker.
	if c.Bool("slurm-direct") {
		// A malformed step is reported once, above.
		if slurmErr == nil {
			if err := slurmDirect(c, &s, slurm, inSlurm); err != nil {
				fail(err)
			}
		}
		log.Info().Str("job", slurm.JobID).Int("rank", s.NodeRank).Int("world_size", s.MaxNodes).
			Msg("inside a Slurm step: this task is one worker")
	} else if inSlurm && !c.IsSet("nnodes") && endpoint == "" && !c.Bool("standalone") {
		s.MinNodes, s.MaxNodes = slurm.NNodes, slurm.NNodes
		endpoint = net.JoinHostPort(slurm.Nodes[0], strconv.Itoa(slurm.Port()))
		s.Backend = "c10d"
		if !c.IsSet("node-rank") {
			// Group ranks follow Slurm's node order, not the order nodes
			// happen to join in.
			s.NodeRank = slurm.NodeRank
			nodeRankFromSlurm = true
		}
		if !c.IsSet("rdzv-id") {
			s.RunID = "slurm-" + slurm.JobID
		}
		if c.String("nproc-per-node") == "auto" && slurm.GPUsOnNode > 0 {
			s.NProcPerNode = slurm.GPUsOnNode
		}
		log.Info().Str("job", slurm.JobID).Int("nodes", slurm.NNodes).Int("node_rank", slurm.NodeRank).
			Str("endpoint", endpoint).Msg("inside a Slurm step")
	}
	if s.Backend == "" {
		s.Backend = "static"
		if s.MinNodes != s.MaxNodes || endpoint != "" {
			s.Backend = "c10d"
		}
	}
	s.StoreTimeout = confSeconds("timeout", s.StoreTimeout)
	s.ExitBarrierTimeout = confSeconds("exit_barrier_timeout", 60*time.Second)
	switch s.Backend {
	case "static":
		if endpoint != "" {
			host, port, err := splitEndpoint(endpoint, 0)
			if err != nil {
				fail(err)
			}
			s.MasterAddr, s.MasterPort = host, port
		}
	case "c10d":
		s.Dynamic, err = dynamicSpec(endpoint, conf, confSeconds)
		if err != nil {
			fail(err)
		}
		if !c.IsSet("node-rank") && !nodeRankFromSlurm {
			s.NodeRank = -1
		}
		for _, inert := range []string{"master-addr", "master-port"} {
			if c.IsSet(inert) {
				log.Warn().Msgf("--%s has no effect with --rdzv-backend c10d: the store is at --rdzv-endpoint", inert)
			}
		}
	default:
		fail(fmt.Errorf("--rdzv-backend %q: want static or c10d", s.Backend))
	}
	for key := range conf {
		log.Warn().Msgf("--rdzv-conf %s has no effect with --rdzv-backend %s", key, s.Backend)
	}
	if c.Bool("standalone") {
		s.Backend, s.MinNodes, s.MaxNodes, s.NodeRank, s.MasterPort = "static", 1, 1, 0, 0
		s.MasterAddr = "127.0.0.1"
		if s.RunID == "none" {
			s.RunID = randomID()
		}
	}
	signals := c.String("signals-to-handle")
	if inSlurm && !c.IsSet("signals-to-handle") {
		// Slurm warns of preemption or a time limit (--signal) with USR1
		// or USR2, which workers want in order to checkpoint.
		signals += ",SIGUSR1,SIGUSR2"
	}
	if s.Signals, err = elastic.ParseSignals(signals); err != nil {
		fail(err)
	}
	// These name local ranks as workers see them: a placed worker's is
	// Slurm's, among the step's tasks on its node.
	localRanks := s.NProcPerNode
	if s.Placement != nil {
		localRanks = s.Placement.LocalWorldSize
	}
	if s.Redirects, err = launcher.ParseStd(c.String("redirects"), localRanks); err != nil {
		fail(fmt.Errorf("--redirects: %w", err))
	}
	if s.Tee, err = launcher.ParseStd(c.String("tee"), localRanks); err != nil {
		fail(fmt.Errorf("--tee: %w", err))
	}
	if filter := c.String("local-ranks-filter"); filter != "" {
		if s.ConsoleRanks, err = launcher.ParseRankFilter(filter, localRanks); err != nil {
			fail(fmt.Errorf("--local-ranks-filter: %w", err))
		}
	}
	switch mode := c.String("pty"); mode {
	case "auto":
		s.PTY = isTerminal(os.Stdout)
	case "always", "never":
		s.PTY = mode == "always"
	default:
		fail(fmt.Errorf("--pty %q: want auto, always or never", mode))
	}
	if binding, err := launcher.ParseBinding(c.String("bind-to")); err != nil {
		fail(fmt.Errorf("--bind-to %w", err))
	} else if s.CPUs, err = binding.CPUsFor(localRanks); err != nil {
		fail(fmt.Errorf("--bind-to %s: %w", binding, err))
	}
	switch backend := c.String("backend"); backend {
	case "":
	case "auto", "nccl", "tcp":
		s.Env = append(s.Env, "GORUN_BACKEND="+backend)
	default:
		fail(fmt.Errorf("--backend %q: want auto, nccl or tcp", backend))
	}
	s.LogDir = c.String("log-dir")
	// torch's LocalElasticAgent serves its file-timer watchdog on these.
	s.FileTimer = os.Getenv("TORCHELASTIC_ENABLE_FILE_TIMER") == "1"
	s.TimerFile = os.Getenv("TORCHELASTIC_TIMER_FILE")
	if v := strings.TrimSpace(c.String("hang-timeout")); v != "" {
		if s.HangTimeout, err = time.ParseDuration(v); err != nil {
			f, ferr := strconv.ParseFloat(v, 64)
			if ferr != nil {
				fail(fmt.Errorf("--hang-timeout %q: want seconds or a duration like 5m", v))
			}
			s.HangTimeout = time.Duration(f * float64(time.Second))
		}
	}

	program, args := c.Args().First(), c.Args().Tail()
	module, noPython, runPath := c.Bool("module"), c.Bool("no-python"), c.Bool("run-path")
	if module && noPython {
		fail(errors.New("--module and --no-python exclude each other"))
	}
	python := cmp.Or(c.String("python"), os.Getenv("PYTHON_EXEC"), launcher.DefaultPython)
	if runPath {
		s.Argv = append([]string{python, "-u", program}, args...)
	} else {
		s.Argv = launcher.Argv(program, args, python, module, noPython)
	}
	s.Python = s.Argv[0] == python && !noPython

	if len(errs) == 0 {
		if err := s.Validate(); err != nil {
			fail(err)
		}
	}
	if len(errs) > 0 {
		return s, log, usageError{errors.Join(errs...)}
	}
	return s, log, nil
}

// dynamicSpec reads the c10d rendezvous settings: the endpoint and the
// --rdzv-conf keys it understands (taken out of conf).
func dynamicSpec(endpoint string, conf map[string]string, seconds func(string, time.Duration) time.Duration) (elastic.DynamicSpec, error) {
	var d elastic.DynamicSpec
	if endpoint == "" {
		endpoint = "localhost"
	}
	var err error
	if d.Host, d.Port, err = splitEndpoint(endpoint, rendezvous.DefaultEndpointPort); err != nil {
		return d, err
	}
	d.JoinTimeout = seconds("join_timeout", rendezvous.DefaultJoinTimeout)
	d.LastCallTimeout = seconds("last_call_timeout", rendezvous.DefaultLastCallTimeout)
	d.CloseTimeout = seconds("close_timeout", rendezvous.DefaultCloseTimeout)
	d.ReadTimeout = seconds("read_timeout", 60*time.Second)
	d.HeartbeatInterval = seconds("heartbeat_interval", rendezvous.DefaultHeartbeatInterval)
	d.HeartbeatMisses = rendezvous.DefaultHeartbeatMisses
	if v, ok := conf["heartbeat_misses"]; ok {
		delete(conf, "heartbeat_misses")
		if d.HeartbeatMisses, err = strconv.Atoi(v); err != nil || d.HeartbeatMisses < 1 {
			return d, fmt.Errorf("--rdzv-conf heartbeat_misses=%q: want a positive integer", v)
		}
	}
	d.FailureGrace = seconds("failure_grace", d.HeartbeatInterval*time.Duration(d.HeartbeatMisses+1))
	if v, ok := conf["is_host"]; ok {
		delete(conf, "is_host")
		isHost, err := strconv.ParseBool(v)
		if err != nil {
			return d, fmt.Errorf("--rdzv-conf is_host=%q: want true or false", v)
		}
		d.IsHost = &isHost
	}
	return d, nil
}

// splitEndpoint parses HOST[:PORT], with IPv6 hosts in brackets; a missing
// port is defaultPort.
func splitEndpoint(endpoint string, defaultPort int) (string, int, error) {
	host, portText := endpoint, ""
	if i := strings.LastIndex(endpoint, ":"); i >= 0 && !strings.HasSuffix(endpoint, "]") {
		host, portText = endpoint[:i], endpoint[i+1:]
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if host == "" {
		return "", 0, fmt.Errorf("--rdzv-endpoint %q: no host", endpoint)
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

func randomID() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// slurmDirect makes this Slurm task one worker: a static rendezvous of one
// "node" per task on the step's first node, with the worker's local rank
// and node as Slurm placed it. step is what DetectSlurm found; inStep is
// false outside an srun step.
func slurmDirect(c *cli.Context, s *elastic.Spec, step launcher.SlurmStep, inStep bool) error {
	if !inStep {
		return errors.New("--slurm-direct runs inside an srun step, and SLURM_JOB_ID or SLURM_STEP_ID is not set")
	}
	task, err := launcher.SlurmTaskOf(step, os.LookupEnv)
	if err != nil {
		return fmt.Errorf("--slurm-direct: %w", err)
	}
	for _, placed := range []string{"nnodes", "node-rank", "rdzv-endpoint", "rdzv-backend", "master-addr", "master-port", "standalone"} {
		if c.IsSet(placed) {
			return fmt.Errorf("--slurm-direct takes the job's shape from Slurm: drop --%s", placed)
		}
	}
	if c.IsSet("nproc-per-node") && c.String("nproc-per-node") != "1" {
		return errors.New("--slurm-direct runs one worker per Slurm task: ask srun for tasks (--ntasks-per-node) instead of --nproc-per-node")
	}
	s.Backend, s.NProcPerNode = "static", 1
	s.MinNodes, s.MaxNodes, s.NodeRank = task.Tasks, task.Tasks, task.Rank
	s.MasterAddr, s.MasterPort = task.Nodes[0], task.Port()
	if !c.IsSet("rdzv-id") {
		s.RunID = "slurm-" + task.JobID
	}
	s.Placement = &elastic.Placement{
		LocalRank: task.LocalRank, LocalWorldSize: task.LocalTasks,
		NodeRank: task.NodeRank, NNodes: task.NNodes,
	}
	return nil
}

// isNumber reports whether s is a decimal integer.
func isNumber(s string) bool {
	_, err := strconv.Atoi(s)
	return err == nil
}
