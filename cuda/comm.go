package cuda

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	goruntime "runtime"
	"slices"
	"sync"
	"time"
)

// Store is what a communicator needs of the rendezvous store: a place
// where rank 0 publishes the NCCL unique id and the other ranks read it.
// rendezvous.Store satisfies it.
type Store interface {
	Set(ctx context.Context, key string, value []byte) error
	// Get blocks until key exists.
	Get(ctx context.Context, key string) ([]byte, error)
}

// DefaultTimeout bounds a communicator's calls whose context has no
// deadline, and its Close: ten minutes, as NCCL's default in torch.
const DefaultTimeout = 10 * time.Minute

// CommConfig places this process in a new communicator.
type CommConfig struct {
	Rank, Size int
	// Store carries the unique id from rank 0 to the others, under Key,
	// which must be new for every communicator the store serves.
	Store Store
	Key   string
	// Timeout bounds calls whose context has no deadline, and Close;
	// zero means DefaultTimeout.
	Timeout time.Duration
}

// Comm is an NCCL communicator on one GPU, with its own CUDA stream. Its
// operations take device pointers and element counts, queue the work on
// the stream and return a *Work to wait for; every rank must start the
// same collectives in the same order. Calls are safe from several
// goroutines; they reach NCCL one at a time.
//
// Communicators are non-blocking when NCCL allows (2.14 on): then a call's
// context ending, or NCCL reporting an asynchronous error, aborts the
// communicator (ncclCommAbort), and that call and every later one fail
// with an error wrapping ErrAborted. A collective cannot be abandoned on
// one rank alone, so there is no cancelling short of that.
type Comm struct {
	nccl        *NCCL
	dev         *Device
	rank, size  int
	store       Store
	key         string
	timeout     time.Duration
	nonblocking bool

	// Owned by the device thread once open.
	stream  stream
	scratch DevicePtr // 4 bytes, for Barrier

	// mu lets one call into NCCL on this communicator at a time, from its
	// start until it has settled: a non-blocking communicator must not be
	// called again while a call is in progress.
	mu sync.Mutex

	// hmu guards the communicator's handle and fate. It is held around
	// every NCCL call on a non-blocking communicator (those return at
	// once), so an abort never frees the communicator under a call. It is
	// never held while waiting for the device thread, which may be waiting
	// for it.
	hmu    sync.Mutex
	handle uintptr            // ncclComm_t; 0 once aborted or destroyed
	failed *OpError           // what aborted the communicator
	closed bool               // Close has run
	works  map[*Work]struct{} // started, with an event not yet destroyed
}

// NewComm creates this rank's communicator on dev: rank 0 makes an NCCL
// unique id and publishes it in the store, the others read it, and all
// call ncclCommInitRank(Config). It returns once every rank has joined,
// or fails when ctx ends.
func (n *NCCL) NewComm(ctx context.Context, dev *Device, cfg CommConfig) (*Comm, error) {
	switch {
	case cfg.Size < 1 || cfg.Rank < 0 || cfg.Rank >= cfg.Size:
		return nil, fmt.Errorf("cuda: nccl init: rank %d of %d is out of range", cfg.Rank, cfg.Size)
	case cfg.Store == nil || cfg.Key == "":
		return nil, errors.New("cuda: nccl init: a store and a key for the unique id are required")
	}
	c := n.newComm(dev, cfg)
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	id, err := c.exchangeID(ctx)
	if err != nil {
		return nil, err
	}
	config := newConfig(false)
	err = c.open(ctx, "init", func(handle *uintptr) (string, ncclResult) {
		if c.nonblocking {
			return "ncclCommInitRankConfig", n.api.ncclCommInitRankConfig(handle, int32(c.size), id, int32(c.rank), config)
		}
		return "ncclCommInitRank", n.api.ncclCommInitRank(handle, int32(c.size), id, int32(c.rank))
	})
	// NCCL copies the config during the call; keep it for good measure
	// until the communicator has settled.
	goruntime.KeepAlive(config)
	if err != nil {
		return nil, err
	}
	return c, nil
}

func (n *NCCL) newComm(dev *Device, cfg CommConfig) *Comm {
	return &Comm{
		nccl:        n,
		dev:         dev,
		rank:        cfg.Rank,
		size:        cfg.Size,
		store:       cfg.Store,
		key:         cfg.Key,
		timeout:     cmp.Or(max(cfg.Timeout, 0), DefaultTimeout),
		nonblocking: n.Nonblocking(),
		works:       map[*Work]struct{}{},
	}
}

// Rank is this process's rank in the communicator.
func (c *Comm) Rank() int { return c.rank }

// Size is the number of ranks.
func (c *Comm) Size() int { return c.size }

// Device is the GPU the communicator runs on.
func (c *Comm) Device() *Device { return c.dev }

// withTimeout gives ctx the communicator's timeout when it has no deadline.
func (c *Comm) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, c.timeout)
}

// exchangeID returns the unique id of the communicator: made here on rank
// 0 and published under c.key, read from there on the others.
func (c *Comm) exchangeID(ctx context.Context) (uniqueID, error) {
	var id uniqueID
	if c.rank == 0 {
		var res ncclResult
		if err := c.dev.do(func() error { res = c.nccl.api.ncclGetUniqueId(&id); return nil }); err != nil {
			return id, &OpError{Op: "init", Rank: c.rank, Err: err}
		}
		if res != ncclSuccess {
			return id, &OpError{Op: "init", Rank: c.rank, Err: c.nccl.ncclError("ncclGetUniqueId", res, 0)}
		}
		if err := c.store.Set(ctx, c.key, id.internal[:]); err != nil {
			return id, &OpError{Op: "init", Rank: c.rank, Err: fmt.Errorf("publishing the unique id under %q: %w", c.key, err)}
		}
		return id, nil
	}
	v, err := c.store.Get(ctx, c.key)
	if err != nil {
		return id, &OpError{Op: "init", Rank: c.rank, Err: fmt.Errorf("reading rank 0's unique id under %q: %w", c.key, err)}
	}
	if len(v) != len(id.internal) {
		return id, &OpError{Op: "init", Rank: c.rank, Err: fmt.Errorf("store key %q holds %d bytes, not a %d-byte ncclUniqueId", c.key, len(v), len(id.internal))}
	}
	copy(id.internal[:], v)
	return id, nil
}

// open makes the communicator's stream and scratch buffer on the device
// thread and then, with create, its NCCL communicator, and waits for that
// to settle. On failure nothing is left behind, except after a blocking
// init (NCCL before 2.14) that ctx ended: that call cannot be interrupted,
// and is left to return when it will.
func (c *Comm) open(ctx context.Context, op string, create func(handle *uintptr) (string, ncclResult)) error {
	var (
		call   string
		res    ncclResult
		handle uintptr
	)
	done := c.dev.submit(func() error {
		if err := c.allocate(); err != nil {
			return err
		}
		call, res = create(&handle)
		return nil
	})
	select {
	case err := <-done:
		if err != nil {
			return &OpError{Op: op, Rank: c.rank, Err: err}
		}
	case <-ctx.Done():
		return &OpError{Op: op, Rank: c.rank, Err: fmt.Errorf("%w: the blocking NCCL %s is abandoned", ctx.Err(), op)}
	}
	if res != ncclSuccess && res != ncclInProgress {
		err := c.nccl.ncclError(call, res, handle)
		return errors.Join(&OpError{Op: op, Rank: c.rank, Err: err}, c.dev.do(c.deallocate))
	}
	c.hmu.Lock()
	c.handle = handle
	c.hmu.Unlock()
	if res == ncclInProgress {
		if err := c.settle(ctx, op); err != nil {
			return errors.Join(err, c.dev.do(c.deallocate))
		}
	}
	return nil
}

// allocate makes the stream NCCL runs on and the scratch buffer Barrier
// reduces. Device thread only.
func (c *Comm) allocate() error {
	drv := c.dev.drv
	if err := drv.check("cuStreamCreate", drv.api.cuStreamCreate(&c.stream, streamNonBlocking)); err != nil {
		return err
	}
	if err := drv.check("cuMemAlloc_v2", drv.api.cuMemAlloc(&c.scratch, 4)); err != nil {
		return errors.Join(err, c.deallocate())
	}
	return nil
}

// deallocate frees what allocate made. Device thread only.
func (c *Comm) deallocate() error {
	drv := c.dev.drv
	var errs []error
	if c.scratch != 0 {
		errs = append(errs, drv.check("cuMemFree_v2", drv.api.cuMemFree(c.scratch)))
		c.scratch = 0
	}
	if c.stream != 0 {
		errs = append(errs, drv.check("cuStreamDestroy_v2", drv.api.cuStreamDestroy(c.stream)))
		c.stream = 0
	}
	return errors.Join(errs...)
}

// Split makes a communicator of the ranks listed, in that order: the new
// rank of ranks[i] is i. Every rank of c calls it with the same list and
// an id that is the same everywhere and new among c's splits; a rank not
// listed gets (nil, nil). It uses ncclCommSplit when NCCL has it (2.18),
// and otherwise a new communicator whose unique id goes through the store.
func (c *Comm) Split(ctx context.Context, ranks []int, id string) (*Comm, error) {
	for i, r := range ranks {
		if r < 0 || r >= c.size || slices.Index(ranks[:i], r) >= 0 {
			return nil, &OpError{Op: "split", Rank: c.rank, Err: fmt.Errorf("ranks %v: each must be in [0, %d) and listed once", ranks, c.size)}
		}
	}
	if id == "" {
		return nil, &OpError{Op: "split", Rank: c.rank, Err: errors.New("an id is required")}
	}
	me := slices.Index(ranks, c.rank)
	cfg := CommConfig{Rank: me, Size: len(ranks), Store: c.store, Key: c.key + "/split/" + id, Timeout: c.timeout}
	if c.nccl.api.ncclCommSplit == nil {
		if me < 0 {
			return nil, nil
		}
		return c.nccl.NewComm(ctx, c.dev, cfg)
	}
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	c.mu.Lock()
	defer c.mu.Unlock()

	color, key := int32(splitNoColor), int32(0)
	if me >= 0 {
		color, key = 0, int32(me)
	}
	child := c.nccl.newComm(c.dev, cfg)
	config := newConfig(!c.nonblocking)
	var (
		handle uintptr
		res    ncclResult
	)
	err := c.dev.do(func() error {
		if me >= 0 {
			if err := child.allocate(); err != nil {
				return err
			}
		}
		c.hmu.Lock()
		defer c.hmu.Unlock()
		if err := c.unusable("split"); err != nil {
			return errors.Join(err, child.deallocate())
		}
		res = c.nccl.api.ncclCommSplit(c.handle, color, key, &handle, config)
		if res != ncclSuccess && res != ncclInProgress {
			return errors.Join(&OpError{Op: "split", Rank: c.rank, Err: c.nccl.ncclError("ncclCommSplit", res, c.handle)}, child.deallocate())
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if res == ncclInProgress {
		if err := c.settle(ctx, "split"); err != nil {
			return nil, errors.Join(err, c.dev.do(child.deallocate))
		}
	}
	goruntime.KeepAlive(config)
	if handle == 0 {
		if me >= 0 {
			return nil, errors.Join(&OpError{Op: "split", Rank: c.rank, Err: errors.New("ncclCommSplit made no communicator for a listed rank")}, c.dev.do(child.deallocate))
		}
		return nil, nil
	}
	child.handle = handle
	if res == ncclInProgress {
		if err := child.settle(ctx, "split"); err != nil {
			return nil, errors.Join(err, c.dev.do(child.deallocate))
		}
	}
	return child, nil
}

// unusable says why the communicator takes no more calls, or nil. hmu held.
func (c *Comm) unusable(op string) error {
	switch {
	case c.closed:
		return &OpError{Op: op, Rank: c.rank, Err: ErrClosed}
	case c.failed != nil:
		return &OpError{Op: op, Rank: c.rank, Err: &abortedError{cause: c.failed}}
	case c.handle == 0: // destroyed by a Close still under way
		return &OpError{Op: op, Rank: c.rank, Err: ErrClosed}
	}
	return nil
}

// asyncState reads the communicator's state (ncclCommGetAsyncError):
// ncclSuccess, ncclInProgress, or the error that broke it.
func (c *Comm) asyncState(op string) (ncclResult, error) {
	c.hmu.Lock()
	defer c.hmu.Unlock()
	if err := c.unusable(op); err != nil {
		return 0, err
	}
	var state ncclResult
	if res := c.nccl.api.ncclCommGetAsyncError(c.handle, &state); res != ncclSuccess {
		return 0, &OpError{Op: op, Rank: c.rank, Err: c.nccl.ncclError("ncclCommGetAsyncError", res, c.handle)}
	}
	return state, nil
}

// settle polls a non-blocking communicator until its last call has left
// ncclInProgress, as NCCL requires before the next call. An asynchronous
// error, or ctx ending first, aborts the communicator.
func (c *Comm) settle(ctx context.Context, op string) error {
	var p poller
	for {
		state, err := c.asyncState(op)
		if err != nil {
			return err
		}
		switch state {
		case ncclSuccess:
			return nil
		case ncclInProgress:
		default:
			return c.abort(op, c.nccl.ncclError("ncclCommGetAsyncError", state, 0), nil)
		}
		if err := p.wait(ctx); err != nil {
			return c.abort(op, fmt.Errorf("still in progress after %v: %w", p.elapsed(), err), nil)
		}
	}
}

// abort aborts the communicator (ncclCommAbort) because op failed with
// cause, fails every unfinished Work (self, op's own if it has one, with
// op's error), and returns op's error. ncclCommAbort runs on a thread of
// its own, so that it also works while the device thread is stuck in a
// blocking NCCL call, which is what it is for.
func (c *Comm) abort(op string, cause error, self *Work) error {
	c.hmu.Lock()
	defer c.hmu.Unlock()
	if err := c.unusable(op); err != nil {
		return err
	}
	handle := c.handle
	c.handle = 0
	// There is nothing more to do if the abort itself fails: the
	// communicator is unusable either way, and cause is the news.
	c.dev.onOwnThread(func() { c.nccl.api.ncclCommAbort(handle) })
	c.failed = &OpError{Op: op, Rank: c.rank, Err: cause, Aborted: true}
	if self != nil {
		self.finishLocked(c.failed)
	}
	for w := range c.works {
		w.finishLocked(&OpError{Op: w.op, Rank: c.rank, Err: &abortedError{cause: c.failed}})
	}
	return c.failed
}

// Close releases the communicator: ncclCommFinalize, which completes the
// work already queued, then ncclCommDestroy; if finalizing fails or
// outlasts the timeout, ncclCommAbort instead. Then the stream and scratch
// memory. Unfinished Works fail with ErrClosed. Close an aborted
// communicator too, to free its stream and memory.
func (c *Comm) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.hmu.Lock()
	if c.closed {
		c.hmu.Unlock()
		return nil
	}
	live := c.handle != 0
	c.hmu.Unlock()

	var errs []error
	if live {
		errs = append(errs, c.finalize())
	}
	c.hmu.Lock()
	c.closed = true
	var events []event
	for w := range c.works {
		w.finishLocked(&OpError{Op: w.op, Rank: c.rank, Err: ErrClosed})
		events = append(events, c.takeEventLocked(w))
	}
	c.hmu.Unlock()
	errs = append(errs, c.dev.do(func() error {
		drv := c.dev.drv
		var errs []error
		for _, ev := range events {
			errs = append(errs, drv.check("cuEventDestroy_v2", drv.api.cuEventDestroy(ev)))
		}
		return errors.Join(append(errs, c.deallocate())...)
	}))
	return errors.Join(errs...)
}

// finalize flushes and destroys a live communicator, aborting it if that
// fails or outlasts c.timeout.
func (c *Comm) finalize() error {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	if c.nccl.api.ncclCommFinalize != nil {
		var res ncclResult
		if err := c.dev.do(func() error {
			c.hmu.Lock()
			defer c.hmu.Unlock()
			res = c.nccl.api.ncclCommFinalize(c.handle)
			return nil
		}); err != nil {
			return err
		}
		switch res {
		case ncclSuccess:
		case ncclInProgress:
			if err := c.settle(ctx, "close"); err != nil {
				return err // settle aborted the communicator
			}
		default:
			return c.abort("close", c.nccl.ncclError("ncclCommFinalize", res, 0), nil)
		}
	}
	var res ncclResult
	err := c.dev.do(func() error {
		c.hmu.Lock()
		defer c.hmu.Unlock()
		res = c.nccl.api.ncclCommDestroy(c.handle)
		c.handle = 0
		return nil
	})
	// ncclCommDestroy blocks until it is done even on a non-blocking
	// communicator; ncclInProgress would only say it frees in the background.
	if err == nil && res != ncclSuccess && res != ncclInProgress {
		err = &OpError{Op: "close", Rank: c.rank, Err: c.nccl.ncclError("ncclCommDestroy", res, 0)}
	}
	return err
}
