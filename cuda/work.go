package cuda

import (
	"context"
	"errors"
	"fmt"
	goruntime "runtime"
	"sync"
	"time"
)

// Work is an operation queued on a communicator's stream. Wait for every
// Work: until then its buffers may still be in use by the GPU.
type Work struct {
	c        *Comm
	op       string
	started  time.Time
	deadline time.Time // the communicator's timeout, from when it started

	wait sync.Mutex // one Wait polls at a time

	// Guarded by c.hmu.
	ev   event // recorded after the operation; 0 once destroyed
	done bool
	err  error
}

// Wait blocks until the GPU has run the operation, and returns its error.
// It fails, and aborts the communicator, when NCCL reports an asynchronous
// error or when ctx ends or the communicator's timeout passes first: a
// collective cannot be abandoned by one rank alone. Waiting again returns
// the same result.
func (w *Work) Wait(ctx context.Context) error {
	w.wait.Lock()
	defer w.wait.Unlock()
	ctx, cancel := context.WithDeadline(ctx, w.deadline)
	defer cancel()
	c := w.c
	var p poller
	for {
		ready, err := w.query()
		if err != nil {
			return w.finish(&OpError{Op: w.op, Rank: c.rank, Err: err})
		}
		if ready {
			return w.finish(nil)
		}
		state, err := c.asyncState(w.op)
		switch {
		case err != nil:
			return w.finish(err)
		case state != ncclSuccess && state != ncclInProgress:
			return w.finish(c.abort(w.op, c.nccl.ncclError("ncclCommGetAsyncError", state, 0), w))
		}
		if err := p.wait(ctx); err != nil {
			cause := fmt.Errorf("not complete %v after it started: %w", time.Since(w.started).Round(time.Millisecond), err)
			return w.finish(c.abort(w.op, cause, w))
		}
	}
}

// query reports whether the GPU has passed the work's event; a finished
// work counts as ready.
func (w *Work) query() (bool, error) {
	var res cuResult
	err := w.c.dev.do(func() error {
		w.c.hmu.Lock()
		defer w.c.hmu.Unlock()
		if w.done || w.ev == 0 {
			res = cudaSuccess
			return nil
		}
		res = w.c.dev.drv.api.cuEventQuery(w.ev)
		return nil
	})
	switch {
	case err != nil:
		return false, err
	case res == cudaErrNotReady:
		return false, nil
	}
	return true, w.c.dev.drv.check("cuEventQuery", res)
}

// finish settles the work with err, unless something (an abort, Close)
// settled it first, releases its event and returns its final error.
func (w *Work) finish(err error) error {
	c := w.c
	c.hmu.Lock()
	w.finishLocked(err)
	ev := c.takeEventLocked(w)
	err = w.err
	c.hmu.Unlock()
	if ev != 0 {
		drv := c.dev.drv
		err = errors.Join(err, c.dev.do(func() error { return drv.check("cuEventDestroy_v2", drv.api.cuEventDestroy(ev)) }))
	}
	return err
}

// finishLocked settles the work with err unless it is settled. hmu held.
func (w *Work) finishLocked(err error) {
	if !w.done {
		w.done, w.err = true, err
	}
}

// takeEventLocked hands over w's event for destruction, once. hmu held.
func (c *Comm) takeEventLocked(w *Work) event {
	ev := w.ev
	w.ev = 0
	delete(c.works, w)
	return ev
}

// launch queues one operation: enqueue runs on the device thread and makes
// the NCCL calls, returning the one that failed (or the last) and its
// result. launch settles them (non-blocking communicators), then records
// an event after them on the stream for the Work to wait for.
func (c *Comm) launch(ctx context.Context, op string, enqueue func(handle uintptr) (string, ncclResult)) (*Work, error) {
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	started := time.Now()
	deadline, _ := ctx.Deadline()
	c.mu.Lock()
	defer c.mu.Unlock()

	var (
		call   string
		res    ncclResult
		handle uintptr
	)
	done := c.dev.submit(func() error {
		c.hmu.Lock()
		err := c.unusable(op)
		handle = c.handle
		if c.nonblocking {
			// The call returns at once; holding hmu keeps an abort from
			// freeing the communicator under it.
			defer c.hmu.Unlock()
		} else {
			// A blocking call may hang until an abort releases it.
			c.hmu.Unlock()
		}
		if err != nil {
			return err
		}
		call, res = enqueue(handle)
		return nil
	})
	select {
	case err := <-done:
		if err != nil {
			return nil, err
		}
	case <-ctx.Done():
		return nil, c.abort(op, fmt.Errorf("the call did not return in %v: %w", time.Since(started).Round(time.Millisecond), ctx.Err()), nil)
	}
	switch res {
	case ncclSuccess:
	case ncclInProgress:
		if err := c.settle(ctx, op); err != nil {
			return nil, err
		}
	default:
		return nil, &OpError{Op: op, Rank: c.rank, Err: c.nccl.ncclError(call, res, handle)}
	}

	w := &Work{c: c, op: op, started: started, deadline: deadline}
	err := c.dev.do(func() error {
		drv := c.dev.drv
		if err := drv.check("cuEventCreate", drv.api.cuEventCreate(&w.ev, eventDisableTiming)); err != nil {
			return err
		}
		if err := drv.check("cuEventRecord", drv.api.cuEventRecord(w.ev, c.stream)); err != nil {
			return errors.Join(err, drv.check("cuEventDestroy_v2", drv.api.cuEventDestroy(w.ev)))
		}
		c.hmu.Lock()
		c.works[w] = struct{}{}
		c.hmu.Unlock()
		return nil
	})
	if err != nil {
		return nil, &OpError{Op: op, Rank: c.rank, Err: err}
	}
	return w, nil
}

// onOwnThread runs fn on a new OS thread with the device's context
// current, for calls that must not wait for the device thread. The thread
// exits with it.
func (d *Device) onOwnThread(fn func()) {
	done := make(chan struct{})
	go func() {
		goruntime.LockOSThread() // never unlocked: the thread goes, and the context with it
		defer close(done)
		_ = d.drv.api.cuCtxSetCurrent(d.ctx)
		fn()
	}()
	<-done
}

// poller paces a polling loop: the first polls come at once, as most
// operations finish within microseconds, then ever sparser up to a
// millisecond apart.
type poller struct {
	n     int
	start time.Time
}

const (
	spinPolls   = 64
	minPollWait = 10 * time.Microsecond
	maxPollWait = time.Millisecond
)

// wait returns after the next pause, or ctx's error when it ends first.
func (p *poller) wait(ctx context.Context) error {
	if p.n == 0 {
		p.start = time.Now()
	}
	p.n++
	if err := ctx.Err(); err != nil {
		return err
	}
	if p.n <= spinPolls {
		goruntime.Gosched()
		return nil
	}
	pause := min(minPollWait<<min(p.n-spinPolls, 10), maxPollWait)
	t := time.NewTimer(pause)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// elapsed is the time since the first wait.
func (p *poller) elapsed() time.Duration {
	if p.n == 0 {
		return 0
	}
	return time.Since(p.start).Round(time.Millisecond)
}
