package runtime

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/gorun/gorun/cuda"
)

// Device tensors: GPU memory in a Tensor, and how an operation on device
// tensors is carried out. On a group with NCCL, it runs on the group's
// NCCL communicator; on the TCP backend, it is staged: the device tensors
// are copied to host memory, the host form of the operation runs, and the
// results are copied back. Either way the operation completes, with its
// Work, once its results are in the device tensors.

// DeviceTensor views the first n elements of dt in buf, GPU memory, as a
// Tensor. It panics when they do not fit, as slicing does. The Tensor
// does not own buf: free it once no operation uses it.
func DeviceTensor(buf *cuda.DeviceBuffer, dt DType, n int) Tensor {
	if dt.Size() == 0 || n < 0 || n*dt.Size() > buf.Size() {
		panic(fmt.Sprintf("runtime: %d %s elements do not fit in a device buffer of %d bytes", n, dt, buf.Size()))
	}
	return Tensor{dtype: dt, buf: buf, size: n * dt.Size()}
}

// NewDeviceTensor allocates n elements of dt on dev (see
// ProcessGroup.Device), uninitialised. Free its memory with
// t.DeviceBuffer().Free().
func NewDeviceTensor(dev *cuda.Device, dt DType, n int) (Tensor, error) {
	if dev == nil {
		return Tensor{}, errors.New("runtime: no GPU to allocate a device tensor on: the group has none (see ProcessGroup.Device)")
	}
	if dt.Size() == 0 || n <= 0 {
		return Tensor{}, fmt.Errorf("runtime: a device tensor of %d %s elements: the length must be positive", n, dt)
	}
	buf, err := dev.Alloc(n * dt.Size())
	if err != nil {
		return Tensor{}, fmt.Errorf("runtime: allocating %d %s elements on GPU %d: %w", n, dt, dev.Ordinal(), err)
	}
	return DeviceTensor(buf, dt, n), nil
}

// OnDevice reports whether t is GPU memory.
func (t Tensor) OnDevice() bool { return t.buf != nil }

// Device returns the GPU t is on, or nil for a host tensor.
func (t Tensor) Device() *cuda.Device {
	if t.buf == nil {
		return nil
	}
	return t.buf.Device()
}

// DeviceBuffer returns the device memory t views part or all of, or nil
// for a host tensor.
func (t Tensor) DeviceBuffer() *cuda.DeviceBuffer { return t.buf }

// mustBeOnHost panics, as a failed type assertion does, when what, a
// host accessor, is used on a device tensor.
func (t Tensor) mustBeOnHost(what string) {
	if t.buf != nil {
		panic(fmt.Sprintf("runtime: %s of a device tensor on GPU %d: copy it to the host with Copy", what, t.buf.Device().Ordinal()))
	}
}

// ptr is the device address of t's first element.
func (t Tensor) ptr() cuda.DevicePtr { return t.buf.Ptr() + cuda.DevicePtr(t.off) }

// Copy copies src into dst, each on the host or a GPU; they must have the
// same dtype and length. Copies that touch a GPU go through pinned host
// memory and are complete when Copy returns. Copy takes no part in any
// group's queue: wait for the operations that use either tensor first.
func Copy(dst, src Tensor) error {
	if dst.dtype != src.dtype || dst.Len() != src.Len() {
		return fmt.Errorf("runtime: copy of %s into %s: %w: the dtypes and lengths must match", src, dst, ErrInvalidArgument)
	}
	switch {
	case dst.buf == nil && src.buf == nil:
		copy(dst.data, src.data)
		return nil
	case dst.buf == nil:
		return src.readInto(dst.data)
	case src.buf == nil:
		return dst.writeFrom(src.data)
	}
	// GPU to GPU goes through the host: the runtime binds no
	// device-to-device copy.
	host := make([]byte, src.size)
	if err := src.readInto(host); err != nil {
		return err
	}
	return dst.writeFrom(host)
}

// readInto copies the device tensor t into host memory p, as long as t.
func (t Tensor) readInto(p []byte) error {
	if _, err := t.buf.ReadAt(p, int64(t.off)); err != nil {
		return fmt.Errorf("runtime: copy of %s to the host: %w", t, err)
	}
	return nil
}

// writeFrom copies host memory p, as long as t, into the device tensor t.
func (t Tensor) writeFrom(p []byte) error {
	if _, err := t.buf.WriteAt(p, int64(t.off)); err != nil {
		return fmt.Errorf("runtime: copy to %s from the host: %w", t, err)
	}
	return nil
}

// operands are an operation's tensors, by what it does with them: reads
// are read, writes written, and a tensor updated in place is in both.
// They point at the variables the operation's forms read, so that staging
// can swap host copies in for device tensors.
type operands struct {
	reads, writes []*Tensor
}

// inPlace is the operands of an operation that reads and writes t.
func inPlace(t *Tensor) operands { return operands{reads: []*Tensor{t}, writes: []*Tensor{t}} }

// each returns pointers to the tensors of ts, a list the operation owns.
func each(ts []Tensor) []*Tensor {
	ps := make([]*Tensor, len(ts))
	for i := range ts {
		ps[i] = &ts[i]
	}
	return ps
}

// all is every operand once.
func (o operands) all() []*Tensor {
	ps := slices.Clone(o.reads)
	for _, p := range o.writes {
		if !slices.Contains(ps, p) {
			ps = append(ps, p)
		}
	}
	return ps
}

// onDevice reports whether the operands are device tensors, refusing a
// mix of host and device tensors and freed device memory. No operands
// are host tensors.
func (o operands) onDevice() (bool, error) {
	var host, device *Tensor
	for _, p := range o.all() {
		if p.buf == nil {
			host = p
			continue
		}
		if p.buf.Ptr() == 0 {
			return false, invalid("%s views freed device memory", *p)
		}
		device = p
	}
	if host != nil && device != nil {
		return false, invalid("%s is on the host and %s on a GPU: an operation's tensors must all be on the host or all on GPUs", *host, *device)
	}
	return device != nil, nil
}

// A deviceOp queues an operation on an NCCL communicator and returns its
// Works, to be waited for even when it fails part way.
type deviceOp func(ctx context.Context, c *cuda.Comm) ([]*cuda.Work, error)

// one adapts an operation of a single NCCL call.
func one(w *cuda.Work, err error) ([]*cuda.Work, error) {
	if err != nil {
		return nil, err
	}
	return []*cuda.Work{w}, nil
}

// runOn runs op on c and waits for the GPU to finish it. ctx is the
// operation's own (the group's timeout, its caller's context, the group's
// Close): when it ends first, the communicator is aborted, on this rank,
// since a collective cannot be abandoned otherwise.
func runOn(ctx context.Context, c *cuda.Comm, op deviceOp) error {
	works, err := op(ctx, c)
	return waitAll(ctx, works, err)
}

// waitAll waits for works, queued before err, and returns every error.
func waitAll(ctx context.Context, works []*cuda.Work, err error) error {
	errs := []error{err}
	for _, w := range works {
		errs = append(errs, w.Wait(ctx))
	}
	return errors.Join(errs...)
}

// tensorOp queues an operation on tensors, as collective does, with its
// forms for the tensors' place (see route): host, for host tensors; for
// device tensors, device on the group's NCCL communicator, or on TCP host
// staged through host memory. args are the tensors the forms use; check
// sees them as given.
func (pg *ProcessGroup) tensorOp(ctx context.Context, op string, args operands, check func() error, host func(context.Context) error, device deviceOp) *Work {
	var run func(context.Context) error
	err := pg.admit(func() (err error) {
		if check != nil {
			if err = check(); err != nil {
				return err
			}
		}
		run, err = route(args, pg.nccl.collectives(), host, device)
		return err
	})
	if err != nil {
		return failedWork(op, err)
	}
	w := newWork(ctx, op, run)
	w.desc = args.describe()
	return pg.exec.submit(w)
}

// route returns how to run an operation on args: its host form for host
// tensors; for device tensors, its device form on comm, the group's NCCL
// communicator for it, or, without one, its host form staged through
// host memory. A nil device form means the operation has none.
func route(args operands, comm *cuda.Comm, host func(context.Context) error, device deviceOp) (func(context.Context) error, error) {
	onDevice, err := args.onDevice()
	switch {
	case err != nil:
		return nil, err
	case !onDevice:
		return host, nil
	case comm == nil || device == nil:
		return staged(args, host), nil
	}
	if err := args.onGPUOf(comm); err != nil {
		return nil, err
	}
	return func(ctx context.Context) error { return runOn(ctx, comm, device) }, nil
}

// onGPUOf checks that the operands, device tensors, are on the GPU of c.
func (o operands) onGPUOf(c *cuda.Comm) error {
	gpu := c.Device().Ordinal()
	for _, p := range o.all() {
		if mine := p.buf.Device().Ordinal(); mine != gpu {
			return invalid("%s is on GPU %d, but the group's NCCL communicator on GPU %d", *p, mine, gpu)
		}
	}
	return nil
}

// staged returns host wrapped to run on host copies of the device
// tensors of args: the ones it reads are copied from their GPU first, and
// the ones it writes copied back once it succeeds. It runs on the group's
// queue, so that each copy happens in its turn, after the operations
// before it.
func staged(args operands, host func(context.Context) error) func(context.Context) error {
	return func(ctx context.Context) (err error) {
		all := args.all()
		devices := make([]Tensor, len(all))
		for i, p := range all {
			devices[i] = *p
		}
		defer func() { // the operation's variables view the device again
			for i, p := range all {
				*p = devices[i]
			}
		}()
		for i, p := range all {
			shadow := Tensor{data: make([]byte, devices[i].size), dtype: devices[i].dtype}
			if slices.Contains(args.reads, p) {
				if err := devices[i].readInto(shadow.data); err != nil {
					return err
				}
			}
			*p = shadow
		}
		if err := host(ctx); err != nil {
			return err
		}
		for i, p := range all {
			if slices.Contains(args.writes, p) {
				if err := devices[i].writeFrom(p.data); err != nil {
					return err
				}
			}
		}
		return nil
	}
}

// span returns the tensor that ts, device tensors, make up when they are
// consecutive slices of one device buffer, in order.
func span(ts []Tensor) (Tensor, bool) {
	if len(ts) == 0 {
		return Tensor{}, false
	}
	whole := ts[0]
	for _, t := range ts[1:] {
		if t.buf != whole.buf || t.off != whole.off+whole.size {
			return Tensor{}, false
		}
		whole.size += t.size
	}
	return whole, true
}

// sendTo and recvFrom are the messages of an NCCL group.
func sendTo(peer int, t Tensor) cuda.P2POp {
	return cuda.P2POp{Peer: peer, Buf: t.ptr(), Count: t.Len(), DType: t.dtype}
}

func recvFrom(peer int, t Tensor) cuda.P2POp {
	return cuda.P2POp{Recv: true, Peer: peer, Buf: t.ptr(), Count: t.Len(), DType: t.dtype}
}

// p2pBatch queues ops as one NCCL group, leaving out the empty messages,
// which both of their sides leave out alike.
func p2pBatch(ctx context.Context, c *cuda.Comm, ops []cuda.P2POp) ([]*cuda.Work, error) {
	ops = slices.DeleteFunc(ops, func(op cuda.P2POp) bool { return op.Count == 0 })
	if len(ops) == 0 {
		return nil, nil
	}
	return one(c.BatchP2P(ctx, ops))
}
