package cuda

import "github.com/ebitengine/purego"

// dlopen loads a shared library by file path or, given a bare name, from
// the dynamic loader's search path. RTLD_LOCAL keeps its symbols out of
// the global scope: NCCL and the driver find each other by their own
// dlopen, not through ours.
func dlopen(name string) (uintptr, error) {
	return purego.Dlopen(name, purego.RTLD_NOW|purego.RTLD_LOCAL)
}

// dlsym returns the address of name in the library h, or false.
func dlsym(h uintptr, name string) (uintptr, bool) {
	addr, err := purego.Dlsym(h, name)
	return addr, err == nil && addr != 0
}

// dlclose releases a library that turned out to be unusable.
func dlclose(h uintptr) { _ = purego.Dlclose(h) }
