//go:build !linux

package collective

import (
	"errors"
	"net"
)

// listenLocal has no abstract namespace to use here: same-host peers use
// TCP.
func listenLocal() (net.Listener, error) {
	return nil, errors.New("collective: no abstract unix sockets on this system")
}

func hostIdentity() string { return "" }
