package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/elastic"
)

// statusOf runs `gorun status --json` as a user of the node whose
// temporary folder is tmp would, and returns the job's documents.
func statusOf(t *testing.T, tmp string) ([]elastic.NodeStatus, job) {
	t.Helper()
	j := gorun(t, []string{"TMPDIR=" + tmp}, "status", "--json")
	if j.code != 0 {
		return nil, j
	}
	var docs []elastic.NodeStatus
	if err := json.Unmarshal([]byte(j.stdout), &docs); err != nil {
		t.Fatalf("gorun status --json does not parse: %v\n%s", err, j)
	}
	return docs, j
}

// allRunning tells whether docs list ranks 0..n-1, each running with a
// pid, after restarts restarts.
func allRunning(docs []elastic.NodeStatus, n, restarts int) bool {
	seen := map[int]bool{}
	for _, d := range docs {
		for _, w := range d.Workers {
			if w.State != elastic.StateRunning || w.Pid <= 0 || w.Restarts != restarts {
				return false
			}
			seen[w.Rank] = true
		}
	}
	return len(seen) == n
}

// metric reads one sample of the agent's /metrics, or -1.
func metric(addr, sample string) float64 {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(sample) + ` (\S+)$`).FindSubmatch(b)
	if m == nil {
		return -1
	}
	v, _ := strconv.ParseFloat(string(m[1]), 64)
	return v
}

// Issue 23: during a 2-node c10d job, `gorun status` on either node lists
// every rank with its pid and state; after a worker fails and the group
// restarts it shows the restart; --json parses; each agent's /metrics
// counts its running workers and the restart.
func TestStatusOfARunningJob(t *testing.T) {
	dir := t.TempDir()
	worker := script(t, dir, "worker.sh", fmt.Sprintf(`echo "rank $RANK restart $TORCHELASTIC_RESTART_COUNT"
while [ ! -e %[1]s/finish ]; do
	if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$RANK" = 3 ] && [ -e %[1]s/fail ]; then exit 3; fi
	sleep 0.1
done
`, dir))
	args := elasticJob(t, "2", "--max-restarts", "1")
	var agents []*agent
	var tmps, metricsAddrs []string
	for range 2 {
		tmp := t.TempDir()
		addr := "127.0.0.1:" + strconv.Itoa(freePort(t))
		env := append(os.Environ(), "TMPDIR="+tmp)
		agents = append(agents, startCommandEnv(t, env, bin("gorun"), append(append(args[:len(args):len(args)], "--metrics-addr", addr), worker)...))
		tmps, metricsAddrs = append(tmps, tmp), append(metricsAddrs, addr)
	}
	logs := func() string { return agents[0].out.String() + "\n---\n" + agents[1].out.String() }

	var before []elastic.NodeStatus
	for i, tmp := range tmps {
		var last job
		if !waitFor(60*time.Second, func() bool {
			before, last = statusOf(t, tmp)
			return allRunning(before, 4, 0)
		}) {
			t.Fatalf("gorun status on node %d never listed 4 running ranks:\n%s\n%s", i, last, logs())
		}
	}
	table := gorun(t, []string{"TMPDIR=" + tmps[1]}, "status")
	for _, d := range before {
		for _, w := range d.Workers {
			if !regexp.MustCompile(fmt.Sprintf(`(?m)^\S+\s+\S+\s+%d\s+%d\s+%d\s+%d\s+running\s+0\s`, d.NodeRank, w.Rank, w.LocalRank, w.Pid)).MatchString(table.stdout) {
				t.Errorf("the table lacks rank %d (pid %d):\n%s", w.Rank, w.Pid, table)
			}
		}
	}
	for _, addr := range metricsAddrs {
		if !waitFor(10*time.Second, func() bool { return metric(addr, `gorun_workers{state="running"}`) == 2 }) {
			t.Fatalf("%s: gorun_workers{state=\"running\"} = %v, want 2", addr, metric(addr, `gorun_workers{state="running"}`))
		}
	}

	if err := os.WriteFile(filepath.Join(dir, "fail"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var after []elastic.NodeStatus
	var last job
	if !waitFor(60*time.Second, func() bool {
		after, last = statusOf(t, tmps[0])
		return allRunning(after, 4, 1)
	}) {
		t.Fatalf("gorun status never showed 4 ranks running after 1 restart:\n%s\n%s", last, logs())
	}
	oldPids := map[int]bool{}
	for _, d := range before {
		for _, w := range d.Workers {
			oldPids[w.Pid] = true
		}
	}
	for _, d := range after {
		for _, w := range d.Workers {
			if oldPids[w.Pid] {
				t.Errorf("rank %d keeps pid %d across the restart", w.Rank, w.Pid)
			}
		}
	}
	if table := gorun(t, []string{"TMPDIR=" + tmps[1]}, "status"); !regexp.MustCompile(`(?m)running\s+1\s`).MatchString(table.stdout) {
		t.Errorf("the table does not show 1 restart:\n%s", table)
	}
	exits := 0.0
	for _, addr := range metricsAddrs {
		if !waitFor(10*time.Second, func() bool {
			return metric(addr, "gorun_restarts_total") == 1 && metric(addr, `gorun_workers{state="running"}`) == 2
		}) {
			t.Errorf("%s: gorun_restarts_total = %v, running = %v; want 1 and 2", addr,
				metric(addr, "gorun_restarts_total"), metric(addr, `gorun_workers{state="running"}`))
		}
		exits += max(0, metric(addr, `gorun_worker_exits_total{status="exitcode 3"}`))
	}
	if exits != 1 {
		t.Errorf("worker exits with exitcode 3 across the agents = %v, want 1", exits)
	}

	if err := os.WriteFile(filepath.Join(dir, "finish"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for i, a := range agents {
		if code := a.wait(t, 60*time.Second); code != 0 {
			t.Fatalf("agent %d exited %d:\n%s", i, code, logs())
		}
	}
	if j := gorun(t, []string{"TMPDIR=" + tmps[0]}, "status"); j.code == 0 || !strings.Contains(j.stderr, "no running gorun agent") {
		t.Errorf("gorun status after the job: want an error naming no agent:\n%s", j)
	}
}

// stacksByRank splits the output of gorun status --stacks into each
// rank's part.
func stacksByRank(out string) map[int]string {
	parts := map[int]string{}
	for _, part := range strings.Split(out, "=== rank ")[1:] {
		var rank int
		if _, err := fmt.Sscanf(part, "%d", &rank); err == nil {
			parts[rank] = part
		}
	}
	return parts
}

// Issue 23: `gorun status --stacks` during a Go job prints each Go
// worker's goroutine stacks, whole, asked of its runtime, and the workers
// keep running: rank 1 sleeps while rank 0 waits in all_reduce for it.
func TestStatusStacksOfGoWorkers(t *testing.T) {
	tmp := t.TempDir()
	env := append(os.Environ(), "TMPDIR="+tmp)
	a := startCommandEnv(t, env, bin("gorun"), "--nproc-per-node", "2", bin("hang"), "-hang-after", "2", "-hang-rank", "1", "-steps", "10")
	defer func() {
		a.cmd.Process.Signal(syscall.SIGTERM)
		a.wait(t, 30*time.Second)
	}()
	var docs []elastic.NodeStatus
	var last job
	if !waitFor(60*time.Second, func() bool {
		docs, last = statusOf(t, tmp)
		return allRunning(docs, 2, 0)
	}) {
		t.Fatalf("gorun status never listed 2 running ranks:\n%s\n%s", last, a.out.String())
	}
	var stacks map[int]string
	if !waitFor(30*time.Second, func() bool {
		last = gorun(t, []string{"TMPDIR=" + tmp}, "status", "--stacks")
		stacks = stacksByRank(last.stdout)
		return last.code == 0 && strings.Contains(stacks[1], "time.Sleep") &&
			strings.Contains(stacks[0], "runtime.(*ProcessGroup).AllReduce")
	}) {
		t.Fatalf("gorun status --stacks never showed rank 1 asleep and rank 0 in all_reduce:\n%s\n%s", last, a.out.String())
	}
	for rank, s := range stacks {
		// Every goroutine, as a panic prints them, and each rank's whole.
		if !strings.Contains(s, "goroutine 1 [") || !strings.Contains(s, "main.main()") || strings.Count(s, "main.main()") != 1 {
			t.Errorf("rank %d's stacks are not its goroutines, whole:\n%s", rank, s)
		}
	}
	// Asking stopped nobody: the same workers still run, and answer again.
	for _, d := range docs {
		for _, w := range d.Workers {
			if !alive(w.Pid) {
				t.Errorf("rank %d (pid %d) died after gorun status --stacks:\n%s", w.Rank, w.Pid, a.out.String())
			}
		}
	}
	after, _ := statusOf(t, tmp)
	if !allRunning(after, 2, 0) {
		t.Errorf("the workers do not all run after gorun status --stacks: %+v", after)
	}
	if again := gorun(t, []string{"TMPDIR=" + tmp}, "status", "--stacks"); !strings.Contains(stacksByRank(again.stdout)[1], "time.Sleep") {
		t.Errorf("a second gorun status --stacks lacks rank 1's stacks:\n%s", again)
	}
}

// With --hang-timeout, Go workers' flight recorders tell gorun status
// which collective each rank is in: rank 0 waits in the all_reduce that
// rank 1, asleep, has not reached.
func TestStatusShowsTheCollective(t *testing.T) {
	tmp := t.TempDir()
	env := append(os.Environ(), "TMPDIR="+tmp)
	a := startCommandEnv(t, env, bin("gorun"), "--nproc-per-node", "2", "--hang-timeout", "10m",
		bin("hang"), "-hang-after", "2", "-hang-rank", "1", "-steps", "10")
	defer func() {
		a.cmd.Process.Signal(syscall.SIGTERM)
		a.wait(t, 30*time.Second)
	}()
	var last job
	if !waitFor(60*time.Second, func() bool {
		docs, j := statusOf(t, tmp)
		last = j
		var in, done bool
		for _, d := range docs {
			for _, w := range d.Workers {
				in = in || w.Rank == 0 && strings.HasPrefix(w.Collective, "in all_reduce #3 (float64 x 1) for ")
				done = done || w.Rank == 1 && w.Collective == "done all_reduce #2 (float64 x 1)"
			}
		}
		return in && done
	}) {
		t.Fatalf("gorun status never showed rank 0 in all_reduce #3 and rank 1 done with #2:\n%s\n%s", last, a.out.String())
	}
	if j := gorun(t, []string{"TMPDIR=" + tmp}, "status"); !strings.Contains(j.stdout, "COLLECTIVE") || !strings.Contains(j.stdout, "in all_reduce #3") {
		t.Errorf("the table lacks the collective column:\n%s", j)
	}
}

// gorun status --watch redraws the table until the job ends, then says so
// and exits 0.
func TestStatusWatchEndsWithTheJob(t *testing.T) {
	tmp := t.TempDir()
	dir := t.TempDir()
	release := filepath.Join(dir, "go")
	w := script(t, dir, "w.sh", `while [ ! -e "`+release+`" ]; do sleep 0.05; done`+"\n")
	a := startCommandEnv(t, append(os.Environ(), "TMPDIR="+tmp), bin("gorun"), "--nproc-per-node", "2", "--rdzv-id", "watched", w)
	if !waitFor(30*time.Second, func() bool { docs, _ := statusOf(t, tmp); return allRunning(docs, 2, 0) }) {
		t.Fatalf("the job never ran:\n%s", a.out.String())
	}
	watch := startCommandEnv(t, append(os.Environ(), "TMPDIR="+tmp), bin("gorun"), "status", "--watch")
	if !waitFor(30*time.Second, func() bool { return strings.Count(watch.out.String(), "RUN ") >= 2 }) {
		t.Fatalf("--watch did not redraw:\n%s", watch.out.String())
	}
	if err := os.WriteFile(release, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if code := a.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("job exited %d:\n%s", code, a.out.String())
	}
	if code := watch.wait(t, 30*time.Second); code != 0 || !strings.Contains(watch.out.String(), "the job has ended") {
		t.Errorf("--watch: exit %d, want 0 after saying the job ended:\n%s", code, watch.out.String())
	}
}
