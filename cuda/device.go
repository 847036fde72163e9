package cuda

import (
	"errors"
	"fmt"
	goruntime "runtime"
	"sync"
	"unsafe"
)

// DevicePtr is an address in a GPU's memory (a CUdeviceptr). Arithmetic
// on it is byte arithmetic.
type DevicePtr uintptr

// stream and event are CUstream and CUevent handles.
type (
	stream uintptr
	event  uintptr
)

// ErrDeviceClosed is returned by calls on a closed Device.
var ErrDeviceClosed = errors.New("cuda: device closed")

// stagingSize is the pinned host buffer each device copies through: big
// enough that a copy runs at the bus's speed, small enough to keep one per
// GPU without thought.
const stagingSize = 4 << 20

// Device is one GPU, driven by a goroutine locked to its own OS thread on
// which the GPU's primary context is current. CUDA binds a context to a
// thread, so every call that touches the GPU runs there, one at a time;
// callers wait for their turn, and a blocking driver call releases its Go
// scheduler slot while it runs. A Device is safe for concurrent use.
type Device struct {
	drv      *Driver
	ordinal  int
	handle   int32   // CUdevice
	ctx      uintptr // CUcontext: the primary context, retained
	name     string
	busID    string
	totalMem int64

	calls     chan func()
	stop      chan struct{} // closed by Close
	done      chan struct{} // closed by the device thread when it has exited
	closeOnce sync.Once
	closeErr  error // set by the device thread before done is closed

	// Owned by the device thread.
	copyStream stream
	staging    unsafe.Pointer // pinned, stagingSize bytes; allocated on first copy
}

// OpenDevice retains the primary context of the GPU with the given ordinal
// (counted after CUDA_VISIBLE_DEVICES) and starts its thread. NCCL, which
// uses the CUDA runtime, adopts the same primary context. Close releases it.
func (d *Driver) OpenDevice(ordinal int) (*Device, error) {
	count, err := d.DeviceCount()
	if err != nil {
		return nil, err
	}
	if ordinal < 0 || ordinal >= count {
		return nil, fmt.Errorf("cuda: no GPU %d: the driver sees %d", ordinal, count)
	}
	dev := &Device{
		drv:     d,
		ordinal: ordinal,
		calls:   make(chan func()),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	if err := d.check("cuDeviceGet", d.api.cuDeviceGet(&dev.handle, int32(ordinal))); err != nil {
		return nil, err
	}
	name := make([]byte, 256)
	if err := d.check("cuDeviceGetName", d.api.cuDeviceGetName(name, int32(len(name)), dev.handle)); err != nil {
		return nil, err
	}
	dev.name = goString(&name[0])
	busID := make([]byte, 32) // "0000:19:00.0", NUL-terminated
	if err := d.check("cuDeviceGetPCIBusId", d.api.cuDeviceGetPCIBusId(busID, int32(len(busID)), dev.handle)); err != nil {
		return nil, err
	}
	dev.busID = goString(&busID[0])
	var total uintptr
	if err := d.check("cuDeviceTotalMem_v2", d.api.cuDeviceTotalMem(&total, dev.handle)); err != nil {
		return nil, err
	}
	dev.totalMem = int64(total)
	if err := d.check("cuDevicePrimaryCtxRetain", d.api.cuDevicePrimaryCtxRetain(&dev.ctx, dev.handle)); err != nil {
		return nil, err
	}
	started := make(chan error)
	go dev.run(started)
	if err := <-started; err != nil {
		return nil, err
	}
	return dev, nil
}

// Ordinal is the GPU's index among those the driver sees.
func (d *Device) Ordinal() int { return d.ordinal }

// Name is the GPU's product name, e.g. "NVIDIA H200".
func (d *Device) Name() string { return d.name }

// BusID is the GPU's PCI address, e.g. "0000:19:00.0": the same GPU's
// whatever CUDA_VISIBLE_DEVICES a process has, as NCCL tells GPUs apart.
func (d *Device) BusID() string { return d.busID }

// TotalMemory is the GPU's memory in bytes.
func (d *Device) TotalMemory() int64 { return d.totalMem }

// run is the device thread: it makes the context current, then runs the
// calls it is given until Close, and finally releases what it holds. The
// thread is never unlocked, so it exits with this goroutine and no other
// goroutine inherits the context.
func (d *Device) run(started chan<- error) {
	goruntime.LockOSThread()
	api := &d.drv.api
	err := d.drv.check("cuCtxSetCurrent", api.cuCtxSetCurrent(d.ctx))
	if err == nil {
		err = d.drv.check("cuStreamCreate", api.cuStreamCreate(&d.copyStream, streamNonBlocking))
	}
	if err != nil {
		d.closeErr = errors.Join(err, d.drv.check("cuDevicePrimaryCtxRelease_v2", api.cuDevicePrimaryCtxRelease(d.handle)))
		close(d.done)
		started <- d.closeErr
		return
	}
	started <- nil
	for {
		select {
		case call := <-d.calls:
			call()
		case <-d.stop:
			d.closeErr = d.release()
			close(d.done)
			return
		}
	}
}

// release frees the device thread's own resources and the context.
func (d *Device) release() error {
	api := &d.drv.api
	var errs []error
	if d.staging != nil {
		errs = append(errs, d.drv.check("cuMemFreeHost", api.cuMemFreeHost(d.staging)))
	}
	errs = append(errs,
		d.drv.check("cuStreamDestroy_v2", api.cuStreamDestroy(d.copyStream)),
		d.drv.check("cuCtxSetCurrent", api.cuCtxSetCurrent(0)),
		d.drv.check("cuDevicePrimaryCtxRelease_v2", api.cuDevicePrimaryCtxRelease(d.handle)),
	)
	return errors.Join(errs...)
}

// Close stops the device thread and releases the context. Free buffers and
// close communicators on the device first.
func (d *Device) Close() error {
	d.closeOnce.Do(func() { close(d.stop) })
	<-d.done
	return d.closeErr
}

// submit queues fn to run on the device thread and returns where its
// result will arrive; the channel is buffered, so nobody has to read it.
func (d *Device) submit(fn func() error) <-chan error {
	res := make(chan error, 1)
	select {
	case d.calls <- func() { res <- fn() }:
	case <-d.done:
		res <- ErrDeviceClosed
	}
	return res
}

// do runs fn on the device thread and returns its error.
func (d *Device) do(fn func() error) error {
	return <-d.submit(fn)
}

// Synchronize waits until the GPU has finished all work queued on it
// (cuCtxSynchronize).
func (d *Device) Synchronize() error {
	return d.do(func() error {
		return d.drv.check("cuCtxSynchronize", d.drv.api.cuCtxSynchronize())
	})
}

// DeviceBuffer is memory on a GPU. It implements io.ReaderAt and
// io.WriterAt; the copies go through the device's pinned staging buffer
// and are complete when they return.
type DeviceBuffer struct {
	dev  *Device
	ptr  DevicePtr
	size int
	mu   sync.Mutex // guards ptr against a concurrent Free
}

// Alloc allocates size bytes of device memory (cuMemAlloc_v2). The memory
// is not cleared.
func (d *Device) Alloc(size int) (*DeviceBuffer, error) {
	if size <= 0 {
		return nil, fmt.Errorf("cuda: alloc of %d bytes: the size must be positive", size)
	}
	b := &DeviceBuffer{dev: d, size: size}
	err := d.do(func() error {
		return d.drv.check("cuMemAlloc_v2", d.drv.api.cuMemAlloc(&b.ptr, uintptr(size)))
	})
	if err != nil {
		return nil, err
	}
	return b, nil
}

// errFreed is returned by the use of a freed DeviceBuffer.
var errFreed = errors.New("cuda: device buffer already freed")

// Ptr is the buffer's address, for NCCL calls; 0 once freed.
func (b *DeviceBuffer) Ptr() DevicePtr {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ptr
}

// Size is the buffer's length in bytes.
func (b *DeviceBuffer) Size() int { return b.size }

// Device is the GPU the buffer is on.
func (b *DeviceBuffer) Device() *Device { return b.dev }

// Free releases the memory (cuMemFree_v2). The caller makes sure no GPU
// work still uses it.
func (b *DeviceBuffer) Free() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ptr == 0 {
		return errFreed
	}
	err := b.dev.do(func() error {
		return b.dev.drv.check("cuMemFree_v2", b.dev.drv.api.cuMemFree(b.ptr))
	})
	b.ptr = 0
	return err
}

// WriteAt copies p to the buffer at byte offset off.
func (b *DeviceBuffer) WriteAt(p []byte, off int64) (int, error) {
	return b.transfer(p, off, "write", func(dst DevicePtr) error { return b.dev.copyToDevice(dst, p) })
}

// ReadAt copies len(p) bytes from the buffer at byte offset off into p.
func (b *DeviceBuffer) ReadAt(p []byte, off int64) (int, error) {
	return b.transfer(p, off, "read", func(src DevicePtr) error { return b.dev.copyToHost(p, src) })
}

// transfer checks that p fits at off and runs move on the device thread.
func (b *DeviceBuffer) transfer(p []byte, off int64, what string, move func(DevicePtr) error) (int, error) {
	if off < 0 || off > int64(b.size) || int64(len(p)) > int64(b.size)-off {
		return 0, fmt.Errorf("cuda: %s of %d bytes at offset %d is outside the %d-byte device buffer", what, len(p), off, b.size)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ptr == 0 {
		return 0, errFreed
	}
	if len(p) == 0 {
		return 0, nil
	}
	if err := b.dev.do(func() error { return move(b.ptr + DevicePtr(off)) }); err != nil {
		return 0, err
	}
	return len(p), nil
}

// stagingBuffer returns the pinned staging buffer, allocating it on first
// use. Device thread only.
func (d *Device) stagingBuffer() ([]byte, error) {
	if d.staging == nil {
		if err := d.drv.check("cuMemAllocHost_v2", d.drv.api.cuMemAllocHost(&d.staging, stagingSize)); err != nil {
			return nil, err
		}
	}
	return unsafe.Slice((*byte)(d.staging), stagingSize), nil
}

// copyToDevice copies src to dst through the staging buffer, a chunk at a
// time. DMA needs pinned memory; Go's memory is neither pinned nor
// guaranteed to stay put. Device thread only.
func (d *Device) copyToDevice(dst DevicePtr, src []byte) error {
	staging, err := d.stagingBuffer()
	if err != nil {
		return err
	}
	api := &d.drv.api
	for len(src) > 0 {
		n := copy(staging, src)
		if err := d.drv.check("cuMemcpyHtoDAsync_v2", api.cuMemcpyHtoDAsync(dst, d.staging, uintptr(n), d.copyStream)); err != nil {
			return err
		}
		if err := d.drv.check("cuStreamSynchronize", api.cuStreamSynchronize(d.copyStream)); err != nil {
			return err
		}
		dst += DevicePtr(n)
		src = src[n:]
	}
	return nil
}

// copyToHost copies len(dst) bytes from src through the staging buffer.
// Device thread only.
func (d *Device) copyToHost(dst []byte, src DevicePtr) error {
	staging, err := d.stagingBuffer()
	if err != nil {
		return err
	}
	api := &d.drv.api
	for len(dst) > 0 {
		n := min(len(dst), len(staging))
		if err := d.drv.check("cuMemcpyDtoHAsync_v2", api.cuMemcpyDtoHAsync(d.staging, src, uintptr(n), d.copyStream)); err != nil {
			return err
		}
		if err := d.drv.check("cuStreamSynchronize", api.cuStreamSynchronize(d.copyStream)); err != nil {
			return err
		}
		copy(dst, staging[:n])
		src += DevicePtr(n)
		dst = dst[n:]
	}
	return nil
}
