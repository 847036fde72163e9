package doctor

import (
	"cmp"
	"fmt"
	goruntime "runtime"
	"strings"

	"github.com/gorun/gorun/cuda/nvml"
)

// writeGPUs reports what NVML says, or why it says nothing, and what
// --nproc-per-node gpu and auto would give.
func writeGPUs(r *report, lib nvml.Library, lookupEnv func(string) (string, bool)) {
	r.section("GPUs (NVML)")
	cpus := goruntime.NumCPU()
	sys, err := nvml.Discover(lib)
	if err != nil {
		r.line("no GPU listed: %v", err)
		r.line("--nproc-per-node gpu fails here; auto gives %d (the CPUs)", cpus)
		return
	}
	r.line("driver %s, CUDA driver API %s", cmp.Or(sys.DriverVersion, "unknown"), nvml.CUDAVersion(sys.CUDADriverVersion))
	if len(sys.GPUs) == 0 {
		r.line("NVML works but reports no GPU")
		r.line("--nproc-per-node gpu fails here; auto gives %d (the CPUs)", cpus)
		return
	}
	t := r.table()
	for _, g := range sys.GPUs {
		fmt.Fprintf(t, "GPU%d\t%s\t%d MiB\t%s\tbus %s\n", g.Index, cmp.Or(g.Name, "?"), g.MemoryTotal>>20, cmp.Or(g.UUID, "?"), cmp.Or(g.BusID, "?"))
	}
	t.Flush()

	visible := sys.GPUs
	if value, set := lookupEnv(nvml.VisibleDevicesEnv); set {
		visible, err = nvml.Visible(sys.GPUs, value)
		var order []string
		for k, g := range visible {
			order = append(order, fmt.Sprintf("cuda:%d = GPU%d", k, g.Index))
		}
		switch {
		case err != nil:
			r.line("%v", err)
		case len(visible) == 0:
			r.line("%s", nvml.HiddenBy(value, len(sys.GPUs)))
		default:
			r.line("%s=%q: %s", nvml.VisibleDevicesEnv, value, strings.Join(order, ", "))
		}
	}
	if len(visible) > 0 {
		r.line("--nproc-per-node gpu and auto give %d", len(visible))
	} else {
		r.line("--nproc-per-node gpu fails here; auto gives %d (the CPUs)", cpus)
	}
	if len(sys.GPUs) > 1 {
		r.line("")
		nvml.WriteTopology(r, sys) // a failed write is kept in r.err
	}
	if sys.Partial != nil {
		r.line("NVML could not say: %s", strings.ReplaceAll(sys.Partial.Error(), "\n", "; "))
	}
}
