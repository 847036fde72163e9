package collective

import (
	"errors"
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// pollSet is an epoll set whose sockets are armed for one event at a
// time (EPOLLONESHOT), plus an eventfd that interrupts the wait.
//
// The poller waits for the set in the runtime's own poller (the set's
// descriptor is readable while it holds an event), parked, not in
// epoll_wait: a goroutine in a blocking system call keeps its P, which
// the runtime's monitor thread must take back for other goroutines, and
// while it does so now and then it looks every 20 us instead of every
// 10 ms, each look a context switch on the cores the ops spin on (4
// ranks pinned two to a core, over TCP: the monitors' wake-ups were a
// fifth of all context switches).
type pollSet struct {
	epfd   int
	file   *os.File        // epfd, for the runtime's poller
	raw    syscall.RawConn // file's
	wakeFD int
	events []unix.EpollEvent

	// The wait's callback for raw, made once (a closure made per call
	// would be allocated), and what it found.
	collect func(fd uintptr) bool
	found   int
	err     error
}

// interruptKey marks the eventfd's events; sockets use their key (a
// world rank, never negative).
const interruptKey = -1

const armEvents = unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLONESHOT

func newPollSet() (*pollSet, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	wakeFD, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err == nil {
		ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: interruptKey}
		err = unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, wakeFD, &ev)
	}
	if err != nil {
		unix.Close(epfd)
		if wakeFD >= 0 {
			unix.Close(wakeFD)
		}
		return nil, err
	}
	s := &pollSet{epfd: epfd, wakeFD: wakeFD, events: make([]unix.EpollEvent, 64)}
	// Non-blocking, so that os.NewFile hands it to the runtime's poller.
	if err = unix.SetNonblock(epfd, true); err == nil {
		s.file = os.NewFile(uintptr(epfd), "collective-pollset")
		s.raw, err = s.file.SyscallConn()
	}
	if err != nil {
		s.close()
		return nil, err
	}
	s.collect = func(fd uintptr) bool {
		s.found, s.err = epollNow(int(fd), s.events)
		return s.found > 0 || s.err != nil // false: park until readable
	}
	return s, nil
}

// epollNow is epoll_wait(2) that does not wait, as a raw system call: it
// returns at once, so it need not tell the runtime it may block.
func epollNow(epfd int, events []unix.EpollEvent) (int, error) {
	for {
		n, _, errno := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(epfd), uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), 0, 0, 0)
		switch errno {
		case 0:
			return int(n), nil
		case unix.EINTR:
			continue
		default:
			return 0, errno
		}
	}
}

// add watches fd, armed, under key.
func (s *pollSet) add(fd, key int) error {
	ev := unix.EpollEvent{Events: armEvents, Fd: int32(key)}
	return unix.EpollCtl(s.epfd, unix.EPOLL_CTL_ADD, fd, &ev)
}

// arm asks for fd's next event; if it is readable now, the event comes
// at once.
func (s *pollSet) arm(fd, key int) {
	ev := unix.EpollEvent{Events: armEvents, Fd: int32(key)}
	unix.EpollCtl(s.epfd, unix.EPOLL_CTL_MOD, fd, &ev)
}

func (s *pollSet) remove(fd int) { unix.EpollCtl(s.epfd, unix.EPOLL_CTL_DEL, fd, nil) }

// wait appends the keys of the sockets that became readable within
// timeout (each is unarmed until arm) to ready.
func (s *pollSet) wait(ready []int, timeout time.Duration) ([]int, error) {
	s.found, s.err = 0, nil
	s.file.SetReadDeadline(time.Now().Add(timeout))
	if err := s.raw.Read(s.collect); err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return ready, nil
		}
		return ready, err
	}
	if s.err != nil {
		return ready, s.err
	}
	for _, ev := range s.events[:s.found] {
		if ev.Fd != interruptKey {
			ready = append(ready, int(ev.Fd))
		}
	}
	return ready, nil
}

// interrupt ends a wait in progress, or the next one.
func (s *pollSet) interrupt() {
	one := [8]byte{1}
	unix.Write(s.wakeFD, one[:])
}

func (s *pollSet) close() {
	if s.file != nil {
		s.file.Close() // and epfd
	} else {
		unix.Close(s.epfd)
	}
	unix.Close(s.wakeFD)
}
