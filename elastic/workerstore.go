package elastic

import (
	"context"
	"fmt"
	"net"

	"github.com/rs/zerolog"

	"github.com/gorun/gorun/rendezvous"
)

// workersListener restricts l, the listener of a workers' store, to the
// round's nodes and this machine: torch's workers cannot authenticate,
// but only theirs may connect. A round that names no nodes (one node)
// leaves this machine alone. It closes l on error.
func (a *Agent) workersListener(ctx context.Context, l net.Listener, r *round) (net.Listener, error) {
	var nodes []rendezvous.NodeInfo
	if r.members != nil {
		err := a.during(ctx, func(ctx context.Context) (err error) {
			nodes, err = r.members(ctx)
			return err
		})
		if err != nil {
			l.Close()
			return nil, fmt.Errorf("elastic: read the round's nodes for the workers' store: %w", err)
		}
	}
	allowed := memberIPs(ctx, nodes, net.DefaultResolver.LookupIPAddr, a.log)
	return rendezvous.PeerListener(l, rendezvous.PeerListenerOptions{Allowed: allowed, Logger: a.log}), nil
}

// memberIPs are the addresses of nodes: each node's advertised address,
// or what its name resolves to. A name that does not resolve is left out,
// with a warning: that node's workers will be refused.
func memberIPs(ctx context.Context, nodes []rendezvous.NodeInfo, lookup func(context.Context, string) ([]net.IPAddr, error), log zerolog.Logger) []net.IP {
	var ips []net.IP
	for _, n := range nodes {
		if n.Addr == "" {
			continue
		}
		if ip := net.ParseIP(n.Addr); ip != nil {
			ips = append(ips, ip)
			continue
		}
		addrs, err := lookup(ctx, n.Addr)
		if err != nil {
			log.Warn().Err(err).Str("node", n.ID).Str("addr", n.Addr).Msg("cannot resolve a node's address: its workers cannot reach the workers' store")
			continue
		}
		for _, ad := range addrs {
			ips = append(ips, ad.IP)
		}
	}
	return ips
}
