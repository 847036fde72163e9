package main

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testenv"
)

// hosts are network namespaces on a bridge of their own, standing in for
// the machines of a job: each has an address on a test-only subnet, and
// links between them can be cut.
type hosts struct {
	t      *testing.T
	bridge string
	subnet string // first three octets
	names  []string
}

// newHosts creates n namespaces; they are removed when the test ends.
// It needs root and iproute2: without them the test is skipped, or fails
// under CI=true.
func newHosts(t *testing.T, n int) *hosts {
	t.Helper()
	testenv.MustHaveCommand(t, "ip", "iproute2")
	testenv.MustHaveRoot(t, "network namespaces")
	h := &hosts{t: t, bridge: "gorunt-br0", subnet: "10.231.0"}
	for i := 1; i <= n; i++ {
		h.names = append(h.names, fmt.Sprintf("gorunt-n%d", i))
	}
	h.teardown() // what an earlier, killed run may have left
	t.Cleanup(h.teardown)
	h.ip("link", "add", h.bridge, "type", "bridge")
	h.ip("link", "set", h.bridge, "up")
	h.ip("addr", "add", h.subnet+".1/24", "dev", h.bridge)
	for i, ns := range h.names {
		veth := fmt.Sprintf("gorunt-v%d", i+1)
		h.ip("netns", "add", ns)
		h.ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
		h.ip("link", "set", veth, "master", h.bridge, "up")
		h.ip("-n", ns, "link", "set", "lo", "up")
		h.ip("-n", ns, "addr", "add", h.addr(i+1)+"/24", "dev", "eth0")
		h.ip("-n", ns, "link", "set", "eth0", "up")
		// Local delivery after the blackhole rules, so that a cut also
		// drops packets arriving for this host.
		h.ip("-n", ns, "rule", "add", "pref", "200", "lookup", "local")
		h.ip("-n", ns, "rule", "del", "pref", "0")
	}
	return h
}

// addr is host i's address (1-based).
func (h *hosts) addr(i int) string { return fmt.Sprintf("%s.1%d", h.subnet, i) }

// partition makes hosts i and j drop each other's packets, silently, as a
// cut link does; both still reach every other host.
func (h *hosts) partition(i, j int) {
	h.ip("-n", h.names[i-1], "rule", "add", "pref", "101", "from", h.addr(j), "blackhole")
	h.ip("-n", h.names[j-1], "rule", "add", "pref", "101", "from", h.addr(i), "blackhole")
}

// command runs argv inside host i.
func (h *hosts) command(i int, argv ...string) []string {
	return append([]string{"ip", "netns", "exec", h.names[i-1]}, argv...)
}

func (h *hosts) ip(args ...string) {
	h.t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		h.t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// teardown kills what runs in the namespaces and removes them and the
// bridge; it ignores what is already gone.
func (h *hosts) teardown() {
	for i, ns := range h.names {
		if out, err := exec.Command("ip", "netns", "pids", ns).Output(); err == nil {
			for _, pid := range strings.Fields(string(out)) {
				exec.Command("kill", "-9", pid).Run()
			}
		}
		// A namespace is freed lazily; deleting the veth pair now keeps
		// its name free for the next run.
		exec.Command("ip", "link", "del", fmt.Sprintf("gorunt-v%d", i+1)).Run()
		exec.Command("ip", "netns", "del", ns).Run()
	}
	exec.Command("ip", "link", "del", h.bridge).Run()
}

// startAgentOn starts a gorun agent inside host i.
func startAgentOn(t *testing.T, h *hosts, i int, args ...string) *agent {
	t.Helper()
	argv := h.command(i, append([]string{bin("gorun")}, args...)...)
	return startCommand(t, argv[0], argv[1:]...)
}

// Issue 4, test 4: the store's host is cut off from one node. The others
// re-rendezvous and finish; the cut node's agent fails cleanly once it
// cannot rejoin.
func TestElasticNetworkPartition(t *testing.T) {
	h := newHosts(t, 3)
	dir := t.TempDir()
	args := []string{
		"--nnodes", "2:3", "--nproc-per-node", "1", "--rdzv-id", "partition",
		"--rdzv-endpoint", h.addr(1) + ":29400",
		"--rdzv-conf", "last_call_timeout=1.5,heartbeat_interval=0.25,heartbeat_misses=3,join_timeout=6,read_timeout=5,close_timeout=3",
		bin("elastic"), "-steps", "150", "-step-delay", "20ms", "-every", "10", "-log-every", "10",
		"-checkpoint", filepath.Join(dir, "ckpt"),
	}
	// Workers of different "hosts" must talk over the network, not over
	// this machine's shared memory.
	t.Setenv("GORUN_TRANSPORT", "tcp")
	agents := []*agent{startAgentOn(t, h, 1, args...)}
	// The store's host arrives first: it is node 0, whose output tells.
	awaitArrivals(t, h.addr(1)+":29400", "partition", 1)
	agents = append(agents, startAgentOn(t, h, 2, args...), startAgentOn(t, h, 3, args...))
	if !waitFor(60*time.Second, func() bool { return strings.Contains(agents[0].out.String(), "world 3 restart 0") }) {
		t.Fatalf("no round of 3 hosts:\n%s\n%s\n%s", agents[0].out.String(), agents[1].out.String(), agents[2].out.String())
	}
	h.partition(1, 3)
	for i, a := range agents[:2] {
		if code := a.wait(t, 90*time.Second); code != 0 {
			t.Fatalf("agent on host %d exited %d:\n%s", i+1, code, a.out.String())
		}
	}
	if !strings.Contains(agents[0].out.String(), "finished 150 steps with world 2 after 0 restarts") {
		t.Errorf("the job did not finish on the two connected hosts:\n%s", agents[0].out.String())
	}
	cut := agents[2]
	if code := cut.wait(t, 60*time.Second); code == 0 {
		t.Errorf("the cut host's agent succeeded:\n%s", cut.out.String())
	}
	if out := cut.out.String(); !strings.Contains(out, "gorun: ") {
		t.Errorf("the cut host's agent did not say why it failed:\n%s", out)
	} else {
		t.Logf("the cut host's agent:\n%s", out[strings.LastIndex(out, "gorun: "):])
	}
}
