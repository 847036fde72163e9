package cuda

import (
	"errors"
	"fmt"
)

// Sentinels for a communicator that can no longer be used.
var (
	// ErrClosed is wrapped by operations on a closed communicator.
	ErrClosed = errors.New("cuda: nccl communicator closed")
	// ErrAborted is wrapped by every error of an operation on, or of a
	// failure that led to, an aborted communicator. An aborted
	// communicator only fails; close it and make a new one.
	ErrAborted = errors.New("cuda: nccl communicator aborted")
)

// OpError reports a failed operation of a communicator: which, on which
// rank, why, and whether the communicator was aborted because of it.
type OpError struct {
	Op      string // torch's name of the operation: "all_reduce", "send", "init", ...
	Rank    int    // the rank in the communicator that failed
	Err     error  // an *NCCLError, a *CUDAError, a context error, ...
	Aborted bool   // this failure aborted the communicator
}

func (e *OpError) Error() string {
	msg := fmt.Sprintf("cuda: nccl %s on rank %d: %v", e.Op, e.Rank, e.Err)
	if e.Aborted {
		msg += "; communicator aborted"
	}
	return msg
}

func (e *OpError) Unwrap() []error {
	if e.Aborted {
		return []error{e.Err, ErrAborted}
	}
	return []error{e.Err}
}

// abortedError is why an operation failed when an earlier failure had
// aborted the communicator.
type abortedError struct{ cause *OpError }

func (e *abortedError) Error() string {
	return fmt.Sprintf("the communicator was aborted when %s failed: %v", e.cause.Op, e.cause.Err)
}

func (e *abortedError) Unwrap() error { return ErrAborted }
