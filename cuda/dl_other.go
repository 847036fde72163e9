//go:build !linux

package cuda

import (
	"errors"
	"fmt"
)

// CUDA and NCCL ship for Linux only; elsewhere nothing loads and every
// Load reports why.

func dlopen(name string) (uintptr, error) {
	return 0, fmt.Errorf("%s: %w: the CUDA driver and NCCL are loaded on Linux only", name, errors.ErrUnsupported)
}

func dlsym(uintptr, string) (uintptr, bool) { return 0, false }

func dlclose(uintptr) {}
