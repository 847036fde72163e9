// Package workerenv names the variables of gorun's own contract with
// its workers, beyond torchrun's: the agent (elastic) sets them in a
// worker's environment and the worker runtime (runtime) reads them.
// Neither side may import the other, so the names live here, once.
package workerenv

const (
	// ProgressFile names the file in which a worker counts the
	// operations it completes, its flight recorder after the counter
	// (gorun --hang-timeout). Its layout is runtime's ProgressFileEnv's.
	ProgressFile = "GORUN_PROGRESS_FILE"
	// StacksSocket names the unix socket on which a worker answers with
	// the stacks of its goroutines (gorun status --stacks, hang
	// analyses).
	StacksSocket = "GORUN_STACKS_SOCKET"
)
