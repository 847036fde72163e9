// Package route finds the address this machine sends from towards a
// host: the address peers on that host's network reach it by. The
// agents advertise it to the rendezvous, and ranks listen on it.
package route

import (
	"context"
	"fmt"
	"net"
)

// SourceAddr returns the local IP address that packets to addr
// ("host:port") leave from. It connects a UDP socket, which sends
// nothing: the kernel only picks the route, and with it the address.
// A host name is resolved first, within ctx.
func SourceAddr(ctx context.Context, addr string) (string, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "udp", addr)
	if err != nil {
		return "", fmt.Errorf("route: the local address towards %s: %w", addr, err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).IP.String(), nil
}
