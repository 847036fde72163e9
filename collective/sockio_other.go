//go:build !linux

package collective

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// The non-blocking socket calls of sockio_linux.go, made the portable
// way.

// readable reports which of s's sockets have data, or an error, to read.
func (s *socketSet) readable() uint32 {
	n, err := unix.Poll(s.fds[:s.n], 0)
	if err != nil {
		return 1<<s.n - 1
	}
	return s.ready(n)
}

// writevNonblocking is writev(2) on a non-blocking descriptor; iov is
// not empty.
func writevNonblocking(fd int, iov []unix.Iovec) (int, unix.Errno) {
	n, _, errno := unix.Syscall(unix.SYS_WRITEV, uintptr(fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
	return int(n), errno
}
