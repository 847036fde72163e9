package launcher

import (
	"context"
	"net"
	"strconv"
	"strings"
)

// The rendezvous endpoint of an SSH launch.
//
// The first host's agent hosts the job's store, and every agent must be
// told an address of that host which it can reach. The host string the
// head was given is no such thing: it is often an ssh_config alias (Host
// node1, HostName 10.0.0.1) that only the head's ssh_config knows. Even the
// HostName it resolves to is the head's view: a name only the head's
// resolver knows, a public address NATed to the host, or, behind
// ProxyJump, a name or address that only the jump host resolves or routes.
//
// So the head asks the first host. sshd sets SSH_CONNECTION ("client_ip
// client_port server_ip server_port") in every session, and server_ip is
// the address on which that host's sshd took the connection, from the head
// or from the last jump host: an address of that very machine (so its own
// agent knows it as local and hosts the store) on a network that reaches
// it, the one a bastion inside the cluster reaches it on. The other hosts
// are then told that address.
//
// The HostName, as the last hop dialed it, is used instead when sshd sets
// no usable SSH_CONNECTION, and when it names a loopback address: that
// says only that the head runs on the first host's machine (gorun started
// on node1 with --hosts node1,node2, where /etc/hosts maps node1 to
// 127.0.1.1), not how the others reach it; a name such as node1 is theirs
// to resolve. An endpoint given explicitly (--rdzv-endpoint) is passed on
// as it is.

// defaultEndpointPort is the rendezvous port when none is given: torchrun's.
const defaultEndpointPort = 29400

// rendezvousEndpoint decides the agents' rendezvous endpoint: explicit when
// given; otherwise the first host's address at port, taken from
// sshConnection (its SSH_CONNECTION, on the last line of what the session
// printed) when that carries a server address that other hosts can use,
// else hostname (its HostName as dialed).
func rendezvousEndpoint(explicit string, port int, sshConnection, hostname string) string {
	if explicit != "" {
		return explicit
	}
	host := hostname
	// A login script may have printed lines before it.
	last := strings.TrimSpace(sshConnection)
	last = last[strings.LastIndexByte(last, '\n')+1:]
	if f := strings.Fields(last); len(f) == 4 {
		// A link-local address arrives with its zone ("fe80::1%eth0"), which
		// ParseIP refuses: the zone names an interface of the first host,
		// meaningless on the others. sshd writes "UNKNOWN" for a connection
		// that is not a socket.
		ip := net.ParseIP(f[2])
		if ip != nil && !ip.IsUnspecified() && !ip.IsLinkLocalUnicast() && !ip.IsMulticast() && !ip.IsLoopback() {
			host = ip.String() // an IPv4-mapped address as plain IPv4
		}
	}
	if port == 0 {
		port = defaultEndpointPort
	}
	return net.JoinHostPort(host, strconv.Itoa(port))
}

// sshConnection returns what a session on c's host prints: the
// SSH_CONNECTION that sshd sets ("" when it sets none), after whatever the
// login scripts print.
func sshConnection(ctx context.Context, c Conn) (string, error) {
	out, err := c.Output(ctx, nil, `printf '%s\n' "$SSH_CONNECTION"`, nil)
	return string(out), err
}
