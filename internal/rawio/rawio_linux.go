package rawio

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// Read is read(2) on a non-blocking descriptor.
func Read(fd int, p []byte) (int, error) { return call(unix.SYS_READ, fd, p) }

// Write is write(2) on a non-blocking descriptor.
func Write(fd int, p []byte) (int, error) { return call(unix.SYS_WRITE, fd, p) }

// call makes system call trap (read or write) on fd and p, raw: it
// cannot block on a non-blocking descriptor, so the runtime need not
// hand our processor to another thread.
func call(trap uintptr, fd int, p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	n, _, errno := unix.RawSyscall(trap, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}
