// Package etcd is the elastic rendezvous on an etcd cluster (torch's
// --rdzv-backend etcd): the rounds, restart budget, failure reports and
// exit barrier of the c10d rendezvous (rendezvous.Dynamic), kept in etcd
// rather than in a store that one agent hosts.
//
// What it guarantees: no node is special. Any node may die, the one that
// hosted the last round's workers' store included, and the others form a
// new round, as long as the etcd cluster keeps a quorum; losing the etcd
// leader or a minority of members changes nothing the workers see. A node
// is alive while its lease is (Options.LeaseTTL): its keys go with it, so
// the others learn of a dead node, or of one cut off from etcd, one lease
// TTL after it stopped, whoever they are. Losing the quorum ends every
// node's round within a lease TTL (the lease cannot be renewed) and its
// next join within RequestTimeout, with an error that says so.
//
// What it costs: an etcd cluster to run (three or five members), a lease
// keep-alive per node every third of the TTL, and a few transactions and
// watch events per node per round: O(1) for each node, whatever the number
// of nodes (the node that decides a round reads every member once, and
// writes each member's seat, which that member alone reads).
// A lost node is noticed one TTL late, where c10d's heartbeats take their
// misses times their interval; and a worker failure with no node lost
// waits up to the failure grace before it spends a restart, as with c10d.
package etcd

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gorun/gorun/rendezvous"
	"github.com/gorun/gorun/rendezvous/internal/jobstate"
)

// Defaults of Options.
const (
	DefaultPrefix         = "/gorun/rdzv"
	DefaultLeaseTTL       = 10 * time.Second
	DefaultRequestTimeout = 60 * time.Second
)

// Options configure the rendezvous of MinNodes to MaxNodes nodes. Zero
// durations take the defaults above.
type Options struct {
	rendezvous.ElasticOptions
	// Prefix is where the handler's jobs live in etcd; a job's keys are
	// under "<Prefix>/<RunID>/".
	Prefix string
	// LeaseTTL is how long this node's keys outlive it: the time the
	// others take to learn that it died or was cut off from etcd. etcd
	// counts it in whole seconds, and the shortest it grants is about
	// 1.5 election timeouts (2 s with etcd's defaults).
	LeaseTTL time.Duration
	// RequestTimeout bounds each request to etcd: how long a node waits
	// for a cluster that has lost its quorum before it says so.
	RequestTimeout time.Duration
}

func (o Options) withDefaults() Options {
	o.ElasticOptions = o.ElasticOptions.WithDefaults()
	if o.LeaseTTL <= 0 {
		o.LeaseTTL = DefaultLeaseTTL
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = DefaultRequestTimeout
	}
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	return o
}

// TLSConfig reads torch's cacert, cert and key files (each may be empty):
// the CA that signed the etcd members' certificates, and this client's
// certificate and key when the members ask for one.
func TLSConfig(caFile, certFile, keyFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("rendezvous/etcd: CA certificate: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("rendezvous/etcd: CA certificate %s: no PEM certificate in it", caFile)
		}
	}
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("rendezvous/etcd: a client certificate needs its key, and a key its certificate")
	}
	if certFile != "" {
		c, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("rendezvous/etcd: client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{c}
	}
	return cfg, nil
}

// Dial returns a client of the etcd members at endpoints (host:port, or
// URLs); tlsConfig nil speaks plain HTTP. Dialing does not wait for a
// member: the first request does, within its own bound.
func Dial(endpoints []string, tlsConfig *tls.Config) (*clientv3.Client, error) {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		TLS:         tlsConfig,
		DialTimeout: 5 * time.Second,
		// Keep-alives notice a member gone silent (kill -9, a cut
		// cable) and move to another. etcd takes pings more often than
		// its --grpc-keepalive-min-time (5 s by default) for abuse and
		// drops the connection (GOAWAY too_many_pings) after a few,
		// failing every request and watch on it: a round that took
		// longer than a few pings broke its nodes' connections.
		DialKeepAliveTime:    6 * time.Second,
		DialKeepAliveTimeout: 2 * time.Second,
		Logger:               nopLogger(),
	})
	if err != nil {
		return nil, fmt.Errorf("rendezvous/etcd: client of %s: %w", strings.Join(endpoints, ","), err)
	}
	return cli, nil
}

// Handler is the elastic rendezvous on etcd (see the package doc).
type Handler struct {
	opts  Options
	log   zerolog.Logger
	cli   *clientv3.Client
	kv    retryKV // cli's, with requests made again while they fail
	retry *retrier
	pfx   string // "<prefix>/<run id>/"
	self  member

	life context.Context // done once Close begins
	quit context.CancelFunc
	ops  sync.WaitGroup

	mu     sync.Mutex
	closed bool
	left   bool
	lease  clientv3.LeaseID // 0 until granted, and once lost
	round  *rendezvous.RoundInfo
	state  jobstate.State // the state that opened round
	// decision is how round was decided.
	decision decision
	myKey    string // this node's key in the round it last joined
	// stopWatch stops watching round; nil once stopped.
	stopWatch func()
	// abandoned is the key of a join that its caller gave up (Next's ctx
	// ended): the next Next, Leave or Close withdraws it.
	abandoned string
}

var _ rendezvous.Elastic = (*Handler)(nil)

// New returns the rendezvous handler on cli, which it owns from then on
// (Close closes it). Nothing is sent before Next.
func New(cli *clientv3.Client, opts Options) *Handler {
	opts = opts.withDefaults()
	retry := newRetrier(cli)
	h := &Handler{
		opts:  opts,
		log:   opts.Logger.With().Str("run", opts.RunID).Str("node", opts.NodeID).Logger(),
		cli:   cli,
		kv:    newRetryKV(cli, retry),
		retry: retry,
		pfx:   strings.TrimSuffix(opts.Prefix, "/") + "/" + opts.RunID + "/",
		self:  member{ID: opts.NodeID, Host: opts.Host, Addr: opts.Addr, NProc: opts.NProc, Rank: opts.NodeRank},
	}
	h.life, h.quit = context.WithCancel(context.Background())
	return h
}

func (h *Handler) k(key string) string { return h.pfx + key }

// begin admits a call unless the handler is closed, and returns its
// context, which Close also ends, and what to call when it returns.
func (h *Handler) begin(ctx context.Context) (context.Context, func(), error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, nil, rendezvous.ErrHandlerClosed
	}
	h.ops.Add(1)
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(h.life, func() { cancel(rendezvous.ErrHandlerClosed) })
	return ctx, func() {
		stop()
		cancel(nil)
		h.ops.Done()
	}, nil
}

// request bounds one request to etcd: a cluster without a quorum holds it
// until then.
func (h *Handler) request(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, h.opts.RequestTimeout)
}

// unreachable wraps the error of a request that etcd did not answer.
func (h *Handler) unreachable(ctx context.Context, op string, err error) error {
	if ctx.Err() == nil {
		return fmt.Errorf("rendezvous/etcd: %s: no answer from a quorum of etcd members %s within %v: %w",
			op, strings.Join(h.cli.Endpoints(), ","), h.opts.RequestTimeout, err)
	}
	return fmt.Errorf("rendezvous/etcd: %s: %w", op, err)
}

// Current returns the latest round this node took part in, or nil.
func (h *Handler) Current() *rendezvous.RoundInfo {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.round
}

// Nodes reads the participants of this node's round, in group-rank
// order: O(n) bytes, for reports, where a round costs each node O(1).
func (h *Handler) Nodes(ctx context.Context) ([]rendezvous.NodeInfo, error) {
	ctx, done, err := h.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	_, st, d, _, err := h.current()
	if err != nil {
		return nil, err
	}
	seats, err := h.seats(ctx, st.Round, d)
	if err != nil {
		return nil, err
	}
	nodes := make([]rendezvous.NodeInfo, len(seats))
	for i, s := range seats {
		nodes[i] = rendezvous.NodeInfo{ID: s.ID, Host: s.Host, Addr: s.Addr, NProc: s.NProc, GroupRank: s.GroupRank, FirstRank: s.FirstRank}
	}
	return nodes, nil
}

// ensureLease grants this node's lease unless it holds one, and keeps it
// alive with etcd's keep-alives until Close; when they stop (the lease
// lapsed: etcd was out of reach for a TTL), the node's round ends, and the
// next Next grants a new lease.
func (h *Handler) ensureLease(ctx context.Context) (clientv3.LeaseID, error) {
	h.mu.Lock()
	id := h.lease
	h.mu.Unlock()
	if id != 0 {
		return id, nil
	}
	rctx, cancel := h.request(ctx)
	defer cancel()
	var g *clientv3.LeaseGrantResponse
	err := h.retry.do(rctx, func(ctx context.Context) (err error) {
		g, err = h.cli.Grant(ctx, int64((h.opts.LeaseTTL+time.Second-1)/time.Second))
		return err
	})
	if err != nil {
		return 0, h.unreachable(ctx, "grant a lease", err)
	}
	h.retry.saw(g.ResponseHeader)
	h.mu.Lock()
	h.lease = g.ID
	h.mu.Unlock()
	go h.keepLease(g.ID, time.Duration(g.TTL)*time.Second/3)
	return g.ID, nil
}

// keepLease follows the keep-alives of lease id until Close. When they
// stop, etcd answered none for a TTL: the leader may have died, and the
// client lost its stream while the others elected a new one (which
// renews every lease), or the cluster lost its quorum, or this node was
// cut off. It asks etcd, for one TTL more, whether the lease lives: if so
// it keeps it alive again, and the round goes on; if not, or if no quorum
// answers, this node is out of its round (the others learn it from its
// keys, which lapse with the lease), and the next Next grants a new lease.
//
// A lease just granted lives a whole TTL: the first keep-alive goes a
// third of it later (first), as etcd's client spaces the others, not at
// once, which cost a busy cluster one request more per node while the
// nodes of a round all join.
func (h *Handler) keepLease(id clientv3.LeaseID, first time.Duration) {
	select {
	case <-h.life.Done():
		return
	case <-time.After(first):
	}
	ka, kerr := h.cli.KeepAlive(h.life, id)
	for {
		if kerr == nil {
			for range ka {
			}
		}
		if h.life.Err() != nil {
			return
		}
		ctx, cancel := context.WithTimeout(h.life, h.opts.LeaseTTL)
		var ttl *clientv3.LeaseTimeToLiveResponse
		err := h.retry.do(ctx, func(ctx context.Context) (err error) {
			ttl, err = h.cli.TimeToLive(ctx, id)
			return err
		})
		cancel()
		if err == nil && ttl.TTL > 0 {
			if ka, kerr = h.cli.KeepAlive(h.life, id); kerr == nil {
				h.log.Info().Msg("etcd answers again: this node's lease lives on")
				continue
			}
		}
		reason := fmt.Sprintf("node %s on %s lost its etcd lease: no etcd quorum answered for %v",
			h.opts.NodeID, h.opts.Host, h.opts.LeaseTTL)
		if err == nil {
			reason = fmt.Sprintf("node %s on %s lost its etcd lease: it expired", h.opts.NodeID, h.opts.Host)
		}
		h.mu.Lock()
		if h.life.Err() != nil {
			h.mu.Unlock()
			return
		}
		if h.lease == id {
			h.lease = 0
		}
		ri := h.round
		h.mu.Unlock()
		h.log.Warn().Msg(reason)
		if ri != nil {
			ri.End(reason)
		}
		return
	}
}

// readState reads the job's state, opening round 0 if the job is new.
func (h *Handler) readState(ctx context.Context) (jobstate.State, int64, error) {
	rctx, cancel := h.request(ctx)
	defer cancel()
	k := h.k(keyState)
	// A read, which raft need not carry, unless the job is new.
	if g, err := h.kv.Get(rctx, k); err == nil && len(g.Kvs) > 0 {
		st, err := jobstate.Parse(g.Kvs[0].Value)
		return st, g.Header.Revision, err
	}
	t, err := h.kv.Txn(rctx).If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, jobstate.State{}.String())).Else(clientv3.OpGet(k)).Commit()
	if err != nil {
		return jobstate.State{}, 0, h.unreachable(ctx, "read the job's state", err)
	}
	if t.Succeeded {
		return jobstate.State{}, t.Header.Revision, nil
	}
	st, err := jobstate.Parse(t.Responses[0].GetResponseRange().Kvs[0].Value)
	return st, t.Header.Revision, err
}

// advance moves the job from state from to state to, with why round
// from.Round ended, in one transaction, unless it has moved already. It
// returns the state now current.
func (h *Handler) advance(ctx context.Context, from, to jobstate.State, reason string) (jobstate.State, error) {
	rctx, cancel := h.request(ctx)
	defer cancel()
	k := h.k(keyState)
	t, err := h.kv.Txn(rctx).If(clientv3.Compare(clientv3.Value(k), "=", from.String())).
		Then(clientv3.OpPut(k, to.String()), clientv3.OpPut(h.k(supersededKey(from.Round)), reason)).
		Else(clientv3.OpGet(k)).Commit()
	if err != nil {
		return jobstate.State{}, h.unreachable(ctx, fmt.Sprintf("end round %d", from.Round), err)
	}
	if t.Succeeded {
		h.log.Info().Int("round", from.Round).Msg(reason)
		return to, nil
	}
	return jobstate.Parse(t.Responses[0].GetResponseRange().Kvs[0].Value)
}

// reason returns why round r ended.
func (h *Handler) reason(ctx context.Context, r int) string {
	rctx, cancel := context.WithTimeout(ctx, h.opts.CloseTimeout)
	defer cancel()
	if resp, err := h.kv.Get(rctx, h.k(supersededKey(r))); err == nil && len(resp.Kvs) > 0 {
		return string(resp.Kvs[0].Value)
	}
	return fmt.Sprintf("round %d was superseded", r)
}

// overError describes a job that is over.
func (h *Handler) overError(ctx context.Context, st jobstate.State) error {
	if st.End == jobstate.Failed {
		return fmt.Errorf("rendezvous/etcd: job %s has failed after %d restarts: %w", h.opts.RunID, st.Restarts, rendezvous.ErrJobFailed)
	}
	return fmt.Errorf("rendezvous/etcd: job %s has ended (%s): %w", h.opts.RunID, h.reason(ctx, st.Round-1), rendezvous.ErrJobEnded)
}
