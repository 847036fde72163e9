package main

import (
	"bytes"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// agent is one gorun agent of a multi-node job, running in the background.
type agent struct {
	cmd  *exec.Cmd
	out  lockedBuffer
	done chan struct{}
	code int
}

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func startAgent(t *testing.T, args ...string) *agent {
	t.Helper()
	return startCommand(t, bin("gorun"), args...)
}

// startCommand starts name with args in the background, as an agent.
func startCommand(t *testing.T, name string, args ...string) *agent {
	t.Helper()
	return startCommandEnv(t, testEnv(t), name, args...)
}

// startCommandEnv is startCommand with the environment env.
func startCommandEnv(t *testing.T, env []string, name string, args ...string) *agent {
	t.Helper()
	a := &agent{cmd: exec.Command(name, args...), done: make(chan struct{})}
	a.cmd.Env = env
	a.cmd.Stdout, a.cmd.Stderr = &a.out, &a.out
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		err := a.cmd.Wait()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			a.code = ee.ExitCode()
		}
		close(a.done)
	}()
	t.Cleanup(func() {
		a.cmd.Process.Kill()
		<-a.done
	})
	return a
}

// wait waits for the agent to exit and returns its status.
func (a *agent) wait(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case <-a.done:
		return a.code
	case <-time.After(d):
		t.Fatalf("agent %v did not finish in %s:\n%s", a.cmd.Args, d, a.out.String())
		return 0
	}
}

// elasticJob is the command line shared by the agents of one test job:
// a c10d rendezvous on loopback with fast heartbeats.
func elasticJob(t *testing.T, nnodes string, extra ...string) []string {
	port := strconv.Itoa(freePort(t))
	return append([]string{
		"--nnodes", nnodes, "--nproc-per-node", "2", "--rdzv-backend", "c10d",
		"--rdzv-endpoint", "127.0.0.1:" + port, "--rdzv-id", strings.ReplaceAll(t.Name(), "/", "-"),
		"--rdzv-conf", "last_call_timeout=1.5,heartbeat_interval=0.25,heartbeat_misses=3",
	}, extra...)
}

// Issue 4, test 1: three agents form one round; kill -9 of one makes the
// other two re-rendezvous and finish with world size 2 x nproc, without
// spending the restart budget.
func TestElasticSurvivesALostNode(t *testing.T) {
	dir := t.TempDir()
	args := append(elasticJob(t, "2:3"), bin("elastic"), "-steps", "150", "-step-delay", "20ms", "-every", "10",
		"-checkpoint", filepath.Join(dir, "ckpt"), "-log-every", "10")
	agents := []*agent{startAgent(t, args...), startAgent(t, args...), startAgent(t, args...)}
	if !waitFor(60*time.Second, func() bool {
		return strings.Contains(agents[0].out.String()+agents[1].out.String()+agents[2].out.String(), "world 6 restart 0")
	}) {
		t.Fatalf("no round of 3 nodes:\n%s", agents[0].out.String())
	}
	victim := agents[2]
	if strings.Contains(victim.out.String(), "hosting the rendezvous store") {
		victim = agents[1]
	}
	victim.cmd.Process.Signal(syscall.SIGKILL)
	for i, a := range agents {
		if a == victim {
			continue
		}
		if code := a.wait(t, 90*time.Second); code != 0 {
			t.Fatalf("agent %d exited %d:\n%s", i, code, a.out.String())
		}
	}
	all := agents[0].out.String() + agents[1].out.String() + agents[2].out.String()
	for _, want := range []string{"missed 3 heartbeats", "with world 4", "finished 150 steps with world 4 after 0 restarts"} {
		if !strings.Contains(all, want) {
			t.Errorf("missing %q:\n%s", want, all)
		}
	}
}

// Issue 4, test 2: a third agent joining a running job of two makes it
// restart with three nodes; the restart budget is not spent.
func TestElasticAdmitsANewNode(t *testing.T) {
	dir := t.TempDir()
	args := append(elasticJob(t, "2:3"), bin("elastic"), "-steps", "200", "-step-delay", "20ms", "-every", "10",
		"-checkpoint", filepath.Join(dir, "ckpt"), "-log-every", "10")
	first := []*agent{startAgent(t, args...), startAgent(t, args...)}
	// Let the two-node job write a checkpoint before the third node comes.
	checkpointed := regexp.MustCompile(`step [2-9]0 loss \S+ world 4 restart 0`)
	if !waitFor(60*time.Second, func() bool { return checkpointed.MatchString(first[0].out.String() + first[1].out.String()) }) {
		t.Fatalf("no round of 2 nodes:\n%s%s", first[0].out.String(), first[1].out.String())
	}
	late := startAgent(t, args...)
	for i, a := range append(first, late) {
		if code := a.wait(t, 90*time.Second); code != 0 {
			t.Fatalf("agent %d exited %d:\n%s", i, code, a.out.String())
		}
	}
	all := first[0].out.String() + first[1].out.String() + late.out.String()
	if !regexp.MustCompile(`resumed from step \d+ \(checkpoint written by world 4\) with world 6`).MatchString(all) ||
		!strings.Contains(all, "finished 200 steps with world 6 after 0 restarts") {
		t.Errorf("the job did not grow to 3 nodes:\n%s", all)
	}
}

// Issue 4, test 3: a worker failure on one node restarts every node once
// from the shared budget; with no budget every agent exits with the
// failing worker's status and names it as the root cause.
func TestElasticGlobalRestartBudget(t *testing.T) {
	for _, budget := range []string{"1", "0"} {
		t.Run("max-restarts="+budget, func(t *testing.T) {
			dir := t.TempDir()
			args := append(elasticJob(t, "2", "--max-restarts", budget), bin("elastic"), "-steps", "60", "-every", "10",
				"-checkpoint", filepath.Join(dir, "ckpt"), "-log-every", "10",
				"-fail-at-step", "35", "-fail-rank", "3", "-fail-code", "7")
			agents := []*agent{startAgent(t, args...), startAgent(t, args...)}
			codes := make([]int, len(agents))
			for i, a := range agents {
				codes[i] = a.wait(t, 90*time.Second)
			}
			all := agents[0].out.String() + agents[1].out.String()
			if budget == "1" {
				if codes[0] != 0 || codes[1] != 0 || !strings.Contains(all, "finished 60 steps with world 4 after 1 restarts") {
					t.Fatalf("want both agents to finish after one restart, got %v:\n%s", codes, all)
				}
				for r := 0; r < 4; r++ {
					if !strings.Contains(all, fmt.Sprintf("[rank%d]: rank %d of 4", r, r)) {
						t.Errorf("rank %d never started", r)
					}
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

// Flags that do nothing with the chosen backend are reported, not ignored.
func TestInertFlagsAreWarnedAbout(t *testing.T) {
	endpoint := "127.0.0.1:" + strconv.Itoa(freePort(t))
	j := gorun(t, nil, "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--master-port", "1234", "--rdzv-conf", "bogus=1,last_call_timeout=0", "true")
	if j.code != 0 {
		t.Fatalf("job failed:\n%s", j)
	}
	for _, want := range []string{"--master-port has no effect with --rdzv-backend c10d", "--rdzv-conf bogus is not a rendezvous setting"} {
		if !strings.Contains(j.stderr, want) {
			t.Errorf("missing warning %q:\n%s", want, j.stderr)
		}
	}
	j = gorun(t, nil, "--rdzv-conf", "join_timeout=5", "true")
	if j.code != 0 || !strings.Contains(j.stderr, "--rdzv-conf join_timeout has no effect with --rdzv-backend static") {
		t.Errorf("want a warning for a c10d setting on a static job:\n%s", j)
	}
}

// With fewer than the minimum of nodes left, the survivor waits
// join_timeout for new ones, then fails saying so.
func TestElasticFailsBelowMinimumNodes(t *testing.T) {
	port := strconv.Itoa(freePort(t))
	args := []string{"--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:" + port, "--rdzv-id", "min",
		"--rdzv-conf", "heartbeat_interval=0.2,heartbeat_misses=2,join_timeout=2", "sleep", "30"}
	host := startAgent(t, args...)
	awaitArrivals(t, "127.0.0.1:"+port, "min", 1) // the first up hosts the store
	other := startAgent(t, args...)
	if !waitFor(30*time.Second, func() bool { return strings.Contains(other.out.String(), "started 1 workers") }) {
		t.Fatalf("the job did not start:\n%s\n%s", host.out.String(), other.out.String())
	}
	other.cmd.Process.Signal(syscall.SIGKILL)
	if code := host.wait(t, 30*time.Second); code == 0 {
		t.Fatalf("the survivor succeeded alone:\n%s", host.out.String())
	}
	if out := host.out.String(); !strings.Contains(out, "join timeout") || !strings.Contains(out, "min 2") {
		t.Errorf("the survivor did not say it lacked nodes:\n%s", out)
	}
}
