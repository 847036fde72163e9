package doctor

import (
	"slices"
	"strings"

	"github.com/gorun/gorun/launcher"
)

// writeSlurm shows Slurm's variables and what gorun makes of them.
func writeSlurm(r *report, environ []string) {
	r.section("Slurm")
	var vars []string
	env := map[string]string{}
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, "SLURM_") {
			vars = append(vars, kv)
			env[k] = v
		}
	}
	if len(vars) == 0 {
		r.line("not inside a Slurm job (no SLURM_* variable)")
		return
	}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	step, ok, err := launcher.DetectSlurm(lookup)
	switch {
	case err != nil:
		r.line("gorun cannot read this Slurm step: %v", err)
	case !ok:
		r.line("inside a Slurm job but not an srun step: start gorun with srun, one task per node")
	default:
		r.line("srun step of job %s: node %d of %d, store on %s:%d, GPUs on node %d",
			step.JobID, step.NodeRank, step.NNodes, step.Nodes[0], step.Port(), step.GPUsOnNode)
	}
	slices.Sort(vars)
	for _, kv := range vars {
		r.line("  %s", kv)
	}
}
