package rendezvous

import (
	"net"
	"slices"

	"github.com/rs/zerolog"
)

// PeerListenerOptions configure PeerListener.
type PeerListenerOptions struct {
	// Allowed are the addresses, besides this machine's, that may connect.
	Allowed []net.IP
	// Logger receives the refusals, at warn, once a minute per address.
	Logger zerolog.Logger
}

// PeerListener wraps l so that it accepts connections only from
// opts.Allowed and from this machine, and closes the others at once: for
// a store whose clients (torch's workers) cannot authenticate, but whose
// addresses are known.
func PeerListener(l net.Listener, opts PeerListenerOptions) net.Listener {
	return &peerListener{Listener: l, allowed: slices.Clone(opts.Allowed), log: newRefusalLog(opts.Logger)}
}

type peerListener struct {
	net.Listener
	allowed []net.IP
	log     *refusalLog
}

func (l *peerListener) Accept() (net.Conn, error) {
	for {
		nc, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if peerAllowed(addrIP(nc.RemoteAddr()), addrIP(nc.LocalAddr()), l.allowed) {
			return nc, nil
		}
		l.log.refuse(nc.RemoteAddr(), "refused a connection to the workers' store from outside the round's nodes")
		nc.Close()
	}
}

// peerAllowed decides whether a connection from remote, taken on this
// machine's address local, may use the store: it comes from this machine
// (loopback, or the very address it reached, which only this machine
// sends from), or from one of allowed.
func peerAllowed(remote, local net.IP, allowed []net.IP) bool {
	switch {
	case remote == nil:
		return false
	case remote.IsLoopback(), local != nil && remote.Equal(local):
		return true
	}
	return slices.ContainsFunc(allowed, remote.Equal)
}

func addrIP(a net.Addr) net.IP {
	if tcp, ok := a.(*net.TCPAddr); ok {
		return tcp.IP
	}
	return nil
}
