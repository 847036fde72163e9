package collective

import (
	"context"
	"fmt"
	"net"
	"os"

	"github.com/gorun/gorun/internal/route"
)

// listenHost picks the address a rank listens on and advertises, the
// first that applies of:
//
//  1. opts.Host;
//  2. the first IPv4 address (else IPv6) of the network interface named by
//     opts.Ifname; naming an interface that has no address is an error;
//  3. the local address that routes to opts.StoreAddr, the store's
//     (127.0.0.1 when the store is on this host);
//  4. a non-loopback address the host name resolves to;
//  5. 127.0.0.1.
func listenHost(ctx context.Context, opts TCPOptions) (string, error) {
	if opts.Host != "" {
		return opts.Host, nil
	}
	if opts.Ifname != "" {
		return interfaceAddr(opts.Ifname)
	}
	if opts.StoreAddr != "" {
		if ip, err := route.SourceAddr(ctx, opts.StoreAddr); err == nil {
			return ip, nil
		}
	}
	if name, err := os.Hostname(); err == nil {
		if ips, err := net.DefaultResolver.LookupIP(ctx, "ip", name); err == nil {
			for _, ip := range ips {
				if !ip.IsLoopback() {
					return ip.String(), nil
				}
			}
		}
	}
	return "127.0.0.1", nil
}

// interfaceAddr is the first IPv4 address of the interface, else its
// first IPv6 one.
func interfaceAddr(name string) (string, error) {
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		return "", fmt.Errorf("collective: network interface %q: %w", name, err)
	}
	addrs, err := ifi.Addrs()
	if err != nil {
		return "", fmt.Errorf("collective: addresses of %q: %w", name, err)
	}
	var v6 string
	for _, a := range addrs {
		ipnet, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		if ipnet.IP.To4() != nil {
			return ipnet.IP.String(), nil
		}
		if v6 == "" && !ipnet.IP.IsLinkLocalUnicast() {
			v6 = ipnet.IP.String()
		}
	}
	if v6 == "" {
		return "", fmt.Errorf("collective: network interface %q has no usable address", name)
	}
	return v6, nil
}
