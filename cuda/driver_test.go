package cuda

import (
	"bytes"
	"context"
	"errors"
	goruntime "runtime"
	"strings"
	"sync"
	"testing"
)

func TestDriverSeesDevices(t *testing.T) {
	t.Setenv("FAKE_CUDA_DEVICES", "2")
	drv, err := LoadDriver(context.Background(), only("GORUN_CUDA_LIBRARY", fakeCUDA(t)))
	if err != nil {
		t.Fatal(err)
	}
	n, err := drv.DeviceCount()
	if err != nil || n != 2 || drv.Version() != 12080 {
		t.Fatalf("DeviceCount %d, %v, version %d; want 2 devices, CUDA 12.8", n, err, drv.Version())
	}
	dev, err := drv.OpenDevice(1)
	if err != nil {
		t.Fatal(err)
	}
	if dev.Name() != "Fake GPU 1" || dev.TotalMemory() != 80<<30 || dev.Ordinal() != 1 {
		t.Errorf("device %d %q with %d bytes; want 1 \"Fake GPU 1\" with 80 GiB", dev.Ordinal(), dev.Name(), dev.TotalMemory())
	}
	if err := dev.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := drv.OpenDevice(2); err == nil || err.Error() != "cuda: no GPU 2: the driver sees 2" {
		t.Errorf("OpenDevice(2): %v", err)
	}
}

func TestDriverWithoutGPU(t *testing.T) {
	t.Setenv("FAKE_CUDA_DEVICES", "0")
	path := fakeCUDA(t)
	_, err := LoadDriver(context.Background(), only("GORUN_CUDA_LIBRARY", path))
	var cudaErr *CUDAError
	if !errors.As(err, &cudaErr) || cudaErr.Name != "CUDA_ERROR_NO_DEVICE" {
		t.Fatalf("got %v; want CUDA_ERROR_NO_DEVICE", err)
	}
	want := "cuda: " + path + " loaded but did not initialise: cuda: cuInit: CUDA_ERROR_NO_DEVICE (100): no CUDA-capable device is detected"
	if err.Error() != want {
		t.Errorf("got  %v\nwant %s", err, want)
	}
}

func TestDeviceBuffersRoundTripThroughPinnedStaging(t *testing.T) {
	g := newGPU(t)
	// Bigger than the staging buffer, so the copies go in chunks.
	data := pattern(stagingSize*2+12345, 3)
	b := g.buffer(make([]byte, len(data)+100))
	if n, err := b.WriteAt(data, 100); err != nil || n != len(data) {
		t.Fatalf("WriteAt: %d, %v", n, err)
	}
	got := make([]byte, len(data))
	if n, err := b.ReadAt(got, 100); err != nil || n != len(data) {
		t.Fatalf("ReadAt: %d, %v", n, err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("the data read back differs from the data written")
	}
	// The fake refuses async copies from memory that is not pinned, and
	// says which stream each copy ran on.
	copies := logLines(g.cudaLog(), "cuMemcpy")
	if len(copies) != 9 { // 3 chunks for the initial zeros, then 3 each way
		t.Errorf("%d copies; want 9:\n%s", len(copies), strings.Join(copies, "\n"))
	}
	for _, c := range copies {
		if !strings.HasSuffix(c, "stream=own result=0") {
			t.Errorf("copy %q: want it on the device's own stream, succeeding", c)
		}
	}
	if g.live("pinned") != 1 {
		t.Errorf("%d pinned buffers; want the one staging buffer", g.live("pinned"))
	}

	if _, err := b.WriteAt(data, 101); err == nil || !strings.Contains(err.Error(), "is outside the") {
		t.Errorf("a write past the end: %v", err)
	}
	if _, err := b.ReadAt(got, -1); err == nil {
		t.Error("a read at a negative offset succeeded")
	}
	if err := b.Free(); err != nil {
		t.Fatal(err)
	}
	if err := b.Free(); !errors.Is(err, errFreed) {
		t.Errorf("a second Free: %v", err)
	}
	if _, err := b.ReadAt(got, 0); !errors.Is(err, errFreed) {
		t.Errorf("a read after Free: %v", err)
	}
}

func TestDeviceCallsRunOnTheDeviceThread(t *testing.T) {
	g := newGPU(t)
	// The fake fails any context-bound call on a thread with no context
	// current: a control, from a thread of our own.
	var p DevicePtr
	done := make(chan cuResult)
	go func() {
		goruntime.LockOSThread()
		defer goruntime.UnlockOSThread()
		done <- g.drv.api.cuMemAlloc(&p, 16)
	}()
	if res := <-done; g.drv.check("cuMemAlloc_v2", res) == nil || !strings.Contains(g.drv.check("cuMemAlloc_v2", res).Error(), "CUDA_ERROR_INVALID_CONTEXT") {
		t.Fatalf("the fake allowed an allocation off the device thread: %v", res)
	}

	// Through the Device, goroutines on any thread succeed.
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Go(func() {
			data := pattern(1000+i, byte(i))
			b, err := g.dev.Alloc(len(data))
			if err != nil {
				errs <- err
				return
			}
			defer b.Free()
			got := make([]byte, len(data))
			if _, err := b.WriteAt(data, 0); err != nil {
				errs <- err
			} else if _, err := b.ReadAt(got, 0); err != nil {
				errs <- err
			} else if !bytes.Equal(got, data) {
				errs <- errors.New("data differs")
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if err := g.dev.Synchronize(); err != nil {
		t.Error(err)
	}
}

func TestAllocErrorsNameTheCall(t *testing.T) {
	g := newGPU(t)
	_, err := g.dev.Alloc(1 << 40)
	if err == nil || err.Error() != "cuda: cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY (2): out of memory" {
		t.Errorf("got %v", err)
	}
	if _, err := g.dev.Alloc(0); err == nil {
		t.Error("a zero-byte allocation succeeded")
	}
}

func TestClosedDevice(t *testing.T) {
	g := newGPU(t)
	if err := g.dev.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := g.dev.Alloc(16); !errors.Is(err, ErrDeviceClosed) {
		t.Errorf("Alloc after Close: %v", err)
	}
	if err := g.dev.Close(); err != nil {
		t.Errorf("a second Close: %v", err)
	}
}
