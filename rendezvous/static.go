package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
)

// StaticOptions configure a fixed-size rendezvous: every node knows its rank
// and the store's address up front, and node 0 hosts the store.
type StaticOptions struct {
	RunID            string
	NodeRank, NNodes int
	// Host and Port locate the store. Port 0 is allowed on a single node
	// only: the store then takes an ephemeral port on Host.
	Host string
	Port int
	// Timeout bounds waits on the store, connecting included.
	Timeout time.Duration
	Logger  zerolog.Logger
}

// Static is torchrun's static rendezvous: no elasticity, one round.
//
// What it guarantees: the fixed --nnodes, each at the rank it was given,
// and a restart budget of each node's own; it is a plain Handler, not an
// Elastic one. What it costs: nothing but node 0's store, which every
// node needs: lose node 0, or any node, and the job is over.
type Static struct {
	opts   StaticOptions
	server *Server
	served atomic.Pointer[Server] // server, for Server's callers on other goroutines
	store  Store
	port   int
}

// Server returns the store's server when this node hosts it (node 0,
// once Next has started it), else nil: for its figures (Server.Stats).
func (s *Static) Server() *Server { return s.served.Load() }

var _ Handler = (*Static)(nil)

// NewStatic returns a static rendezvous handler; nothing is started before
// Next.
func NewStatic(opts StaticOptions) *Static {
	return &Static{opts: opts}
}

// Next hosts the store (node 0) or connects to it (other nodes) and returns
// the round, scoped to the run id as torch's static rendezvous does.
func (s *Static) Next(ctx context.Context) (*Round, error) {
	if s.store == nil {
		if err := s.connect(ctx); err != nil {
			return nil, err
		}
	}
	return &Round{
		Store:          NewPrefixStore(s.opts.RunID, s.store),
		GroupRank:      s.opts.NodeRank,
		GroupWorldSize: s.opts.NNodes,
		StoreHost:      s.opts.Host,
		StorePort:      s.port,
	}, nil
}

func (s *Static) connect(ctx context.Context) error {
	o := s.opts
	if o.NodeRank != 0 {
		addr := net.JoinHostPort(o.Host, strconv.Itoa(o.Port))
		o.Logger.Info().Str("endpoint", addr).Msg("joining the store of node 0")
		c, err := dialWaiting(ctx, addr, ClientOptions{Timeout: o.Timeout}, o.Logger,
			"node rank 0", "waiting for the store of node 0")
		if err != nil {
			return fmt.Errorf("rendezvous: node %d joins the store of node 0 (missing: node rank 0): %w", o.NodeRank, err)
		}
		s.store, s.port = c, o.Port
		return nil
	}
	// A single node binds where its workers connect; node 0 of several
	// listens on every interface, since peers reach it by an outside name.
	bind := net.JoinHostPort(o.Host, strconv.Itoa(o.Port))
	if o.NNodes > 1 {
		bind = ":" + strconv.Itoa(o.Port)
	}
	l, err := net.Listen("tcp", bind)
	if err != nil {
		return fmt.Errorf("rendezvous: host the store on %s: %w", bind, err)
	}
	warnOpenStore(o.Logger, l.Addr())
	s.server = NewServer(ServerOptions{Logger: o.Logger})
	s.served.Store(s.server)
	go func() {
		if err := s.server.Serve(l); err != nil && !errors.Is(err, ErrServerClosed) {
			o.Logger.Error().Err(err).Msg("store server stopped")
		}
	}()
	s.port = l.Addr().(*net.TCPAddr).Port
	// In process, the agent must see the keys exactly as remote clients
	// do, and they put "/" in front of every key.
	s.store = NewPrefixStore("", s.server.Store())
	o.Logger.Info().Str("endpoint", net.JoinHostPort(o.Host, strconv.Itoa(s.port))).Msg("store listening")
	return nil
}

// Leave lets the other nodes read what this one last wrote to the store
// (the agent marks there that it left) before the store goes with it: a
// node that hosts the store waits, within ctx, until no other node is
// connected to it. A static rendezvous has no rounds to leave.
func (s *Static) Leave(ctx context.Context) error {
	if s.server == nil {
		return nil
	}
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for s.server.Clients() > 0 {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
	return nil
}

// Close stops the hosted store or disconnects from it.
func (s *Static) Close() error {
	var err error
	if s.store != nil {
		err = s.store.Close()
	}
	if s.server != nil {
		err = errors.Join(err, s.server.Close())
	}
	return err
}
