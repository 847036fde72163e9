package cuda

import (
	"context"
	"fmt"
	"unsafe"
)

// cuResult is the driver API's CUresult.
type cuResult int32

// The CUresult values we act on.
const (
	cudaSuccess     cuResult = 0
	cudaErrNotReady cuResult = 600
)

// Flags of the driver calls we make.
const (
	streamNonBlocking  = 0x1 // CU_STREAM_NON_BLOCKING: no implicit sync with the legacy default stream
	eventDisableTiming = 0x2 // CU_EVENT_DISABLE_TIMING: the cheapest event, for completion only
)

// minDriver is what has every driver function we bind
// (cuDevicePrimaryCtxRelease_v2 came with CUDA 11).
const minDriver = "a CUDA 11 or newer driver"

// driverAPI holds the driver functions we call, named as in cuda.h. The
// header maps most of them to _v2 symbols by macro, so we bind those.
type driverAPI struct {
	cuInit                    func(flags uint32) cuResult
	cuDriverGetVersion        func(version *int32) cuResult
	cuGetErrorName            func(res cuResult, name **byte) cuResult
	cuGetErrorString          func(res cuResult, text **byte) cuResult
	cuDeviceGetCount          func(count *int32) cuResult
	cuDeviceGet               func(dev *int32, ordinal int32) cuResult
	cuDeviceGetName           func(name []byte, length int32, dev int32) cuResult
	cuDeviceGetPCIBusId       func(id []byte, length int32, dev int32) cuResult
	cuDeviceTotalMem          func(bytes *uintptr, dev int32) cuResult
	cuDevicePrimaryCtxRetain  func(ctx *uintptr, dev int32) cuResult
	cuDevicePrimaryCtxRelease func(dev int32) cuResult
	cuCtxSetCurrent           func(ctx uintptr) cuResult
	cuCtxSynchronize          func() cuResult
	cuMemAlloc                func(ptr *DevicePtr, bytes uintptr) cuResult
	cuMemFree                 func(ptr DevicePtr) cuResult
	cuMemAllocHost            func(ptr *unsafe.Pointer, bytes uintptr) cuResult
	cuMemFreeHost             func(ptr unsafe.Pointer) cuResult
	cuMemcpyHtoDAsync         func(dst DevicePtr, src unsafe.Pointer, bytes uintptr, s stream) cuResult
	cuMemcpyDtoHAsync         func(dst unsafe.Pointer, src DevicePtr, bytes uintptr, s stream) cuResult
	cuStreamCreate            func(s *stream, flags uint32) cuResult
	cuStreamDestroy           func(s stream) cuResult
	cuStreamSynchronize       func(s stream) cuResult
	cuEventCreate             func(e *event, flags uint32) cuResult
	cuEventRecord             func(e event, s stream) cuResult
	cuEventQuery              func(e event) cuResult
	cuEventDestroy            func(e event) cuResult
}

func (a *driverAPI) symbols() []symbol {
	return []symbol{
		{name: "cuInit", fn: &a.cuInit},
		{name: "cuDriverGetVersion", fn: &a.cuDriverGetVersion},
		{name: "cuGetErrorName", fn: &a.cuGetErrorName},
		{name: "cuGetErrorString", fn: &a.cuGetErrorString},
		{name: "cuDeviceGetCount", fn: &a.cuDeviceGetCount},
		{name: "cuDeviceGet", fn: &a.cuDeviceGet},
		{name: "cuDeviceGetName", fn: &a.cuDeviceGetName},
		{name: "cuDeviceGetPCIBusId", fn: &a.cuDeviceGetPCIBusId},
		{name: "cuDeviceTotalMem_v2", fn: &a.cuDeviceTotalMem},
		{name: "cuDevicePrimaryCtxRetain", fn: &a.cuDevicePrimaryCtxRetain},
		{name: "cuDevicePrimaryCtxRelease_v2", fn: &a.cuDevicePrimaryCtxRelease},
		{name: "cuCtxSetCurrent", fn: &a.cuCtxSetCurrent},
		{name: "cuCtxSynchronize", fn: &a.cuCtxSynchronize},
		{name: "cuMemAlloc_v2", fn: &a.cuMemAlloc},
		{name: "cuMemFree_v2", fn: &a.cuMemFree},
		{name: "cuMemAllocHost_v2", fn: &a.cuMemAllocHost},
		{name: "cuMemFreeHost", fn: &a.cuMemFreeHost},
		{name: "cuMemcpyHtoDAsync_v2", fn: &a.cuMemcpyHtoDAsync},
		{name: "cuMemcpyDtoHAsync_v2", fn: &a.cuMemcpyDtoHAsync},
		{name: "cuStreamCreate", fn: &a.cuStreamCreate},
		{name: "cuStreamDestroy_v2", fn: &a.cuStreamDestroy},
		{name: "cuStreamSynchronize", fn: &a.cuStreamSynchronize},
		{name: "cuEventCreate", fn: &a.cuEventCreate},
		{name: "cuEventRecord", fn: &a.cuEventRecord},
		{name: "cuEventQuery", fn: &a.cuEventQuery},
		{name: "cuEventDestroy_v2", fn: &a.cuEventDestroy},
	}
}

// CUDAError is a failed driver API call.
type CUDAError struct {
	Call string // the driver function, e.g. "cuMemAlloc_v2"
	Code int    // the CUresult
	Name string // e.g. "CUDA_ERROR_OUT_OF_MEMORY"
	Text string // e.g. "out of memory"
}

func (e *CUDAError) Error() string {
	return fmt.Sprintf("cuda: %s: %s (%d): %s", e.Call, e.Name, e.Code, e.Text)
}

// Driver is the CUDA driver API of libcuda.so.1, loaded and initialised.
// It is safe for concurrent use; work on a GPU goes through its Device.
type Driver struct {
	path    string
	api     driverAPI
	version int
	lib     uintptr // the dlopen handle, which the tests use to reach a fake driver's own functions
}

// LoadDriver finds libcuda.so.1 as s says, binds the driver functions and
// calls cuInit. A missing library or function is a *LoadError; a driver
// that loads but does not initialise (no GPU, a driver/kernel mismatch) is
// a *CUDAError from cuInit.
func LoadDriver(ctx context.Context, s Search) (*Driver, error) {
	d := &Driver{}
	lib, path, err := s.load(ctx, cudaLibrary, func(h uintptr) error {
		api, version, err := checkDriver(h)
		if err != nil {
			return err
		}
		d.api, d.version = api, version
		return nil
	})
	if err != nil {
		return nil, err
	}
	d.lib, d.path = lib, path
	if err := d.check("cuInit", d.api.cuInit(0)); err != nil {
		return nil, fmt.Errorf("cuda: %s loaded but did not initialise: %w", path, err)
	}
	return d, nil
}

// Path is the file the driver was loaded from, or its soname when the
// dynamic loader found it.
func (d *Driver) Path() string { return d.path }

// Version is the newest CUDA version the driver supports, as
// 1000*major + 10*minor (12080 is CUDA 12.8).
func (d *Driver) Version() int { return d.version }

// DeviceCount is the number of GPUs the driver sees (after
// CUDA_VISIBLE_DEVICES).
func (d *Driver) DeviceCount() (int, error) {
	var n int32
	if err := d.check("cuDeviceGetCount", d.api.cuDeviceGetCount(&n)); err != nil {
		return 0, err
	}
	return int(n), nil
}

// check turns a CUresult into nil or a *CUDAError naming call.
func (d *Driver) check(call string, res cuResult) error {
	if res == cudaSuccess {
		return nil
	}
	e := &CUDAError{Call: call, Code: int(res), Name: "CUDA_ERROR_UNKNOWN", Text: "unrecognized error code"}
	var name, text *byte
	if d.api.cuGetErrorName(res, &name) == cudaSuccess {
		e.Name = goString(name)
	}
	if d.api.cuGetErrorString(res, &text) == cudaSuccess {
		e.Text = goString(text)
	}
	return e
}
