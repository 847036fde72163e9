package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// storeFixture is a Store under test, with what the conformance suite
// needs to know about it.
type storeFixture struct {
	store Store
	// open returns another handle on the same data, to write while store
	// is blocked: a Client serves one request at a time.
	open func(t *testing.T) Store
	// pendingWaits, if known, counts the waits the backing table holds,
	// so that a test can write only once a wait has registered.
	pendingWaits func() int
	// appendSupported is false for the torch 1.13 protocol.
	appendSupported bool
	// compareSetWakes is true when a key created by compare_set wakes its
	// waiters (ours; not torch 1.13's server).
	compareSetWakes bool
}

// shortWait is how long tests wait for keys that must not appear.
const shortWait = 150 * time.Millisecond

// testStoreSemantics runs the TCPStore conformance suite (protocol §3)
// on every store newFixture makes. Keys are unique per subtest, so a
// fixture may share one backing store between subtests.
func testStoreSemantics(t *testing.T, newFixture func(t *testing.T) storeFixture) {
	key := func(t *testing.T, name string) string { return t.Name() + "/" + name }
	ctx := func(t *testing.T) context.Context { return ctxTimeout(t, testTimeout) }

	t.Run("set and get", func(t *testing.T) {
		f := newFixture(t)
		k := key(t, "k")
		for _, v := range []string{"v1", "v2", "", "\x00bin\xff"} {
			mustDo(t, f.store.Set(ctx(t), k, []byte(v)))
			if got := mustGet(t, f.store, k); got != v {
				t.Fatalf("get = %q, want %q", got, v)
			}
		}
	})

	t.Run("get waits for set", func(t *testing.T) {
		f := newFixture(t)
		k := key(t, "late")
		got := make(chan string, 1)
		go func() {
			v, err := f.store.Get(ctx(t), k)
			if err != nil {
				t.Error(err)
			}
			got <- string(v)
		}()
		f.afterWaitRegistered(t, 1)
		mustDo(t, f.open(t).Set(ctx(t), k, []byte("here")))
		if v := <-got; v != "here" {
			t.Fatalf("get = %q", v)
		}
	})

	t.Run("add", func(t *testing.T) {
		f := newFixture(t)
		k := key(t, "n")
		for _, step := range []struct{ delta, want int64 }{{5, 5}, {-2, 3}, {0, 3}} {
			if n, err := f.store.Add(ctx(t), k, step.delta); err != nil || n != step.want {
				t.Fatalf("add %d = %d, %v; want %d", step.delta, n, err, step.want)
			}
		}
		if got := mustGet(t, f.store, k); got != "3" {
			t.Fatalf("stored %q, want 3", got)
		}
	})

	t.Run("add parses like std::stoll", func(t *testing.T) {
		f := newFixture(t)
		for i, tc := range []struct {
			stored string
			want   int64
		}{
			{"12abc", 13}, {"  7", 8}, {"+4", 5}, {"0x10", 1},
			{strconv.FormatInt(math.MaxInt64, 10), math.MinInt64},
		} {
			k := key(t, strconv.Itoa(i))
			mustDo(t, f.store.Set(ctx(t), k, []byte(tc.stored)))
			if n, err := f.store.Add(ctx(t), k, 1); err != nil || n != tc.want {
				t.Errorf("add 1 to %q = %d, %v; want %d", tc.stored, n, err, tc.want)
			}
		}
		for i, bad := range []string{"", "P", "99999999999999999999"} {
			k := key(t, "bad"+strconv.Itoa(i))
			mustDo(t, f.store.Set(ctx(t), k, []byte(bad)))
			if _, err := f.store.Add(ctx(t), k, 1); err == nil {
				t.Errorf("add 1 to %q succeeded", bad)
			}
			// The store is still usable, and the value unchanged.
			if got := mustGet(t, f.store, k); got != bad {
				t.Errorf("after the failed add the key holds %q, want %q", got, bad)
			}
		}
	})

	t.Run("compare_set", func(t *testing.T) {
		f := newFixture(t)
		cs := func(k, expected, desired string) string {
			t.Helper()
			v, err := f.store.CompareSet(ctx(t), k, []byte(expected), []byte(desired))
			mustDo(t, err)
			return string(v)
		}
		missing := key(t, "missing")
		if got := cs(missing, "abc", "y"); got != "abc" {
			t.Errorf("missing key, expected given: reply %q, want the expected value", got)
		}
		if ok, _ := f.store.Check(ctx(t), []string{missing}); ok {
			t.Error("a failed compare_set created the key")
		}
		k := key(t, "k")
		if got := cs(k, "", "first"); got != "first" {
			t.Errorf("missing key, empty expected: reply %q, want the desired value", got)
		}
		if got := cs(k, "first", "second"); got != "second" {
			t.Errorf("matching: reply %q, want the desired value", got)
		}
		if got := cs(k, "stale", "third"); got != "second" {
			t.Errorf("not matching: reply %q, want the current value", got)
		}
		if got := mustGet(t, f.store, k); got != "second" {
			t.Errorf("stored %q", got)
		}
		empty := key(t, "empty")
		if got := cs(empty, "", ""); got != "" {
			t.Errorf("empty desired: reply %q", got)
		}
		if ok, _ := f.store.Check(ctx(t), []string{empty}); !ok {
			t.Error("compare_set with an empty desired value must create the key")
		}
	})

	t.Run("check", func(t *testing.T) {
		f := newFixture(t)
		present, missing := key(t, "present"), key(t, "missing")
		mustDo(t, f.store.Set(ctx(t), present, nil))
		for _, tc := range []struct {
			keys []string
			want bool
		}{
			{nil, true}, {[]string{present}, true}, {[]string{missing}, false}, {[]string{present, missing}, false},
		} {
			if ok, err := f.store.Check(ctx(t), tc.keys); err != nil || ok != tc.want {
				t.Errorf("check %q = %v, %v; want %v", tc.keys, ok, err, tc.want)
			}
		}
	})

	t.Run("wait", func(t *testing.T) {
		f := newFixture(t)
		present, missing := key(t, "present"), key(t, "missing")
		mustDo(t, f.store.Set(ctx(t), present, nil))
		mustDo(t, f.store.Wait(ctx(t), nil))
		mustDo(t, f.store.Wait(ctx(t), []string{present}))
		err := f.store.Wait(ctxTimeout(t, shortWait), []string{present, missing})
		if !errors.Is(err, ErrTimeout) {
			t.Fatalf("wait on a missing key: %v, want ErrTimeout", err)
		}
		var opErr *OpError
		if !errors.As(err, &opErr) || !strings.Contains(err.Error(), missing) {
			t.Errorf("the timeout %q does not name the key %q", err, missing)
		}
		if _, err := f.store.Get(ctxTimeout(t, shortWait), missing); !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), missing) {
			t.Errorf("get of a missing key: %v, want ErrTimeout naming it", err)
		}
	})

	t.Run("wait is woken by", func(t *testing.T) {
		writes := []struct {
			name      string
			supported func(storeFixture) bool
			create    func(ctx context.Context, s Store, k string) error
		}{
			{"set", nil, func(ctx context.Context, s Store, k string) error { return s.Set(ctx, k, []byte("v")) }},
			{"add", nil, func(ctx context.Context, s Store, k string) error { _, err := s.Add(ctx, k, 1); return err }},
			{"multi_set", nil, func(ctx context.Context, s Store, k string) error {
				return s.MultiSet(ctx, []string{k + "x", k}, [][]byte{nil, []byte("v")})
			}},
			{"append", func(f storeFixture) bool { return f.appendSupported }, func(ctx context.Context, s Store, k string) error {
				return s.Append(ctx, k, []byte("v"))
			}},
			{"compare_set", func(f storeFixture) bool { return f.compareSetWakes }, func(ctx context.Context, s Store, k string) error {
				_, err := s.CompareSet(ctx, k, nil, []byte("v"))
				return err
			}},
		}
		for _, w := range writes {
			t.Run(w.name, func(t *testing.T) {
				f := newFixture(t)
				a, b := key(t, "a"), key(t, "b")
				done := make(chan error, 1)
				go func() { done <- f.store.Wait(ctx(t), []string{a, b}) }()
				f.afterWaitRegistered(t, 1)
				other := f.open(t)
				errA, errB := w.create(ctx(t), other, a), w.create(ctx(t), other, b)
				if w.supported == nil || w.supported(f) {
					mustDo(t, errA)
					mustDo(t, errB)
					mustDo(t, <-done)
					return
				}
				// This protocol lacks the operation, or torch's server does
				// not wake waiters for it: either way the waiter must still
				// be waiting, and an ordinary set must then wake it.
				if errA != nil && !errors.Is(errA, errors.ErrUnsupported) {
					t.Fatalf("unsupported write: %v", errA)
				}
				if f.pendingWaits != nil {
					// Once the server has answered a later request of
					// other's, it has handled the writes: the wait must
					// still be registered.
					_, err := other.Check(ctx(t), []string{a})
					mustDo(t, err)
					if n := f.pendingWaits(); n != 1 {
						t.Fatalf("%d waits pending after writes this protocol does not wake waiters for, want 1", n)
					}
				} else {
					// Torch's server cannot be seen into: a wake-up would
					// have reached the waiter within shortWait.
					select {
					case err := <-done:
						t.Fatalf("the wait returned (%v) although this protocol does not wake it", err)
					case <-time.After(shortWait):
					}
				}
				mustDo(t, other.Set(ctx(t), a, []byte("v")))
				mustDo(t, other.Set(ctx(t), b, []byte("v")))
				mustDo(t, <-done)
			})
		}
	})

	t.Run("timed-out wait leaves the store usable", func(t *testing.T) {
		f := newFixture(t)
		k := key(t, "k")
		if err := f.store.Wait(ctxTimeout(t, shortWait), []string{k}); !errors.Is(err, ErrTimeout) {
			t.Fatalf("wait: %v", err)
		}
		// Creating the key now answers the abandoned wait; that late
		// STOP_WAITING must not be taken for a later reply.
		mustDo(t, f.open(t).Set(ctx(t), k, []byte("v")))
		for i := 0; i < 3; i++ {
			if got := mustGet(t, f.store, k); got != "v" {
				t.Fatalf("get = %q", got)
			}
			if n, err := f.store.Add(ctx(t), key(t, "n"), 1); err != nil || n != int64(i+1) {
				t.Fatalf("add = %d, %v", n, err)
			}
		}
	})

	t.Run("delete", func(t *testing.T) {
		f := newFixture(t)
		k := key(t, "k")
		mustDo(t, f.store.Set(ctx(t), k, []byte("v")))
		for _, want := range []bool{true, false} {
			if ok, err := f.store.Delete(ctx(t), k); err != nil || ok != want {
				t.Fatalf("delete = %v, %v; want %v", ok, err, want)
			}
		}
		if ok, _ := f.store.Check(ctx(t), []string{k}); ok {
			t.Fatal("deleted key still exists")
		}
		// A delete is no creation: a wait stays pending.
		done := make(chan error, 1)
		go func() { done <- f.store.Wait(ctxTimeout(t, shortWait), []string{k}) }()
		f.afterWaitRegistered(t, 1)
		_, err := f.open(t).Delete(ctx(t), k)
		mustDo(t, err)
		if err := <-done; !errors.Is(err, ErrTimeout) {
			t.Fatalf("wait after delete: %v, want ErrTimeout", err)
		}
	})

	t.Run("num_keys", func(t *testing.T) {
		f := newFixture(t)
		before, err := f.store.NumKeys(ctx(t))
		mustDo(t, err)
		mustDo(t, f.store.Set(ctx(t), key(t, "a"), nil))
		_, err = f.store.Add(ctx(t), key(t, "b"), 1)
		mustDo(t, err)
		mustDo(t, f.store.Set(ctx(t), key(t, "a"), nil))
		if n, err := f.store.NumKeys(ctx(t)); err != nil || n != before+2 {
			t.Fatalf("num_keys = %d, %v; want %d", n, err, before+2)
		}
	})

	t.Run("multi_set and multi_get", func(t *testing.T) {
		f := newFixture(t)
		a, b, missing := key(t, "a"), key(t, "b"), key(t, "missing")
		mustDo(t, f.store.MultiSet(ctx(t), []string{a, b}, [][]byte{[]byte("1"), []byte("2")}))
		values, err := f.store.MultiGet(ctx(t), []string{b, a, b})
		mustDo(t, err)
		if got := fmt.Sprintf("%s", values); got != "[2 1 2]" {
			t.Fatalf("multi_get = %s", got)
		}
		if _, err := f.store.MultiGet(ctxTimeout(t, shortWait), []string{a, missing}); !errors.Is(err, ErrTimeout) {
			t.Fatalf("multi_get with a missing key: %v", err)
		}
		if err := f.store.MultiSet(ctx(t), []string{a}, nil); err == nil {
			t.Fatal("multi_set with fewer values than keys succeeded")
		}
		if got := mustGet(t, f.store, a); got != "1" {
			t.Fatalf("store usable after errors: get = %q", got)
		}
	})

	t.Run("append", func(t *testing.T) {
		f := newFixture(t)
		k := key(t, "k")
		err := f.store.Append(ctx(t), k, []byte("ab"))
		if !f.appendSupported {
			if !errors.Is(err, errors.ErrUnsupported) {
				t.Fatalf("append: %v, want ErrUnsupported", err)
			}
			return
		}
		mustDo(t, err)
		mustDo(t, f.store.Append(ctx(t), k, []byte("cd")))
		if got := mustGet(t, f.store, k); got != "abcd" {
			t.Fatalf("get = %q", got)
		}
	})

	t.Run("concurrent adds", func(t *testing.T) {
		f := newFixture(t)
		k := key(t, "n")
		const workers, adds = 8, 25
		var wg sync.WaitGroup
		for i := 0; i < workers; i++ {
			s := f.store
			if i%2 == 1 {
				s = f.open(t)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := 0; j < adds; j++ {
					if _, err := s.Add(ctx(t), k, 1); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		if got := mustGet(t, f.store, k); got != strconv.Itoa(workers*adds) {
			t.Fatalf("total %s, want %d", got, workers*adds)
		}
	})

	t.Run("closed", func(t *testing.T) {
		f := newFixture(t)
		s := f.open(t)
		mustDo(t, s.Close())
		if err := s.Set(ctx(t), key(t, "k"), nil); !errors.Is(err, ErrClosed) {
			t.Fatalf("set on a closed store: %v", err)
		}
		if _, err := s.Get(ctx(t), key(t, "k")); !errors.Is(err, ErrClosed) {
			t.Fatalf("get on a closed store: %v", err)
		}
	})
}

// afterWaitRegistered returns once the backing table holds n pending
// waits; for a store we cannot see into, after a grace period (the test
// then still passes if the wait had not registered, but tests less).
func (f storeFixture) afterWaitRegistered(t *testing.T, n int) {
	t.Helper()
	if f.pendingWaits == nil {
		time.Sleep(100 * time.Millisecond)
		return
	}
	deadline := time.Now().Add(testTimeout)
	for f.pendingWaits() < n {
		if time.Now().After(deadline) {
			t.Fatalf("no wait registered")
		}
		time.Sleep(time.Millisecond)
	}
}

func mustDo(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func mustGet(t testing.TB, s Store, key string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	v, err := s.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(v)
}

func TestMemoryStoreSemantics(t *testing.T) {
	testStoreSemantics(t, func(t *testing.T) storeFixture {
		s := NewMemoryStore(0)
		return storeFixture{
			store:           s,
			open:            func(*testing.T) Store { return newMemoryStore(s.table, 0) },
			pendingWaits:    s.table.pendingWaits,
			appendSupported: true,
			compareSetWakes: true,
		}
	})
}

func TestPrefixStoreSemantics(t *testing.T) {
	testStoreSemantics(t, func(t *testing.T) storeFixture {
		s := NewMemoryStore(0)
		return storeFixture{
			store:           NewPrefixStore("p", s),
			open:            func(*testing.T) Store { return NewPrefixStore("p", newMemoryStore(s.table, 0)) },
			pendingWaits:    s.table.pendingWaits,
			appendSupported: true,
			compareSetWakes: true,
		}
	})
}

func TestServerStoreSemantics(t *testing.T) {
	testStoreSemantics(t, func(t *testing.T) storeFixture {
		srv, addr, _ := startServer(t, ServerOptions{})
		return storeFixture{
			store:           NewPrefixStore("", srv.Store()),
			open:            func(t *testing.T) Store { return dialClient(t, addr, ClientOptions{}) },
			pendingWaits:    srv.table.pendingWaits,
			appendSupported: true,
			compareSetWakes: true,
		}
	})
}

func TestClientSemantics(t *testing.T) {
	for _, d := range []Dialect{DialectV2, Dialect113, DialectAuto} {
		t.Run(d.String(), func(t *testing.T) {
			testStoreSemantics(t, func(t *testing.T) storeFixture {
				srv, addr, _ := startServer(t, ServerOptions{})
				open := func(t *testing.T) Store { return dialClient(t, addr, ClientOptions{Dialect: d}) }
				return storeFixture{
					store:           open(t),
					open:            open,
					pendingWaits:    srv.table.pendingWaits,
					appendSupported: d != Dialect113,
					compareSetWakes: true,
				}
			})
		})
	}
}

func TestPrefixStoreKeys(t *testing.T) {
	ctx := ctxTimeout(t, testTimeout)
	base := NewMemoryStore(0)
	inner := NewPrefixStore("b", NewPrefixStore("/worker/attempt_0", base))
	mustDo(t, inner.Set(ctx, "k", []byte("v")))
	if got := mustGet(t, base, "/worker/attempt_0/b/k"); got != "v" {
		t.Fatalf("got %q", got)
	}
	if n, _ := inner.NumKeys(ctx); n != 1 {
		t.Fatalf("num_keys = %d", n)
	}
	mustDo(t, inner.Close())
	if err := inner.Set(ctx, "k", nil); !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), `"b/k"`) {
		t.Fatalf("set on a closed view: %v", err)
	}
	if got := mustGet(t, base, "/worker/attempt_0/b/k"); got != "v" {
		t.Fatal("closing a view must leave the underlying store open")
	}
}

// TestServerStoreSharesKeysWithClients: the launcher's in-process view,
// wrapped as torch would, and remote clients see the same keys.
func TestServerStoreSharesKeysWithClients(t *testing.T) {
	ctx := ctxTimeout(t, testTimeout)
	srv, addr, _ := startServer(t, ServerOptions{})
	c := dialClient(t, addr, ClientOptions{WorldSize: 2})
	local := NewPrefixStore("", srv.Store())
	mustDo(t, local.Set(ctx, "from-launcher", []byte("1")))
	mustDo(t, c.Set(ctx, "from-client", []byte("2")))
	if got := mustGet(t, c, "from-launcher"); got != "1" {
		t.Fatalf("client got %q", got)
	}
	if got := mustGet(t, local, "from-client"); got != "2" {
		t.Fatalf("launcher got %q", got)
	}
	if got := mustGet(t, srv.Store(), "init/"); got != "1" {
		t.Fatalf(`WorldSize must count the client in "init/": %q`, got)
	}
	mustDo(t, local.Close())
	if got := mustGet(t, c, "from-launcher"); got != "1" {
		t.Fatal("closing the view must not stop the server")
	}
}
