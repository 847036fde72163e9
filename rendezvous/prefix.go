package rendezvous

import (
	"context"
	"sync/atomic"
)

// PrefixStore namespaces another Store as torch's PrefixStore does: key k
// becomes prefix + "/" + k. Prefix stores nest.
type PrefixStore struct {
	prefix string
	store  Store
	closed atomic.Bool
}

var _ Store = (*PrefixStore)(nil)

// NewPrefixStore returns a view of s under prefix.
func NewPrefixStore(prefix string, s Store) *PrefixStore {
	return &PrefixStore{prefix: prefix, store: s}
}

// Underlying returns the store the prefix applies to.
func (p *PrefixStore) Underlying() Store { return p.store }

// Close makes later calls on p return ErrClosed. The underlying store stays
// open: it belongs to whoever created it, and other views may share it.
func (p *PrefixStore) Close() error {
	p.closed.Store(true)
	return nil
}

// open returns key joined to the prefix, or fails op on a closed view.
func (p *PrefixStore) open(op, key string) (string, error) {
	ks, err := p.openAll(op, []string{key})
	return ks[0], err
}

// openAll is open for several keys.
func (p *PrefixStore) openAll(op string, keys []string) ([]string, error) {
	joined := make([]string, len(keys))
	for i, k := range keys {
		joined[i] = p.prefix + "/" + k
	}
	if p.closed.Load() {
		return joined, &OpError{Op: op, Keys: joined, Err: ErrClosed}
	}
	return joined, nil
}

func (p *PrefixStore) Set(ctx context.Context, key string, value []byte) error {
	k, err := p.open("set", key)
	if err != nil {
		return err
	}
	return p.store.Set(ctx, k, value)
}

func (p *PrefixStore) Get(ctx context.Context, key string) ([]byte, error) {
	k, err := p.open("get", key)
	if err != nil {
		return nil, err
	}
	return p.store.Get(ctx, k)
}

func (p *PrefixStore) Add(ctx context.Context, key string, delta int64) (int64, error) {
	k, err := p.open("add", key)
	if err != nil {
		return 0, err
	}
	return p.store.Add(ctx, k, delta)
}

func (p *PrefixStore) CompareSet(ctx context.Context, key string, expected, desired []byte) ([]byte, error) {
	k, err := p.open("compare_set", key)
	if err != nil {
		return nil, err
	}
	return p.store.CompareSet(ctx, k, expected, desired)
}

func (p *PrefixStore) Check(ctx context.Context, keys []string) (bool, error) {
	ks, err := p.openAll("check", keys)
	if err != nil {
		return false, err
	}
	return p.store.Check(ctx, ks)
}

func (p *PrefixStore) Wait(ctx context.Context, keys []string) error {
	ks, err := p.openAll("wait", keys)
	if err != nil {
		return err
	}
	return p.store.Wait(ctx, ks)
}

func (p *PrefixStore) Delete(ctx context.Context, key string) (bool, error) {
	k, err := p.open("delete_key", key)
	if err != nil {
		return false, err
	}
	return p.store.Delete(ctx, k)
}

// NumKeys counts every key of the underlying store, as torch's does.
func (p *PrefixStore) NumKeys(ctx context.Context) (int64, error) {
	if p.closed.Load() {
		return 0, &OpError{Op: "num_keys", Err: ErrClosed}
	}
	return p.store.NumKeys(ctx)
}

func (p *PrefixStore) MultiGet(ctx context.Context, keys []string) ([][]byte, error) {
	ks, err := p.openAll("multi_get", keys)
	if err != nil {
		return nil, err
	}
	return p.store.MultiGet(ctx, ks)
}

func (p *PrefixStore) MultiSet(ctx context.Context, keys []string, values [][]byte) error {
	ks, err := p.openAll("multi_set", keys)
	if err != nil {
		return err
	}
	return p.store.MultiSet(ctx, ks, values)
}

func (p *PrefixStore) Append(ctx context.Context, key string, value []byte) error {
	k, err := p.open("append", key)
	if err != nil {
		return err
	}
	return p.store.Append(ctx, k, value)
}
