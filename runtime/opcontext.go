package runtime

import (
	"context"
	"math"
	"sync"
	"time"
)

// opContext is the context of the blocking operations a group runs
// inline (see executor.runInline), one at a time, reused from one to the
// next: a context and a timer made per call cost a small collective
// several allocations, which early in a process land on fresh pages whose
// faults cost it many times its own time. It ends when the group closes,
// with context.Canceled (perform turns the operation's error into
// ErrClosed then), or at the running operation's deadline, with
// context.DeadlineExceeded; an operation that starts after one ended gets
// a new done channel. It serves callers whose context can never end (nil
// Done), whose values it passes on; a caller's context that can end gets
// a context of its own (scope.operationContext).
type opContext struct {
	timer *time.Timer // runs expire

	mu       sync.Mutex
	firesAt  time.Time       // when timer fires; zero while it is stopped
	caller   context.Context // the running operation's; nil between operations
	deadline time.Time       // the running operation's
	done     chan struct{}
	err      error // set when done is closed
	closed   bool  // the group closed: no operation starts again
}

// newOpContext returns the opContext of a group whose lifetime is life.
func newOpContext(life context.Context) *opContext {
	c := &opContext{done: make(chan struct{})}
	c.timer = time.AfterFunc(math.MaxInt64, c.expire)
	c.timer.Stop()
	// Close cancels life, which also ends this registration.
	context.AfterFunc(life, c.close)
	return c
}

// start makes c the context of an operation of caller that may run for
// timeout; it fails with ErrClosed once the group has closed.
func (c *opContext) start(caller context.Context, timeout time.Duration) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	if c.err != nil { // the last operation timed out
		c.done, c.err = make(chan struct{}), nil
	}
	c.caller, c.deadline = caller, time.Now().Add(timeout)
	// The timer is left running between operations, and only moved
	// earlier, never later: resetting it per call took the runtime's
	// timer lock twice, a tenth of a small collective. A timer that fires
	// before the running operation's deadline sets itself again.
	if c.firesAt.IsZero() || c.deadline.Before(c.firesAt) {
		c.firesAt = c.deadline
		c.timer.Reset(timeout)
	}
	c.mu.Unlock()
	return nil
}

// stop ends the running operation's use of c.
func (c *opContext) stop() {
	c.mu.Lock()
	c.caller = nil
	c.mu.Unlock()
}

// expire ends the running operation at its deadline, or sets the timer
// again for it. The timer may fire late, once its operation has stopped
// or even while the next one runs: only an operation past its own
// deadline ends.
func (c *opContext) expire() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.firesAt = time.Time{}
	if c.caller == nil || c.err != nil {
		return
	}
	if left := time.Until(c.deadline); left > 0 {
		c.firesAt = c.deadline
		c.timer.Reset(left)
		return
	}
	c.err = context.DeadlineExceeded
	close(c.done)
}

// close ends the running operation, if any, and every later one.
func (c *opContext) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	c.timer.Stop()
	if c.err == nil {
		c.err = context.Canceled
		close(c.done)
	}
}

func (c *opContext) Deadline() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.deadline, c.caller != nil
}

func (c *opContext) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.done
}

func (c *opContext) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *opContext) Value(key any) any {
	c.mu.Lock()
	caller := c.caller
	c.mu.Unlock()
	if caller == nil {
		return nil
	}
	return caller.Value(key)
}
