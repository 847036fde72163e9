// Package slurmtest starts a real Slurm cluster on this machine for tests:
// munged, slurmctld and several slurmd "nodes" (node1 on 127.0.0.1, node2
// on 127.0.0.2, ...), each daemon with its own key, ports and files in a
// temporary directory, all torn down when the test ends. It is used only
// by tests.
//
// One machine holds every node thanks to Debian's multiple-slurmd build
// (`slurmd -N nodeX`, each on its own port). Every daemon runs in a mount
// namespace of its own, so that teardown finds it and everything it spawned
// (slurmscriptd, slurmstepd, the job's tasks) by namespace, never by name.
// Each slurmd also has a UTS namespace with the node's hostname and a
// private /etc/hosts in which every node name resolves, so that a job sees
// node1 and node2 as two hosts.
package slurmtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testenv"
)

// Packages are the Debian packages that hold the cluster's programs.
const Packages = "slurm-wlm munge"

// programs are what Start runs: the daemons, munge's key tool and the
// clients it uses itself.
var programs = []string{"munged", "mungekey", "slurmctld", "slurmd", "srun", "sbatch", "scontrol", "sinfo", "squeue", "scancel"}

// Options shape the cluster; zero values take the defaults.
type Options struct {
	// Nodes is the number of slurmd nodes (default 2). Node i is named
	// "node<i>" and has the address 127.0.0.<i>.
	Nodes int
	// CPUs is what each node offers (default 2), whatever this machine has.
	CPUs int
	// FirstJobID is the id of the cluster's first job, the readiness probe
	// (default 1). Tests whose programs derive ports from job ids choose it.
	FirstJobID int
}

func (o Options) withDefaults() Options {
	if o.Nodes <= 0 {
		o.Nodes = 2
	}
	if o.CPUs <= 0 {
		o.CPUs = 2
	}
	if o.FirstJobID <= 0 {
		o.FirstJobID = 1
	}
	return o
}

// Node is one slurmd of the cluster.
type Node struct {
	Name string // its Slurm name and, inside its jobs, its hostname
	Addr string // its loopback address
	Port int    // slurmd's port
}

// Cluster is a running local Slurm cluster.
type Cluster struct {
	Dir    string // configuration, state, logs and JobDir
	Conf   string // slurm.conf; clients find it through SLURM_CONF
	JobDir string // where Sbatch runs jobs and writes their output
	Nodes  []Node

	programs  map[string]string // absolute paths by name
	daemons   []*daemon         // in start order
	slurmctld *daemon
}

// Start brings up munged, slurmctld and opts.Nodes slurmd, waits until
// every node is idle and a step across all of them runs, and tears the
// cluster down when the test ends. Without root or a program of Packages
// the test is skipped naming them, or fails under CI=true (testenv's
// rule); a cluster that does not come up fails the test.
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	begin := time.Now()
	opts = opts.withDefaults()
	c := &Cluster{programs: Need(t)}
	// Not t.TempDir: munged refuses a socket below a directory that others
	// cannot enter, and t.TempDir's parent is private.
	dir, err := os.MkdirTemp("", "gorun-slurm-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	c.Dir = dir
	c.Conf = filepath.Join(c.Dir, "slurm.conf")
	c.JobDir = filepath.Join(c.Dir, "jobs")
	if err := os.Chmod(c.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{"munge", "state", "log", "spool", "jobs"} {
		if err := os.Mkdir(filepath.Join(c.Dir, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ports := freePorts(t, 1+opts.Nodes)
	for i := 1; i <= opts.Nodes; i++ {
		c.Nodes = append(c.Nodes, Node{Name: "node" + strconv.Itoa(i), Addr: "127.0.0." + strconv.Itoa(i), Port: ports[i]})
	}
	t.Cleanup(func() { c.stop(t) })

	socket := c.startMunge(t)
	c.writeConfig(t, opts, ports[0], socket)
	c.writeHosts(t)
	c.slurmctld = c.start(t, "slurmctld", syscall.CLONE_NEWNS, c.programs["slurmctld"], "-D", "-i", "-f", c.Conf)
	// Slurm's clients and slurmd wait a second before they retry a
	// controller that is not listening yet.
	c.waitListening(t, c.slurmctld, net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0])))
	for _, n := range c.Nodes {
		c.startSlurmd(t, n)
	}
	c.waitReady(t)
	t.Logf("slurmtest: %d-node cluster ready in %v (%s)", len(c.Nodes), time.Since(begin).Round(time.Millisecond), c.Dir)
	return c
}

// Need returns the paths of the programs Start runs, looked up in PATH and
// in the sbin directories, which a root shell in a container may lack in
// PATH. Without root or one of them the test is skipped naming Packages,
// or fails under CI=true.
func Need(t testing.TB) map[string]string {
	t.Helper()
	found := map[string]string{}
	for _, name := range programs {
		found[name] = testenv.MustHaveCommand(t, name, Packages)
	}
	// Every node is a slurmd in mount and UTS namespaces of its own, with
	// its own hostname and /etc/hosts.
	testenv.MustHaveRoot(t, "a local Slurm cluster")
	return found
}

// freePorts returns n distinct TCP ports that are free on every address
// right now (the daemons bind all addresses).
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", ":0")
		if err != nil {
			t.Fatalf("slurmtest: no free port: %v", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// startMunge creates a key and runs munged on a socket of the cluster's
// own; it returns the socket's path once it exists.
func (c *Cluster) startMunge(t testing.TB) string {
	t.Helper()
	dir := filepath.Join(c.Dir, "munge")
	key := filepath.Join(dir, "munge.key")
	if out, err := exec.Command(c.programs["mungekey"], "--create", "--bits=1024", "--keyfile="+key).CombinedOutput(); err != nil {
		t.Fatalf("slurmtest: mungekey: %v: %s", err, out)
	}
	socket := filepath.Join(dir, "munge.sock")
	d := c.start(t, "munged", syscall.CLONE_NEWNS, c.programs["munged"], "--foreground",
		"--key-file="+key, "--socket="+socket, "--pid-file="+filepath.Join(dir, "munged.pid"),
		"--log-file="+filepath.Join(dir, "munged.log"), "--seed-file="+filepath.Join(dir, "munged.seed"))
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(socket); err == nil {
			return socket
		}
		if d.hasExited() || time.Now().After(deadline) {
			t.Fatalf("slurmtest: munged did not open %s:\n%s", socket, tail(d.out))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// writeConfig writes slurm.conf: root runs everything, nothing needs
// cgroups or accounting, batch jobs start at once, and each node is a
// slurmd on its own loopback address and port.
func (c *Cluster) writeConfig(t testing.TB, opts Options, ctldPort int, mungeSocket string) {
	t.Helper()
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	// slurmctld knows itself by the short hostname.
	host, _, _ = strings.Cut(host, ".")
	lines := []string{
		"ClusterName=gorun-test",
		fmt.Sprintf("SlurmctldHost=%s(127.0.0.1)", host),
		"SlurmctldPort=" + strconv.Itoa(ctldPort),
		"SlurmdPort=" + strconv.Itoa(c.Nodes[0].Port),
		"AuthType=auth/munge",
		"CredType=cred/munge",
		"AuthInfo=socket=" + mungeSocket,
		"SlurmUser=root",
		"SlurmdUser=root",
		"StateSaveLocation=" + filepath.Join(c.Dir, "state"),
		// %n: every node has its own spool, pid file and log.
		"SlurmdSpoolDir=" + filepath.Join(c.Dir, "spool", "%n"),
		"SlurmctldPidFile=" + filepath.Join(c.Dir, "slurmctld.pid"),
		"SlurmdPidFile=" + filepath.Join(c.Dir, "slurmd-%n.pid"),
		"SlurmctldLogFile=" + filepath.Join(c.Dir, "log", "slurmctld.log"),
		"SlurmdLogFile=" + filepath.Join(c.Dir, "log", "slurmd-%n.log"),
		"SlurmctldDebug=info",
		"SlurmdDebug=info",
		// No cgroups, accounting or MPI plugins: they need a host set up for them.
		"ProctrackType=proctrack/linuxproc",
		"TaskPlugin=task/none",
		"JobAcctGatherType=jobacct_gather/none",
		"AccountingStorageType=accounting_storage/none",
		"JobCompType=jobcomp/none",
		"MpiDefault=none",
		"SwitchType=switch/none",
		"SelectType=select/cons_tres",
		"SelectTypeParameters=CR_CPU",
		"SchedulerType=sched/backfill",
		// Batch jobs start on slurmctld's next pass, about a second away,
		// rather than up to 3 s later (the first one after start-up still
		// waits about 3 s).
		"SchedulerParameters=batch_sched_delay=0",
		// Nodes may claim more CPUs than the machine has.
		"SlurmdParameters=config_overrides",
		"ReturnToService=2",
		"InactiveLimit=0",
		"KillWait=2",
		"FirstJobId=" + strconv.Itoa(opts.FirstJobID),
	}
	for _, n := range c.Nodes {
		lines = append(lines, fmt.Sprintf("NodeName=%s NodeAddr=%s Port=%d CPUs=%d Sockets=1 CoresPerSocket=%d ThreadsPerCore=1 RealMemory=1000 State=UNKNOWN",
			n.Name, n.Addr, n.Port, opts.CPUs, opts.CPUs))
		if err := os.Mkdir(filepath.Join(c.Dir, "spool", n.Name), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	lines = append(lines, "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
	writeFile(t, c.Conf, strings.Join(lines, "\n")+"\n")
	// slurmd 22.05 loads a cgroup plugin even when nothing in use needs
	// one. Left to detect the cgroup version, it gives up without a cgroup
	// filesystem at /sys/fs/cgroup (many containers) and on cgroup2 next to
	// v1 hierarchies ("Hybrid mode is not supported"); named, the v1 plugin
	// starts on any of these and is never used.
	writeFile(t, filepath.Join(c.Dir, "cgroup.conf"), "CgroupPlugin=cgroup/v1\n")
}

// writeHosts writes the /etc/hosts that every node sees: the machine's own
// names plus one line per node.
func (c *Cluster) writeHosts(t testing.TB) {
	t.Helper()
	host, _ := os.Hostname()
	lines := []string{"127.0.0.1 localhost " + host, "::1 localhost ip6-localhost ip6-loopback"}
	for _, n := range c.Nodes {
		lines = append(lines, n.Addr+" "+n.Name)
	}
	writeFile(t, filepath.Join(c.Dir, "hosts"), strings.Join(lines, "\n")+"\n")
}

// slurmdScript runs in the node's fresh namespaces before slurmd: its
// mounts stay private (a bind mount on a shared / would reach the host),
// then it takes the node's hostname and /etc/hosts. $1 is the hosts file,
// $2 the hostname, then slurmd's command line.
const slurmdScript = `set -e
mount --make-rprivate /
hostname "$2"
mount --bind "$1" /etc/hosts
shift 2
exec "$@"
`

// startSlurmd runs node n's slurmd in mount and UTS namespaces of its own.
func (c *Cluster) startSlurmd(t testing.TB, n Node) {
	t.Helper()
	c.start(t, "slurmd-"+n.Name, syscall.CLONE_NEWNS|syscall.CLONE_NEWUTS, "/bin/sh", "-c", slurmdScript, "slurmd-"+n.Name,
		filepath.Join(c.Dir, "hosts"), n.Name, c.programs["slurmd"], "-D", "-f", c.Conf, "-N", n.Name)
}

// waitListening waits until d accepts connections on addr.
func (c *Cluster) waitListening(t testing.TB, d *daemon, addr string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			conn.Close()
			return
		}
		if d.hasExited() || time.Now().After(deadline) {
			t.Fatalf("slurmtest: %s does not listen on %s: %v\n%s", d.name, addr, err, c.logs())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitReady waits until slurmctld lists every node idle, then until a step
// on all of them runs, and until its job is gone again.
func (c *Cluster) waitReady(t testing.TB) {
	t.Helper()
	c.waitIdle(t, 30*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nodes := strconv.Itoa(len(c.Nodes))
	probe := c.CommandContext(ctx, "srun", "-N", nodes, "-n", nodes, "--ntasks-per-node=1", "-t", "1", "true")
	if out, err := probe.CombinedOutput(); err != nil {
		t.Fatalf("slurmtest: the probe step srun -N%s true failed: %v\n%s\n%s", nodes, err, out, c.logs())
	}
	c.waitIdle(t, 10*time.Second)
	c.waitNoJobs(t, 10*time.Second)
}

// waitNoJobs polls squeue until no job is left, not even one completing:
// a job submitted while one completes waits for a later scheduling pass.
func (c *Cluster) waitNoJobs(t testing.TB, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		out, err := c.Command("squeue", "--noheader", "--format=%A %T").CombinedOutput()
		if err == nil && len(strings.TrimSpace(string(out))) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("slurmtest: jobs still listed after %v: %v\n%s", timeout, err, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitIdle polls sinfo until every node is idle.
func (c *Cluster) waitIdle(t testing.TB, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var states string
	for {
		out, _ := c.Command("sinfo", "--noheader", "--Node", "--format=%N %T").Output()
		states = string(out)
		if strings.Count(states, " idle\n") == len(c.Nodes) {
			return
		}
		for _, d := range c.daemons {
			if d.hasExited() {
				t.Fatalf("slurmtest: %s exited while the cluster started\n%s", d.name, c.logs())
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("slurmtest: nodes not idle after %v; sinfo says:\n%s\n%s", timeout, states, c.logs())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Env is the test's environment for Slurm's clients: this cluster's
// configuration and none of the SLURM_ variables of a job the test itself
// might run in.
func (c *Cluster) Env() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SLURM_") {
			env = append(env, kv)
		}
	}
	return append(env, "SLURM_CONF="+c.Conf)
}

// Command runs one of Slurm's clients (srun, sbatch, scontrol...) against
// the cluster.
func (c *Cluster) Command(name string, args ...string) *exec.Cmd {
	return c.CommandContext(context.Background(), name, args...)
}

// CommandContext is Command, killed when ctx is done.
func (c *Cluster) CommandContext(ctx context.Context, name string, args ...string) *exec.Cmd {
	if path, ok := c.programs[name]; ok {
		name = path
	}
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = c.Env()
	return cmd
}

// Sbatch submits script (a shell script unless it starts with "#!") with
// sbatch's options args, to run in c.JobDir with its output in
// OutputFile(id), and returns the job's id. The job gets the test's
// environment, SLURM_CONF included, so that srun in it finds the cluster.
func (c *Cluster) Sbatch(t testing.TB, script string, args ...string) string {
	t.Helper()
	if !strings.HasPrefix(script, "#!") {
		script = "#!/bin/sh\n" + script
	}
	f, err := os.CreateTemp(c.JobDir, "job-*.sh")
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteString(script)
	if err = errors.Join(err, f.Chmod(0o755), f.Close()); err != nil {
		t.Fatal(err)
	}
	argv := append([]string{"--parsable", "--chdir=" + c.JobDir, "--output=" + filepath.Join(c.JobDir, "%j.out")}, args...)
	out, err := c.Command("sbatch", append(argv, f.Name())...).CombinedOutput()
	if err != nil {
		t.Fatalf("slurmtest: sbatch %v: %v\n%s", args, err, out)
	}
	// --parsable prints "id" or "id;cluster".
	id, _, _ := strings.Cut(strings.TrimSpace(string(out)), ";")
	if _, err := strconv.Atoi(id); err != nil {
		t.Fatalf("slurmtest: sbatch %v printed %q, not a job id", args, out)
	}
	return id
}

// Job is a finished job as slurmctld reports it.
type Job struct {
	ID       string
	State    string // COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL...
	ExitCode int    // the batch script's exit status
	Signal   int    // the signal that ended it, or 0
}

// finalStates are the job states that do not change any more.
var finalStates = map[string]bool{
	"COMPLETED": true, "FAILED": true, "CANCELLED": true, "TIMEOUT": true, "NODE_FAIL": true,
	"OUT_OF_MEMORY": true, "BOOT_FAIL": true, "DEADLINE": true, "PREEMPTED": true,
}

// Wait polls slurmctld every 50 ms until job id has ended and returns how
// (sbatch --wait checks only after 2 s, then every 8 s or so). It fails
// the test when the job has not ended within timeout.
func (c *Cluster) Wait(t testing.TB, id string, timeout time.Duration) Job {
	t.Helper()
	begin := time.Now()
	deadline := begin.Add(timeout)
	for {
		out, err := c.Command("scontrol", "--oneliner", "show", "job", id).CombinedOutput()
		if err != nil {
			// A busy controller may time out once; the deadline bounds it.
			if time.Now().After(deadline) {
				t.Fatalf("slurmtest: scontrol show job %s: %v\n%s", id, err, out)
			}
			time.Sleep(50 * time.Millisecond)
			continue
		}
		job := Job{ID: id}
		for _, field := range strings.Fields(string(out)) {
			key, value, _ := strings.Cut(field, "=")
			switch key {
			case "JobState":
				job.State = value
			case "ExitCode":
				code, signal, _ := strings.Cut(value, ":")
				job.ExitCode, _ = strconv.Atoi(code)
				job.Signal, _ = strconv.Atoi(signal)
			}
		}
		if finalStates[job.State] {
			t.Logf("slurmtest: job %s ended %s (exit code %d) after %v of waiting", id, job.State, job.ExitCode, time.Since(begin).Round(time.Millisecond))
			return job
		}
		if time.Now().After(deadline) {
			t.Fatalf("slurmtest: job %s has not ended after %v:\n%s\noutput so far:\n%s", id, timeout, out, c.readOutput(id))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Output is what job id wrote to its output file.
func (c *Cluster) Output(t testing.TB, id string) string {
	t.Helper()
	b, err := os.ReadFile(c.OutputFile(id))
	if err != nil {
		t.Fatalf("slurmtest: output of job %s: %v", id, err)
	}
	return string(b)
}

// OutputFile is where job id's output goes.
func (c *Cluster) OutputFile(id string) string {
	return filepath.Join(c.JobDir, id+".out")
}

func (c *Cluster) readOutput(id string) string {
	b, err := os.ReadFile(c.OutputFile(id))
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// logs is the end of every daemon's log, for failure messages. (Its
// stderr has what it writes to its log file too.)
func (c *Cluster) logs() string {
	var b strings.Builder
	for _, d := range c.daemons {
		b.WriteString(tail(d.out))
	}
	return b.String()
}

// tail is the last lines of the file at path, under its name.
func tail(path string) string {
	data, err := os.ReadFile(path)
	if err != nil || len(data) == 0 {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	lines = lines[max(0, len(lines)-30):]
	return fmt.Sprintf("--- %s\n%s\n", path, strings.Join(lines, "\n"))
}

func writeFile(t testing.TB, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}
