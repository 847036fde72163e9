package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/sshtest"
)

// treeHosts is the tree launch of the tests: five hosts, --ssh-fanout 2.
// The head reaches 127.0.0.1, which hosts the store and relays nothing,
// and 127.0.0.2, which reaches .3 and .4; .4 relays to .5.
const treeHosts = "127.0.0.1:1,127.0.0.2:1,127.0.0.3:1,127.0.0.4:1,127.0.0.5:1"

func TestSSHTreeLaunch(t *testing.T) {
	e := sshtest.NewEnv(t)
	c := &sshCluster{env: e}
	for i := 1; i <= 5; i++ {
		ip := fmt.Sprintf("127.0.0.%d", i)
		c.servers = append(c.servers, e.StartSSHD(t, ip, "SetEnv GORUN_TEST_NODE="+ip))
	}
	c.config = e.WriteSSHConfig(t, c.servers...)
	args := func(t *testing.T, extra ...string) []string {
		return c.headArgs(t, append([]string{"--hosts", treeHosts, "--ssh-fanout", "2"}, extra...)...)
	}

	// After a node is lost the others wait in a new round for it (a
	// membership change is no restart); a shorter join timeout, still
	// long enough for a loaded machine to start them all, makes them fail
	// soon, rather than after the head's failure grace.
	failFast := func(t *testing.T) []string {
		a := args(t, "--max-restarts", "0")
		i := slices.Index(a, "--rdzv-conf")
		a[i+1] += ",join_timeout=40"
		return a
	}

	t.Run("every rank's output whole, the root cause's status", func(t *testing.T) {
		dir := t.TempDir()
		// Rank 4 runs on 127.0.0.5, two relays down; its long line must
		// arrive whole.
		worker := script(t, dir, "worker.sh", `printf 'rank %s node %s %s end\n' "$RANK" "$GORUN_TEST_NODE" "$(printf '%0.sx' $(seq 3000))"
if [ "$RANK" = 4 ]; then exit 7; fi; sleep 2`+"\n")
		h := startHead(t, dir, args(t, worker)...)
		if code := h.wait(t, 120*time.Second); code != 7 {
			t.Fatalf("head exited %d, want 7:\n%s", code, h.out.String())
		}
		line := regexp.MustCompile(`(?m)^\[[^\]]+\]: rank (\d) node (127\.0\.0\.\d) (x+) end$`)
		var ranks []string
		for _, m := range line.FindAllStringSubmatch(h.out.String(), -1) {
			if len(m[3]) != 3000 {
				t.Errorf("rank %s's line has %d of 3000 x", m[1], len(m[3]))
			}
			if r, _ := strconv.Atoi(m[1]); m[2] != fmt.Sprintf("127.0.0.%d", r+1) {
				t.Errorf("rank %s ran on %s", m[1], m[2])
			}
			ranks = append(ranks, m[1])
		}
		slices.Sort(ranks)
		if !slices.Equal(ranks, []string{"0", "1", "2", "3", "4"}) {
			t.Errorf("ranks %v printed, want 0-4 once each:\n%s", ranks, h.out.String())
		}
		if n := strings.Count(h.out.String(), "Root Cause (first observed failure)"); n != 1 {
			t.Errorf("the failure report is shown %d times:\n%s", n, h.out.String())
		}
	})

	t.Run("the head holds at most fan-out sessions; SIGTERM stops every host", func(t *testing.T) {
		h, pids := startTreeSleepers(t, args(t))
		var ports []string
		for _, s := range c.servers {
			ports = append(ports, s.Port())
		}
		if n := sshdConnections(t, h.cmd.Process.Pid, ports); n != 2 {
			t.Errorf("the head holds %d connections to sshd, want 2 (--ssh-fanout)", n)
		}
		h.cmd.Process.Signal(syscall.SIGTERM)
		if code := h.wait(t, 30*time.Second); code != 143 {
			t.Fatalf("head exited %d, want 143:\n%s", code, h.out.String())
		}
		waitDead(t, pids, h)
	})

	t.Run("a relay's agent killed is reported naming its host, and every host stops", func(t *testing.T) {
		h, pids := startTreeSleepers(t, failFast(t))
		// The agent of a relay (the relay's child) on 127.0.0.1 or
		// 127.0.0.2, whichever does not host the store.
		ip, agent := relayAgent(t, c, h)
		syscall.Kill(agent, syscall.SIGKILL)
		code := h.wait(t, 120*time.Second)
		if code == 0 || !regexp.MustCompile(`remote agent failed.*exit=137.*host=`+regexp.QuoteMeta(ip)).MatchString(h.out.String()) {
			t.Fatalf("want a failure naming %s, got %d:\n%s", ip, code, h.out.String())
		}
		waitDead(t, pids, h)
	})

	t.Run("a lost relay stops its subtree", func(t *testing.T) {
		h, pids := startTreeSleepers(t, failFast(t))
		_, agent := relayAgent(t, c, h)
		syscall.Kill(parentOf(agent), syscall.SIGKILL)
		if code := h.wait(t, 120*time.Second); code == 0 {
			t.Fatalf("head exited 0 after a relay was killed:\n%s", h.out.String())
		}
		waitDead(t, pids, h)
	})
}

// startTreeSleepers starts a head of five one-rank hosts whose workers
// record their pids and sleep, and returns it once they all run.
func startTreeSleepers(t *testing.T, args []string) (*agent, []int) {
	t.Helper()
	return startSleepers(t, args, 5, 90*time.Second)
}

// relayAgent finds the agent of a relay (the child of a gorun --ssh-relay
// that sshd runs: on 127.0.0.2 or 127.0.0.4) that does not host the store:
// killing that one would leave the others retrying to reach it. Every
// agent here is on this machine, so whichever binds the endpoint first
// hosts it.
func relayAgent(t *testing.T, c *sshCluster, h *agent) (ip string, pid int) {
	t.Helper()
	i := slices.Index(h.cmd.Args, "--rdzv-endpoint")
	_, port, _ := strings.Cut(h.cmd.Args[i+1], ":")
	for _, k := range []int{1, 3} {
		relay := findProcess(t, c.servers[k].SessionPids(), "--"+sshRelayFlag)
		agent := findProcess(t, sshtest.Descendants(relay), "--node-rank")
		if !listens(t, agent, port) {
			return fmt.Sprintf("127.0.0.%d", k+1), agent
		}
	}
	t.Fatal("both relays' agents host the store")
	return "", 0
}

// listens reports whether pid has a listening TCP socket on port.
func listens(t *testing.T, pid int, port string) bool {
	t.Helper()
	return tcpSockets(t, pid, "0A", []string{port}, false) > 0
}

// findProcess is the one of pids whose command line has word.
func findProcess(t *testing.T, pids []int, word string) int {
	t.Helper()
	for _, pid := range pids {
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if slices.Contains(strings.Split(string(cmdline), "\x00"), word) {
			return pid
		}
	}
	t.Fatalf("no process with %s among %v", word, pids)
	return 0
}

// sshdConnections counts pid's established TCP connections to the ports.
func sshdConnections(t *testing.T, pid int, ports []string) int {
	t.Helper()
	return tcpSockets(t, pid, "01", ports, true)
}

// tcpSockets counts pid's TCP sockets in state (01 established, 0A
// listening) whose remote (or else local) port is one of ports.
func tcpSockets(t *testing.T, pid int, state string, ports []string, remote bool) int {
	t.Helper()
	inodes := map[string]bool{}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		link, _ := os.Readlink(filepath.Join(fmt.Sprintf("/proc/%d/fd", pid), fd.Name()))
		if inode, ok := strings.CutPrefix(link, "socket:["); ok {
			inodes[strings.TrimSuffix(inode, "]")] = true
		}
	}
	table, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/tcp", pid))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(table), "\n")[1:] {
		f := strings.Fields(line)
		// sl local rem st ... inode (the 10th field).
		if len(f) < 10 || f[3] != state || !inodes[f[9]] {
			continue
		}
		addr := f[1]
		if remote {
			addr = f[2]
		}
		_, hexPort, _ := strings.Cut(addr, ":")
		port, _ := strconv.ParseUint(hexPort, 16, 16)
		if slices.Contains(ports, strconv.Itoa(int(port))) {
			n++
		}
	}
	return n
}
