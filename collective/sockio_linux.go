package collective

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// The system calls an op makes on its non-blocking sockets while it
// spins. They are raw: none of them can block, and a plain system call
// tells the Go scheduler that the thread may be stuck. A read or write of
// a megabyte takes long enough (100 us and more) that the runtime's
// monitor would then take the processor away and wake another thread to
// run it, only for the op to take it back when the call returns: with
// every core busy moving bytes, those wake-ups cost a context switch
// each and kept the monitor polling every 20 us. A raw call looks to the
// scheduler like ordinary computation; it delays a stop-the-world pause
// by at most one copy of a socket buffer.

// readable asks the kernel which of s's sockets have data, or an error,
// to read. Unlike a read, it takes no socket's lock: a spinning op reads
// only once something came, and does not slow the sender's delivery.
func (s *socketSet) readable() uint32 {
	var zero unix.Timespec // do not wait
	n, _, errno := unix.RawSyscall(unix.SYS_PPOLL, uintptr(unsafe.Pointer(&s.fds[0])), uintptr(s.n), uintptr(unsafe.Pointer(&zero)))
	if errno != 0 {
		return 1<<s.n - 1 // let the reads find out
	}
	return s.ready(int(n))
}

// writevNonblocking is writev(2) on a non-blocking descriptor; iov is
// not empty.
func writevNonblocking(fd int, iov []unix.Iovec) (int, unix.Errno) {
	n, _, errno := unix.RawSyscall(unix.SYS_WRITEV, uintptr(fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
	return int(n), errno
}
