package etcd

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// firstAttempt is how long the first attempt of a request runs before the
// cluster is asked whether it may have lost it; each retry doubles it. A
// request that a member took as its leader died waits for the member's own
// request timeout, 7 s with etcd's defaults, while the same request made
// again, once the others have elected a leader (a second or two), is
// answered at once.
const firstAttempt = 2 * time.Second

// Pauses between attempts: from firstPause, doubling up to maxPause, each
// drawn at random from its upper half, so that the thousands of nodes
// whose requests a busy cluster failed together do not all ask again
// together, and again.
const (
	firstPause = 50 * time.Millisecond
	maxPause   = 2 * time.Second
)

// retrier makes a client's requests, again while they fail. An attempt
// that outlasts its bound is given up only when the cluster may have lost
// it: a member does not answer, has no leader, or is in a later raft term
// than the attempt began in. A cluster that answers with the same leader
// is busy, not broken, and the attempt goes on: giving up a request that
// a busy cluster still applies (a lease grant, a join) only queues another
// behind it, and with thousands of nodes joining at once that was 40% more
// requests, each late for the same reason.
type retrier struct {
	// probe asks the cluster how it is (statusOf).
	probe func(context.Context) health
	// term is the latest raft term a response showed; 0 before the first.
	term atomic.Uint64
}

func newRetrier(cli *clientv3.Client) *retrier { return &retrier{probe: statusOf(cli)} }

// saw notes the raft term of a response.
func (r *retrier) saw(h *pb.ResponseHeader) {
	if h == nil {
		return
	}
	for {
		t := r.term.Load()
		if h.RaftTerm <= t || r.term.CompareAndSwap(t, h.RaftTerm) {
			return
		}
	}
}

// do runs fn until it succeeds, fails for good, or ctx ends; it returns
// fn's last error.
func (r *retrier) do(ctx context.Context, fn func(ctx context.Context) error) error {
	bound, pause := firstAttempt, firstPause
	for {
		actx, cancel := context.WithCancel(ctx)
		stop := r.oversee(actx, cancel, bound)
		err := fn(actx)
		stop()
		cancel()
		if err == nil || ctx.Err() != nil || errors.Is(err, rpctypes.ErrLeaseNotFound) {
			// A lease that lapsed stays lapsed: asking again with it,
			// until the request's bound, held a join that an
			// overloaded cluster answered late.
			return err
		}
		bound *= 2
		t := time.NewTimer(jitter(pause))
		pause = min(2*pause, maxPause)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

// oversee asks the cluster, each time an attempt outlasts bound (doubling
// after each ask), whether it may have lost the attempt, and if so gives
// it up (cancel), until stop. No goroutine runs before the first bound.
func (r *retrier) oversee(ctx context.Context, cancel context.CancelFunc, bound time.Duration) (stop func()) {
	began := r.term.Load()
	var mu sync.Mutex
	stopped := false
	var t *time.Timer
	mu.Lock()
	defer mu.Unlock()
	t = time.AfterFunc(bound, func() {
		// The probe gets as long as the attempt had: a cluster too busy
		// to say how it is within that is as good as lost.
		pctx, pcancel := context.WithTimeout(ctx, bound)
		found := r.probe(pctx)
		pcancel()
		if began == 0 {
			// The first request: the term the probe found is the one
			// it began in, as far as can be told.
			began = found.term
		}
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		if !keepWaiting(began, found) {
			cancel()
			return
		}
		bound *= 2
		t.Reset(bound)
	})
	return func() {
		mu.Lock()
		stopped = true
		t.Stop()
		mu.Unlock()
	}
}

// health is what asking each endpoint of a client for its status found.
type health struct {
	answered   int    // members that answered
	leaderless bool   // one of them has no leader
	term       uint64 // the latest raft term among them
}

// keepWaiting decides whether an attempt that began in raft term began
// may go on: every member asked answered, each with a leader, and none in
// a later term (a new leader may have dropped the attempt's proposal).
func keepWaiting(began uint64, h health) bool {
	return h.answered > 0 && !h.leaderless && h.term <= began
}

// statusOf asks every endpoint of cli for its status, at once.
func statusOf(cli *clientv3.Client) func(context.Context) health {
	return func(ctx context.Context) health {
		eps := cli.Endpoints()
		found := make(chan *clientv3.StatusResponse, len(eps))
		for _, ep := range eps {
			go func() {
				s, err := cli.Status(ctx, ep)
				if err != nil {
					s = nil
				}
				found <- s
			}()
		}
		var h health
		for range eps {
			s := <-found
			if s == nil {
				// An endpoint that does not answer counts as a member
				// that may have lost the attempt.
				h.leaderless = true
				continue
			}
			h.answered++
			h.leaderless = h.leaderless || s.Leader == 0
			h.term = max(h.term, s.RaftTerm)
		}
		return h
	}
}

// jitter draws a pause from the upper half of d.
func jitter(d time.Duration) time.Duration {
	return d/2 + rand.N(d/2+1)
}

// retryKV is etcd's KV with every request made again while it fails
// (retrier). Every request this package makes may be repeated: puts of
// the same value, deletes, reads, and transactions whose comparison fails
// once they have been applied.
type retryKV struct {
	kv clientv3.KV
	r  *retrier
}

var _ clientv3.KV = retryKV{}

func newRetryKV(cli *clientv3.Client, r *retrier) retryKV { return retryKV{kv: cli, r: r} }

func (r retryKV) Do(ctx context.Context, op clientv3.Op) (clientv3.OpResponse, error) {
	var resp clientv3.OpResponse
	err := r.r.do(ctx, func(ctx context.Context) (err error) {
		resp, err = r.kv.Do(ctx, op)
		return err
	})
	if err == nil {
		r.r.saw(header(resp))
	}
	return resp, err
}

// header is the response header of whichever request resp answers.
func header(resp clientv3.OpResponse) *pb.ResponseHeader {
	switch {
	case resp.Get() != nil:
		return resp.Get().Header
	case resp.Put() != nil:
		return resp.Put().Header
	case resp.Del() != nil:
		return resp.Del().Header
	case resp.Txn() != nil:
		return resp.Txn().Header
	}
	return nil
}

func (r retryKV) Put(ctx context.Context, key, val string, opts ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	resp, err := r.Do(ctx, clientv3.OpPut(key, val, opts...))
	return resp.Put(), err
}

func (r retryKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	resp, err := r.Do(ctx, clientv3.OpGet(key, opts...))
	return resp.Get(), err
}

func (r retryKV) Delete(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.DeleteResponse, error) {
	resp, err := r.Do(ctx, clientv3.OpDelete(key, opts...))
	return resp.Del(), err
}

func (r retryKV) Compact(ctx context.Context, rev int64, opts ...clientv3.CompactOption) (*clientv3.CompactResponse, error) {
	return r.kv.Compact(ctx, rev, opts...)
}

func (r retryKV) Txn(ctx context.Context) clientv3.Txn { return &retryTxn{kv: r, ctx: ctx} }

// retryTxn gathers a transaction and commits it through retryKV.
type retryTxn struct {
	kv              retryKV
	ctx             context.Context
	cmps            []clientv3.Cmp
	thenOps, elseOs []clientv3.Op
}

func (t *retryTxn) If(cs ...clientv3.Cmp) clientv3.Txn {
	t.cmps = append(t.cmps, cs...)
	return t
}

func (t *retryTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.thenOps = append(t.thenOps, ops...)
	return t
}

func (t *retryTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.elseOs = append(t.elseOs, ops...)
	return t
}

func (t *retryTxn) Commit() (*clientv3.TxnResponse, error) {
	resp, err := t.kv.Do(t.ctx, clientv3.OpTxn(t.cmps, t.thenOps, t.elseOs))
	return resp.Txn(), err
}
