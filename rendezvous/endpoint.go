package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/rs/zerolog"
)

// DefaultEndpointPort is the c10d rendezvous port when the endpoint names
// none, as torchrun's.
const DefaultEndpointPort = 29400

// EndpointOptions say where a job's rendezvous store is and who hosts it.
type EndpointOptions struct {
	Host string
	Port int
	// IsHost forces this agent to host the store (true) or to connect to
	// it (false); nil infers it: an agent hosts when Host is one of this
	// machine's addresses or names, and connects when another agent on the
	// same machine got the port first.
	IsHost *bool
	// Timeout bounds connecting, retries included.
	Timeout time.Duration
	// Auth, when set, is the job's secret: a store this agent hosts
	// serves only clients that prove they know it, and a store it joins
	// must prove it knows it before the agent sends it anything. Without
	// it, as torch's, anyone who reaches the port may use the store.
	Auth   *Auth
	Logger zerolog.Logger
}

// Endpoint is a job's rendezvous store as one agent sees it: served by
// this process, or reached over TCP.
type Endpoint struct {
	// Store carries the rendezvous; Heartbeats is a second view for the
	// heartbeats, so that long waits on Store never delay them.
	Store, Heartbeats Store
	// Hosting reports whether this process serves the store.
	Hosting bool
	server  *Server
}

// Server returns the store's server when this process hosts it, else
// nil: for its figures (Server.Stats).
func (e *Endpoint) Server() *Server { return e.server }

// OpenEndpoint hosts or joins the store at opts.Host:opts.Port.
func OpenEndpoint(ctx context.Context, opts EndpointOptions) (*Endpoint, error) {
	addr := net.JoinHostPort(opts.Host, strconv.Itoa(opts.Port))
	host := opts.IsHost == nil && isLocalHost(opts.Host) || opts.IsHost != nil && *opts.IsHost
	if host {
		e, err := hostEndpoint(opts)
		switch {
		case err == nil:
			opts.Logger.Info().Str("endpoint", addr).Bool("secret", opts.Auth != nil).Msg("hosting the rendezvous store")
			return e, nil
		case opts.IsHost != nil || !errors.Is(err, syscall.EADDRINUSE):
			return nil, err
		}
		opts.Logger.Info().Str("endpoint", addr).Msg("another agent on this machine hosts the rendezvous store; joining it")
	}
	copts := ClientOptions{Timeout: opts.Timeout, Auth: opts.Auth}
	dial := func(c *Client, err error) (*Client, error) {
		if err != nil {
			return nil, fmt.Errorf("rendezvous: join the store at %s (missing: its host): %w", addr, err)
		}
		return c, nil
	}
	// The first dial waits for the host, saying so; the second finds it.
	store, err := dial(dialWaiting(ctx, addr, copts, opts.Logger, "the store's host "+opts.Host, "waiting for the rendezvous store"))
	if err != nil {
		return nil, err
	}
	heartbeats, err := dial(Dial(ctx, addr, copts))
	if err != nil {
		store.Close()
		return nil, err
	}
	return &Endpoint{Store: store, Heartbeats: heartbeats}, nil
}

func hostEndpoint(opts EndpointOptions) (*Endpoint, error) {
	bind := net.JoinHostPort(opts.Host, strconv.Itoa(opts.Port))
	if ip := net.ParseIP(opts.Host); ip == nil || !ip.IsLoopback() {
		// Peers reach a host by an outside name: listen everywhere.
		bind = ":" + strconv.Itoa(opts.Port)
	}
	l, err := net.Listen("tcp", bind)
	if err != nil {
		return nil, fmt.Errorf("rendezvous: host the store on %s: %w", bind, err)
	}
	if opts.Auth != nil {
		l = opts.Auth.Listener(l, AuthListenerOptions{Logger: opts.Logger})
	} else {
		warnOpenStore(opts.Logger, l.Addr())
	}
	srv := NewServer(ServerOptions{Logger: opts.Logger})
	go srv.Serve(l)
	// In process the agent must see keys as remote clients do: with "/"
	// in front of each.
	view := func() Store { return NewPrefixStore("", srv.Store()) }
	return &Endpoint{Store: view(), Heartbeats: view(), Hosting: true, server: srv}, nil
}

// Close stops serving the store, when this process hosts it, once every
// other agent has disconnected or linger has passed: the agents that are
// still reading the job's outcome (its failures, its exit barrier) must
// not lose the store under them. The views belong to whoever uses them
// (the Dynamic handler closes them).
func (e *Endpoint) Close(linger time.Duration) error {
	if e.server == nil {
		return nil
	}
	deadline := time.Now().Add(linger)
	for e.server.Clients() > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	return e.server.Close()
}

// isLocalHost reports whether host names this machine: localhost, a
// loopback address, one of its interfaces' addresses, or its host name.
func isLocalHost(host string) bool {
	if host == "localhost" {
		return true
	}
	if name, err := os.Hostname(); err == nil && host == name {
		return true
	}
	ips := []net.IP{net.ParseIP(host)}
	if ips[0] == nil {
		addrs, err := net.LookupIP(host)
		if err != nil {
			return false
		}
		ips = addrs
	}
	local, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	for _, ip := range ips {
		if ip.IsLoopback() {
			return true
		}
		for _, a := range local {
			if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
				return true
			}
		}
	}
	return false
}
