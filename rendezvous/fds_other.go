//go:build !unix

package rendezvous

import (
	"errors"
	"net"
)

func fdLimit() int { return 0 }

func countFDs() (int, error) { return 0, errors.ErrUnsupported }

func readAvailable(net.Conn, []byte) int { return 0 }

func hasInput(net.Conn) bool { return false }
