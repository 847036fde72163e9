package runtime

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

var (
	// ErrNotMember is returned by every operation of a group this process
	// does not belong to (torch's GroupMember.NON_GROUP_MEMBER).
	ErrNotMember = errors.New("runtime: not a member of the group")
	// ErrClosed is returned by operations on a closed group, and by those
	// that were pending when it closed.
	ErrClosed = errors.New("runtime: process group closed")
	// ErrInvalidArgument is wrapped by the errors of operations refused
	// before any communication: wrong list lengths, mismatched dtypes or
	// sizes, ranks out of range.
	ErrInvalidArgument = errors.New("runtime: invalid argument")
)

// OpError reports a failed operation. Err is the cause: a validation
// error wrapping ErrInvalidArgument, ErrNotMember, ErrClosed, or the
// backend's error (collective.ErrMismatch, *collective.PeerError, ...).
type OpError struct {
	Op  string // torch's name of the operation: "all_reduce", "send", ...
	Err error
}

func (e *OpError) Error() string {
	// Our own causes carry the package prefix already; say it once.
	return "runtime: " + e.Op + ": " + strings.TrimPrefix(e.Err.Error(), "runtime: ")
}

func (e *OpError) Unwrap() error { return e.Err }

// invalid returns a validation error.
func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidArgument}, args...)...)
}

// BarrierError reports the ranks (of the group) that did not reach a
// MonitoredBarrier in time. It comes wrapped in an OpError:
// "runtime: monitored_barrier: ranks [2 5] did not arrive within 3s".
type BarrierError struct {
	Missing []int
	Timeout time.Duration
}

func (e *BarrierError) Error() string {
	if len(e.Missing) == 1 {
		return fmt.Sprintf("runtime: rank %d did not arrive within %s", e.Missing[0], e.Timeout)
	}
	return fmt.Sprintf("runtime: ranks %v did not arrive within %s", e.Missing, e.Timeout)
}
