//go:build linux

// Command storefloor is the least a TCPStore server can do for torch
// 1.13's init pattern, as a floor to measure gorun's store against
// (bench/scale_store.py): one thread, one epoll set, a map, nothing
// else. No limits, no authentication, no torch 2 dialect, no watches,
// and only the requests storesim sends (SET, GET, ADD, WAIT). Replies
// are written at once; a reply the socket cannot take whole ends that
// connection, which a benchmark's few bytes per request never meet.
//
//	storefloor
//	listening on 127.0.0.1:41234
//
// It serves until SIGINT or SIGTERM. Linux only.
package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// torch 1.13's query types.
const (
	opSet  = 0
	opGet  = 2
	opAdd  = 3
	opWait = 5
)

const stopWaiting = 0 // WAIT's reply once every key exists

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "storefloor:", err)
		os.Exit(1)
	}
}

type client struct {
	fd      int
	in      []byte   // bytes of a request not whole yet
	waiting []string // the keys of a WAIT not answered yet
}

type server struct {
	epoll   int
	clients map[int]*client
	values  map[string][]byte
	waiters map[string][]*client
	out     []byte
}

func run() error {
	listener, err := listen()
	if err != nil {
		return err
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	go func() { <-stop; os.Exit(0) }()

	epoll, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return fmt.Errorf("epoll: %w", err)
	}
	if err := unix.EpollCtl(epoll, unix.EPOLL_CTL_ADD, listener, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(listener)}); err != nil {
		return fmt.Errorf("epoll add: %w", err)
	}
	s := &server{epoll: epoll, clients: map[int]*client{}, values: map[string][]byte{}, waiters: map[string][]*client{}}
	events := make([]unix.EpollEvent, 256)
	buf := make([]byte, 64<<10)
	for {
		n, err := unix.EpollWait(epoll, events, -1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("epoll wait: %w", err)
		}
		for _, ev := range events[:n] {
			if int(ev.Fd) == listener {
				s.accept(listener)
			} else {
				s.read(s.clients[int(ev.Fd)], buf)
			}
		}
	}
}

func listen() (int, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		return 0, fmt.Errorf("bind: %w", err)
	}
	if err := unix.Listen(fd, 4096); err != nil {
		return 0, fmt.Errorf("listen: %w", err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return 0, fmt.Errorf("getsockname: %w", err)
	}
	// The one line a benchmark reads to find the port.
	fmt.Printf("listening on 127.0.0.1:%d\n", sa.(*unix.SockaddrInet4).Port)
	return fd, nil
}

func (s *server) accept(listener int) {
	for {
		fd, _, err := unix.Accept4(listener, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
		if err != nil {
			return // EAGAIN: all taken; anything else: the client retries
		}
		_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
		if unix.EpollCtl(s.epoll, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}) != nil {
			_ = unix.Close(fd)
			continue
		}
		s.clients[fd] = &client{fd: fd}
	}
}

func (s *server) read(c *client, buf []byte) {
	n, err := unix.Read(c.fd, buf)
	if errors.Is(err, unix.EAGAIN) {
		return
	}
	if n <= 0 {
		s.drop(c)
		return
	}
	c.in = append(c.in, buf[:n]...)
	for {
		used, ok := s.handle(c, c.in)
		if !ok {
			break
		}
		c.in = c.in[used:]
	}
	if len(c.in) == 0 {
		c.in = nil
	}
}

func (s *server) drop(c *client) {
	_ = unix.Close(c.fd)
	delete(s.clients, c.fd)
	c.fd = -1 // a WAIT it left is answered to no one
}

// handle serves the request at the start of b, if it is whole, and says
// how many bytes it took.
func (s *server) handle(c *client, b []byte) (int, bool) {
	if len(b) == 0 {
		return 0, false
	}
	r := reader{b: b, at: 1, ok: true}
	switch b[0] {
	case opSet:
		key, value := r.str(), r.bytes()
		if !r.ok {
			return 0, false
		}
		s.set(key, value)
	case opGet:
		key := r.str()
		if !r.ok {
			return 0, false
		}
		v := s.values[key]
		s.reply(c, append(binary.LittleEndian.AppendUint64(s.out[:0], uint64(len(v))), v...))
	case opAdd:
		key, delta := r.str(), int64(r.u64())
		if !r.ok {
			return 0, false
		}
		sum, _ := strconv.ParseInt(string(s.values[key]), 10, 64)
		sum += delta
		s.set(key, strconv.AppendInt(nil, sum, 10))
		s.reply(c, binary.LittleEndian.AppendUint64(s.out[:0], uint64(sum)))
	case opWait:
		n := r.u64()
		if n > uint64(len(b)) {
			return 0, false // more keys than bytes: not whole yet, or hostile
		}
		keys := make([]string, n)
		for i := range keys {
			keys[i] = r.str()
		}
		if !r.ok {
			return 0, false
		}
		c.waiting = keys
		s.answerWait(c)
	default:
		s.drop(c) // a request this floor does not serve
		return 0, false
	}
	return r.at, true
}

func (s *server) set(key string, value []byte) {
	s.values[key] = value
	waiting := s.waiters[key]
	delete(s.waiters, key)
	for _, c := range waiting {
		s.answerWait(c)
	}
}

// answerWait answers c's WAIT once its keys exist, else waits on the
// first that does not.
func (s *server) answerWait(c *client) {
	for _, k := range c.waiting {
		if _, ok := s.values[k]; !ok {
			s.waiters[k] = append(s.waiters[k], c)
			return
		}
	}
	c.waiting = nil
	s.reply(c, append(s.out[:0], stopWaiting))
}

func (s *server) reply(c *client, b []byte) {
	s.out = b[:0]
	if c.fd < 0 {
		return
	}
	if n, err := unix.Write(c.fd, b); err != nil || n != len(b) {
		s.drop(c)
	}
}

// reader takes torch 1.13's fields from a request; ok turns false at
// the first field the bytes do not hold yet.
type reader struct {
	b  []byte
	at int
	ok bool
}

func (r *reader) u64() uint64 {
	if !r.ok || len(r.b)-r.at < 8 {
		r.ok = false
		return 0
	}
	v := binary.LittleEndian.Uint64(r.b[r.at:])
	r.at += 8
	return v
}

func (r *reader) bytes() []byte {
	n := r.u64()
	if !r.ok || uint64(len(r.b)-r.at) < n {
		r.ok = false
		return nil
	}
	v := append([]byte(nil), r.b[r.at:r.at+int(n)]...)
	r.at += int(n)
	return v
}

func (r *reader) str() string { return string(r.bytes()) }
