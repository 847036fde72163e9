package main

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// hugeMin is the size from which numpy, whose arrays are the anchors'
// buffers (bench/anchor.py), asks the kernel for transparent huge pages.
const hugeMin = 4 << 20

// allocHuge maps n bytes, aligned to a huge page, and asks for them to be
// backed by transparent huge pages (madvise MADV_HUGEPAGE, as numpy
// does); release unmaps them.
func allocHuge(n int) (mem []byte, release func(), err error) {
	const huge = 2 << 20
	m, err := unix.Mmap(-1, 0, n+huge, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, nil, fmt.Errorf("map %d bytes: %w", n, err)
	}
	off := (huge - int(uintptr(unsafe.Pointer(&m[0])))%huge) % huge
	mem = m[off : off+n : off+n]
	if err := unix.Madvise(mem, unix.MADV_HUGEPAGE); err != nil {
		unix.Munmap(m)
		return nil, nil, fmt.Errorf("madvise huge pages: %w", err)
	}
	return mem, func() { unix.Munmap(m) }, nil
}
