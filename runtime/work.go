package runtime

import (
	"cmp"
	"context"
	"sync"
	"time"
)

// Work is an operation started asynchronously: a collective queued on its
// group, or a point-to-point message in flight. Every operation has a
// blocking form that starts its Work and waits for it.
type Work struct {
	op      string
	desc    opDesc                      // what the flight recorder notes besides op
	ctx     context.Context             // the caller's; cancelling it cancels the operation
	run     func(context.Context) error // nil once finished
	timeout time.Duration               // when not zero, replaces the group's
	done    chan struct{}               // closed when finished, after err and source are set

	err    error
	source int

	// exec is the queue w was submitted to, from which Wait may take w
	// to run it itself (see Wait).
	exec *executor
}

// detached is the context of the asynchronous forms' operations: never
// done, and not any caller's, so that the queue can tell an operation
// nobody waits for yet from a blocking call's, which waits at once.
var detached = context.WithoutCancel(context.Background())

func newWork(ctx context.Context, op string, run func(context.Context) error) *Work {
	return &Work{op: op, desc: opDesc{peer: -1}, ctx: ctx, run: run, done: make(chan struct{}), source: -1}
}

// failedWork returns a Work that finished with err without running.
func failedWork(op string, err error) *Work {
	w := newWork(context.Background(), op, nil)
	w.finish(err)
	return w
}

// Wait blocks until the operation finishes and returns its error, or
// until ctx is done. Giving up waiting does not cancel an asynchronous
// operation: it runs on until it finishes or the group's timeout ends it.
func (w *Work) Wait(ctx context.Context) error {
	select {
	case <-w.done:
		return w.err
	default:
	}
	if e := w.exec; e != nil {
		// Waiting with the operation's own context, when nothing runs
		// ahead of it, the caller runs it on its own goroutine, which is
		// what a blocking call does: it saves two goroutine handoffs, most
		// of a small collective's time, and changes nothing the caller can
		// observe. Otherwise the queue's goroutine runs it.
		if e.claim(w, ctx) {
			e.runClaimed(w)
			return w.err
		}
		e.signal() // submit may have left it to us
	}
	select {
	case <-w.done:
		return w.err
	case <-ctx.Done():
		return &OpError{Op: w.op, Err: context.Cause(ctx)}
	}
}

// IsCompleted reports whether the operation has finished, successfully or
// not.
func (w *Work) IsCompleted() bool {
	select {
	case <-w.done:
		return true
	default:
		return false
	}
}

// Err returns the operation's error once it has finished; nil before.
func (w *Work) Err() error {
	if !w.IsCompleted() {
		return nil
	}
	return w.err
}

// Source returns the rank that sent the message a finished IRecv
// received, which is how a receive from AnySource learns its sender; -1
// for every other operation, and before the receive finishes.
func (w *Work) Source() int {
	if !w.IsCompleted() {
		return -1
	}
	return w.source
}

func (w *Work) finish(err error) {
	if err != nil {
		w.err = &OpError{Op: w.op, Err: err}
	}
	w.ctx, w.run = nil, nil
	close(w.done)
}

// scope is what every operation of a group runs within: the group's
// lifetime, cancelled by Close, and its timeout for each operation.
type scope struct {
	life     context.Context
	timeout  time.Duration
	progress *progress // counts the operations that succeed
}

// execute runs w to completion. The operation sees a context that ends
// when the caller's does, when the group closes, or after the group's
// timeout (or its own) counted from the operation's start, so that time
// spent queued behind a slow operation is not charged to the next one.
func (s scope) execute(w *Work) {
	w.finish(s.perform(w.ctx, cmp.Or(w.timeout, s.timeout), nil, w.op, w.desc, w.run))
}

// perform runs an operation of the caller's ctx within the scope: under
// reused, when given and ctx can never end (see opContext), else under a
// context of its own. It counts the operation's success and returns the
// cause of its failure. The flight recorder notes it, as op and d, from
// its start to its end.
func (s scope) perform(ctx context.Context, timeout time.Duration, reused *opContext, op string, d opDesc, run func(context.Context) error) error {
	if s.life.Err() != nil {
		return ErrClosed
	}
	seq := s.progress.begin(op, d)
	var err error
	if reused != nil && ctx.Done() == nil {
		if err = reused.start(ctx, timeout); err == nil {
			err = run(reused)
			reused.stop()
		}
	} else {
		opCtx, release := s.operationContext(ctx, timeout)
		err = run(opCtx)
		release()
	}
	if err != nil && s.life.Err() != nil {
		// The backend's error for an operation cut short by Close says
		// less than ours.
		err = ErrClosed
	}
	s.progress.end(seq, err)
	if err == nil {
		s.progress.add()
	}
	return err
}

// operationContext returns the context of an operation of the caller's
// ctx: done when ctx is, with its error and cause; when the group closes,
// with cause ErrClosed; or at the timeout, with DeadlineExceeded.
func (s scope) operationContext(ctx context.Context, timeout time.Duration) (context.Context, func()) {
	if ctx == context.Background() || ctx == detached {
		// A caller's context that never ends and holds no values adds
		// nothing: one context under the group's lifetime (which ends
		// with cause ErrClosed) does, for a third of the cost of the
		// layers below, most of a small collective's overhead.
		return context.WithTimeout(s.life, timeout)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(s.life, func() { cancel(ErrClosed) })
	ctx, cancelTimeout := context.WithTimeout(ctx, timeout)
	return ctx, func() {
		cancelTimeout()
		stop()
		cancel(nil)
	}
}

// executor runs a group's collectives one at a time, in the order they
// were submitted, on one goroutine, as ProcessGroupGloo's worker thread
// does. The order is what keeps ranks in step: every rank submits the
// same collectives in the same order, and the backend requires that they
// reach it so.
type executor struct {
	scope scope
	// inline is the context of the blocking calls runInline runs, which
	// only one runs at a time: the one that claimed the queue.
	inline *opContext

	mu      sync.Mutex
	queue   []*Work
	closed  bool
	running bool // a work is running, on loop's goroutine or on a waiter's

	wake chan struct{} // capacity 1: the queue or closed changed
	done chan struct{} // closed by loop when it returns
}

func newExecutor(s scope) *executor {
	e := &executor{scope: s, inline: newOpContext(s.life), wake: make(chan struct{}, 1), done: make(chan struct{})}
	go e.loop()
	return e
}

// submit queues w; after close it fails w with ErrClosed. It wakes the
// queue's goroutine, unless w is a blocking call's (not detached) with
// nothing ahead of it: its caller's Wait runs it, and waking a goroutine
// that finds nothing to do costs a small collective a good part of its
// time on a machine with few cores.
func (e *executor) submit(w *Work) *Work {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		w.finish(ErrClosed)
		return w
	}
	w.exec = e
	e.queue = append(e.queue, w)
	callerRuns := len(e.queue) == 1 && !e.running && w.ctx != detached
	e.mu.Unlock()
	if !callerRuns {
		e.signal()
	}
	return w
}

// claim takes w off the queue for a caller waiting with ctx to run with
// runClaimed, if ctx is w's own, w is next and nothing is running. (w.ctx
// may be read here: a queued work is not finishing.)
func (e *executor) claim(w *Work, ctx context.Context) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.running || len(e.queue) == 0 || e.queue[0] != w || ctx != w.ctx {
		return false
	}
	e.pop()
	e.running = true
	return true
}

// pop removes the queue's first work, shifting the rest down rather than
// reslicing, so that the queue keeps its capacity and submitting to an
// emptied queue allocates nothing.
func (e *executor) pop() *Work {
	w := e.queue[0]
	n := copy(e.queue, e.queue[1:])
	e.queue[n] = nil
	e.queue = e.queue[:n]
	return w
}

// runInline runs a blocking operation on the caller's goroutine, when
// the queue is empty and nothing runs, and reports whether it did; when
// it did not, the caller queues the operation. It is a blocking call's
// whole path: no Work, no channel, and run, which does not outlive the
// call, need not be allocated.
func (e *executor) runInline(ctx context.Context, op string, d opDesc, run func(context.Context) error) (bool, error) {
	e.mu.Lock()
	if e.closed || e.running || len(e.queue) > 0 {
		e.mu.Unlock()
		return false, nil
	}
	e.running = true
	e.mu.Unlock()
	err := e.scope.perform(ctx, e.scope.timeout, e.inline, op, d, run)
	e.release()
	return true, err
}

// runClaimed runs a claimed work, then hands what is queued behind it
// back to loop.
func (e *executor) runClaimed(w *Work) {
	e.scope.execute(w)
	e.release()
}

// release ends a waiter's turn at running, handing what was queued
// meanwhile to loop.
func (e *executor) release() {
	e.mu.Lock()
	e.running = false
	more := len(e.queue) > 0 || e.closed
	e.mu.Unlock()
	if more {
		e.signal()
	}
}

func (e *executor) signal() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// loop runs queued works until close, one at a time, none while a
// waiter runs one it claimed; it owns nothing but the work it has taken
// off the queue. It returns once closed and no work runs anywhere.
func (e *executor) loop() {
	defer close(e.done)
	for {
		e.mu.Lock()
		if len(e.queue) == 0 || e.running {
			stop := e.closed && !e.running
			e.mu.Unlock()
			if stop {
				return
			}
			<-e.wake
			continue
		}
		w := e.pop()
		e.running = true
		e.mu.Unlock()
		e.scope.execute(w)
		e.mu.Lock()
		e.running = false
		e.mu.Unlock()
	}
}

// close fails the queued works with ErrClosed and stops the loop once the
// running work, if any, returns; wait waits for that.
func (e *executor) close() {
	e.mu.Lock()
	pending := e.queue
	e.queue, e.closed = nil, true
	e.mu.Unlock()
	for _, w := range pending {
		w.finish(ErrClosed)
	}
	e.signal()
}

func (e *executor) wait() { <-e.done }

// lane identifies the point-to-point operations that must keep their
// order: those in one direction, with one peer and one tag.
type lane struct {
	send      bool
	peer, tag int
}

// lanes runs point-to-point operations, each on its own goroutine so that
// they overlap, except that operations of one lane run in the order they
// were started: two messages sent to one peer with one tag arrive in the
// order they were sent, and two receives from one peer with one tag are
// matched in the order they were posted, as in MPI.
type lanes struct {
	scope scope

	mu   sync.Mutex
	tail map[lane]chan struct{} // done channel of each busy lane's latest work
	wg   sync.WaitGroup
}

func newLanes(s scope) *lanes {
	return &lanes{scope: s, tail: make(map[lane]chan struct{})}
}

func (l *lanes) start(k lane, w *Work) *Work {
	l.mu.Lock()
	prev := l.tail[k]
	l.tail[k] = w.done
	l.mu.Unlock()

	l.wg.Go(func() {
		if prev != nil {
			<-prev
		}
		l.scope.execute(w)
		l.mu.Lock()
		if l.tail[k] == w.done {
			delete(l.tail, k)
		}
		l.mu.Unlock()
	})
	return w
}

// now runs w on its own goroutine, in no lane: for an operation whose
// order was settled when it was queued (NCCL's messages).
func (l *lanes) now(w *Work) *Work {
	l.wg.Go(func() { l.scope.execute(w) })
	return w
}

// wait waits for every operation started, which Close has made fail.
func (l *lanes) wait() { l.wg.Wait() }
