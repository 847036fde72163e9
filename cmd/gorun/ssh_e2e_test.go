package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/sshtest"
	"golang.org/x/sys/unix"
)

// sshCluster is two "hosts", real sshd servers on 127.0.0.1 and 127.0.0.2
// of this machine, and an ssh_config that reaches both.
type sshCluster struct {
	env     *sshtest.Env
	servers []*sshtest.SSHD
	config  string
}

func newSSHCluster(t *testing.T) *sshCluster {
	t.Helper()
	e := sshtest.NewEnv(t)
	c := &sshCluster{env: e}
	for _, ip := range []string{"127.0.0.1", "127.0.0.2"} {
		// The node's name reaches its commands, to tell the hosts apart.
		c.servers = append(c.servers, e.StartSSHD(t, ip, "SetEnv GORUN_TEST_NODE="+ip))
	}
	c.config = e.WriteSSHConfig(t, c.servers...)
	return c
}

// commandSessions counts the commands the cluster's servers have started
// (sshd logs each "Starting session: command ...").
func (c *sshCluster) commandSessions(t *testing.T) int {
	t.Helper()
	n := 0
	for _, s := range c.servers {
		n += strings.Count(sshtest.ReadFile(t, s.Log), "Starting session: command")
	}
	return n
}

// awaitNoSessions waits until no server of the cluster serves a
// connection any more: what the servers were asked to do is done.
func (c *sshCluster) awaitNoSessions(t *testing.T) {
	t.Helper()
	if !waitFor(30*time.Second, func() bool {
		for _, s := range c.servers {
			if len(s.SessionPids()) > 0 {
				return false
			}
		}
		return true
	}) {
		for _, s := range c.servers {
			t.Logf("sshd %s still serves processes %v", s.Addr, s.SessionPids())
		}
		t.Fatal("the servers still serve connections 30 s after the head exited")
	}
}

// head is a gorun head started in dir, in the background.
func startHead(t *testing.T, dir string, args ...string) *agent {
	t.Helper()
	a := &agent{cmd: exec.Command(bin("gorun"), args...), done: make(chan struct{})}
	a.cmd.Dir = dir
	a.cmd.Env = testEnv(t)
	a.cmd.Stdout, a.cmd.Stderr = &a.out, &a.out
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		err := a.cmd.Wait()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			a.code = ee.ExitCode()
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				a.code = 128 + int(ws.Signal())
			}
		}
		close(a.done)
	}()
	t.Cleanup(func() {
		a.cmd.Process.Kill()
		<-a.done
	})
	return a
}

// headArgs is the start of a head's command line on the cluster.
func (c *sshCluster) headArgs(t *testing.T, extra ...string) []string {
	return append([]string{
		"--ssh-config", c.config,
		"--rdzv-endpoint", "127.0.0.1:" + strconv.Itoa(freePort(t)),
		"--rdzv-conf", "last_call_timeout=0.5,heartbeat_interval=0.25,heartbeat_misses=3",
		"--shutdown-timeout", "5",
	}, extra...)
}

func TestSSHLaunch(t *testing.T) {
	c := newSSHCluster(t)

	t.Run("four ranks on two hosts", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, ".gorun_env"), []byte("# forwarded\nGORUN_FILE=from file\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		worker := script(t, dir, "worker.sh", `echo "rank $RANK world $WORLD_SIZE group $GROUP_RANK node $GORUN_TEST_NODE x $GORUN_X file $GORUN_FILE cpus $(grep Cpus_allowed_list /proc/self/status | cut -f2) pwd $PWD"`+"\n")
		h := startHead(t, dir, c.headArgs(t, "--hosts", "127.0.0.1:2,127.0.0.2:2", "-x", "GORUN_X=a,b", "--bind-to", "core", worker)...)
		if code := h.wait(t, 90*time.Second); code != 0 {
			t.Fatalf("head exited %d:\n%s", code, h.out.String())
		}
		if c.commandSessions(t) == 0 {
			t.Errorf("the servers logged no command: commandSessions cannot see the commands a head starts")
		}
		out := h.out.String()
		line := regexp.MustCompile(`(?m)^\[[^:\]]+:(\d)\]: rank (\d) world 4 group (\d) node (127\.0\.0\.[12]) x a,b file from file cpus (\S+) pwd (.*)$`)
		nodes := map[string][]string{}
		seen := map[string]bool{}
		for _, m := range line.FindAllStringSubmatch(out, -1) {
			if m[1] != m[2] {
				t.Errorf("line of rank %s tagged rank %s", m[2], m[1])
			}
			if m[6] != dir {
				t.Errorf("rank %s ran in %s, not %s", m[2], m[6], dir)
			}
			// --bind-to reaches the remote agents: one CPU each.
			if _, err := strconv.Atoi(m[5]); err != nil {
				t.Errorf("rank %s may run on CPUs %s, want one (--bind-to core)", m[2], m[5])
			}
			seen[m[2]] = true
			nodes[m[4]] = append(nodes[m[4]], m[3])
		}
		if len(seen) != 4 || len(nodes["127.0.0.1"]) != 2 || len(nodes["127.0.0.2"]) != 2 {
			t.Fatalf("want ranks 0-3, two per host; got ranks %v, nodes %v:\n%s", seen, nodes, out)
		}
		for node, groups := range nodes {
			if groups[0] != groups[1] {
				t.Errorf("host %s has group ranks %v", node, groups)
			}
		}
	})

	t.Run("the root cause's status", func(t *testing.T) {
		dir := t.TempDir()
		worker := script(t, dir, "worker.sh", `if [ "$RANK" = 3 ]; then echo failing; exit 7; fi; sleep 2`+"\n")
		h := startHead(t, dir, c.headArgs(t, "--hosts", "127.0.0.1:2,127.0.0.2:2", worker)...)
		if code := h.wait(t, 90*time.Second); code != 7 {
			t.Fatalf("head exited %d, want 7:\n%s", code, h.out.String())
		}
		if !strings.Contains(h.out.String(), ":3]: failing") {
			t.Errorf("rank 3's line is missing:\n%s", h.out.String())
		}
		// Both agents print the job's report; the head shows it once.
		if n := strings.Count(h.out.String(), "Root Cause (first observed failure)"); n != 1 {
			t.Errorf("the failure report is shown %d times:\n%s", n, h.out.String())
		}
	})

	t.Run("unknown host key", func(t *testing.T) {
		dir := t.TempDir()
		// Only the first host is known.
		var known []string
		for _, l := range strings.SplitAfter(sshtest.ReadFile(t, c.env.KnownHosts), "\n") {
			if strings.Contains(l, "[127.0.0.1]") {
				known = append(known, l)
			}
		}
		knownHosts := filepath.Join(dir, "known_hosts")
		sshtest.WriteFile(t, knownHosts, strings.Join(known, ""))
		worker := script(t, dir, "worker.sh", `touch "$0.started"; sleep 5`+"\n")
		sessionsBefore := c.commandSessions(t)
		h := startHead(t, dir, c.headArgs(t, "--hosts", "127.0.0.1:2,127.0.0.2:2", "--ssh-known-hosts", knownHosts, worker)...)
		code := h.wait(t, 30*time.Second)
		out := h.out.String()
		if code != exitUnavailable || !strings.Contains(out, "cannot reach host 127.0.0.2") || !strings.Contains(out, "unknown host key") {
			t.Fatalf("want exit %d naming 127.0.0.2 and its unknown key, got %d:\n%s", exitUnavailable, code, out)
		}
		// Once the servers have ended every connection the head made, no
		// command it asked for can start any more: each would have been
		// logged by then. None may have been: no host runs anything until
		// every host is reached.
		c.awaitNoSessions(t)
		if got := c.commandSessions(t); got != sessionsBefore {
			t.Errorf("the servers ran %d commands for a head that reached only one host", got-sessionsBefore)
		}
		if _, err := os.Stat(worker + ".started"); err == nil {
			t.Errorf("a worker started")
		}
	})

	t.Run("accept-new adds unknown keys and never a changed one", func(t *testing.T) {
		dir := t.TempDir()
		knownHosts := filepath.Join(dir, "known_hosts")
		worker := script(t, dir, "worker.sh", `echo "rank $RANK ran"`+"\n")
		h := startHead(t, dir, c.headArgs(t, "--hosts", "127.0.0.1:1,127.0.0.2:1", "--ssh-known-hosts", knownHosts, "--ssh-accept-new", worker)...)
		if code := h.wait(t, 90*time.Second); code != 0 || strings.Count(h.out.String(), " ran\n") != 2 {
			t.Fatalf("head exited %d:\n%s", code, h.out.String())
		}
		added := sshtest.ReadFile(t, knownHosts)
		for _, s := range c.servers {
			if !strings.Contains(added, "["+strings.Replace(s.Addr, ":", "]:", 1)) {
				t.Errorf("known_hosts lacks %s:\n%s", s.Addr, added)
			}
		}

		// 127.0.0.2 now offers a key other than the one recorded.
		other := filepath.Join(dir, "other_key")
		sshtest.Keygen(t, other, "ed25519")
		var lines []string
		for _, l := range strings.Split(strings.TrimSpace(added), "\n") {
			if strings.Contains(l, "[127.0.0.2]") {
				fields := strings.Fields(l)
				l = fields[0] + " " + strings.TrimSpace(sshtest.ReadFile(t, other+".pub"))
			}
			lines = append(lines, l)
		}
		sshtest.WriteFile(t, knownHosts, strings.Join(lines, "\n")+"\n")
		h = startHead(t, dir, c.headArgs(t, "--hosts", "127.0.0.1:1,127.0.0.2:1", "--ssh-known-hosts", knownHosts, "--ssh-accept-new", worker)...)
		code := h.wait(t, 30*time.Second)
		if out := h.out.String(); code != exitUnavailable || !strings.Contains(out, "REMOTE HOST KEY CHANGED") || strings.Contains(out, " ran\n") {
			t.Fatalf("want exit %d refusing 127.0.0.2's changed key before anything runs, got %d:\n%s", exitUnavailable, code, out)
		}
	})

	t.Run("include and exclude choose the hosts", func(t *testing.T) {
		dir := t.TempDir()
		worker := script(t, dir, "worker.sh", `echo "rank $RANK world $WORLD_SIZE node $GORUN_TEST_NODE"`+"\n")
		for _, sel := range [][]string{{"--exclude", "127.0.0.1"}, {"--include", "127.0.0.2"}} {
			args := append([]string{"--hosts", "127.0.0.1:2,127.0.0.2:2"}, sel...)
			h := startHead(t, dir, c.headArgs(t, append(args, worker)...)...)
			if code := h.wait(t, 90*time.Second); code != 0 {
				t.Fatalf("%v: head exited %d:\n%s", sel, code, h.out.String())
			}
			out := h.out.String()
			if strings.Count(out, "world 2 node 127.0.0.2") != 2 || strings.Contains(out, "node 127.0.0.1") {
				t.Errorf("%v: want two ranks, both on 127.0.0.2:\n%s", sel, out)
			}
		}
	})

	t.Run("a host without slots counts its own CPUs", func(t *testing.T) {
		// Commands on 127.0.0.2 may use one CPU, however many the head has.
		sshd := c.servers[1].Pid
		var all, one unix.CPUSet
		if err := unix.SchedGetaffinity(sshd, &all); err != nil {
			t.Fatal(err)
		}
		one.Set(0)
		if err := unix.SchedSetaffinity(sshd, &one); err != nil {
			t.Fatal(err)
		}
		defer unix.SchedSetaffinity(sshd, &all)

		dir := t.TempDir()
		worker := script(t, dir, "worker.sh", `echo "rank $RANK world $WORLD_SIZE local $LOCAL_WORLD_SIZE node $GORUN_TEST_NODE"`+"\n")
		h := startHead(t, dir, c.headArgs(t, "--hosts", "127.0.0.1:1,127.0.0.2", "--nproc-per-node", "cpu", worker)...)
		if code := h.wait(t, 90*time.Second); code != 0 {
			t.Fatalf("head exited %d:\n%s", code, h.out.String())
		}
		out := h.out.String()
		if strings.Count(out, "world 2 local 1 node 127.0.0.2") != 1 || strings.Count(out, "world 2 local 1 node 127.0.0.1") != 1 {
			t.Errorf("want one worker per host (the head has %d CPUs):\n%s", runtime.NumCPU(), out)
		}
	})

	t.Run("stage-binary copies gorun once", func(t *testing.T) {
		dir := t.TempDir()
		cache := filepath.Join(dir, "cache")
		// The worker's parent is the remote agent: the staged copy.
		worker := script(t, dir, "worker.sh", `echo "rank $RANK agent $(readlink /proc/$PPID/exe)"`+"\n")
		want, err := os.ReadFile(bin("gorun"))
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(want)
		staged := filepath.Join(cache, "gorun", "gorun-"+hex.EncodeToString(sum[:])[:16])
		for run, copied := range []string{"copied=true", "copied=false"} {
			h := startHead(t, dir, c.headArgs(t, "--hosts", "127.0.0.1:1,127.0.0.2:1", "-x", "XDG_CACHE_HOME="+cache, "--stage-binary", worker)...)
			if code := h.wait(t, 90*time.Second); code != 0 {
				t.Fatalf("run %d: head exited %d:\n%s", run, code, h.out.String())
			}
			out := h.out.String()
			if strings.Count(out, "agent "+staged) != 2 {
				t.Errorf("run %d: the agents did not run %s:\n%s", run, staged, out)
			}
			if run == 1 && strings.Contains(out, "copied=true") || !strings.Contains(out, copied) {
				t.Errorf("run %d: want %s:\n%s", run, copied, out)
			}
		}
		if got, err := os.ReadFile(staged); err != nil || !bytes.Equal(got, want) {
			t.Errorf("the staged copy differs from gorun (%v)", err)
		}

		// A host that says it is another machine gets no copy it cannot run.
		fake := filepath.Join(dir, "fakebin")
		os.Mkdir(fake, 0o755)
		script(t, fake, "uname", "echo Linux riscv64\n")
		h := startHead(t, dir, c.headArgs(t, "--hosts", "127.0.0.1:1,127.0.0.2:1", "-x", "XDG_CACHE_HOME="+filepath.Join(dir, "other"),
			"-x", "PATH="+fake+":/usr/bin:/bin", "--stage-binary", worker)...)
		code := h.wait(t, 30*time.Second)
		if out := h.out.String(); code != exitUnavailable || !strings.Contains(out, `the host is "Linux riscv64"`) || strings.Contains(out, "agent ") {
			t.Fatalf("want exit %d refusing a riscv64 host, got %d:\n%s", exitUnavailable, code, out)
		}
	})

	t.Run("bad hostfile", func(t *testing.T) {
		dir := t.TempDir()
		hostfile := filepath.Join(dir, "hosts")
		sshtest.WriteFile(t, hostfile, "# two hosts\n127.0.0.1 slots=2\n127.0.0.2 slots=two\n")
		worker := script(t, dir, "worker.sh", `touch "$0.started"`+"\n")
		h := startHead(t, dir, c.headArgs(t, "--hostfile", hostfile, worker)...)
		code := h.wait(t, 30*time.Second)
		out := h.out.String()
		if code != 2 || !strings.Contains(out, hostfile+":3:") {
			t.Fatalf("want exit 2 naming line 3, got %d:\n%s", code, out)
		}
		if _, err := os.Stat(worker + ".started"); err == nil {
			t.Errorf("a worker started")
		}
	})

	t.Run("SIGINT stops every host", func(t *testing.T) {
		h, pids := c.startSleepers(t)
		h.cmd.Process.Signal(syscall.SIGINT)
		if code := h.wait(t, 30*time.Second); code != 130 {
			t.Fatalf("head exited %d, want 130:\n%s", code, h.out.String())
		}
		waitDead(t, pids, h)
	})

	t.Run("a lost connection fails the job", func(t *testing.T) {
		h, pids := c.startSleepers(t)
		// Kill the sshd processes serving 127.0.0.2, not the commands.
		for _, pid := range c.servers[1].SessionPids() {
			if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.TrimSpace(string(comm)) == "sshd" {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		code := h.wait(t, 30*time.Second)
		if code == 0 || !strings.Contains(h.out.String(), "host 127.0.0.2: the remote agent was lost") {
			t.Fatalf("want a failure naming 127.0.0.2, got %d:\n%s", code, h.out.String())
		}
		waitDead(t, pids, h)
	})
}

// startSleepers starts a two-host head whose four workers record their pids
// and sleep, and returns it once they all run.
func (c *sshCluster) startSleepers(t *testing.T) (*agent, []int) {
	t.Helper()
	return startSleepers(t, c.headArgs(t, "--hosts", "127.0.0.1:2,127.0.0.2:2"), 4, 60*time.Second)
}

// startSleepers starts a head with args and a worker that records its pid
// and sleeps, and returns it once all ranks run, with their pids.
func startSleepers(t *testing.T, args []string, ranks int, within time.Duration) (*agent, []int) {
	t.Helper()
	dir := t.TempDir()
	worker := script(t, dir, "worker.sh", `echo $$ > "$0.pid.$RANK.tmp" && mv "$0.pid.$RANK.tmp" "$0.pid.$RANK" && exec sleep 300`+"\n")
	h := startHead(t, dir, append(args, worker)...)
	var pids []int
	if !waitFor(within, func() bool {
		pids = pids[:0]
		for r := range ranks {
			b, err := os.ReadFile(fmt.Sprintf("%s.pid.%d", worker, r))
			if err != nil {
				return false
			}
			pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
			pids = append(pids, pid)
		}
		return true
	}) {
		t.Fatalf("the workers did not all start:\n%s", h.out.String())
	}
	t.Cleanup(func() {
		for _, pid := range pids {
			if alive(pid) {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	return h, pids
}

// waitDead fails the test unless every pid is gone within 10 s.
func waitDead(t *testing.T, pids []int, h *agent) {
	t.Helper()
	if !waitFor(10*time.Second, func() bool {
		for _, pid := range pids {
			if alive(pid) {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("workers %v still alive after the head exited:\n%s", pids, h.out.String())
	}
}

// Hosts named only by ssh_config entries that no resolver knows: the
// remote agents are given the first host's address, never its alias, and
// rendezvous. No --rdzv-endpoint: the head picks it (port 29400).
func TestSSHAliasHosts(t *testing.T) {
	c := newSSHCluster(t)
	a, b := c.servers[0], c.servers[1]
	// A third host on this machine's outside address, which the head
	// reaches through node-b by a HostName that only node-b's OpenSSH
	// resolves: Go's resolver, so gorun's, cannot.
	outside, decimal := sshtest.OutsideIPv4(t)
	hidden := c.env.StartSSHD(t, outside, "SetEnv GORUN_TEST_NODE="+outside)
	// known_hosts is searched by HostName, as OpenSSH does.
	c.env.AddKnownHost(t, decimal+":"+hidden.Port(), hidden.HostKeys["ed25519"])
	config := c.env.WriteSSHConfigText(t, "alias_config", fmt.Sprintf(`
Host node-a
  HostName 127.0.0.1
  Port %[1]s
Host node-b
  HostName 127.0.0.2
  Port %[2]s
Host first-*
  HostName 127.0.0.1
  Port %[1]s
Match host second-*
  HostName 127.0.0.2
  Port %[2]s
Host hidden
  HostName %[3]s
  Port %[4]s
  ProxyJump node-b
`, a.Port(), b.Port(), decimal, hidden.Port()))
	headArgs := func(hosts string, extra ...string) []string {
		return append([]string{
			"--ssh-config", config,
			"--hosts", hosts,
			"--rdzv-conf", "last_call_timeout=0.5,heartbeat_interval=0.25,heartbeat_misses=3",
			"--shutdown-timeout", "5",
		}, extra...)
	}
	// The worker's parent is its agent: its command line says which
	// endpoint it was given.
	const report = `echo "rank $RANK world $WORLD_SIZE group $GROUP_RANK node $GORUN_TEST_NODE endpoint $(tr '\0' '\n' < /proc/$PPID/cmdline | grep -x -A1 -e --rdzv-endpoint | tail -n 1)"` + "\n"
	line := regexp.MustCompile(`(?m)^\[[^:\]]+:(\d)\]: rank (\d) world (\d) group (\d) node (\S+) endpoint (\S+)$`)
	// check wants the ranks 0..world-1 in order on the hosts of nodes,
	// world/len(nodes) per host, each agent given endpoint.
	check := func(t *testing.T, out string, nodes []string, world int, endpoint string) {
		t.Helper()
		got := map[int]string{}
		for _, m := range line.FindAllStringSubmatch(out, -1) {
			rank, _ := strconv.Atoi(m[2])
			group, _ := strconv.Atoi(m[4])
			perHost := world / len(nodes)
			switch {
			case m[1] != m[2]:
				t.Errorf("line of rank %s tagged rank %s", m[2], m[1])
			case m[3] != strconv.Itoa(world):
				t.Errorf("rank %d: world %s, want %d", rank, m[3], world)
			case group != rank/perHost || m[5] != nodes[group]:
				t.Errorf("rank %d ran as group %d on %s, want group %d on %s", rank, group, m[5], rank/perHost, nodes[rank/perHost])
			case m[6] != endpoint:
				t.Errorf("rank %d's agent was given --rdzv-endpoint %s, want %s", rank, m[6], endpoint)
			}
			got[rank] = m[5]
		}
		if len(got) != world {
			t.Errorf("want %d ranks, got %v:\n%s", world, got, out)
		}
	}

	t.Run("aliases", func(t *testing.T) {
		dir := t.TempDir()
		worker := script(t, dir, "worker.sh", report)
		h := startHead(t, dir, headArgs("node-a:2,node-b:2", worker)...)
		if code := h.wait(t, 90*time.Second); code != 0 {
			t.Fatalf("head exited %d:\n%s", code, h.out.String())
		}
		check(t, h.out.String(), []string{"127.0.0.1", "127.0.0.2"}, 4, "127.0.0.1:29400")
	})

	t.Run("Host and Match patterns, and the root cause's status", func(t *testing.T) {
		dir := t.TempDir()
		// Rank 3 fails once every rank has printed its line (30 s at most).
		worker := script(t, dir, "worker.sh", report+`touch "$0.printed.$RANK"
if [ "$RANK" = 3 ]; then
	for i in $(seq 600); do [ "$(ls "$0".printed.* | wc -l)" -ge 4 ] && break; sleep 0.05; done
	exit 7
fi
sleep 30
`)
		// The second host first: it hosts the store.
		h := startHead(t, dir, headArgs("second-x:2,first-y:2", worker)...)
		if code := h.wait(t, 90*time.Second); code != 7 {
			t.Fatalf("head exited %d, want 7:\n%s", code, h.out.String())
		}
		check(t, h.out.String(), []string{"127.0.0.2", "127.0.0.1"}, 4, "127.0.0.2:29400")
	})

	t.Run("ProxyJump to a name only the jump host resolves", func(t *testing.T) {
		dir := t.TempDir()
		worker := script(t, dir, "worker.sh", report)
		forwards := func() int { return strings.Count(sshtest.ReadFile(t, b.Log), "server_request_direct_tcpip") }
		before := forwards()
		h := startHead(t, dir, headArgs("hidden:1,node-b:1", worker)...)
		if code := h.wait(t, 90*time.Second); code != 0 {
			t.Fatalf("head exited %d:\n%s", code, h.out.String())
		}
		// The address hidden's sshd took the connection on; its HostName
		// would leave the agents unable to rendezvous.
		check(t, h.out.String(), []string{outside, "127.0.0.2"}, 2, outside+":29400")
		if forwards() == before {
			t.Errorf("hidden was not reached through node-b")
		}
	})

	t.Run("--rdzv-endpoint wins", func(t *testing.T) {
		dir := t.TempDir()
		worker := script(t, dir, "worker.sh", report)
		endpoint := "127.0.0.2:" + strconv.Itoa(freePort(t))
		h := startHead(t, dir, headArgs("node-a:1,node-b:1", "--rdzv-endpoint", endpoint, worker)...)
		if code := h.wait(t, 90*time.Second); code != 0 {
			t.Fatalf("head exited %d:\n%s", code, h.out.String())
		}
		check(t, h.out.String(), []string{"127.0.0.1", "127.0.0.2"}, 2, endpoint)
	})
}
