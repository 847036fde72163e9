// Package rendezvous holds the key-value store that launchers and workers
// meet through, in PyTorch's TCPStore wire protocol, and the rendezvous
// handlers built on it.
package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Errors shared by every Store implementation.
var (
	// ErrClosed is returned by operations on a closed store.
	ErrClosed = errors.New("rendezvous: store closed")
	// ErrTimeout is wrapped by blocking operations (Get, Wait, MultiGet)
	// whose keys did not appear before the deadline.
	ErrTimeout = errors.New("rendezvous: wait timed out")
)

// DefaultTimeout bounds blocking operations whose context has no deadline,
// as torch's Store does (300 s).
const DefaultTimeout = 300 * time.Second

// Store is the contract of torch's c10d::Store. Blocking calls (Get, Wait,
// MultiGet) wait until their keys exist or ctx is done; an implementation
// applies its own default timeout when ctx carries no deadline.
type Store interface {
	// Set stores value under key, waking waiters on key.
	Set(ctx context.Context, key string, value []byte) error
	// Get blocks until key exists, then returns its value.
	Get(ctx context.Context, key string) ([]byte, error)
	// Add adds delta to the integer stored under key (missing counts as 0)
	// and returns the new value.
	Add(ctx context.Context, key string, delta int64) (int64, error)
	// CompareSet replaces the value of key with desired when it equals
	// expected (a missing key matches an empty expected) and returns torch's
	// reply: desired on success, else the current value (or expected when
	// the key is missing).
	CompareSet(ctx context.Context, key string, expected, desired []byte) ([]byte, error)
	// Check reports whether every key exists, without blocking.
	Check(ctx context.Context, keys []string) (bool, error)
	// Wait blocks until every key exists.
	Wait(ctx context.Context, keys []string) error
	// Delete removes key and reports whether it existed.
	Delete(ctx context.Context, key string) (bool, error)
	// NumKeys counts every key in the store.
	NumKeys(ctx context.Context) (int64, error)
	// MultiGet blocks until every key exists and returns their values.
	MultiGet(ctx context.Context, keys []string) ([][]byte, error)
	// MultiSet sets keys[i] to values[i] for every i.
	MultiSet(ctx context.Context, keys []string, values [][]byte) error
	// Append appends value to key's value, creating it when missing.
	Append(ctx context.Context, key string, value []byte) error
	// Close releases the store's resources; later calls return ErrClosed.
	Close() error
}

// withDefaultTimeout gives ctx the timeout d when it has no deadline yet.
func withDefaultTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok || d <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, d)
}

// OpError reports a failed store operation, naming the keys as they are
// stored (with any prefix the store adds).
type OpError struct {
	Op   string // torch's name of the operation: "get", "add", "compare_set", ...
	Keys []string
	Err  error
}

func (e *OpError) Error() string {
	var b strings.Builder
	b.WriteString("rendezvous: ")
	b.WriteString(e.Op)
	switch n := len(e.Keys); {
	case n == 1:
		fmt.Fprintf(&b, " %q", e.Keys[0])
	case n > 1:
		const shown = 8
		b.WriteString(" [")
		for i, k := range e.Keys[:min(n, shown)] {
			if i > 0 {
				b.WriteByte(' ')
			}
			fmt.Fprintf(&b, "%q", k)
		}
		if n > shown {
			fmt.Fprintf(&b, " and %d more", n-shown)
		}
		b.WriteByte(']')
	}
	b.WriteString(": ")
	// Our sentinels carry the package prefix already; say it once.
	b.WriteString(strings.TrimPrefix(e.Err.Error(), "rendezvous: "))
	return b.String()
}

func (e *OpError) Unwrap() error { return e.Err }

// waitError is the cause of a wait that ctx ended: ErrTimeout for its
// deadline, else why it was cancelled.
func waitError(ctx context.Context) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return ErrTimeout
	}
	return context.Cause(ctx)
}
