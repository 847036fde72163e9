package etcd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gorun/gorun/rendezvous"
)

// Store is a rendezvous.Store on etcd, under a key prefix: what the
// agents of one round share (Round.Store). Blocking reads watch their key;
// read-modify-writes (Add, Append) are transactions on the key's revision.
// It does not own the client: Close does nothing.
type Store struct {
	cli    *clientv3.Client
	kv     retryKV
	prefix string
}

// NewStore returns the store of the keys under prefix.
func NewStore(cli *clientv3.Client, prefix string) *Store {
	return &Store{cli: cli, kv: newRetryKV(cli, newRetrier(cli)), prefix: prefix}
}

var _ rendezvous.Store = (*Store)(nil)

func (s *Store) k(key string) string { return s.prefix + key }

func opError(op string, key string, err error) error {
	return &rendezvous.OpError{Op: op, Keys: []string{key}, Err: err}
}

func (s *Store) Set(ctx context.Context, key string, value []byte) error {
	if _, err := s.kv.Put(ctx, s.k(key), string(value)); err != nil {
		return opError("set", s.k(key), err)
	}
	return nil
}

// Get waits for key: it watches from the revision at which it read the
// key missing, so that no put in between is lost.
func (s *Store) Get(ctx context.Context, key string) ([]byte, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	v, err := s.await(ctx, s.k(key))
	if err != nil {
		return nil, opError("get", s.k(key), err)
	}
	return v, nil
}

func withDefaultTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, rendezvous.DefaultTimeout)
}

// await returns key's value once it exists (key is absolute).
func (s *Store) await(ctx context.Context, key string) ([]byte, error) {
	for {
		resp, err := s.kv.Get(ctx, key)
		if err != nil {
			return nil, waitErr(ctx, err)
		}
		if len(resp.Kvs) > 0 {
			return resp.Kvs[0].Value, nil
		}
		wctx, cancel := context.WithCancel(ctx)
		w := s.cli.Watch(wctx, key, clientv3.WithRev(resp.Header.Revision+1), clientv3.WithFilterDelete())
		for wr := range w {
			for _, ev := range wr.Events {
				cancel()
				return ev.Kv.Value, nil
			}
			if wr.Err() != nil {
				break
			}
		}
		cancel()
		if ctx.Err() != nil {
			return nil, waitErr(ctx, ctx.Err())
		}
		// The watch broke (compaction, a lost member): read again.
	}
}

// waitErr is rendezvous.ErrTimeout for a wait whose deadline passed.
func waitErr(ctx context.Context, err error) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("%w: %w", rendezvous.ErrTimeout, err)
	}
	return err
}

func (s *Store) Add(ctx context.Context, key string, delta int64) (int64, error) {
	var n int64
	err := s.update(ctx, s.k(key), func(old []byte) ([]byte, error) {
		var v int64
		if len(old) > 0 {
			var err error
			if v, err = strconv.ParseInt(string(old), 10, 64); err != nil {
				return nil, fmt.Errorf("rendezvous/etcd: %q is not an integer", old)
			}
		}
		n = v + delta
		return []byte(strconv.FormatInt(n, 10)), nil
	})
	if err != nil {
		return 0, opError("add", s.k(key), err)
	}
	return n, nil
}

func (s *Store) Append(ctx context.Context, key string, value []byte) error {
	err := s.update(ctx, s.k(key), func(old []byte) ([]byte, error) {
		return append(bytes.Clone(old), value...), nil
	})
	if err != nil {
		return opError("append", s.k(key), err)
	}
	return nil
}

// update replaces key's value with f of it in a transaction on the
// revision it read, again until no one else wrote in between.
func (s *Store) update(ctx context.Context, key string, f func(old []byte) ([]byte, error)) error {
	for {
		resp, err := s.kv.Get(ctx, key)
		if err != nil {
			return err
		}
		var old []byte
		var rev int64
		if len(resp.Kvs) > 0 {
			old, rev = resp.Kvs[0].Value, resp.Kvs[0].ModRevision
		}
		v, err := f(old)
		if err != nil {
			return err
		}
		t, err := s.kv.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).
			Then(clientv3.OpPut(key, string(v))).Commit()
		if err != nil {
			return err
		}
		if t.Succeeded {
			return nil
		}
	}
}

func (s *Store) CompareSet(ctx context.Context, key string, expected, desired []byte) ([]byte, error) {
	k := s.k(key)
	cond := clientv3.Compare(clientv3.Value(k), "=", string(expected))
	if len(expected) == 0 {
		cond = clientv3.Compare(clientv3.CreateRevision(k), "=", 0)
	}
	t, err := s.kv.Txn(ctx).If(cond).Then(clientv3.OpPut(k, string(desired))).Else(clientv3.OpGet(k)).Commit()
	if err != nil {
		return nil, opError("compare_set", k, err)
	}
	if t.Succeeded {
		return desired, nil
	}
	if kvs := t.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		return kvs[0].Value, nil
	}
	return expected, nil
}

func (s *Store) Check(ctx context.Context, keys []string) (bool, error) {
	for _, key := range keys {
		resp, err := s.kv.Get(ctx, s.k(key), clientv3.WithCountOnly())
		if err != nil {
			return false, opError("check", s.k(key), err)
		}
		if resp.Count == 0 {
			return false, nil
		}
	}
	return true, nil
}

func (s *Store) Wait(ctx context.Context, keys []string) error {
	_, err := s.MultiGet(ctx, keys)
	return err
}

func (s *Store) Delete(ctx context.Context, key string) (bool, error) {
	resp, err := s.kv.Delete(ctx, s.k(key))
	if err != nil {
		return false, opError("delete_key", s.k(key), err)
	}
	return resp.Deleted > 0, nil
}

func (s *Store) NumKeys(ctx context.Context) (int64, error) {
	resp, err := s.kv.Get(ctx, s.prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, opError("num_keys", s.prefix, err)
	}
	return resp.Count, nil
}

func (s *Store) MultiGet(ctx context.Context, keys []string) ([][]byte, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	values := make([][]byte, len(keys))
	for i, key := range keys {
		v, err := s.await(ctx, s.k(key))
		if err != nil {
			return nil, &rendezvous.OpError{Op: "multi_get", Keys: keys, Err: err}
		}
		values[i] = v
	}
	return values, nil
}

// maxOps is etcd's default limit of operations in one transaction.
const maxOps = 128

func (s *Store) MultiSet(ctx context.Context, keys []string, values [][]byte) error {
	if len(keys) != len(values) {
		return errors.New("rendezvous/etcd: multi_set: keys and values differ in number")
	}
	for len(keys) > 0 {
		n := min(len(keys), maxOps)
		ops := make([]clientv3.Op, n)
		for i := range n {
			ops[i] = clientv3.OpPut(s.k(keys[i]), string(values[i]))
		}
		if _, err := s.kv.Txn(ctx).Then(ops...).Commit(); err != nil {
			return &rendezvous.OpError{Op: "multi_set", Keys: keys, Err: err}
		}
		keys, values = keys[n:], values[n:]
	}
	return nil
}

// Close does nothing: the handler owns the client.
func (s *Store) Close() error { return nil }
