package main

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gorun/gorun/internal/etcdtest"
	rendezvousetcd "github.com/gorun/gorun/rendezvous/etcd"
)

// etcdLeaseTTL is the tests' lease TTL, in seconds.
const etcdLeaseTTL = 3

// etcdJob is the command line shared by the agents of one test job: the
// etcd rendezvous in cluster c with short timings.
func etcdJob(t *testing.T, c *etcdtest.Cluster, nnodes string, extra ...string) []string {
	return append([]string{
		"--nnodes", nnodes, "--nproc-per-node", "2", "--rdzv-backend", "etcd",
		"--rdzv-endpoint", strings.Join(c.Endpoints(), ","), "--rdzv-id", strings.ReplaceAll(t.Name(), "/", "-"),
		"--rdzv-conf", fmt.Sprintf("last_call_timeout=1,lease_ttl=%d,read_timeout=5", etcdLeaseTTL),
	}, extra...)
}

func allOutput(agents []*agent) string {
	var b strings.Builder
	for _, a := range agents {
		b.WriteString(a.out.String())
	}
	return b.String()
}

// Three agents form one round on a 3-member etcd cluster; kill -9 of the
// one that is group rank 0, which hosts the workers' store, makes the
// other two form a round of their own within 3 lease TTLs and finish,
// without spending the restart budget.
func TestEtcdSurvivesLosingGroupRankZero(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	dir := t.TempDir()
	args := append(etcdJob(t, c, "2:3"), bin("elastic"), "-steps", "200", "-step-delay", "20ms", "-every", "10",
		"-checkpoint", filepath.Join(dir, "ckpt"), "-log-every", "10")
	agents := []*agent{startAgent(t, args...), startAgent(t, args...), startAgent(t, args...)}
	if !waitFor(60*time.Second, func() bool { return strings.Contains(allOutput(agents), "world 6 restart 0") }) {
		t.Fatalf("no round of 3 nodes:\n%s", allOutput(agents))
	}
	var victim *agent
	for _, a := range agents {
		if regexp.MustCompile(`rendezvous complete.*node_rank=0`).MatchString(a.out.String()) {
			victim = a
		}
	}
	if victim == nil {
		t.Fatalf("no agent says it is group rank 0:\n%s", allOutput(agents))
	}
	victim.cmd.Process.Signal(syscall.SIGKILL)
	killed := time.Now()
	if !waitFor(60*time.Second, func() bool { return strings.Contains(allOutput(agents), "with world 4") }) {
		t.Fatalf("the survivors did not re-form:\n%s", allOutput(agents))
	}
	if took := time.Since(killed); took > etcdLeaseTTL*3*time.Second {
		t.Errorf("the survivors' workers restarted %v after the kill, more than 3 lease TTLs", took)
	}
	for i, a := range agents {
		if a == victim {
			continue
		}
		if code := a.wait(t, 90*time.Second); code != 0 {
			t.Fatalf("agent %d exited %d:\n%s", i, code, a.out.String())
		}
	}
	all := allOutput(agents)
	for _, want := range []string{"is gone: it left, or its etcd lease lapsed", "finished 200 steps with world 4 after 0 restarts"} {
		if !strings.Contains(all, want) {
			t.Errorf("missing %q:\n%s", want, all)
		}
	}
}

// kill -9 of the etcd leader while the nodes form their round, and of the
// next leader while the job runs, changes nothing the workers see: one
// round, no restart.
func TestEtcdLeaderLoss(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	dir := t.TempDir()
	args := append(etcdJob(t, c, "2"), bin("elastic"), "-steps", "400", "-step-delay", "20ms", "-every", "10",
		"-checkpoint", filepath.Join(dir, "ckpt"), "-log-every", "10")
	first := startAgent(t, args...)
	// The first agent waits in round 0 for the second.
	cli := c.Client()
	if !waitFor(30*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		r, err := cli.Get(ctx, rendezvousetcd.DefaultPrefix+"/"+t.Name()+"/round/0/node/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && r.Count == 1
	}) {
		t.Fatalf("the first agent never joined round 0:\n%s", first.out.String())
	}
	leader := c.Leader()
	c.Kill(leader)
	agents := []*agent{first, startAgent(t, args...)}
	if !waitFor(60*time.Second, func() bool { return strings.Contains(allOutput(agents), "step 50 loss") }) {
		t.Fatalf("no job after the leader's loss:\n%s", allOutput(agents))
	}
	// Mid-job: bring the first back (a quorum of three needs two), then
	// kill whoever leads now.
	c.Restart(leader)
	c.AwaitHealthy(30 * time.Second)
	next := c.Leader()
	for _, a := range agents {
		select {
		case <-a.done:
			t.Fatalf("the job ended before the second leader was killed:\n%s", allOutput(agents))
		default:
		}
	}
	c.Kill(next)
	for i, a := range agents {
		if code := a.wait(t, 90*time.Second); code != 0 {
			t.Fatalf("agent %d exited %d:\n%s", i, code, a.out.String())
		}
	}
	all := allOutput(agents)
	if !strings.Contains(all, "finished 400 steps with world 4 after 0 restarts") || strings.Contains(all, "round changed") ||
		strings.Contains(all, "resumed from step") {
		t.Errorf("the workers saw the leader's loss:\n%s", all)
	}
}

// With every etcd member down, the agent says so and exits 69
// (unavailable) once read_timeout passes.
func TestEtcdDownEntirely(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	for _, m := range c.Members {
		c.Kill(m)
	}
	j := gorun(t, nil, append(etcdJob(t, c, "2"), "true")...)
	if j.code != 69 || !strings.Contains(j.stderr, "no answer from a quorum of etcd members") {
		t.Fatalf("want exit 69 naming etcd, got:\n%s", j)
	}
}

// Losing etcd's quorum mid-job makes every agent say so, stop its
// workers and exit 69.
func TestEtcdQuorumLoss(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	dir := t.TempDir()
	args := append(etcdJob(t, c, "2"), bin("elastic"), "-steps", "100000", "-step-delay", "20ms", "-every", "10",
		"-checkpoint", filepath.Join(dir, "ckpt"), "-log-every", "10")
	agents := []*agent{startAgent(t, args...), startAgent(t, args...)}
	if !waitFor(60*time.Second, func() bool { return strings.Contains(allOutput(agents), "step 20 loss") }) {
		t.Fatalf("no job:\n%s", allOutput(agents))
	}
	c.Kill(c.Members[0])
	c.Kill(c.Members[1])
	for i, a := range agents {
		// A lease TTL to notice, read_timeout (5 s) to give up.
		if code := a.wait(t, 60*time.Second); code != 69 {
			t.Fatalf("agent %d exited %d, want 69:\n%s", i, code, a.out.String())
		}
		if out := a.out.String(); !strings.Contains(out, "lost its etcd lease") || !strings.Contains(out, "no answer from a quorum") {
			t.Errorf("agent %d does not say it lost etcd:\n%s", i, out)
		}
	}
}

// The members speak HTTPS and ask for client certificates: torch's
// protocol, cacert, cert and key reach them.
func TestEtcdTLS(t *testing.T) {
	certs := etcdtest.NewCerts(t, "127.0.0.1")
	c := etcdtest.Start(t, etcdtest.Options{TLS: certs})
	tlsConf := fmt.Sprintf("protocol=https,cacert=%s,cert=%s,key=%s,lease_ttl=%d,read_timeout=5",
		certs.CA, certs.ClientCert, certs.ClientKey, etcdLeaseTTL)
	base := []string{"--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "etcd-v2",
		"--rdzv-endpoint", strings.Join(c.Endpoints(), ","), "--rdzv-id", strings.ReplaceAll(t.Name(), "/", "-")}
	args := append(append(base, "--rdzv-conf", tlsConf), bin("elastic"), "-steps", "30", "-every", "10",
		"-checkpoint", filepath.Join(t.TempDir(), "ckpt"))
	agents := []*agent{startAgent(t, args...), startAgent(t, args...)}
	for i, a := range agents {
		if code := a.wait(t, 60*time.Second); code != 0 {
			t.Fatalf("agent %d exited %d:\n%s", i, code, a.out.String())
		}
	}
	if all := allOutput(agents); !strings.Contains(all, "finished 30 steps with world 4") {
		t.Fatalf("no job over TLS:\n%s", all)
	}
	// Without its certificate, a client is refused: exit 69.
	noCert := fmt.Sprintf("protocol=https,cacert=%s,read_timeout=3", certs.CA)
	j := gorun(t, nil, append(append(base, "--rdzv-conf", noCert), "true")...)
	if j.code != 69 {
		t.Fatalf("want exit 69 without a client certificate, got:\n%s", j)
	}
}

// A node cut off from etcd (network namespaces stand in for the hosts;
// the etcd members are on the bridge's host) loses its lease: the others
// form a round without it and finish, while its agent says it lost etcd,
// stops its workers and exits 69. The node cut off is group rank 0, the
// one that hosted the workers' store.
func TestEtcdNodeCutOff(t *testing.T) {
	etcdtest.Need(t)
	h := newHosts(t, 3)
	c := etcdtest.Start(t, etcdtest.Options{Host: h.subnet + ".1"})
	dir := t.TempDir()
	args := []string{
		"--nnodes", "2:3", "--nproc-per-node", "1", "--rdzv-backend", "etcd", "--rdzv-id", strings.ReplaceAll(t.Name(), "/", "-"),
		"--rdzv-endpoint", strings.Join(c.Endpoints(), ","),
		"--rdzv-conf", fmt.Sprintf("last_call_timeout=1,lease_ttl=%d,read_timeout=5,close_timeout=2", etcdLeaseTTL),
		bin("elastic"), "-steps", "600", "-step-delay", "20ms", "-every", "10", "-log-every", "10",
		"-checkpoint", filepath.Join(dir, "ckpt"),
	}
	t.Setenv("GORUN_TRANSPORT", "tcp")
	agents := []*agent{startAgentOn(t, h, 1, args...), startAgentOn(t, h, 2, args...), startAgentOn(t, h, 3, args...)}
	if !waitFor(60*time.Second, func() bool { return strings.Contains(allOutput(agents), "world 3 restart 0") }) {
		t.Fatalf("no round of 3 nodes:\n%s", allOutput(agents))
	}
	cut := -1
	for i, a := range agents {
		if regexp.MustCompile(`rendezvous complete.*node_rank=0`).MatchString(a.out.String()) {
			cut = i
		}
	}
	if cut < 0 {
		t.Fatalf("no agent says it is group rank 0:\n%s", allOutput(agents))
	}
	// Host cut+1 drops whatever the etcd members send it.
	h.ip("-n", h.names[cut], "rule", "add", "pref", "101", "from", h.subnet+".1", "blackhole")
	for i, a := range agents {
		code := a.wait(t, 90*time.Second)
		out := a.out.String()
		switch {
		case i == cut && (code != 69 || !strings.Contains(out, "lost its etcd lease")):
			t.Errorf("the cut agent exited %d; want 69, saying it lost etcd:\n%s", code, out)
		case i != cut && code != 0:
			t.Errorf("agent %d exited %d:\n%s", i, code, out)
		}
	}
	if all := allOutput(agents); !strings.Contains(all, "finished 600 steps with world 2 after 0 restarts") ||
		!strings.Contains(all, "is gone: it left, or its etcd lease lapsed") {
		t.Errorf("the others did not go on without the cut node:\n%s", all)
	}
}

// What c10d does, etcd does: a late joiner grows the job, a worker
// failure spends the one budget of the job, both nodes name the root
// cause once it is spent, and one node's Ctrl-C does not end the job for
// the others.
func TestEtcdAdmitsANewNode(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	dir := t.TempDir()
	args := append(etcdJob(t, c, "2:3"), bin("elastic"), "-steps", "200", "-step-delay", "20ms", "-every", "10",
		"-checkpoint", filepath.Join(dir, "ckpt"), "-log-every", "10")
	first := []*agent{startAgent(t, args...), startAgent(t, args...)}
	checkpointed := regexp.MustCompile(`step [2-9]0 loss \S+ world 4 restart 0`)
	if !waitFor(60*time.Second, func() bool { return checkpointed.MatchString(allOutput(first)) }) {
		t.Fatalf("no round of 2 nodes:\n%s", allOutput(first))
	}
	late := startAgent(t, args...)
	agents := append(first, late)
	for i, a := range agents {
		if code := a.wait(t, 90*time.Second); code != 0 {
			t.Fatalf("agent %d exited %d:\n%s", i, code, a.out.String())
		}
	}
	all := allOutput(agents)
	if !regexp.MustCompile(`resumed from step \d+ \(checkpoint written by world 4\) with world 6`).MatchString(all) ||
		!strings.Contains(all, "finished 200 steps with world 6 after 0 restarts") || !strings.Contains(all, "waits to join") {
		t.Errorf("the job did not grow to 3 nodes:\n%s", all)
	}
}

func TestEtcdGlobalRestartBudget(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	for _, budget := range []string{"1", "0"} {
		t.Run("max-restarts="+budget, func(t *testing.T) {
			dir := t.TempDir()
			args := append(etcdJob(t, c, "2", "--max-restarts", budget), bin("elastic"), "-steps", "60", "-every", "10",
				"-checkpoint", filepath.Join(dir, "ckpt"), "-log-every", "10",
				"-fail-at-step", "35", "-fail-rank", "3", "-fail-code", "7")
			agents := []*agent{startAgent(t, args...), startAgent(t, args...)}
			codes := []int{agents[0].wait(t, 90*time.Second), agents[1].wait(t, 90*time.Second)}
			all := allOutput(agents)
			if budget == "1" {
				if codes[0] != 0 || codes[1] != 0 || !strings.Contains(all, "finished 60 steps with world 4 after 1 restarts") {
					t.Fatalf("want both agents to finish after one restart, got %v:\n%s", codes, all)
				}
				return
			}
			for i, a := range agents {
				out := a.out.String()
				if codes[i] != 7 || !strings.Contains(out, "Root Cause") {
					t.Fatalf("agent %d: want exit 7 with a report, got %d:\n%s", i, codes[i], out)
				}
				root := out[strings.Index(out, "Root Cause"):]
				if !strings.Contains(root[:strings.Index(root, "exitcode")], "rank      : 3 (local_rank: 1)") {
					t.Errorf("agent %d does not name rank 3 as the root cause:\n%s", i, out)
				}
			}
		})
	}
}

func TestEtcdInterruptedNodeLeaves(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	dir := t.TempDir()
	args := append(etcdJob(t, c, "2:3"), bin("elastic"), "-steps", "300", "-step-delay", "20ms", "-every", "10",
		"-checkpoint", filepath.Join(dir, "ckpt"), "-log-every", "10")
	agents := []*agent{startAgent(t, args...), startAgent(t, args...), startAgent(t, args...)}
	if !waitFor(60*time.Second, func() bool { return strings.Contains(allOutput(agents), "world 6 restart 0") }) {
		t.Fatalf("no round of 3 nodes:\n%s", allOutput(agents))
	}
	agents[1].cmd.Process.Signal(syscall.SIGINT)
	left := time.Now()
	if code := agents[1].wait(t, 30*time.Second); code != 130 {
		t.Fatalf("the interrupted agent exited %d, want 130:\n%s", code, agents[1].out.String())
	}
	// It left: the others need not wait out its lease.
	if !waitFor(60*time.Second, func() bool { return strings.Contains(allOutput(agents), "with world 4") }) {
		t.Fatalf("no round without the node that left:\n%s", allOutput(agents))
	}
	if took := time.Since(left); took > etcdLeaseTTL*time.Second {
		t.Errorf("the others re-formed %v after the node left, no sooner than its lease would lapse", took)
	}
	for _, i := range []int{0, 2} {
		if code := agents[i].wait(t, 90*time.Second); code != 0 {
			t.Fatalf("agent %d exited %d:\n%s", i, code, agents[i].out.String())
		}
	}
	if all := allOutput(agents); !regexp.MustCompile(`node \S+ on \S+ left`).MatchString(all) {
		t.Errorf("no node says the interrupted one left:\n%s", all)
	}
}

// One command launches an etcd job over SSH: the head passes the backend
// and the members on to every host's agent, and no rendezvous secret
// (etcd authenticates its own clients).
func TestEtcdOverSSH(t *testing.T) {
	e := etcdtest.Start(t, etcdtest.Options{})
	c := newSSHCluster(t)
	dir := t.TempDir()
	worker := script(t, dir, "worker.sh", `echo "rank $RANK world $WORLD_SIZE node $GORUN_TEST_NODE"`+"\n")
	h := startHead(t, dir, "--ssh-config", c.config, "--shutdown-timeout", "5",
		"--rdzv-backend", "etcd", "--rdzv-endpoint", strings.Join(e.Endpoints(), ","),
		"--rdzv-conf", fmt.Sprintf("last_call_timeout=0.5,lease_ttl=%d", etcdLeaseTTL),
		"--hosts", "127.0.0.1:2,127.0.0.2:2", worker)
	if code := h.wait(t, 90*time.Second); code != 0 {
		t.Fatalf("head exited %d:\n%s", code, h.out.String())
	}
	out := h.out.String()
	for r := range 4 {
		if want := fmt.Sprintf("rank %d world 4 node 127.0.0.%d", r, r/2+1); !strings.Contains(out, want) {
			t.Errorf("missing %q:\n%s", want, out)
		}
	}
	if j := gorun(t, nil, "--hosts", "a,b", "--rdzv-backend", "etcd", "true"); j.code != 2 || !strings.Contains(j.stderr, "name the etcd members") {
		t.Errorf("etcd over SSH without members: want exit 2:\n%s", j)
	}
}
