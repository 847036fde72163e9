package main

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/rendezvous"
)

// stopBound is how soon an agent with no workers running must exit once a
// stop signal reaches it.
const stopBound = time.Second

// awaitOutput waits until the agent's output holds want.
func (a *agent) awaitOutput(t *testing.T, want string) {
	t.Helper()
	if !waitFor(60*time.Second, func() bool { return strings.Contains(a.out.String(), want) }) {
		t.Fatalf("agent %v never said %q:\n%s", a.cmd.Args, want, a.out.String())
	}
}

// stopWithin sends sig to the agent and checks that it exits with
// 128+sig within bound of the signal.
func (a *agent) stopWithin(t *testing.T, sig syscall.Signal, bound time.Duration) {
	t.Helper()
	sent := time.Now()
	if err := a.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("agent did not exit on %v:\n%s", sig, a.out.String())
	}
	took := time.Since(sent)
	if a.code != 128+int(sig) {
		t.Errorf("exit %d after %v, want %d:\n%s", a.code, sig, 128+int(sig), a.out.String())
	}
	if took > bound {
		t.Errorf("exited %v after %v, want within %v:\n%s", took, sig, bound, a.out.String())
	}
}

// staticJob is the command line of node rank of a static job of nnodes
// on loopback.
func staticJob(port, nnodes, rank int, extra ...string) []string {
	return append([]string{"--nnodes", strconv.Itoa(nnodes), "--node-rank", strconv.Itoa(rank),
		"--master-addr", "127.0.0.1", "--master-port", strconv.Itoa(port), "--nproc-per-node", "1"}, extra...)
}

// A node waiting for a peer that never comes stops at once on a signal,
// with 128+signal, static or c10d.
func TestSignalWhileWaitingForPeers(t *testing.T) {
	for _, backend := range []string{"static", "c10d"} {
		for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP} {
			t.Run(backend+"/"+sig.String(), func(t *testing.T) {
				args, waiting := staticJob(freePort(t), 2, 0, "true"), "store listening"
				if backend == "c10d" {
					args = append(elasticJob(t, "2"), "true")
					waiting = "hosting the rendezvous store"
				}
				a := startAgent(t, args...)
				a.awaitOutput(t, waiting)
				a.stopWithin(t, sig, stopBound)
				if strings.Contains(a.out.String(), "started") {
					t.Errorf("workers started after the signal:\n%s", a.out.String())
				}
			})
		}
	}
}

// A static node that cannot reach node 0's store yet stops at once too.
func TestSignalWhileJoiningTheStore(t *testing.T) {
	a := startAgent(t, staticJob(freePort(t), 2, 1, "true")...)
	a.awaitOutput(t, "joining the store of node 0")
	a.stopWithin(t, syscall.SIGTERM, stopBound)
}

// A static node that leaves before the job began makes the nodes waiting
// for it fail at once, naming it, instead of waiting out the store's
// timeout; so does the store's host leaving.
func TestStaticPeersLearnANodeLeft(t *testing.T) {
	for _, leaver := range []int{1, 0} {
		t.Run("node"+strconv.Itoa(leaver), func(t *testing.T) {
			port := freePort(t)
			nodes := []*agent{startAgent(t, staticJob(port, 3, 0, "true")...)}
			nodes[0].awaitOutput(t, "store listening")
			nodes = append(nodes, startAgent(t, staticJob(port, 3, 1, "true")...))
			// Node 1 waits once it published its role info in node 0's store.
			if !waitFor(30*time.Second, func() bool { return storeHasRoleInfo(t, port, 1) }) {
				t.Fatalf("node 1 did not join:\n%s", nodes[1].out.String())
			}
			nodes[leaver].stopWithin(t, syscall.SIGTERM, stopBound)
			other := nodes[1-leaver]
			sent := time.Now()
			if code := other.wait(t, 30*time.Second); code != exitUnavailable {
				t.Errorf("the other node exited %d, want %d:\n%s", code, exitUnavailable, other.out.String())
			}
			if took := time.Since(sent); took > stopBound {
				t.Errorf("the other node failed %v after node %d left, want within %v", took, leaver, stopBound)
			}
			want := "node " + strconv.Itoa(leaver) + " on "
			if out := other.out.String(); !strings.Contains(out, want) || !strings.Contains(out, "left before the job began: stopped by SIGTERM") {
				t.Errorf("the other node does not say that node %d left:\n%s", leaver, out)
			}
		})
	}
}

// storeHasRoleInfo asks the static job's store on port whether node rank
// published its role info there (run id "none").
func storeHasRoleInfo(t *testing.T, port, rank int) bool {
	t.Helper()
	return storeCounter(t, port, "none/torchelastic/role_info/"+strconv.Itoa(rank), true) > 0
}

// storeCounter reads a counter of the store on port, or with exists,
// whether key exists (1) or not (0). It hangs up at once: hosts wait for
// their clients as they leave.
func storeCounter(t *testing.T, port int, key string, exists bool) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := rendezvous.Dial(ctx, "127.0.0.1:"+strconv.Itoa(port), rendezvous.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if exists {
		ok, err := c.Check(ctx, []string{key})
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			return 1
		}
		return 0
	}
	n, err := c.Add(ctx, key, 0)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// awaitArrivals waits until n nodes have arrived in round 0 of the c10d
// rendezvous id, whose store listens at addr ("host:port"): a node that
// must come first has then come first, and hosts the store if it can.
func awaitArrivals(t *testing.T, addr, id string, n int64) {
	t.Helper()
	key := "rdzv/" + id + "/round/0/arrivals"
	arrived := func() (int64, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		c, err := rendezvous.Dial(ctx, addr, rendezvous.ClientOptions{})
		if err != nil {
			return 0, err
		}
		defer c.Close()
		if ok, err := c.Check(ctx, []string{key}); err != nil || !ok {
			return 0, err
		}
		return c.Add(ctx, key, 0)
	}
	var got int64
	var err error
	if !waitFor(60*time.Second, func() bool { got, err = arrived(); return err == nil && got >= n }) {
		t.Fatalf("%d of %d nodes arrived in round 0 of %s at %s: %v", got, n, id, addr, err)
	}
}

// endpointPort is the port of --rdzv-endpoint in args.
func endpointPort(t *testing.T, args []string) int {
	for i, a := range args {
		if a == "--rdzv-endpoint" {
			_, port, _ := strings.Cut(args[i+1], ":")
			p, err := strconv.Atoi(port)
			if err == nil {
				return p
			}
		}
	}
	t.Fatalf("no --rdzv-endpoint in %v", args)
	return 0
}

// A c10d node that leaves the round being formed withdraws from it: the
// nodes that come next form a round without it at once, and no one waits
// for its heartbeats.
func TestElasticPeersFormWithoutANodeThatLeft(t *testing.T) {
	args := append(elasticJob(t, "3"), "sh", "-c", `echo "world=$WORLD_SIZE"`)
	host := startAgent(t, args...)
	host.awaitOutput(t, "hosting the rendezvous store")
	leaver := startAgent(t, args...)
	arrivals := "rdzv/" + t.Name() + "/round/0/arrivals"
	if !waitFor(30*time.Second, func() bool { return storeCounter(t, endpointPort(t, args), arrivals, false) == 2 }) {
		t.Fatalf("the second node did not join round 0:\n%s", leaver.out.String())
	}
	leaver.stopWithin(t, syscall.SIGTERM, stopBound)
	late := []*agent{startAgent(t, args...), startAgent(t, args...)}
	for i, a := range append(late, host) {
		if code := a.wait(t, 60*time.Second); code != 0 {
			t.Fatalf("agent %d exited %d:\n%s", i, code, a.out.String())
		}
	}
	// Round 0 had the leaver; its withdrawal voided it.
	for i, a := range append(late, host) {
		if out := a.out.String(); !strings.Contains(out, "nodes=3 nproc_per_node=2 restarts=0 round=1") || strings.Count(out, "world=6") != 2 {
			t.Errorf("agent %d did not run in round 1 with the 2 others:\n%s", i, out)
		}
	}
	all := host.out.String() + late[0].out.String() + late[1].out.String()
	if strings.Contains(all, "missed") {
		t.Errorf("the others waited for the leaver's heartbeats:\n%s", all)
	}
}

// The c10d store's host leaving ends the job: a node waiting for a round
// learns it at once, and why, rather than losing the store under it.
func TestElasticHostLeavingEndsTheJob(t *testing.T) {
	args := append(elasticJob(t, "3"), "true")
	host := startAgent(t, args...)
	host.awaitOutput(t, "hosting the rendezvous store")
	other := startAgent(t, args...)
	arrivals := "rdzv/" + t.Name() + "/round/0/arrivals"
	if !waitFor(30*time.Second, func() bool { return storeCounter(t, endpointPort(t, args), arrivals, false) == 2 }) {
		t.Fatalf("the second node did not join round 0:\n%s", other.out.String())
	}
	host.stopWithin(t, syscall.SIGINT, stopBound)
	sent := time.Now()
	other.wait(t, 30*time.Second)
	if took := time.Since(sent); took > stopBound {
		t.Errorf("the other node exited %v after the host left, want within %v:\n%s", took, stopBound, other.out.String())
	}
	if out := other.out.String(); !strings.Contains(out, "which hosts the store, left") {
		t.Errorf("the other node does not say that the job ended as its host left:\n%s", out)
	}
}

// A node whose workers finished waits in the exit barrier for a slow
// node; a signal there stops it at once, and the slow node still
// finishes its job.
func TestSignalDuringExitBarrier(t *testing.T) {
	dir := t.TempDir()
	release := filepath.Join(dir, "release")
	slow := script(t, dir, "slow.sh", `while [ ! -e "`+release+`" ]; do sleep 0.05; done; echo slow done`+"\n")
	port := freePort(t)
	node0 := startAgent(t, staticJob(port, 2, 0, slow)...)
	node1 := startAgent(t, staticJob(port, 2, 1, "true")...)
	// The store counts node 1 in torchrun's exit barrier (under the
	// default run id): it is waiting there for node 0.
	arrived := "none/torchelastic/agent/terminal_state/num_members"
	if !waitFor(60*time.Second, func() bool {
		return storeCounter(t, port, arrived, true) == 1 && storeCounter(t, port, arrived, false) == 1
	}) {
		t.Fatalf("node 1 never arrived at the exit barrier:\n%s", node1.out.String())
	}
	node1.stopWithin(t, syscall.SIGTERM, stopBound)
	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code := node0.wait(t, 60*time.Second); code != 0 || !strings.Contains(node0.out.String(), "slow done") {
		t.Errorf("the slow node exited %d:\n%s", code, node0.out.String())
	}
}

// A c10d node re-rendezvousing after it lost its peer stops at once on a
// signal.
func TestSignalWhileRestarting(t *testing.T) {
	args := append(elasticJob(t, "2", "--max-restarts", "3"), "sleep", "60")
	host := startAgent(t, args...)
	host.awaitOutput(t, "hosting the rendezvous store")
	peer := startAgent(t, args...)
	host.awaitOutput(t, "started 2 workers")
	peer.cmd.Process.Signal(syscall.SIGKILL)
	host.awaitOutput(t, "stopped the workers to rejoin")
	host.stopWithin(t, syscall.SIGTERM, stopBound)
}

// A second SIGINT kills workers that ignore SIGTERM at once, however long
// the grace.
func TestSecondSignalKillsAtOnce(t *testing.T) {
	dir := t.TempDir()
	w := script(t, dir, "w.sh", `trap '' INT TERM
echo ready > "`+dir+`/ready.$RANK"
while :; do sleep 0.05; done
`)
	a := startAgent(t, "--nproc-per-node", "2", "--shutdown-timeout", "60", w)
	if !waitFor(30*time.Second, func() bool {
		_, e0 := os.Stat(filepath.Join(dir, "ready.0"))
		_, e1 := os.Stat(filepath.Join(dir, "ready.1"))
		return e0 == nil && e1 == nil
	}) {
		t.Fatalf("workers did not start:\n%s", a.out.String())
	}
	if err := a.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	a.awaitOutput(t, "stopping")
	a.stopWithin(t, syscall.SIGINT, stopBound)
}
