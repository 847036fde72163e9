package etcd

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

func TestKeepWaiting(t *testing.T) {
	for _, c := range []struct {
		name  string
		began uint64
		found health
		want  bool
	}{
		{"busy: same leader, same term", 3, health{answered: 3, term: 3}, true},
		{"a member lost its leader", 3, health{answered: 3, leaderless: true, term: 3}, false},
		{"a new leader: the proposal may be lost", 3, health{answered: 2, term: 4}, false},
		{"nobody answered", 3, health{leaderless: true}, false},
		{"one member silent", 3, health{answered: 2, leaderless: true, term: 3}, false},
		{"an older term than seen (a lagging member)", 5, health{answered: 1, term: 4}, true},
	} {
		if got := keepWaiting(c.began, c.found); got != c.want {
			t.Errorf("%s: keepWaiting(%d, %+v) = %v, want %v", c.name, c.began, c.found, got, c.want)
		}
	}
}

// attempt is a fake request: it answers when answerAfter has passed
// since the first attempt began, and counts the attempts made.
type attempt struct {
	answerAfter time.Duration
	start       time.Time
	made        atomic.Int32
}

func (a *attempt) fn(ctx context.Context) error {
	if a.made.Add(1) == 1 {
		a.start = time.Now()
	}
	select {
	case <-time.After(time.Until(a.start.Add(a.answerAfter))):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// A request that a healthy but busy cluster answers after 20 s is made
// once: each probe finds the leader of the term the attempt began in.
func TestRetryWaitsOnABusyCluster(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var probes atomic.Int32
		r := &retrier{probe: func(context.Context) health {
			probes.Add(1)
			return health{answered: 3, term: 7}
		}}
		r.saw(&pb.ResponseHeader{RaftTerm: 7})
		a := &attempt{answerAfter: 20 * time.Second}
		if err := r.do(t.Context(), a.fn); err != nil {
			t.Fatal(err)
		}
		if n := a.made.Load(); n != 1 {
			t.Errorf("%d attempts, want 1", n)
		}
		// Bounds of 2, 4 and 8 s passed (at 2, 6 and 14 s).
		if n := probes.Load(); n != 3 {
			t.Errorf("%d probes, want 3", n)
		}
	})
}

// An attempt is given up, and made again, once a probe finds a new
// leader (the attempt's proposal may be lost), or a member without one.
func TestRetryGivesUpALostAttempt(t *testing.T) {
	for name, found := range map[string]health{
		"new term":   {answered: 3, term: 8},
		"leaderless": {answered: 3, leaderless: true, term: 7},
		"silent":     {leaderless: true},
	} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := &retrier{probe: func(context.Context) health { return found }}
				r.saw(&pb.ResponseHeader{RaftTerm: 7})
				a := &attempt{answerAfter: 3 * time.Second}
				start := time.Now()
				if err := r.do(t.Context(), a.fn); err != nil {
					t.Fatal(err)
				}
				if n := a.made.Load(); n != 2 {
					t.Errorf("%d attempts, want 2 (the first given up at its bound)", n)
				}
				// Given up at 2 s; the second attempt answers at 3 s.
				if took := time.Since(start); took != 3*time.Second {
					t.Errorf("took %v, want 3s", took)
				}
			})
		})
	}
}

// The first request of a client knows no term: the first probe's stands
// for it, and a later probe that finds another gives the attempt up.
func TestRetryFirstRequestTakesTheProbesTerm(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var probes atomic.Int32
		r := &retrier{probe: func(context.Context) health {
			return health{answered: 1, term: uint64(4 + probes.Add(1)/2)} // 4, 5, ...
		}}
		a := &attempt{answerAfter: time.Minute}
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		err := r.do(ctx, a.fn)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want the deadline", err)
		}
		// Probes at 2 s (term 4: it stands) and 6 s (term 5: given up),
		// then the second attempt, its bound 4 s, runs to the deadline.
		if n := a.made.Load(); n != 2 {
			t.Errorf("%d attempts, want 2", n)
		}
	})
}

// A request that fails for good (a lapsed lease) is not made again.
func TestRetryStopsAtALapsedLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &retrier{probe: func(context.Context) health { return health{answered: 1} }}
		var made int
		err := r.do(t.Context(), func(context.Context) error {
			made++
			return rpctypes.ErrLeaseNotFound
		})
		if !errors.Is(err, rpctypes.ErrLeaseNotFound) || made != 1 {
			t.Fatalf("err = %v after %d attempts, want ErrLeaseNotFound after 1", err, made)
		}
	})
}
