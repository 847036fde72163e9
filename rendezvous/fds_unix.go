//go:build unix

package rendezvous

import (
	"errors"
	"net"
	"os"
	"syscall"
)

// fdLimit returns the process's soft RLIMIT_NOFILE, or 0 if unknown.
func fdLimit() int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur > 1<<30 {
		return 0
	}
	return int(rl.Cur)
}

// countFDs counts the process's open file descriptors.
func countFDs() (int, error) {
	for _, dir := range []string{"/proc/self/fd", "/dev/fd"} {
		f, err := os.Open(dir)
		if err != nil {
			continue
		}
		names, err := f.Readdirnames(-1)
		f.Close()
		if err == nil {
			return len(names) - 1, nil // less the one reading the directory
		}
	}
	return 0, os.ErrNotExist
}

// socketOf is nc's socket, if nc gives access to it.
func socketOf(nc net.Conn) (syscall.RawConn, bool) {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nil, false
	}
	rc, err := sc.SyscallConn()
	return rc, err == nil
}

// peekInput reports whether bytes wait in fd's socket, leaving them there.
func peekInput(fd uintptr) (pending, wouldBlock bool) {
	var peek [1]byte
	n, _, err := syscall.Recvfrom(int(fd), peek[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	return err == nil && n > 0, err == syscall.EAGAIN
}

// readAvailable reads what the kernel already holds for nc without
// waiting: 0 bytes when nothing has arrived.
func readAvailable(nc net.Conn, p []byte) int {
	rc, ok := socketOf(nc)
	if !ok {
		return 0
	}
	var n int
	var rerr error
	if err := rc.Read(func(fd uintptr) bool {
		n, rerr = syscall.Read(int(fd), p)
		return true // never wait for readiness
	}); err != nil || rerr != nil || n < 0 {
		return 0
	}
	return n
}

// waitReadable blocks, holding no buffer, until nc has bytes to read or
// has hung up or failed, or until its read deadline passes. It returns
// errors.ErrUnsupported when nc offers no access to its socket.
func waitReadable(nc net.Conn) error {
	if w, ok := nc.(readableWaiter); ok {
		return w.waitReadable()
	}
	rc, ok := socketOf(nc)
	if !ok {
		return errors.ErrUnsupported
	}
	return rc.Read(func(fd uintptr) bool {
		// Peek rather than trust the poller's last word: bytes left in the
		// socket by a read that filled its buffer raise no new event.
		_, wouldBlock := peekInput(fd)
		return !wouldBlock
	})
}

// hasInput reports whether bytes wait to be read on nc, without waiting:
// a connection marked idle whose reader has not yet been scheduled to
// see its client's next request is not idle.
func hasInput(nc net.Conn) bool {
	if w, ok := nc.(readableWaiter); ok {
		return w.hasInput()
	}
	rc, ok := socketOf(nc)
	if !ok {
		return false
	}
	pending := false
	_ = rc.Control(func(fd uintptr) { pending, _ = peekInput(fd) })
	return pending
}
