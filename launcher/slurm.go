package launcher

import (
	"fmt"
	"strconv"
)

// SlurmStep is what gorun learns from Slurm when srun starts it, one task
// per node, so that `srun gorun ./worker` needs no flags.
type SlurmStep struct {
	JobID    string
	NNodes   int
	NodeRank int
	// Nodes are the step's nodes in Slurm's order; the first hosts the
	// rendezvous store.
	Nodes []string
	// GPUsOnNode is SLURM_GPUS_ON_NODE, 0 when GPUs were not requested.
	GPUsOnNode int
}

// SlurmTask is one task of an srun step, for `srun gorun --slurm-direct`
// where every Slurm task is one worker and Slurm, not gorun, places it.
type SlurmTask struct {
	SlurmStep
	// Rank and Tasks are SLURM_PROCID and the step's task count.
	Rank, Tasks int
	// LocalRank is SLURM_LOCALID; LocalTasks counts the step's tasks on
	// this node.
	LocalRank, LocalTasks int
}

// slurmEnv reads Slurm's variables, remembering the first malformed one.
type slurmEnv struct {
	lookup func(string) (string, bool)
	err    error
}

// get returns the first of keys that is set and not empty.
func (e *slurmEnv) get(keys ...string) string {
	for _, k := range keys {
		if v, ok := e.lookup(k); ok && v != "" {
			return v
		}
	}
	return ""
}

// number is get as an integer.
func (e *slurmEnv) number(keys ...string) int {
	v := e.get(keys...)
	n, err := strconv.Atoi(v)
	if err != nil && e.err == nil {
		e.err = fmt.Errorf("launcher: slurm: %s=%q is not a number", keys[0], v)
	}
	return n
}

// DetectSlurm reads the environment of an srun step. ok is false outside
// one: no job, or the batch script itself (which has no step id), where
// gorun must not take the whole allocation for its own.
func DetectSlurm(lookupEnv func(string) (string, bool)) (step SlurmStep, ok bool, err error) {
	env := &slurmEnv{lookup: lookupEnv}
	step.JobID = env.get("SLURM_JOB_ID", "SLURM_JOBID")
	if step.JobID == "" || env.get("SLURM_STEP_ID", "SLURM_STEPID") == "" {
		return SlurmStep{}, false, nil
	}
	step.NNodes = env.number("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
	step.NodeRank = env.number("SLURM_NODEID")
	if env.get("SLURM_GPUS_ON_NODE") != "" {
		step.GPUsOnNode = env.number("SLURM_GPUS_ON_NODE")
	}
	if env.err != nil {
		return SlurmStep{}, false, env.err
	}
	list := env.get("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
	if step.Nodes, err = ExpandHostlist(list); err != nil {
		return SlurmStep{}, false, fmt.Errorf("launcher: slurm: node list %q: %w", list, err)
	}
	if step.NNodes < 1 || step.NNodes > len(step.Nodes) || step.NodeRank < 0 || step.NodeRank >= step.NNodes {
		return SlurmStep{}, false, fmt.Errorf("launcher: slurm: node %d of %d does not fit the node list %q", step.NodeRank, step.NNodes, list)
	}
	return step, true, nil
}

// SlurmTaskOf reads this task's place in step, the srun step DetectSlurm
// found.
func SlurmTaskOf(step SlurmStep, lookupEnv func(string) (string, bool)) (SlurmTask, error) {
	env := &slurmEnv{lookup: lookupEnv}
	task := SlurmTask{
		SlurmStep: step,
		Rank:      env.number("SLURM_PROCID"),
		Tasks:     env.number("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"),
		LocalRank: env.number("SLURM_LOCALID"),
	}
	perNode := env.get("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
	if env.err != nil {
		return SlurmTask{}, env.err
	}
	counts, err := ExpandTasksPerNode(perNode)
	if err != nil {
		return SlurmTask{}, err
	}
	if len(counts) != step.NNodes {
		return SlurmTask{}, fmt.Errorf("launcher: slurm: tasks per node %q names %d nodes, the step has %d", perNode, len(counts), step.NNodes)
	}
	task.LocalTasks = counts[step.NodeRank]
	if task.Tasks < 1 || task.Rank < 0 || task.Rank >= task.Tasks || task.LocalRank < 0 || task.LocalRank >= task.LocalTasks {
		return SlurmTask{}, fmt.Errorf("launcher: slurm: task %d (local %d) does not fit %d tasks, %d on this node", task.Rank, task.LocalRank, task.Tasks, task.LocalTasks)
	}
	return task, nil
}

// Port is the rendezvous port every node of the job derives alike from
// its id, so that nodes agree without talking and two jobs sharing a node
// rarely collide.
func (s SlurmStep) Port() int {
	id, _ := strconv.Atoi(s.JobID)
	return 29400 + id%10000
}
