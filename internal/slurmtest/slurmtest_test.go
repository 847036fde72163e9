package slurmtest

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A cluster runs a batch job across both nodes, each task on a host of its
// own name that resolves the other; Wait reports the script's exit code;
// and teardown leaves nothing behind, not even a job still running.
func TestSlurmClusterRunsJobsOnBothNodes(t *testing.T) {
	Need(t) // here, not in the subtest: a skipped subtest would pass this test
	var daemons []*daemon
	var sleeperPids []int
	t.Run("cluster", func(t *testing.T) {
		c := Start(t, Options{FirstJobID: 500})
		daemons = c.daemons

		id := c.Sbatch(t, `srun --label sh -c 'echo "host=$(hostname) node=$SLURMD_NODENAME other=$(getent hosts node2 | cut -d" " -f1)"'
exit 3
`, "--nodes=2", "--ntasks-per-node=1")
		if id != "501" { // the readiness probe was job 500
			t.Errorf("first job id %s, want 501", id)
		}
		job := c.Wait(t, id, 30*time.Second)
		out := c.Output(t, id)
		if job.State != "FAILED" || job.ExitCode != 3 {
			t.Errorf("job %s: state %s, exit code %d; want FAILED with 3\n%s", id, job.State, job.ExitCode, out)
		}
		for _, want := range []string{"0: host=node1 node=node1 other=127.0.0.2", "1: host=node2 node=node2 other=127.0.0.2"} {
			if !strings.Contains(out, want) {
				t.Errorf("job output lacks %q:\n%s", want, out)
			}
		}

		// A job still running when the test ends: teardown must end it.
		running := c.Sbatch(t, `srun sh -c 'echo $$ > pid.$SLURM_PROCID; exec sleep 300'`, "--nodes=2", "--ntasks-per-node=1")
		deadline := time.Now().Add(30 * time.Second)
		for len(sleeperPids) < 2 && time.Now().Before(deadline) {
			sleeperPids = sleeperPids[:0]
			for rank := range 2 {
				if pid, err := strconv.Atoi(strings.TrimSpace(readOrEmpty(filepath.Join(c.JobDir, "pid."+strconv.Itoa(rank))))); err == nil {
					sleeperPids = append(sleeperPids, pid)
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
		if len(sleeperPids) < 2 {
			t.Fatalf("job %s did not start its sleepers:\n%s", running, c.readOutput(running))
		}
	})
	if daemons == nil {
		return // the subtest failed, so does this test
	}
	if len(daemons) != 4 {
		t.Fatalf("want munged, slurmctld and 2 slurmd, started %d daemons", len(daemons))
	}
	for _, d := range daemons {
		if left := processesIn(d.mntNS); len(left) > 0 {
			t.Errorf("%s's namespace still holds processes %v after teardown", d.name, left)
		}
		if alive(d.pid) {
			t.Errorf("%s (pid %d) outlived the teardown", d.name, d.pid)
		}
	}
	for _, pid := range sleeperPids {
		if alive(pid) {
			t.Errorf("a task of the running job (pid %d) outlived the teardown", pid)
		}
	}
}

func readOrEmpty(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

// alive reports whether pid is a live process; a zombie is dead.
func alive(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses.
	i := bytes.LastIndexByte(stat, ')')
	return i >= 0 && i+2 < len(stat) && stat[i+2] != 'Z'
}
