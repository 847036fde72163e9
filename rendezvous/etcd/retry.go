package etcd

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// firstAttempt bounds the first attempt of a request; each retry doubles
// it. A request that a member took while the cluster had no leader (its
// leader just died) waits for the member's own request timeout, 7 s with
// etcd's defaults, while the same request made again, once the others
// have elected a leader (a second or two), is answered at once. Doubling
// keeps a cluster that is merely slow from being asked again and again.
const firstAttempt = 2 * time.Second

// Pauses between attempts: from firstPause, doubling up to maxPause, each
// drawn at random from its upper half, so that the thousands of nodes
// whose requests a busy cluster failed together do not all ask again
// together, and again.
const (
	firstPause = 50 * time.Millisecond
	maxPause   = 2 * time.Second
)

// retry runs fn until it succeeds, fails for good, or ctx ends, each
// attempt bounded as firstAttempt says; it returns fn's last error.
func retry(ctx context.Context, fn func(ctx context.Context) error) error {
	attempt, pause := firstAttempt, firstPause
	for {
		actx, cancel := context.WithTimeout(ctx, attempt)
		err := fn(actx)
		cancel()
		if err == nil || ctx.Err() != nil || errors.Is(err, rpctypes.ErrLeaseNotFound) {
			// A lease that lapsed stays lapsed: asking again with it,
			// until the request's bound, held a join that an
			// overloaded cluster answered late.
			return err
		}
		attempt *= 2
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

// jitter draws a pause from the upper half of d.
func jitter(d time.Duration) time.Duration {
	return d/2 + rand.N(d/2+1)
}

// retryKV is etcd's KV with every request made again while it fails,
// until its context ends (retry). Every request this package makes may be
// repeated: puts of the same value, deletes, reads, and transactions
// whose comparison fails once they have been applied.
type retryKV struct{ kv clientv3.KV }

var _ clientv3.KV = retryKV{}

func (r retryKV) Do(ctx context.Context, op clientv3.Op) (clientv3.OpResponse, error) {
	var resp clientv3.OpResponse
	err := retry(ctx, func(ctx context.Context) (err error) {
		resp, err = r.kv.Do(ctx, op)
		return err
	})
	return resp, err
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
