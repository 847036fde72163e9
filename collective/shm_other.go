//go:build !linux

package collective

import "errors"

// Shared memory between ranks is built for Linux only; elsewhere same-host
// ranks use sockets.

type segment struct {
	path string
	mem  []byte
}

var errNoSharedMemory = errors.New("collective: no shared-memory transport on this system")

func createSegment(string, int) (*segment, error) { return nil, errNoSharedMemory }
func openSegment(string, int) (*segment, error)   { return nil, errNoSharedMemory }
func (s *segment) unlink()                        {}
func (s *segment) unmap()                         {}

func cpusOf([]int) (int, bool) { return 0, false }

func readPeer(int, uintptr, []byte) error  { return errNoSharedMemory }
func writePeer(int, uintptr, []byte) error { return errNoSharedMemory }
