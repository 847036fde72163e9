package launcher

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A worker's background child survives Pdeathsig; the keeper must kill it
// when the agent is killed -9, and remove the job's folders but those that
// hold worker logs.
func TestKeeperKillsWorkerTreeWhenAgentIsKilled(t *testing.T) {
	t.Parallel()
	plain, logs := jobDirs(t)
	agent := exec.Command(os.Args[0], "-test.run=^$")
	agent.Env = append(os.Environ(), fakeAgentEnv+"=1", fakeAgentDirsEnv+"="+plain+":"+logs)
	agent.Stderr = os.Stderr
	stdout, err := agent.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	killOnCleanup(t, agent.Process.Pid)

	pids := readPids(t, bufio.NewScanner(stdout), "worker", "grandchild", "keeper")
	for _, pid := range pids {
		killOnCleanup(t, pid)
		if !alive(pid) {
			t.Fatalf("process %d not running before the agent was killed", pid)
		}
	}
	if err := agent.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	agent.Wait()
	// A bound for a hang: the keeper itself lives on for up to
	// keeperSweepWait while the killed groups end, and then sweeps.
	waitGone(t, keeperSweepWait+5*time.Second, pids...)
	assertSwept(t, plain, logs)
}

// jobDirs makes two folders for a keeper to remove: plain, and logs, which
// holds a worker's log and must be kept.
func jobDirs(t *testing.T) (plain, logs string) {
	t.Helper()
	plain, logs = t.TempDir()+"/job", t.TempDir()+"/job"
	for _, dir := range []string{plain, logs} {
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(logs+"/stdout.log", []byte("kept\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return plain, logs
}

func assertSwept(t *testing.T, plain, logs string) {
	t.Helper()
	if _, err := os.Stat(plain); !os.IsNotExist(err) {
		t.Errorf("the job's folder %s is still there (%v)", plain, err)
	}
	if _, err := os.Stat(logs + "/stdout.log"); err != nil {
		t.Errorf("the folder holding a worker's log was not kept: %v", err)
	}
}

// At the agent's own end, Close does the keeper's work itself and then
// dismisses the keeper (SIGKILL), rather than waiting for it to act.
func TestKeeperCloseDoesTheWorkAndDismissesTheKeeper(t *testing.T) {
	t.Parallel()
	keeper, err := StartKeeper(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	plain, logs := jobDirs(t)
	for _, dir := range []string{plain, logs} {
		if err := keeper.RemoveOnExit(dir); err != nil {
			t.Fatal(err)
		}
	}
	if err := keeper.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	assertSwept(t, plain, logs)
	state := keeper.cmd.ProcessState
	if state == nil {
		t.Fatal("Close returned before the keeper was reaped")
	}
	if ws, ok := state.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Errorf("keeper ended with %v; want SIGKILL from Close", state)
	}
}

// readPids reads "<name> <pid>" lines until it has every name.
func readPids(t *testing.T, lines *bufio.Scanner, names ...string) []int {
	t.Helper()
	found := make(map[string]int)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for len(found) < len(names) && lines.Scan() {
			var name string
			var pid int
			if _, err := fmt.Sscanf(lines.Text(), "%s %d", &name, &pid); err == nil {
				found[name] = pid
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("fake agent did not report its pids")
	}
	var pids []int
	for _, name := range names {
		pid, ok := found[name]
		if !ok {
			t.Fatalf("fake agent did not report %s; got %v", name, found)
		}
		pids = append(pids, pid)
	}
	return pids
}

func TestKeeperCloseKillsTrackedGroups(t *testing.T) {
	t.Parallel()
	keeper, err := StartKeeper(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	out := newWaitingWriter()
	g, err := StartGroup([]WorkerSpec{
		{LocalRank: 0, Argv: sh("exit 0")},
		{LocalRank: 1, Argv: sh("echo ready; exec sleep 300"), Stdout: out},
	}, GroupOptions{Logger: testLogger(t), Keeper: keeper})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Stop(syscall.SIGKILL, 0) })
	out.waitFor(t, "ready")
	// Worker 0 ends, and is forgotten, before the keeper closes: the
	// workers start side by side, so worker 1 may be ready first.
	select {
	case exit := <-g.Exits():
		if exit.LocalRank != 0 || exit.Failed() {
			t.Fatalf("first exit %v; want worker 0 ending on its own", exit)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("worker 0 did not exit")
	}
	if err := keeper.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if exits := collectExits(t, g); len(exits) != 1 || exits[0].Signal != syscall.SIGKILL {
		t.Errorf("exits %v; want worker 1 SIGKILLed by the keeper", exits)
	}
	if err := keeper.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := keeper.Track(1); err == nil {
		t.Error("Track after Close succeeded")
	}
}

func TestKeepRecords(t *testing.T) {
	records := "+10\n+20\n+30\n-20\nbogus\n+\n-x\n+-5\n+40\n-40\n"
	var warnings strings.Builder
	if got, _ := keep(strings.NewReader(records), &warnings); !slices.Equal(got, []int{10, 30}) {
		t.Errorf("keep(%q) = %v, want [10 30]", records, got)
	}
	if n := strings.Count(warnings.String(), "ignoring record"); n != 4 {
		t.Errorf("%d warnings for 4 malformed records:\n%s", n, warnings.String())
	}
}

func TestNilKeeperIsANoOp(t *testing.T) {
	var keeper *Keeper
	if keeper.Track(1) != nil || keeper.Untrack(1) != nil || keeper.Close() != nil {
		t.Error("a nil *Keeper must accept every call")
	}
}
