package collective

import (
	"errors"
	"time"

	"golang.org/x/sys/unix"
)

// pollSet is an epoll set whose sockets are armed for one event at a
// time (EPOLLONESHOT), plus an eventfd that interrupts the wait.
type pollSet struct {
	epfd   int
	wakeFD int
	events []unix.EpollEvent
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
	return &pollSet{epfd: epfd, wakeFD: wakeFD, events: make([]unix.EpollEvent, 64)}, nil
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
	n, err := unix.EpollWait(s.epfd, s.events, int(timeout/time.Millisecond))
	if err != nil {
		if errors.Is(err, unix.EINTR) {
			return ready, nil
		}
		return ready, err
	}
	for _, ev := range s.events[:n] {
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
	unix.Close(s.epfd)
	unix.Close(s.wakeFD)
}
