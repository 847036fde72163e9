//go:build !linux

package rawio

import "golang.org/x/sys/unix"

// Read is read(2) on a non-blocking descriptor.
func Read(fd int, p []byte) (int, error) { return unix.Read(fd, p) }

// Write is write(2) on a non-blocking descriptor.
func Write(fd int, p []byte) (int, error) { return unix.Write(fd, p) }
