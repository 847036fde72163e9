// Package cuda drives NVIDIA GPUs and NCCL from Go without cgo. It loads
// the CUDA driver API (libcuda.so.1) and NCCL (libnccl.so.2) while the
// program runs, through purego, so building needs neither the CUDA
// toolkit nor NCCL, and a machine without them gets an error to fall back
// on rather than a binary that does not start.
//
//	search := cuda.Search{LookupEnv: lookupEnv}      // GORUN_CUDA_LIBRARY, GORUN_NCCL_LIBRARY
//	drv, err := cuda.LoadDriver(ctx, search)         // *LoadError, *CUDAError
//	nccl, err := cuda.LoadNCCL(ctx, search)          // *LoadError (too old, missing symbols, absent)
//	dev, err := drv.OpenDevice(localRank)
//	comm, err := nccl.NewComm(ctx, dev, cuda.CommConfig{Rank: rank, Size: world, Store: store, Key: "nccl/default"})
//	buf, err := dev.Alloc(4 * n)
//	_, err = buf.WriteAt(data, 0)
//	w, err := comm.AllReduce(ctx, buf.Ptr(), buf.Ptr(), n, elem.Float32, elem.Sum)
//	err = w.Wait(ctx)
//	_, err = buf.ReadAt(data, 0)
//
// Element types and reduction operators are package collective/elem's,
// which package collective shares. The package reads no environment
// itself: the variables that name the libraries come through
// Search.LookupEnv.
//
// Threads: CUDA makes a context current per OS thread, so each Device owns
// a goroutine locked to its own thread, with the GPU's primary context
// current, and every call that touches the GPU runs there; NCCL, which
// uses the CUDA runtime, adopts that same primary context.
//
// Hangs: communicators are non-blocking where NCCL allows (2.14 on), so a
// call never blocks inside NCCL; while one is in progress, or its work is
// on the GPU, ncclCommGetAsyncError is polled, and when the context ends
// first the communicator is aborted and the error names the operation and
// the rank.
package cuda
