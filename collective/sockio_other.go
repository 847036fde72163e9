//go:build !linux

package collective

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// The non-blocking socket calls of sockio_linux.go, made the portable
// way.

// readableSockets reports which of fds have data (or an error) to read:
// bit i for fds[i].
func readableSockets(fds []int) uint32 {
	var pfds [maxStreams]unix.PollFd
	for i, fd := range fds {
		pfds[i] = unix.PollFd{Fd: int32(fd), Events: unix.POLLIN}
	}
	if _, err := unix.Poll(pfds[:len(fds)], 0); err != nil {
		return 1<<len(fds) - 1
	}
	var ready uint32
	for i := range fds {
		if pfds[i].Revents != 0 {
			ready |= 1 << i
		}
	}
	return ready
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
