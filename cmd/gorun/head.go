package main

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"github.com/urfave/cli/v2"

	"github.com/gorun/gorun/elastic"
	"github.com/gorun/gorun/launcher"
	"github.com/gorun/gorun/rendezvous"
)

// envFileName is the file in the working directory whose VAR=value lines
// the head forwards to every remote agent, like DeepSpeed's .deepspeed_env.
const envFileName = ".gorun_env"

// headFlags are the flags of head mode: launching the job on several hosts
// over SSH from one command.
func headFlags() []cli.Flag {
	return []cli.Flag{
		stringFlag("hosts", "", "launch over SSH on these hosts: HOST[:SLOTS],... (SLOTS defaults to --nproc-per-node)"),
		stringFlag("hostfile", "", "launch over SSH on the hosts of FILE: one per line, 'host slots=N', 'host:N' or 'host'"),
		stringFlag("include", "", "hosts (and GPU ids) to use, DeepSpeed syntax: host1@host2:0,1"),
		stringFlag("exclude", "", "hosts (and GPU ids) to leave out, DeepSpeed syntax: host1@host2:0,1"),
		stringSliceFlag("x", "forward VAR (the head's value) or set VAR=value on every host; repeatable"),
		stringFlag("remote-gorun", "", "path of gorun on the remote hosts (default: this gorun's own path)"),
		boolFlag("stage-binary", "copy this gorun to hosts that lack it (into ~/.cache/gorun, or to --remote-gorun), then run that copy"),
		stringFlag("remote-dir", "", "working directory on the remote hosts (default: the current directory)"),
		boolFlag("ssh-accept-new", "add unknown host keys to known_hosts (StrictHostKeyChecking=accept-new)"),
		stringFlag("ssh-config", "", "ssh_config file (default ~/.ssh/config; none: read none)"),
		stringSliceFlag("ssh-identity", "private key to log in with; repeatable"),
		stringFlag("ssh-known-hosts", "", "known_hosts file (default: ssh_config's UserKnownHostsFile, then ~/.ssh/known_hosts)"),
		stringFlag("ssh-fanout", strconv.Itoa(launcher.DefaultFanOut), "the most SSH connections the head, and each host that relays the launch, opens and holds: beyond N hosts the launch is a tree"),
		boolFlag("ssh-no-tree", "launch every host from the head, however many (--ssh-fanout then bounds the connections being set up at once)"),
		stringFlag("ssh-retries", "3", "dial a host again up to N times when its sshd drops the connection during set-up (MaxStartups)"),
		hiddenBoolFlag(sshRelayFlag, "relay a tree launch: read the plan of this host's subtree from stdin: set on remote hosts"),
		hiddenStringFlag("node-hosts", "the job's hosts in node-rank order, as the head names them, for the rendezvous's reports: set on remote agents"),
		hiddenBoolFlag("exit-on-stdin-eof", "stop the job (as on SIGTERM) when stdin reaches EOF: set on remote agents"),
		hiddenBoolFlag(tokenStdinFlag, "read the rendezvous secret from the first line of stdin: set on remote agents"),
		hiddenBoolFlag(nodeHostsStdinFlag, "read --node-hosts from stdin, the line after the secret's if any: set on remote agents"),
	}
}

// headMode reports whether the command line asks for an SSH launch.
func headMode(c flagValues) bool {
	return c.String("hosts") != "" || c.String("hostfile") != ""
}

// headPlan is an SSH launch, checked and ready to start.
type headPlan struct {
	fanout launcher.Fanout
}

// planHead turns the command line into the head's plan, with a usageError
// for anything malformed. spec is the already-validated agent spec; secret
// is the job's rendezvous secret, or "" for a fresh one.
func planHead(c *cli.Context, spec elastic.Spec, secret string, log zerolog.Logger, stdout, stderr io.Writer) (*headPlan, error) {
	var errs []error
	fail := func(err error) { errs = append(errs, err) }
	for _, name := range []string{"nnodes", "node-rank", "standalone", "master-addr", "master-port"} {
		if c.IsSet(name) {
			fail(fmt.Errorf("--%s cannot be combined with --hosts/--hostfile: the head sets it for every host", name))
		}
	}
	// The hosts meet on c10d, the first one hosting the store, or on the
	// etcd cluster that --rdzv-endpoint names.
	backend := "c10d"
	switch c.String("rdzv-backend") {
	case "", "c10d":
	case "etcd", "etcd-v2":
		backend = "etcd"
		if c.String("rdzv-endpoint") == "" {
			fail(errors.New("--rdzv-backend etcd with --hosts/--hostfile: name the etcd members in --rdzv-endpoint"))
		}
	default:
		fail(fmt.Errorf("--rdzv-backend %q: --hosts/--hostfile use c10d or etcd", c.String("rdzv-backend")))
	}
	var hosts []launcher.Host
	var err error
	switch list, file := c.String("hosts"), c.String("hostfile"); {
	case list != "" && file != "":
		fail(errors.New("--hosts and --hostfile exclude each other"))
	case list != "":
		if hosts, err = launcher.ParseHostList(list, spec.NProcPerNode); err != nil {
			fail(fmt.Errorf("--hosts: %w", err))
		}
	default:
		f, err := os.Open(file)
		if err != nil {
			fail(fmt.Errorf("--hostfile: %w", err))
			break
		}
		hosts, err = launcher.ParseHostfile(f, file, spec.NProcPerNode)
		f.Close()
		if err != nil {
			fail(fmt.Errorf("--hostfile: %w", err))
		}
	}
	if hosts != nil {
		if hosts, err = launcher.SelectHosts(hosts, c.String("include"), c.String("exclude")); err != nil {
			fail(err)
		}
	}
	env, err := forwardedEnv(c.StringSlice("x"), envFileName, log)
	if err != nil {
		fail(err)
	}
	// env(1) would show the secret in the remote argv: it goes on stdin.
	env = slices.DeleteFunc(env, func(kv string) bool {
		if strings.HasPrefix(kv, rdzvTokenEnv+"=") {
			log.Warn().Msgf("%s is not forwarded: the head passes the job's secret over each SSH session", rdzvTokenEnv)
			return true
		}
		return false
	})
	if secret == "" {
		// Agents of one launch share a secret of its own.
		secret = rendezvous.NewSecret()
	}

	remoteGorun := c.String("remote-gorun")
	self, err := os.Executable()
	if err != nil && (remoteGorun == "" || c.Bool("stage-binary")) {
		fail(fmt.Errorf("cannot find this gorun's path: %w", err))
	}
	var stage *launcher.Binary
	if c.Bool("stage-binary") && err == nil {
		b, err := launcher.OpenBinary(self)
		if err != nil {
			fail(fmt.Errorf("--stage-binary: %w", err))
		}
		stage = &b
	}
	stageTo := remoteGorun
	remoteGorun = cmp.Or(remoteGorun, self)
	remoteDir := c.String("remote-dir")
	if remoteDir == "" {
		if remoteDir, err = os.Getwd(); err != nil {
			fail(fmt.Errorf("--remote-dir: %w", err))
		}
	}
	fanOut, err := strconv.Atoi(c.String("ssh-fanout"))
	if err != nil || fanOut < 1 {
		fail(fmt.Errorf("--ssh-fanout %q: want a number of connections, 1 or more", c.String("ssh-fanout")))
	}
	retries, err := strconv.Atoi(c.String("ssh-retries"))
	if err != nil || retries < 0 {
		fail(fmt.Errorf("--ssh-retries %q: want a number, 0 or more", c.String("ssh-retries")))
	}
	runID := c.String("rdzv-id")
	if runID == "none" || runID == "" {
		runID = randomID()
	}
	if len(errs) > 0 {
		return nil, usageError{errors.Join(errs...)}
	}

	prefix := "[${hostname}:${rank}]: "
	if c.IsSet("log-line-prefix-template") {
		prefix = c.String("log-line-prefix-template")
	}
	names := make([]string, len(hosts))
	for i, h := range hosts {
		names[i] = h.Name
	}
	// The host list goes on stdin, after the secret: in every agent's
	// argv it would make one SSH command O(hosts) long, past the kernel's
	// 128 KiB for one argument near 8,000 hosts.
	common := []string{"--nnodes", strconv.Itoa(len(hosts)), "--" + nodeHostsStdinFlag}
	hostLine := []byte(strings.Join(names, ",") + "\n")
	var passed []string
	for _, name := range []string{"rdzv-conf", "shutdown-timeout", "python", "role", "monitor-interval",
		"redirects", "tee", "local-ranks-filter", "signals-to-handle", "hang-timeout", "log-dir", "log-format", "log-level", "backend", "bind-to",
		"numa-binding", "duplicate-stdout-filters", "duplicate-stderr-filters", "event-log-handler", "report", "metrics-addr"} {
		if c.IsSet(name) {
			passed = append(passed, "--"+name, c.String(name))
		}
	}
	for _, name := range []string{"module", "no-python", "run-path", "virtual-local-rank", "timestamps"} {
		if c.Bool(name) {
			passed = append(passed, "--"+name)
		}
	}
	program := append([]string{c.Args().First()}, c.Args().Tail()...)

	// A host named without slots counts its own GPUs or CPUs for
	// --nproc-per-node auto, gpu or cpu: the head's may differ.
	nprocWord := c.String("nproc-per-node")
	if isNumber(nprocWord) {
		nprocWord = ""
	}
	agents := make([]launcher.RemoteAgent, len(hosts))
	for i, h := range hosts {
		nproc := strconv.Itoa(h.Slots)
		if h.DefaultSlots && nprocWord != "" {
			nproc = nprocWord
		}
		argv := append([]string{remoteGorun}, common...)
		argv = append(argv,
			"--node-rank", strconv.Itoa(i),
			"--nproc-per-node", nproc,
			"--rdzv-backend", backend,
			"--rdzv-endpoint")
		// The fanout fills the endpoint in once it has reached the first
		// host: --rdzv-endpoint, else that host's own address, never its
		// name in --hosts, which may be an ssh_config alias that only the
		// head knows (see launcher.Fanout.Endpoint).
		endpointArg := len(argv)
		argv = append(argv, "",
			"--rdzv-id", runID,
			"--max-restarts", c.String("max-restarts"),
			"--log-line-prefix-template", prefix)
		argv = append(argv, passed...)
		argv = append(argv, "--exit-on-stdin-eof")
		var stdin []byte
		if backend == "c10d" {
			// etcd authenticates its clients itself (TLS, see --rdzv-conf).
			argv = append(argv, "--"+tokenStdinFlag)
			stdin = []byte(secret + "\n")
		}
		stdin = append(stdin, hostLine...)
		argv = append(argv, "--")
		argv = append(argv, program...)
		hostEnv := env
		if h.GPUs != nil {
			ids := make([]string, len(h.GPUs))
			for j, g := range h.GPUs {
				ids[j] = strconv.Itoa(g)
			}
			hostEnv = append(append([]string(nil), env...), "CUDA_VISIBLE_DEVICES="+strings.Join(ids, ","))
		}
		agents[i] = launcher.RemoteAgent{Host: h.Name, Argv: argv, Env: hostEnv, EndpointArg: endpointArg, Stdin: stdin}
	}
	sshCfg := launcher.SSHConfig{
		IdentityFiles: c.StringSlice("ssh-identity"),
		ConfigFile:    c.String("ssh-config"),
		KnownHosts:    c.String("ssh-known-hosts"),
		AcceptNew:     c.Bool("ssh-accept-new"),
		LookupEnv:     os.LookupEnv,
		Logger:        log,
	}
	return &headPlan{fanout: launcher.Fanout{
		Agents:      agents,
		Dir:         remoteDir,
		SSH:         sshCfg,
		Stdout:      stdout,
		Stderr:      stderr,
		StopTimeout: spec.ShutdownTimeout + 5*time.Second,
		Stage:       stage,
		StageTo:     stageTo,
		// The first host's agent hosts the store (c10d, default port);
		// etcd's members are given.
		Endpoint:     c.String("rdzv-endpoint"),
		EndpointPort: rendezvous.DefaultEndpointPort,
		Logger:       log,
		FanOut:       fanOut,
		NoTree:       c.Bool("ssh-no-tree"),
		Relay:        []string{remoteGorun, "--" + sshRelayFlag},
		Retries:      retries,
	}}, nil
}

// forwardedEnv is the environment sent to every remote agent: the lines of
// envFile (if it exists in the working directory), then the -x flags.
func forwardedEnv(xs []string, envFile string, log zerolog.Logger) ([]string, error) {
	var env []string
	f, err := os.Open(envFile)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("%s: %w", envFile, err)
	default:
		defer f.Close()
		sc := bufio.NewScanner(f)
		for n := 1; sc.Scan(); n++ {
			line := strings.TrimSpace(sc.Text())
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			if k, _, ok := strings.Cut(line, "="); !ok || !validEnvName(k) {
				return nil, fmt.Errorf("%s:%d: %q is not VAR=value", filepath.Base(envFile), n, line)
			}
			env = append(env, line)
		}
		if err := sc.Err(); err != nil {
			return nil, fmt.Errorf("%s: %w", envFile, err)
		}
	}
	for _, x := range xs {
		k, _, hasValue := strings.Cut(x, "=")
		if !validEnvName(k) {
			return nil, fmt.Errorf("-x %q: want VAR or VAR=value", x)
		}
		if hasValue {
			env = append(env, x)
		} else if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		} else {
			log.Warn().Msgf("-x %s: not set here; not forwarded", k)
		}
	}
	return env, nil
}

func validEnvName(k string) bool {
	if k == "" || (k[0] >= '0' && k[0] <= '9') {
		return false
	}
	for _, r := range k {
		if !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

// runHead launches the job over SSH and returns its exit status.
func runHead(ctx context.Context, plan *headPlan, spec elastic.Spec) (int, error) {
	signals := make(chan os.Signal, 4)
	for _, s := range spec.Signals {
		signal.Notify(signals, s)
	}
	defer signal.Stop(signals)
	plan.fanout.Signals = signals
	return plan.fanout.Run(ctx)
}
