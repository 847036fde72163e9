package cuda

import (
	"runtime"

	"github.com/ebitengine/purego"
)

// dlopen loads a shared library by file path or, given a bare name, from
// the dynamic loader's search path. RTLD_LOCAL keeps its symbols out of
// the global scope: NCCL and the driver find each other by their own
// dlopen, not through ours. The thread stays put because purego asks
// dlerror why a load failed in a call of its own, and dlerror answers
// per thread: a goroutine moved in between got no reason, and a missing
// file read as an unnamed failure.
func dlopen(name string) (uintptr, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return purego.Dlopen(name, purego.RTLD_NOW|purego.RTLD_LOCAL)
}

// dlsym returns the address of name in the library h, or false.
func dlsym(h uintptr, name string) (uintptr, bool) {
	addr, err := purego.Dlsym(h, name)
	return addr, err == nil && addr != 0
}

// dlclose releases a library that turned out to be unusable.
func dlclose(h uintptr) { _ = purego.Dlclose(h) }
