package main

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/slurmtest"
	"github.com/gorun/gorun/launcher"
)

// Issue 5, test 3: gorun in batch jobs on a real Slurm cluster of two
// slurmd nodes (node1 and node2, both this machine). One cluster serves
// the three cases, one job each.
func TestSlurmClusterRunsGorun(t *testing.T) {
	// The cluster's readiness probe is the first job, then one per case.
	c := slurmtest.Start(t, slurmtest.Options{FirstJobID: slurmJobIDs(t, 4)})
	py := python(t)
	worker, err := filepath.Abs("testdata/slurm_worker.py")
	if err != nil {
		t.Fatal(err)
	}

	// `srun gorun` with no rendezvous flag: Slurm's variables alone make
	// one job of the two nodes' agents, two workers each.
	t.Run("srun gorun needs no flags", func(t *testing.T) {
		id := c.Sbatch(t, fmt.Sprintf(`srun --ntasks-per-node=1 %s --nproc-per-node 2 %s %s
echo "srun exit $?"
`, shellQuote(bin("gorun")), shellQuote(py), shellQuote(worker)), "--nodes=2", "--ntasks-per-node=1")
		job, out := c.Wait(t, id, 2*time.Minute), c.Output(t, id)
		if job.State != "COMPLETED" || !strings.Contains(out, "srun exit 0") {
			t.Fatalf("job %s ended %s (exit code %d):\n%s", id, job.State, job.ExitCode, out)
		}
		var wrong []string
		for rank, w := range workerLines(t, out, 4) {
			wrong = append(wrong, mismatches(rank, w, map[string]string{
				"RANK": strconv.Itoa(rank), "LOCAL_RANK": strconv.Itoa(rank % 2),
				"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": strconv.Itoa(rank / 2),
				"HOST": "node" + strconv.Itoa(rank/2+1), "SUM": "10",
			})...)
		}
		if len(wrong) > 0 {
			t.Errorf("%s\n%s", strings.Join(wrong, "\n"), out)
		}
	})

	// `srun gorun --slurm-direct`: every Slurm task is one worker, placed
	// where Slurm put it.
	t.Run("direct mode", func(t *testing.T) {
		id := c.Sbatch(t, fmt.Sprintf(`srun %s --slurm-direct %s %s
echo "srun exit $?"
`, shellQuote(bin("gorun")), shellQuote(py), shellQuote(worker)), "--nodes=2", "--ntasks-per-node=2")
		job, out := c.Wait(t, id, 2*time.Minute), c.Output(t, id)
		if job.State != "COMPLETED" || !strings.Contains(out, "srun exit 0") {
			t.Fatalf("job %s ended %s (exit code %d):\n%s", id, job.State, job.ExitCode, out)
		}
		var wrong []string
		for rank, w := range workerLines(t, out, 4) {
			wrong = append(wrong, mismatches(rank, w, map[string]string{
				"RANK": w["SLURM_PROCID"], "LOCAL_RANK": w["SLURM_LOCALID"], "GROUP_RANK": w["SLURM_NODEID"],
				"WORLD_SIZE": w["SLURM_NTASKS"], "SLURM_NTASKS": "4", "LOCAL_WORLD_SIZE": "2",
				"SLURM_PROCID": strconv.Itoa(rank), "SLURM_LOCALID": strconv.Itoa(rank % 2), "SLURM_NODEID": strconv.Itoa(rank / 2),
				"HOST": "node" + strconv.Itoa(rank/2+1), "MASTER_ADDR": "node1", "SUM": "10",
			})...)
		}
		if len(wrong) > 0 {
			t.Errorf("%s\n%s", strings.Join(wrong, "\n"), out)
		}
	})

	// A worker that exits 7 in a Slurm step: gorun's report names it and
	// the step ends with its status. (failure_grace: by default the failing
	// node waits 20 s for news of a lost node before it reports.)
	t.Run("a failing worker", func(t *testing.T) {
		w := script(t, t.TempDir(), "w.sh", `
if [ "$RANK" = 3 ]; then echo "rank 3 fails" >&2; exit 7; fi
trap 'exit 0' TERM
sleep 60 & wait
`)
		id := c.Sbatch(t, fmt.Sprintf(`srun --ntasks-per-node=1 %s --nproc-per-node 2 --rdzv-conf failure_grace=1 %s
rc=$?
echo "srun exit $rc"
exit $rc
`, shellQuote(bin("gorun")), shellQuote(w)), "--nodes=2", "--ntasks-per-node=1")
		job, out := c.Wait(t, id, 2*time.Minute), c.Output(t, id)
		if job.ExitCode != 7 || !strings.Contains(out, "srun exit 7") {
			t.Fatalf("job %s: want the step and the job to end with status 7, got %s (exit code %d):\n%s", id, job.State, job.ExitCode, out)
		}
		i := strings.Index(out, "Root Cause")
		if i < 0 {
			t.Fatalf("no failure report in the job's output:\n%s", out)
		}
		root := out[i:]
		if end := strings.Index(root, "exitcode"); end < 0 || !strings.Contains(root[:end], "rank      : 3 (local_rank: 1)") ||
			!strings.Contains(root, "exitcode  : 7") {
			t.Errorf("the report does not name rank 3 and its status 7:\n%s", out)
		}
		if !strings.Contains(out, "rank 3 fails") {
			t.Errorf("the failing worker's stderr is missing:\n%s", out)
		}
	})
}

// slurmJobIDs returns the first of n consecutive job ids whose ports, as
// gorun derives them from the job id, are free on this machine now.
func slurmJobIDs(t *testing.T, n int) int {
	t.Helper()
	for range 50 {
		first := 1000 + rand.IntN(8000)
		free := true
		for id := first; id < first+n && free; id++ {
			l, err := listenLoopback(launcher.SlurmStep{JobID: strconv.Itoa(id)}.Port())
			if err == nil {
				l.Close()
			}
			free = err == nil
		}
		if free {
			return first
		}
	}
	t.Fatalf("no %d consecutive Slurm job ids with free ports", n)
	return 0
}

// workerPattern matches the line slurm_worker.py prints, after any prefix
// gorun puts on it.
var workerPattern = regexp.MustCompile(`worker (RANK=\S+(?: \w+=\S*)*)$`)

// workerLines parses the lines of slurm_worker.py in a job's output, by
// rank, and fails unless there is one for each of n ranks.
func workerLines(t *testing.T, out string, n int) []map[string]string {
	t.Helper()
	byRank := make([]map[string]string, n)
	for _, line := range strings.Split(out, "\n") {
		m := workerPattern.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		fields := map[string]string{}
		for _, kv := range strings.Fields(m[1]) {
			k, v, _ := strings.Cut(kv, "=")
			fields[k] = v
		}
		rank, err := strconv.Atoi(fields["RANK"])
		if err != nil || rank < 0 || rank >= n || byRank[rank] != nil {
			t.Fatalf("unexpected or repeated rank in %q:\n%s", line, out)
		}
		byRank[rank] = fields
	}
	for rank, fields := range byRank {
		if fields == nil {
			t.Fatalf("no line from rank %d:\n%s", rank, out)
		}
	}
	return byRank
}

// mismatches lists where one rank's fields differ from want.
func mismatches(rank int, got, want map[string]string) []string {
	var wrong []string
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if got[k] != want[k] {
			wrong = append(wrong, fmt.Sprintf("rank %d: %s=%q, want %q", rank, k, got[k], want[k]))
		}
	}
	return wrong
}

// shellQuote quotes s for sh.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
