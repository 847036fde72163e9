package runtime

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/rendezvous"
)

// withEnv makes Init read env instead of the process's environment, so
// that no test sees the shell it runs in.
func withEnv(env map[string]string) Option {
	return WithLookupEnv(func(name string) (string, bool) { v, ok := env[name]; return v, ok })
}

// onRanks runs body on every rank of a world of n ranks joined by fake
// communicators, through Init, and fails the test with each rank's error.
func onRanks(t *testing.T, n int, body func(pg *ProcessGroup) error, opts ...Option) {
	t.Helper()
	fake := newFakeNet(n)
	runRanks(t, n, body, func(rank int) []Option {
		connect := func(context.Context, rendezvous.Store) (collective.Comm, error) { return fake.comm(rank), nil }
		return append([]Option{WithStore(rendezvous.NewMemoryStore(0)), withConnector(connect)}, opts...)
	})
}

// onTCPRanks is onRanks on the TCP backend, over the loopback interface.
func onTCPRanks(t testing.TB, n int, body func(pg *ProcessGroup) error, opts ...Option) {
	t.Helper()
	store := rendezvous.NewMemoryStore(0)
	runRanks(t, n, body, func(int) []Option {
		return append([]Option{WithStore(store), WithHost("127.0.0.1")}, opts...)
	})
}

// runRanks runs body on n ranks, each in its own goroutine, after Init
// with optionsOf(rank), and fails the test with each rank's error.
func runRanks(t testing.TB, n int, body func(pg *ProcessGroup) error, optionsOf func(rank int) []Option) {
	t.Helper()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			// No environment unless the test gives one; a hang fails the
			// test, not the run.
			base := []Option{withEnv(nil), WithRank(r, n), WithTimeout(20 * time.Second)}
			pg, err := Init(context.Background(), append(base, optionsOf(r)...)...)
			if err != nil {
				errs[r] = err
				return
			}
			defer pg.Close()
			errs[r] = body(pg)
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// expect returns an error describing got when it differs from want.
func expect[T comparable](what string, got, want []T) error {
	if !slices.Equal(got, want) {
		return fmt.Errorf("%s = %v, want %v", what, got, want)
	}
	return nil
}

// filled returns n copies of v.
func filled[T any](n int, v T) []T {
	return slices.Repeat([]T{v}, n)
}
