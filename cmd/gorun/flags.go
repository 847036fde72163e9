package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"

	"github.com/rs/zerolog"
	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/elastic"
	"github.com/gorun/gorun/launcher"
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

// hiddenStringFlag is a flag gorun sets for itself (on remote agents):
// no torchrun spelling, no PET_ variable, not in --help.
func hiddenStringFlag(name, usage string) cli.Flag {
	f := &cli.StringFlag{Name: name, Hidden: true, Usage: usage}
	return namedString{f, f.Names()}
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
		stringFlag("rdzv-backend", "", "rendezvous backend: static or c10d (default: static, as torchrun's; c10d when --nnodes is a range)"),
		stringFlag("rdzv-endpoint", "", "rendezvous store HOST[:PORT] (static: instead of --master-addr:--master-port; c10d: default port 29400)"),
		stringFlag("rdzv-id", "none", "job id shared by all nodes (TORCHELASTIC_RUN_ID)"),
		stringFlag("rdzv-conf", "", "rendezvous settings k1=v1,...; c10d: join_timeout, last_call_timeout, close_timeout, read_timeout, keep_alive_interval (or heartbeat_interval), keep_alive_max_attempt (or heartbeat_misses), heartbeat_timeout, failure_grace, is_host, store_type=tcp; static: timeout, rank; both: exit_barrier_timeout (times in seconds)"),
		boolFlag("standalone", "single-node job: store on an ephemeral loopback port, random run id"),
		stringFlag("backend", "", "what carries Go workers' GPU tensors: auto (NCCL when every rank has a GPU of its own, else TCP), nccl or tcp; sets GORUN_BACKEND"),
		boolFlag("slurm-direct", "inside an srun step, run every Slurm task as one worker placed by Slurm (RANK=$SLURM_PROCID, LOCAL_RANK=$SLURM_LOCALID)"),
		stringFlag("max-restarts", "0", "restarts of the worker group allowed after a failure"),
		stringFlag("monitor-interval", "0.1", "seconds between health checks of the workers"),
		stringFlag("start-method", "spawn", "torchrun's multiprocessing start method (spawn, fork, forkserver): accepted; gorun always starts fresh processes"),
		stringFlag("event-log-handler", "null", "torchelastic events: null (none) or console (one JSON line per event on stderr)"),
		boolFlag("use-env", "accepted for torch.distributed.launch scripts: workers always read LOCAL_RANK from the environment"),
		stringFlag("role", "default", "role of the workers (ROLE_NAME)"),
		boolFlag("module", "run PROGRAM as a Python module (python -m)", "m"),
		boolFlag("no-python", "execute PROGRAM directly, even if it ends in .py"),
		boolFlag("run-path", "run PROGRAM as a Python file whatever its name"),
		stringFlag("python", "", "Python interpreter for .py programs (default $PYTHON_EXEC or python3)"),
		stringFlag("log-dir", "", "folder for <run_id>/attempt_<k>/<local_rank>/{stdout,stderr}.log"),
		stringFlag("metrics-addr", "", "serve the agent's Prometheus metrics (gorun_*) on HOST:PORT at /metrics"),
		stringFlag("report", "", "when the job ends, write a picture of it on this node (a row per rank over time: starts, restarts, exits, rounds, hangs) to FILE.html or FILE.svg"),
		stringFlag("redirects", "0", "streams sent to log files only: 0 none, 1 stdout, 2 stderr, 3 both, or per local rank 0:1,1:2", "r"),
		stringFlag("tee", "0", "streams sent to log files and the console (same syntax as --redirects)", "t"),
		stringFlag("local-ranks-filter", "", "local ranks shown on the console, e.g. 0,2 (files keep all)"),
		stringFlag("duplicate-stdout-filters", "", "copy tee'd stdout lines that contain any of these comma-separated strings (,, for a comma) to <log-dir>/<run_id>/attempt_<k>/filtered_stdout.log"),
		stringFlag("duplicate-stderr-filters", "", "the same for stderr, into filtered_stderr.log"),
		stringFlag("logs-specs", "", "torchrun's log layout plugin: only the default is supported"),
		stringFlag("local-addr", "", "address this node advertises to workers and peers"),
		stringFlag("signals-to-handle", "SIGTERM,SIGINT,SIGHUP,SIGQUIT", "signals forwarded to every worker's process group"),
		stringFlag("hang-timeout", "", "restart (or fail) the worker group when a worker using gorun's runtime makes no collective progress for this long: seconds or a duration like 5m; 0 or empty: off"),
		stringFlag("shutdown-timeout", "", "seconds between a forwarded signal and SIGKILL (default $TORCH_ELASTIC_SHUTDOWN_TIMEOUT or 30)"),
		boolFlag("virtual-local-rank", "every worker gets LOCAL_RANK=0 and one GPU in CUDA_VISIBLE_DEVICES"),
		stringFlag("log-line-prefix-template", "", "console prefix of worker lines with ${rank}, ${local_rank}, ${role_name}, ${hostname} (or ${host}); empty: no prefix (default [rank${rank}]: or $TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE)"),
		boolFlag("timestamps", "start every worker line on the console with the time"),
		stringFlag("bind-to", "none", "pin workers to CPUs: none; core (worker i on the i-th CPU gorun may use, wrapping around); numa (worker i on the CPUs of the i-th NUMA node); as mpirun --bind-to"),
		stringFlag("numa-binding", "", "pin workers as torchrun does, local rank i beside GPU i: node (its NUMA node's CPUs), socket (its socket's), exclusive (a share of its NUMA node's CPUs of its own), core-complex (the CPUs of one L3 cache of its NUMA node)"),
		stringFlag("pty", "auto", "give workers a pseudo-terminal as stdout: auto (when gorun's stdout is one), always, never"),
		stringFlag("log-format", "console", "launcher log format: console or json"),
		stringFlag("log-level", "", "launcher log level: debug, info, warn, error (default $LOGLEVEL or info)"),
	}
}

// specFromFlags resolves the command line into the agent's Spec and builds
// the launcher's logger: the edge where resolve's inputs are read from the
// process and the machine, and its notes logged.
func specFromFlags(c *cli.Context, stderr io.Writer) (elastic.Spec, zerolog.Logger, error) {
	res, err := resolve(c, c.Args().Slice(), machine{
		lookupEnv:        os.LookupEnv,
		environ:          os.Environ(),
		countGPUs:        visibleGPUs,
		cpusFor:          launcher.Binding.CPUsFor,
		stdoutIsTerminal: isTerminal(os.Stdout),
		hostname:         elastic.Hostname(),
		randomID:         randomID,
		maxFiles:         rlimit(unix.RLIMIT_NOFILE),
		maxProcs:         rlimit(unix.RLIMIT_NPROC),
		lookPath:         exec.LookPath,
	})
	log, logErr := newLogger(stderr, res.logFormat, res.logLevel)
	if logErr != nil {
		return res.spec, log, usageError{errors.Join(logErr, err)}
	}
	if err != nil {
		return res.spec, log, err
	}
	for _, n := range res.notes {
		log.WithLevel(n.level).Msg(n.msg)
	}
	return res.spec, log, nil
}

// rlimit is this process's soft limit on resource, 0 when there is none
// or it cannot be read. (Go raises the open-files limit to its hard limit
// when it starts.)
func rlimit(resource int) uint64 {
	var l unix.Rlimit
	if err := unix.Getrlimit(resource, &l); err != nil || l.Cur == unix.RLIM_INFINITY {
		return 0
	}
	return l.Cur
}

func randomID() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}
