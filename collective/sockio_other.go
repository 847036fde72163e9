//go:build !linux

package collective

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// The non-blocking socket calls of sockio_linux.go, made the portable
// way.

// readable reports whether fd has data (or an error) to read.
func readable(fd int) bool {
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, err := unix.Poll(pfd, 0)
	return err != nil || n != 0
}

// readNonblocking is read(2) on a non-blocking descriptor.
func readNonblocking(fd int, p []byte) (int, error) {
	return unix.Read(fd, p)
}

// writevNonblocking is writev(2) on a non-blocking descriptor; iov is
// not empty.
func writevNonblocking(fd int, iov []unix.Iovec) (int, unix.Errno) {
	n, _, errno := unix.Syscall(unix.SYS_WRITEV, uintptr(fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
	return int(n), errno
}
