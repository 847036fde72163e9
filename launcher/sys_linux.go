package launcher

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"
)

// workerAttr puts a worker in a process group of its own, so that one
// kill(-pgid) reaches everything it starts, and has the kernel SIGKILL it
// when the agent dies. With a terminal the worker leads a new session (a
// controlling terminal requires one), which also makes pgid == pid.
//
// Pdeathsig fires when the thread that forked the worker exits, not the
// process. The Go runtime never ends a thread unless a goroutine locked to it
// returns without unlocking; StartGroup therefore forks each worker from a
// fresh, unlocked goroutine, whatever the caller's goroutine is doing.
func workerAttr(withTTY bool) *syscall.SysProcAttr {
	if withTTY {
		// Ctty is the child's fd of the terminal: its stdout.
		return &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 1, Pdeathsig: syscall.SIGKILL}
	}
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// awaitExit blocks until process pid has exited, without reaping it: the
// zombie keeps the pid (and so the process group id) from being reused while
// the group is killed and marked exited, so a later kill(-pid) can never hit
// a stranger.
//
// It waits on a pidfd in Go's poller, which holds no OS thread: blocked in
// waitid, the reapers of 256 workers held 256 threads.
func awaitExit(pid int) error {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil { // before Linux 5.3
		return awaitExitBlocking(pid)
	}
	pidfd := os.NewFile(uintptr(fd), "pidfd")
	defer pidfd.Close()
	raw, err := pidfd.SyscallConn()
	if err != nil {
		return awaitExitBlocking(pid)
	}
	var waitErr error
	err = raw.Read(func(fd uintptr) bool {
		for {
			// Linux zeroes info when nothing is waitable yet.
			var info unix.Siginfo
			waitErr = unix.Waitid(unix.P_PIDFD, int(fd), &info, unix.WEXITED|unix.WNOWAIT|unix.WNOHANG, nil)
			if !errors.Is(waitErr, unix.EINTR) {
				return waitErr != nil || info.Signo != 0
			}
		}
	})
	return errors.Join(err, waitErr)
}

// awaitExitBlocking is awaitExit holding an OS thread in waitid.
func awaitExitBlocking(pid int) error {
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// ttyWinsize is a conventional terminal size, so that programs which format
// for the terminal width see a sane one.
var ttyWinsize = unix.Winsize{Row: 24, Col: 80}

// openTerminal opens a pseudo-terminal for a worker's stdout. The terminal
// does not turn "\n" into "\r\n" (ONLCR off), so log files get plain lines.
//
// creack/pty leaves the master in blocking mode (its ioctls go through Fd),
// where Close cannot interrupt a Read; we keep a non-blocking duplicate
// instead, which lets the output drain be bounded when a background process
// holds the terminal open.
func openTerminal() (master, tty *os.File, err error) {
	ptmx, tty, err := pty.Open()
	if err != nil {
		return nil, nil, err
	}
	defer ptmx.Close()
	if err := configureTerminal(int(tty.Fd())); err != nil {
		tty.Close()
		return nil, nil, err
	}
	master, err = nonBlockingDup(ptmx)
	if err != nil {
		tty.Close()
		return nil, nil, fmt.Errorf("pty master: %w", err)
	}
	return master, tty, nil
}

// nonBlockingDup returns a pollable duplicate of f.
func nonBlockingDup(f *os.File) (*os.File, error) {
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, err
	}
	// os.NewFile registers a non-blocking descriptor with the poller.
	return os.NewFile(uintptr(fd), f.Name()), nil
}

func configureTerminal(fd int) error {
	termios, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	if err != nil {
		return fmt.Errorf("pty termios: %w", err)
	}
	termios.Oflag &^= unix.ONLCR
	if err := unix.IoctlSetTermios(fd, unix.TCSETS, termios); err != nil {
		return fmt.Errorf("pty termios: %w", err)
	}
	if err := unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &ttyWinsize); err != nil {
		return fmt.Errorf("pty size: %w", err)
	}
	return nil
}
