package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// slurmStep is the environment srun gives one task per node of a step,
// here for nodes that are all this machine.
func slurmStep(job, nodes, node int) []string {
	return []string{
		"SLURM_JOB_ID=" + strconv.Itoa(job), "SLURM_STEP_ID=0",
		"SLURM_STEP_NUM_NODES=" + strconv.Itoa(nodes), "SLURM_NODEID=" + strconv.Itoa(node),
		"SLURM_STEP_NODELIST=" + strings.TrimSuffix(strings.Repeat("localhost,", nodes), ","),
	}
}

// A job id whose derived port is free on this machine right now.
func slurmJobID(t *testing.T) int {
	t.Helper()
	return slurmJobIDs(t, 1)
}

// `srun gorun ./worker` needs no flags: two "nodes" of an srun step form
// one job from Slurm's variables alone. (A real Slurm cluster runs this in
// issue 5's tests; here the step's environment is given by hand.)
func TestSlurmStepNeedsNoFlags(t *testing.T) {
	job := slurmJobID(t)
	dir := t.TempDir()
	w := script(t, dir, "w.sh", `echo "rank=$RANK world=$WORLD_SIZE node=$GROUP_RANK/$GROUP_WORLD_SIZE run=$TORCHELASTIC_RUN_ID"`+"\n")
	agents := make([]*agent, 2)
	for node := range agents {
		agents[node] = startCommandEnv(t, append(testEnv(t), slurmStep(job, 2, node)...), bin("gorun"), "--nproc-per-node", "2",
			"--rdzv-conf", "last_call_timeout=0.5", w)
	}
	var all string
	for i, a := range agents {
		if code := a.wait(t, 60*time.Second); code != 0 {
			t.Fatalf("node %d exited %d:\n%s", i, code, a.out.String())
		}
		all += a.out.String()
	}
	for r := 0; r < 4; r++ {
		want := fmt.Sprintf("rank=%d world=4 node=%d/2 run=slurm-%d", r, r/2, job)
		if !strings.Contains(all, want) {
			t.Errorf("missing %q:\n%s", want, all)
		}
	}
}

// Under Slurm, USR1 (a preemption or time-limit notice) reaches the
// workers and the job goes on.
func TestSlurmNoticeIsForwarded(t *testing.T) {
	job := slurmJobID(t)
	dir := t.TempDir()
	w := script(t, dir, "w.sh", `
trap 'echo "got USR1"; exit 0' USR1
echo ready > "`+dir+`/ready.$RANK"
i=0; while [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done
exit 3
`)
	a := startCommandEnv(t, append(testEnv(t), slurmStep(job, 1, 0)...), bin("gorun"), "--nproc-per-node", "2", w)
	if !waitFor(30*time.Second, func() bool {
		_, e0 := os.Stat(filepath.Join(dir, "ready.0"))
		_, e1 := os.Stat(filepath.Join(dir, "ready.1"))
		return e0 == nil && e1 == nil
	}) {
		t.Fatalf("workers did not start:\n%s", a.out.String())
	}
	a.cmd.Process.Signal(syscall.SIGUSR1)
	if code := a.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("want the job to finish after the notice, got %d:\n%s", code, a.out.String())
	}
	if strings.Count(a.out.String(), "got USR1") != 2 {
		t.Errorf("USR1 did not reach both workers:\n%s", a.out.String())
	}
}

// directTask is the environment srun gives task rank of a step of tasks
// tasks, perNode of them on each of its nodes (all this machine).
func directTask(job, tasks, perNode, rank int) []string {
	nodes := tasks / perNode
	return append(slurmStep(job, nodes, rank/perNode),
		"SLURM_PROCID="+strconv.Itoa(rank), "SLURM_LOCALID="+strconv.Itoa(rank%perNode),
		"SLURM_STEP_NUM_TASKS="+strconv.Itoa(tasks),
		fmt.Sprintf("SLURM_STEP_TASKS_PER_NODE=%d(x%d)", perNode, nodes))
}

// `srun gorun --slurm-direct`: every task is one worker placed by Slurm,
// and real torch forms one gloo job from them.
func TestSlurmDirectTaskIsOneWorker(t *testing.T) {
	job := slurmJobID(t)
	dir := t.TempDir()
	w := script(t, dir, "w.sh", `echo "rank=$RANK local=$LOCAL_RANK/$LOCAL_WORLD_SIZE node=$GROUP_RANK/$GROUP_WORLD_SIZE world=$WORLD_SIZE"
exec "$@"
`)
	agents := make([]*agent, 4)
	for rank := range agents {
		agents[rank] = startCommandEnv(t, append(testEnv(t), directTask(job, 4, 2, rank)...), bin("gorun"), "--slurm-direct",
			w, python(t), "testdata/torch_collectives.py")
	}
	var all string
	for i, a := range agents {
		if code := a.wait(t, 60*time.Second); code != 0 {
			t.Fatalf("task %d exited %d:\n%s", i, code, a.out.String())
		}
		all += a.out.String()
	}
	for r := 0; r < 4; r++ {
		for _, want := range []string{
			fmt.Sprintf("rank=%d local=%d/2 node=%d/2 world=4", r, r%2, r/2),
			fmt.Sprintf("all_reduce rank=%d value=10", r),
		} {
			if !strings.Contains(all, want) {
				t.Errorf("missing %q:\n%s", want, all)
			}
		}
	}
}

// Under --slurm-direct, --local-ranks-filter and the log folders go by
// the local rank Slurm gave each task, as its worker sees it.
func TestSlurmDirectLocalRankPicksOutput(t *testing.T) {
	job := slurmJobID(t)
	dir, logs := t.TempDir(), t.TempDir()
	w := script(t, dir, "w.sh", `echo "local=$LOCAL_RANK"`+"\n")
	agents := make([]*agent, 2)
	for rank := range agents {
		agents[rank] = startCommandEnv(t, append(testEnv(t), directTask(job, 2, 2, rank)...), bin("gorun"), "--slurm-direct",
			"--local-ranks-filter", "1", "--log-dir", logs, w)
	}
	for i, a := range agents {
		if code := a.wait(t, 60*time.Second); code != 0 {
			t.Fatalf("task %d exited %d:\n%s", i, code, a.out.String())
		}
	}
	if out := agents[0].out.String(); strings.Contains(out, "local=0") {
		t.Errorf("local rank 0 reached the console past --local-ranks-filter 1:\n%s", out)
	}
	if out := agents[1].out.String(); !strings.Contains(out, "local=1") {
		t.Errorf("local rank 1 is missing from the console:\n%s", out)
	}
	for lr := range 2 {
		path := filepath.Join(logs, fmt.Sprintf("slurm-%d", job), "attempt_0", strconv.Itoa(lr), "stdout.log")
		if b, err := os.ReadFile(path); err != nil || string(b) != fmt.Sprintf("local=%d\n", lr) {
			t.Errorf("%s = %q, %v; want local rank %d's output", path, b, err, lr)
		}
	}
}

// Under --slurm-direct, the failure report names the local rank Slurm gave
// the task, not its worker's place in the agent's group of one; and the
// task whose worker succeeded ends at once, its exit barrier opened by the
// failed task (static rendezvous: it would wait for the store timeout).
func TestSlurmDirectReportNamesLocalRank(t *testing.T) {
	job := slurmJobID(t)
	w := script(t, t.TempDir(), "w.sh", `[ "$LOCAL_RANK" = 1 ] && exit 3
exit 0
`)
	agents := make([]*agent, 2)
	for rank := range agents {
		agents[rank] = startCommandEnv(t, append(testEnv(t), directTask(job, 2, 2, rank)...), bin("gorun"), "--slurm-direct", w)
	}
	if code := agents[1].wait(t, 60*time.Second); code != 3 {
		t.Fatalf("task 1 exited %d, want its worker's 3:\n%s", code, agents[1].out.String())
	}
	if code := agents[0].wait(t, 60*time.Second); code != 0 {
		t.Fatalf("task 0 exited %d:\n%s", code, agents[0].out.String())
	}
	if out := agents[1].out.String(); !strings.Contains(out, "rank      : 1 (local_rank: 1)") {
		t.Errorf("the report does not name rank 1, local rank 1:\n%s", out)
	}
}

// --slurm-direct outside srun, or with flags that would place workers
// against Slurm, fails before anything starts.
func TestSlurmDirectRefusesWhatSlurmDecides(t *testing.T) {
	for _, tc := range []struct {
		env  []string
		args []string
		want string
	}{
		{nil, nil, "--slurm-direct runs inside an srun step"},
		{directTask(1, 2, 1, 0), []string{"--nproc-per-node", "2"}, "ask srun for tasks"},
		{directTask(1, 2, 1, 0), []string{"--nnodes", "2"}, "drop --nnodes"},
		{append(directTask(1, 2, 1, 0), "SLURM_LOCALID=5"), nil, "does not fit"},
	} {
		args := append(append([]string{"--slurm-direct"}, tc.args...), "/bin/true")
		j := gorun(t, tc.env, args...)
		if j.code != 2 || !strings.Contains(j.stderr, tc.want) {
			t.Errorf("gorun %v: want exit 2 saying %q, got %s", args, tc.want, j)
		}
	}
}
