package launcher

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Binding names how workers are pinned to CPUs (gorun --bind-to).
type Binding string

const (
	// BindNone leaves workers on every CPU the agent may use.
	BindNone Binding = "none"
	// BindCore pins worker i to the i-th CPU the agent may use, wrapping
	// around when there are more workers than CPUs, as mpirun --bind-to
	// core does (with overload allowed).
	BindCore Binding = "core"
	// BindNUMA pins worker i to the CPUs the agent may use of the i-th
	// NUMA node that has any, wrapping around, as mpirun --bind-to numa.
	BindNUMA Binding = "numa"
)

// nodeRoot is where the kernel lists the NUMA nodes' CPUs.
const nodeRoot = "/sys/devices/system/node"

// ParseBinding reads a --bind-to value.
func ParseBinding(s string) (Binding, error) {
	switch b := Binding(strings.ToLower(strings.TrimSpace(s))); b {
	case BindNone, BindCore, BindNUMA:
		return b, nil
	}
	return "", fmt.Errorf("%q: want none, core or numa", s)
}

// CPUsFor lists, per local rank, the CPUs each of n workers is bound to
// under b; nil for BindNone. The CPUs are the agent's own (its affinity,
// which Slurm, taskset or a container may have narrowed), in order.
func (b Binding) CPUsFor(n int) ([][]int, error) {
	if b == BindNone || b == "" {
		return nil, nil
	}
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, fmt.Errorf("read the CPUs this process may use: %w", err)
	}
	switch b {
	case BindGPUNode, BindGPUSocket, BindGPUExclusive, BindGPUCoreComplex:
		cpus, gpuNodes, err := topology(sysRoot, cpusOf(&set))
		if err != nil {
			return nil, err
		}
		return planNUMA(b, cpus, gpuNodes, n)
	}
	var groups [][]int // what worker i takes the (i mod len)-th of
	if b == BindNUMA {
		nodes, err := numaNodes(nodeRoot)
		if err != nil {
			return nil, err
		}
		for _, cpus := range nodes {
			var ours []int
			for _, c := range cpus {
				if set.IsSet(c) {
					ours = append(ours, c)
				}
			}
			if len(ours) > 0 {
				groups = append(groups, ours)
			}
		}
	} else {
		for _, c := range cpusOf(&set) {
			groups = append(groups, []int{c})
		}
	}
	if len(groups) == 0 {
		return nil, errors.New("this process may use no CPU")
	}
	per := make([][]int, n)
	for i := range per {
		per[i] = groups[i%len(groups)]
	}
	return per, nil
}

// cpusOf lists the CPUs in set, ascending.
func cpusOf(set *unix.CPUSet) []int {
	var cpus []int
	for c := 0; len(cpus) < set.Count(); c++ {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	return cpus
}

// numaNodes reads the CPUs of every NUMA node under root, in node order.
func numaNodes(root string) ([][]int, error) {
	paths, err := filepath.Glob(filepath.Join(root, "node[0-9]*", "cpulist"))
	if err != nil || len(paths) == 0 {
		return nil, fmt.Errorf("no NUMA nodes listed in %s", root)
	}
	id := func(p string) int {
		n, _ := strconv.Atoi(strings.TrimPrefix(filepath.Base(filepath.Dir(p)), "node"))
		return n
	}
	sort.Slice(paths, func(i, j int) bool { return id(paths[i]) < id(paths[j]) })
	nodes := make([][]int, 0, len(paths))
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		cpus, err := parseCPUList(strings.TrimSpace(string(b)))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		nodes = append(nodes, cpus)
	}
	return nodes, nil
}

// parseCPUList reads the kernel's list format, "0-3,8,10-11"; empty is
// no CPU (a node of memory only).
func parseCPUList(s string) ([]int, error) {
	var cpus []int
	if s == "" {
		return nil, nil
	}
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		b := a
		if err == nil && isRange {
			b, err = strconv.Atoi(hi)
		}
		if err != nil || a < 0 || b < a {
			return nil, fmt.Errorf("bad CPU list %q", s)
		}
		for c := a; c <= b; c++ {
			cpus = append(cpus, c)
		}
	}
	return cpus, nil
}

// startBound starts cmd bound to cpus, or unbound when cpus is empty.
// The forking thread takes the CPUs' mask for the fork, and the worker
// inherits it before it runs an instruction of its own; pinned after the
// fork instead, a Go worker's runtime may already have started threads
// that keep every CPU. The thread gets its own mask back after.
func startBound(cmd *exec.Cmd, cpus []int) error {
	if len(cpus) == 0 {
		return cmd.Start()
	}
	runtime.LockOSThread()
	// Unlocked whatever happens: a thread that ends with its locked
	// goroutine would fire every worker's Pdeathsig it forked (workerAttr).
	defer runtime.UnlockOSThread()
	var own, want unix.CPUSet
	if err := unix.SchedGetaffinity(0, &own); err != nil {
		return fmt.Errorf("read the CPUs this thread may use: %w", err)
	}
	for _, c := range cpus {
		want.Set(c)
	}
	if err := unix.SchedSetaffinity(0, &want); err != nil {
		return fmt.Errorf("bind to CPUs %v: %w", cpus, err)
	}
	err := cmd.Start()
	// Restoring a mask the thread had cannot fail; were it to, the
	// thread would only run the agent's goroutines on fewer CPUs.
	_ = unix.SchedSetaffinity(0, &own)
	return err
}
