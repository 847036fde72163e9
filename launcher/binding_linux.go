package launcher

import (
	"errors"
	"fmt"
	"os/exec"
	"runtime"
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
)

// ParseBinding reads a --bind-to value.
func ParseBinding(s string) (Binding, error) {
	switch b := Binding(strings.ToLower(strings.TrimSpace(s))); b {
	case BindNone, BindCore:
		return b, nil
	}
	return "", fmt.Errorf("%q: want none or core", s)
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
	var cpus []int
	for c := 0; len(cpus) < set.Count(); c++ {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	if len(cpus) == 0 {
		return nil, errors.New("this process may use no CPU")
	}
	per := make([][]int, n)
	for i := range per {
		per[i] = []int{cpus[i%len(cpus)]}
	}
	return per, nil
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
