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

// DetectSlurm reads the environment of an srun step. ok is false outside
// one: no job, or the batch script itself (which has no step id), where
// gorun must not take the whole allocation for its own.
func DetectSlurm(lookupEnv func(string) (string, bool)) (step SlurmStep, ok bool, err error) {
	get := func(keys ...string) string {
		for _, k := range keys {
			if v, ok := lookupEnv(k); ok && v != "" {
				return v
			}
		}
		return ""
	}
	step.JobID = get("SLURM_JOB_ID", "SLURM_JOBID")
	if step.JobID == "" || get("SLURM_STEP_ID", "SLURM_STEPID") == "" {
		return SlurmStep{}, false, nil
	}
	number := func(keys ...string) int {
		v := get(keys...)
		n, convErr := strconv.Atoi(v)
		if convErr != nil && err == nil {
			err = fmt.Errorf("launcher: slurm: %s=%q is not a number", keys[0], v)
		}
		return n
	}
	step.NNodes = number("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
	step.NodeRank = number("SLURM_NODEID")
	if get("SLURM_GPUS_ON_NODE") != "" {
		step.GPUsOnNode = number("SLURM_GPUS_ON_NODE")
	}
	if err != nil {
		return SlurmStep{}, false, err
	}
	list := get("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
	if step.Nodes, err = ExpandHostlist(list); err != nil {
		return SlurmStep{}, false, fmt.Errorf("launcher: slurm: node list %q: %w", list, err)
	}
	if step.NNodes < 1 || step.NNodes > len(step.Nodes) || step.NodeRank < 0 || step.NodeRank >= step.NNodes {
		return SlurmStep{}, false, fmt.Errorf("launcher: slurm: node %d of %d does not fit the node list %q", step.NodeRank, step.NNodes, list)
	}
	return step, true, nil
}

// Port is the rendezvous port every node of the job derives alike from
// its id, so that nodes agree without talking and two jobs sharing a node
// rarely collide.
func (s SlurmStep) Port() int {
	id, _ := strconv.Atoi(s.JobID)
	return 29400 + id%10000
}
