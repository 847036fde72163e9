package rawio

import (
	"errors"
	"testing"

	"golang.org/x/sys/unix"
)

// A write and a read through a non-blocking socket pair: the bytes go
// across whole, an empty socket answers EAGAIN, and empty buffers cost
// no call.
func TestReadWrite(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	p := make([]byte, 16)
	if _, err := Read(fds[1], p); !errors.Is(err, unix.EAGAIN) {
		t.Fatalf("read of an empty socket: %v, want EAGAIN", err)
	}
	if n, err := Write(fds[0], []byte("hello")); n != 5 || err != nil {
		t.Fatalf("Write = %d, %v", n, err)
	}
	if n, err := Read(fds[1], p); n != 5 || err != nil || string(p[:n]) != "hello" {
		t.Fatalf("Read = %d %q, %v", n, p[:n], err)
	}
	if n, err := Read(fds[1], nil); n != 0 || err != nil {
		t.Fatalf("Read(nil) = %d, %v", n, err)
	}
	if n, err := Write(fds[0], nil); n != 0 || err != nil {
		t.Fatalf("Write(nil) = %d, %v", n, err)
	}
}
