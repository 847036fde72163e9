//go:build !linux

package collective

import (
	"errors"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// pollSet without epoll: poll(2) over the armed sockets, and a pipe that
// interrupts the wait. Arming is kept here: a socket that reported an
// event leaves the set until arm.
type pollSet struct {
	mu    sync.Mutex
	armed map[int]int // fd to key
	pipe  [2]int
	fds   []unix.PollFd
	keys  []int
}

func newPollSet() (*pollSet, error) {
	s := &pollSet{armed: make(map[int]int)}
	if err := unix.Pipe(s.pipe[:]); err != nil {
		return nil, err
	}
	unix.SetNonblock(s.pipe[0], true)
	unix.SetNonblock(s.pipe[1], true)
	return s, nil
}

func (s *pollSet) add(fd, key int) error {
	s.arm(fd, key)
	return nil
}

func (s *pollSet) arm(fd, key int) {
	s.mu.Lock()
	s.armed[fd] = key
	s.mu.Unlock()
	s.interrupt() // the wait in progress does not know fd
}

func (s *pollSet) remove(fd int) {
	s.mu.Lock()
	delete(s.armed, fd)
	s.mu.Unlock()
}

func (s *pollSet) wait(ready []int, timeout time.Duration) ([]int, error) {
	s.mu.Lock()
	s.fds = append(s.fds[:0], unix.PollFd{Fd: int32(s.pipe[0]), Events: unix.POLLIN})
	s.keys = append(s.keys[:0], -1)
	for fd, key := range s.armed {
		s.fds = append(s.fds, unix.PollFd{Fd: int32(fd), Events: unix.POLLIN})
		s.keys = append(s.keys, key)
	}
	s.mu.Unlock()
	n, err := unix.Poll(s.fds, int(timeout/time.Millisecond))
	if err != nil {
		if errors.Is(err, unix.EINTR) {
			return ready, nil
		}
		return ready, err
	}
	if n == 0 {
		return ready, nil
	}
	var drain [64]byte
	unix.Read(s.pipe[0], drain[:])
	s.mu.Lock()
	for i, p := range s.fds[1:] {
		if p.Revents != 0 {
			delete(s.armed, int(p.Fd))
			ready = append(ready, s.keys[i+1])
		}
	}
	s.mu.Unlock()
	return ready, nil
}

func (s *pollSet) interrupt() {
	one := [1]byte{1}
	unix.Write(s.pipe[1], one[:])
}

func (s *pollSet) close() {
	unix.Close(s.pipe[0])
	unix.Close(s.pipe[1])
}
