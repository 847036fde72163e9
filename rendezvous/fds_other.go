//go:build !unix

package rendezvous

import (
	"errors"
	"net"
)

func fdLimit() int { return 0 }

func countFDs() (int, error) { return 0, errors.ErrUnsupported }

func readAvailable(net.Conn, []byte) int { return 0 }

func hasInput(nc net.Conn) bool {
	if w, ok := nc.(readableWaiter); ok {
		return w.hasInput()
	}
	return false
}

func waitReadable(nc net.Conn) error {
	if w, ok := nc.(readableWaiter); ok {
		return w.waitReadable()
	}
	return errors.ErrUnsupported
}
