package launcher

import (
	"slices"
	"strings"
	"testing"
)

func TestDetectSlurm(t *testing.T) {
	env := func(vars map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
	}
	step := map[string]string{
		"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_NODES": "3", "SLURM_NODEID": "1",
		"SLURM_STEP_NODELIST": "node[01-03]", "SLURM_GPUS_ON_NODE": "4",
	}
	got, ok, err := DetectSlurm(env(step))
	if err != nil || !ok {
		t.Fatalf("DetectSlurm = %v, %v", ok, err)
	}
	if got.JobID != "4242" || got.NNodes != 3 || got.NodeRank != 1 || got.GPUsOnNode != 4 ||
		!slices.Equal(got.Nodes, []string{"node01", "node02", "node03"}) || got.Port() != 29400+4242 {
		t.Errorf("DetectSlurm = %+v, port %d", got, got.Port())
	}

	// The batch script itself has a job but no step: not for gorun to use.
	batch := map[string]string{"SLURM_JOB_ID": "7", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "a,b"}
	if _, ok, err := DetectSlurm(env(batch)); ok || err != nil {
		t.Errorf("the batch step was taken for an srun step: %v, %v", ok, err)
	}
	if _, ok, _ := DetectSlurm(env(nil)); ok {
		t.Error("outside Slurm, DetectSlurm found a step")
	}

	for key, bad := range map[string]string{"SLURM_NODEID": "x", "SLURM_STEP_NODELIST": "n[1-", "SLURM_STEP_NUM_NODES": "9"} {
		vars := map[string]string{}
		for k, v := range step {
			vars[k] = v
		}
		vars[key] = bad
		if _, _, err := DetectSlurm(env(vars)); err == nil || !strings.HasPrefix(err.Error(), "launcher: slurm: ") {
			t.Errorf("%s=%q: want a slurm error, got %v", key, bad, err)
		}
	}
}

func TestDetectSlurmTask(t *testing.T) {
	vars := map[string]string{
		"SLURM_JOB_ID": "9", "SLURM_STEP_ID": "1", "SLURM_STEP_NUM_NODES": "2", "SLURM_NODEID": "1",
		"SLURM_STEP_NODELIST": "n[1-2]", "SLURM_PROCID": "3", "SLURM_STEP_NUM_TASKS": "5",
		"SLURM_LOCALID": "0", "SLURM_STEP_TASKS_PER_NODE": "3,2",
	}
	lookup := func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
	// detectTask reads the step, then the task's place in it, as
	// --slurm-direct does; ok is false on any error.
	detectTask := func(lookup func(string) (string, bool)) (SlurmTask, bool, error) {
		step, ok, err := DetectSlurm(lookup)
		if !ok || err != nil {
			return SlurmTask{}, ok, err
		}
		task, err := SlurmTaskOf(step, lookup)
		return task, err == nil, err
	}
	got, ok, err := detectTask(lookup)
	if err != nil || !ok {
		t.Fatalf("detectTask = %v, %v", ok, err)
	}
	if got.Rank != 3 || got.Tasks != 5 || got.LocalRank != 0 || got.LocalTasks != 2 || got.NodeRank != 1 || got.Nodes[0] != "n1" {
		t.Errorf("detectTask = %+v", got)
	}

	for key, bad := range map[string]string{
		"SLURM_PROCID":              "5", // past the task count
		"SLURM_LOCALID":             "2", // past this node's tasks
		"SLURM_STEP_TASKS_PER_NODE": "3", // one node's count for two nodes
		"SLURM_STEP_NUM_TASKS":      "",  // missing
	} {
		old := vars[key]
		vars[key] = bad
		_, ok, err := detectTask(lookup)
		vars[key] = old
		if ok || err == nil || !strings.HasPrefix(err.Error(), "launcher: ") {
			t.Errorf("%s=%q: want an error, got %v, %v", key, bad, ok, err)
		}
	}
}
