package rendezvous

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"time"
)

// MemoryStore is an in-process Store with TCPStore's semantics. A Server's
// Store method returns one that shares the server's table.
type MemoryStore struct {
	table   *table
	timeout time.Duration

	closeOnce sync.Once
	closed    chan struct{}
}

var _ Store = (*MemoryStore)(nil)

// NewMemoryStore returns an empty store whose blocking calls give up after
// timeout when their context has no deadline (zero means DefaultTimeout).
func NewMemoryStore(timeout time.Duration) *MemoryStore {
	return newMemoryStore(newTable(), timeout)
}

func newMemoryStore(t *table, timeout time.Duration) *MemoryStore {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	return &MemoryStore{table: t, timeout: timeout, closed: make(chan struct{})}
}

// Close makes later calls, and the blocking calls in progress, return
// ErrClosed. It does not clear the table, which a Server may still serve.
func (s *MemoryStore) Close() error {
	s.closeOnce.Do(func() { close(s.closed) })
	return nil
}

func (s *MemoryStore) isClosed() bool {
	select {
	case <-s.closed:
		return true
	default:
		return false
	}
}

// open passes keys through, or fails op on a closed store.
func (s *MemoryStore) open(op string, keys ...string) ([]string, error) {
	if s.isClosed() {
		return keys, &OpError{Op: op, Keys: keys, Err: ErrClosed}
	}
	return keys, nil
}

func (s *MemoryStore) Set(ctx context.Context, key string, value []byte) error {
	k, err := s.open("set", key)
	if err != nil {
		return err
	}
	_ = s.table.set(local, k[0], bytes.Clone(value)) // local writes are never refused
	return nil
}

func (s *MemoryStore) Get(ctx context.Context, key string) ([]byte, error) {
	values, err := s.await(ctx, "get", []string{key})
	if err != nil {
		return nil, err
	}
	return bytes.Clone(values[0]), nil
}

func (s *MemoryStore) Add(ctx context.Context, key string, delta int64) (int64, error) {
	k, err := s.open("add", key)
	if err != nil {
		return 0, err
	}
	n, err := s.table.add(local, k[0], delta)
	if err != nil {
		return 0, &OpError{Op: "add", Keys: k, Err: err}
	}
	return n, nil
}

func (s *MemoryStore) CompareSet(ctx context.Context, key string, expected, desired []byte) ([]byte, error) {
	k, err := s.open("compare_set", key)
	if err != nil {
		return nil, err
	}
	v, _ := s.table.compareSet(local, k[0], bytes.Clone(expected), bytes.Clone(desired)) // never refused
	return bytes.Clone(v), nil
}

func (s *MemoryStore) Check(ctx context.Context, keys []string) (bool, error) {
	k, err := s.open("check", keys...)
	if err != nil {
		return false, err
	}
	return s.table.check(k), nil
}

func (s *MemoryStore) Wait(ctx context.Context, keys []string) error {
	_, err := s.await(ctx, "wait", keys)
	return err
}

func (s *MemoryStore) Delete(ctx context.Context, key string) (bool, error) {
	k, err := s.open("delete_key", key)
	if err != nil {
		return false, err
	}
	return s.table.delete(k[0]), nil
}

func (s *MemoryStore) NumKeys(ctx context.Context) (int64, error) {
	if _, err := s.open("num_keys"); err != nil {
		return 0, err
	}
	return s.table.numKeys(), nil
}

func (s *MemoryStore) MultiGet(ctx context.Context, keys []string) ([][]byte, error) {
	values, err := s.await(ctx, "multi_get", keys)
	if err != nil {
		return nil, err
	}
	for i, v := range values {
		values[i] = bytes.Clone(v)
	}
	return values, nil
}

func (s *MemoryStore) MultiSet(ctx context.Context, keys []string, values [][]byte) error {
	k, err := s.open("multi_set", keys...)
	if err != nil {
		return err
	}
	if len(keys) != len(values) {
		return &OpError{Op: "multi_set", Keys: k, Err: errMultiSetLengths}
	}
	cloned := make([][]byte, len(values))
	for i, v := range values {
		cloned[i] = bytes.Clone(v)
	}
	_ = s.table.multiSet(local, k, cloned) // never refused
	return nil
}

func (s *MemoryStore) Append(ctx context.Context, key string, value []byte) error {
	k, err := s.open("append", key)
	if err != nil {
		return err
	}
	// The table copies value; only the server's value cap can refuse it.
	if err := s.table.append(local, k[0], value); err != nil {
		return &OpError{Op: "append", Keys: k, Err: err}
	}
	return nil
}

// await blocks until every key exists and returns their values (which the
// caller must not modify).
func (s *MemoryStore) await(ctx context.Context, op string, keys []string) ([][]byte, error) {
	k, err := s.open(op, keys...)
	if err != nil {
		return nil, err
	}
	ctx, cancel := withDefaultTimeout(ctx, s.timeout)
	defer cancel()
	for {
		values, w := s.table.lookup(k)
		if w == nil {
			return values, nil
		}
		select {
		case <-w.done:
			// Look again: a delete may have come between.
			continue
		case <-ctx.Done():
			err = waitError(ctx)
		case <-s.closed:
			err = ErrClosed
		}
		s.table.cancel(w)
		return nil, &OpError{Op: op, Keys: k, Err: err}
	}
}

var errMultiSetLengths = errors.New("rendezvous: keys and values differ in length")
