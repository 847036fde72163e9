package elastic

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"slices"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun/gorun/rendezvous"
)

// These tests run the agent as gorun does, through Options, with fake
// workers (fakes_test.go) and testing/synctest's clock: every wait, the
// grace, the barrier and the workers' run times take no real time.

const hour = time.Hour

// testSpec is one node of nproc workers on the static rendezvous, in
// agent-store mode, without restarts.
func testSpec(t *testing.T, nproc int) Spec {
	return Spec{
		Argv: []string{"train"}, NProcPerNode: nproc, MinNodes: 1, MaxNodes: 1,
		Role: "default", RunID: "test", Backend: "static", ShareStore: true,
		StoreTimeout: time.Minute, ExitBarrierTimeout: time.Minute, ShutdownTimeout: 30 * time.Second,
		LogDir: t.TempDir(), Host: "node0",
	}
}

// elasticSpec is one of two nodes on an elastic rendezvous.
func elasticSpec(t *testing.T, maxRestarts int, grace time.Duration) Spec {
	s := testSpec(t, 2)
	s.Backend, s.ShareStore, s.MaxNodes, s.MaxRestarts = "c10d", false, 2, maxRestarts
	s.Dynamic.FailureGrace = grace
	return s
}

func newTestAgent(spec Spec, h rendezvous.Handler, w *fakeWorkers, signals <-chan os.Signal) *Agent {
	return NewAgent(spec, Options{
		Logger: zerolog.Nop(), Stdout: io.Discard, Stderr: io.Discard,
		Rendezvous: h, Signals: signals, StartGroup: w.start,
	})
}

func singleNode() rendezvous.Handler {
	return &staticHandler{store: rendezvous.NewMemoryStore(time.Minute), rank: 0, nodes: 1}
}

// runAgent runs a in the background; the result arrives on the channel.
func runAgent(ctx context.Context, a *Agent) <-chan runResult {
	done := make(chan runResult, 1)
	go func() {
		r, err := a.Run(ctx)
		done <- runResult{r, err}
	}()
	return done
}

type runResult struct {
	res *Result
	err error
}

func mustSucceed(t *testing.T, res *Result, err error, restarts int) {
	t.Helper()
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if res.ExitCode != 0 || len(res.Failures) != 0 || res.Interrupted != "" {
		t.Fatalf("result %+v, want success", res)
	}
	if res.Restarts != restarts {
		t.Fatalf("restarts = %d, want %d", res.Restarts, restarts)
	}
}

func mustStart(t *testing.T, w *fakeWorkers, n int) []*fakeGroup {
	t.Helper()
	gs := w.started()
	if len(gs) != n {
		t.Fatalf("the agent started the group %d times, want %d", len(gs), n)
	}
	return gs
}

func mustSend(t *testing.T, g *fakeGroup, want ...syscall.Signal) {
	t.Helper()
	if got := g.sent(); !slices.Equal(got, want) {
		t.Fatalf("the agent sent the workers %v, want %v", got, want)
	}
}

func TestAgentSucceeds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := &fakeWorkers{plan: func(_, slot int) plan { return plan{run: time.Duration(slot+1) * time.Second} }}
		res, err := newTestAgent(testSpec(t, 2), singleNode(), w, nil).Run(t.Context())
		mustSucceed(t, res, err, 0)
		g := mustStart(t, w, 1)[0]
		mustSend(t, g)
		if got := g.env(1, "RANK"); got != "1" {
			t.Errorf("slot 1 has RANK=%q, want 1", got)
		}
	})
}

func TestAgentRestartsAFailedGroupWithinTheBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// The first start: rank 1 fails after a second, rank 0 would run
		// for an hour; the second: both succeed.
		w := &fakeWorkers{plan: func(start, slot int) plan {
			switch {
			case start > 0:
				return plan{run: 2 * time.Second}
			case slot == 1:
				return plan{run: time.Second, code: 3}
			}
			return plan{run: hour}
		}}
		spec := testSpec(t, 2)
		spec.MaxRestarts = 2
		res, err := newTestAgent(spec, singleNode(), w, nil).Run(t.Context())
		mustSucceed(t, res, err, 1)
		gs := mustStart(t, w, 2)
		mustSend(t, gs[0], syscall.SIGTERM) // the failure stopped rank 0
		mustSend(t, gs[1])
		for i, g := range gs {
			if got, want := g.env(0, "TORCHELASTIC_RESTART_COUNT"), fmt.Sprint(i); got != want {
				t.Errorf("start %d: TORCHELASTIC_RESTART_COUNT=%s, want %s", i, got, want)
			}
		}
		if d := gs[1].started.Sub(gs[0].started); d != time.Second {
			t.Errorf("the group restarted %v after it started, want 1s: at once after the failure", d)
		}
	})
}

func TestAgentFailsTheJobOnceTheBudgetIsSpent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Rank 0 fails every time; rank 1 is stopped by the failure.
		w := &fakeWorkers{plan: func(_, slot int) plan {
			if slot == 0 {
				return plan{run: time.Second, code: 7}
			}
			return plan{run: hour}
		}}
		spec := testSpec(t, 2)
		spec.MaxRestarts = 1
		res, err := newTestAgent(spec, singleNode(), w, nil).Run(t.Context())
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		mustStart(t, w, 2)
		if res.ExitCode != 7 || res.Restarts != 1 || res.Interrupted != "" {
			t.Fatalf("result %+v, want exit code 7 after 1 restart", res)
		}
		// Rank 1's SIGTERM was the stop's doing, not a failure.
		if len(res.Failures) != 1 || res.Failures[0].Rank != 0 || res.Failures[0].ExitCode != 7 || res.Failures[0].Host != "node0" {
			t.Fatalf("failures %+v, want rank 0's exit code 7 alone", res.Failures)
		}
	})
}

func TestAgentStopsOnASignal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := &fakeWorkers{plan: func(int, int) plan { return plan{run: hour} }}
		signals := make(chan os.Signal, 1)
		spec := testSpec(t, 2)
		spec.MaxRestarts = 3
		start := time.Now()
		done := runAgent(t.Context(), newTestAgent(spec, singleNode(), w, signals))
		time.Sleep(5 * time.Second)
		signals <- syscall.SIGTERM
		r := <-done
		if r.err != nil {
			t.Fatalf("Run: %v", r.err)
		}
		if r.res.Interrupted != "SIGTERM" || r.res.ExitCode != 128+int(syscall.SIGTERM) || len(r.res.Failures) != 0 || r.res.Restarts != 0 {
			t.Fatalf("result %+v, want interrupted by SIGTERM, no failures, no restart", r.res)
		}
		mustSend(t, mustStart(t, w, 1)[0], syscall.SIGTERM)
		if d := time.Since(start); d != 5*time.Second {
			t.Errorf("the agent returned %v after it began, want 5s: as soon as the workers stopped", d)
		}
	})
}

func TestAgentKillsAtOnceOnASecondSignal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := &fakeWorkers{plan: func(int, int) plan { return plan{run: hour, ignoresTerm: true} }}
		signals := make(chan os.Signal, 1)
		spec := testSpec(t, 2)
		start := time.Now()
		done := runAgent(t.Context(), newTestAgent(spec, singleNode(), w, signals))
		time.Sleep(5 * time.Second)
		signals <- syscall.SIGTERM
		time.Sleep(time.Second)
		signals <- syscall.SIGINT
		r := <-done
		if r.err != nil || r.res.Interrupted != "SIGTERM" {
			t.Fatalf("Run = %+v, %v; want interrupted by the first signal, SIGTERM", r.res, r.err)
		}
		mustSend(t, mustStart(t, w, 1)[0], syscall.SIGTERM, syscall.SIGKILL)
		if d := time.Since(start); d != 6*time.Second {
			t.Errorf("the agent returned %v after it began, want 6s: at the second signal, not after the %v shutdown grace", d, spec.ShutdownTimeout)
		}
	})
}

func TestAgentForwardsNotices(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := &fakeWorkers{plan: func(int, int) plan { return plan{run: 10 * time.Second} }}
		signals := make(chan os.Signal, 1)
		done := runAgent(t.Context(), newTestAgent(testSpec(t, 2), singleNode(), w, signals))
		time.Sleep(5 * time.Second)
		signals <- syscall.SIGUSR1
		r := <-done
		mustSucceed(t, r.res, r.err, 0)
		mustSend(t, mustStart(t, w, 1)[0], syscall.SIGUSR1)
	})
}

func TestAgentSpendsNoRestartWhenTheRoundChangesDuringAFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Rank 0 fails a second in, as if its peer on a lost node had
		// died; two seconds later, heartbeats tell the node is lost.
		w := &fakeWorkers{plan: func(start, slot int) plan {
			switch {
			case start > 0:
				return plan{run: time.Second}
			case slot == 0:
				return plan{run: time.Second, code: 1}
			}
			return plan{run: hour}
		}}
		const grace = 10 * time.Second
		f := newFakeElastic(1)
		done := runAgent(t.Context(), newTestAgent(elasticSpec(t, 1, grace), f, w, nil))
		<-f.weighing
		time.Sleep(2 * time.Second)
		f.endRound("node n1 on h1 missed 3 heartbeats")
		r := <-done
		mustSucceed(t, r.res, r.err, 0)
		gs := mustStart(t, w, 2)
		rounds, restarts, reports, weighs, _ := f.state()
		if rounds != 2 || restarts != 0 || reports != 1 || weighs != 1 {
			t.Fatalf("rounds %d, restarts %d, reports %d, weighs ended %d; want 2, 0, 1, 1", rounds, restarts, reports, weighs)
		}
		if d := gs[1].started.Sub(gs[0].started); d != 3*time.Second {
			t.Errorf("the group restarted %v after it started, want 3s: as soon as the round changed, within the %v grace", d, grace)
		}
	})
}

func TestAgentSpendsARestartOnAFailureOfItsOwn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := &fakeWorkers{plan: func(start, slot int) plan {
			if start == 0 && slot == 0 {
				return plan{run: time.Second, code: 1}
			}
			return plan{run: time.Second}
		}}
		const grace = 10 * time.Second
		f := newFakeElastic(1)
		res, err := newTestAgent(elasticSpec(t, 1, grace), f, w, nil).Run(t.Context())
		mustSucceed(t, res, err, 1)
		gs := mustStart(t, w, 2)
		if rounds, restarts, reports, weighs, _ := f.state(); rounds != 2 || restarts != 1 || reports != 1 || weighs != 1 {
			t.Fatalf("rounds %d, restarts %d, reports %d, weighs ended %d; want 2, 1, 1, 1", rounds, restarts, reports, weighs)
		}
		if got := gs[1].env(0, "TORCHELASTIC_RESTART_COUNT"); got != "1" {
			t.Errorf("the restarted workers have TORCHELASTIC_RESTART_COUNT=%s, want 1", got)
		}
		// The failure was weighed for the whole grace: no node was lost.
		if d := gs[1].started.Sub(gs[0].started); d != time.Second+grace {
			t.Errorf("the group restarted %v after it started, want %v", d, time.Second+grace)
		}
	})
}

func TestAgentFailsTheElasticJobOnceTheSharedBudgetIsSpent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := &fakeWorkers{plan: func(start, slot int) plan {
			if slot == 1 {
				return plan{run: time.Second, code: 10 + start}
			}
			return plan{run: hour}
		}}
		f := newFakeElastic(1)
		res, err := newTestAgent(elasticSpec(t, 1, time.Second), f, w, nil).Run(t.Context())
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		mustStart(t, w, 2)
		// The job's result is the last round's failure, not the first's.
		if res.ExitCode != 11 || res.Restarts != 1 || len(res.Failures) != 1 || res.Failures[0].Rank != 1 || res.Failures[0].Round != 1 {
			t.Fatalf("result %+v, want rank 1's exit code 11 in round 1, after 1 restart", res)
		}
	})
}

func TestAgentRejoinsWhenTheRoundChanges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := &fakeWorkers{plan: func(start, _ int) plan {
			if start == 0 {
				return plan{run: hour}
			}
			return plan{run: time.Second}
		}}
		f := newFakeElastic(0)
		done := runAgent(t.Context(), newTestAgent(elasticSpec(t, 0, time.Second), f, w, nil))
		time.Sleep(5 * time.Second)
		f.endRound("node n2 on h2 waits to join")
		r := <-done
		mustSucceed(t, r.res, r.err, 0)
		gs := mustStart(t, w, 2)
		mustSend(t, gs[0], syscall.SIGTERM)
		if rounds, restarts, reports, _, _ := f.state(); rounds != 2 || restarts != 0 || reports != 0 {
			t.Fatalf("rounds %d, restarts %d, reports %d; want 2 rounds, no restart, no report", rounds, restarts, reports)
		}
	})
}

func TestAgentRunsAgainWhenTheRoundChangesAtTheExitBarrier(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := &fakeWorkers{plan: func(int, int) plan { return plan{run: time.Second} }}
		f := newFakeElastic(0)
		f.barrier = func(_ context.Context, n int) error {
			if n == 0 {
				return fmt.Errorf("%w: node n1 on h1 left", rendezvous.ErrRoundChanged)
			}
			return nil
		}
		res, err := newTestAgent(elasticSpec(t, 0, time.Second), f, w, nil).Run(t.Context())
		mustSucceed(t, res, err, 0)
		mustStart(t, w, 2)
		if rounds, _, _, _, _ := f.state(); rounds != 2 {
			t.Fatalf("rounds %d, want 2", rounds)
		}
	})
}

func TestAgentStopsOnASignalAtTheExitBarrier(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := &fakeWorkers{plan: func(int, int) plan { return plan{run: time.Second} }}
		f := newFakeElastic(0)
		atBarrier := make(chan struct{})
		f.barrier = func(ctx context.Context, _ int) error {
			close(atBarrier)
			<-ctx.Done() // the other node never arrives
			return ctx.Err()
		}
		signals := make(chan os.Signal, 1)
		done := runAgent(t.Context(), newTestAgent(elasticSpec(t, 0, time.Second), f, w, signals))
		<-atBarrier
		signals <- syscall.SIGINT
		r := <-done
		if r.err != nil || r.res.Interrupted != "SIGINT" || r.res.ExitCode != 128+int(syscall.SIGINT) {
			t.Fatalf("Run = %+v, %v; want interrupted by SIGINT", r.res, r.err)
		}
		if _, _, _, _, left := f.state(); !left {
			t.Fatal("the stopped agent did not leave the rendezvous")
		}
	})
}

// nodeEnd is how one node's agent ended, and when.
type nodeEnd struct {
	node  int
	after time.Duration
	runResult
}

// runStaticNodes runs an agent for each of len(plans) static nodes that
// share a store, node i's workers by plans[i]; it returns as each ended.
func runStaticNodes(t *testing.T, nproc int, plans []plan) ([]nodeEnd, []*fakeWorkers) {
	store := rendezvous.NewMemoryStore(time.Minute)
	start := time.Now()
	ends := make(chan nodeEnd, len(plans))
	workers := make([]*fakeWorkers, len(plans))
	for node, p := range plans {
		workers[node] = &fakeWorkers{plan: func(int, int) plan { return p }}
		spec := testSpec(t, nproc)
		spec.MinNodes, spec.MaxNodes, spec.NodeRank, spec.Host = len(plans), len(plans), node, fmt.Sprint("node", node)
		a := newTestAgent(spec, &staticHandler{store: store, rank: node, nodes: len(plans)}, workers[node], nil)
		go func() {
			r, err := a.Run(t.Context())
			ends <- nodeEnd{node, time.Since(start), runResult{r, err}}
		}()
	}
	var out []nodeEnd
	for range plans {
		out = append(out, <-ends)
	}
	return out, workers
}

func TestAgentWaitsAtTheExitBarrierForTheOtherNode(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Node 0's workers take 5 s, node 1's one.
		ends, workers := runStaticNodes(t, 2, []plan{{run: 5 * time.Second}, {run: time.Second}})
		for _, e := range ends {
			mustSucceed(t, e.res, e.err, 0)
			if e.after != 5*time.Second {
				t.Errorf("node %d returned after %v, want 5s: once both nodes' workers ended", e.node, e.after)
			}
		}
		if got := mustStart(t, workers[1], 1)[0].env(0, "RANK"); got != "2" {
			t.Errorf("node 1's first worker has RANK=%s, want 2", got)
		}
	})
}

func TestAgentOutOfRestartsOpensTheExitBarrier(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Node 1's workers succeed at 1 s and wait at the barrier; node
		// 0's fail at 2 s with no restart left: node 0 counts as
		// arrived, so node 1 need not wait out the barrier's minute.
		ends, _ := runStaticNodes(t, 1, []plan{{run: 2 * time.Second, code: 5}, {run: time.Second}})
		for _, e := range ends {
			if e.after != 2*time.Second {
				t.Errorf("node %d returned after %v, want 2s: when node 0's workers failed", e.node, e.after)
			}
			switch {
			case e.node == 1:
				mustSucceed(t, e.res, e.err, 0)
			case e.err != nil || e.res.ExitCode != 5:
				t.Errorf("node 0: Run = %+v, %v; want exit code 5", e.res, e.err)
			}
		}
	})
}

func TestAgentEndsWhenTheRendezvousDoes(t *testing.T) {
	storeGone := errors.New("store gone")
	tests := []struct {
		name     string
		join     func(n int) error
		starts   int
		want     *Result
		wantErr  string
		isRdzErr bool
	}{
		{name: "the job ended before this node got a place",
			join: func(int) error { return rendezvous.ErrJobEnded }, want: &Result{}},
		{name: "the store is gone at the first join",
			join: func(int) error { return storeGone }, wantErr: "store gone", isRdzErr: true},
		{name: "the store is gone at a rejoin", starts: 1,
			join: func(n int) error {
				if n > 0 {
					return storeGone
				}
				return nil
			}, wantErr: "elastic: cannot rejoin the job: store gone", isRdzErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				// The workers fail and restart, which rejoins.
				w := &fakeWorkers{plan: func(int, int) plan { return plan{run: time.Second, code: 1} }}
				f := newFakeElastic(3)
				f.join = tt.join
				res, err := newTestAgent(elasticSpec(t, 3, 0), f, w, nil).Run(t.Context())
				mustStart(t, w, tt.starts)
				var re *RendezvousError
				switch {
				case tt.wantErr == "" && (err != nil || !reflect.DeepEqual(res, tt.want)):
					t.Fatalf("Run = %+v, %v; want %+v", res, err, tt.want)
				case tt.wantErr != "" && (err == nil || err.Error() != tt.wantErr || errors.As(err, &re) != tt.isRdzErr || !errors.Is(err, storeGone)):
					t.Fatalf("Run = %+v, %v; want the rendezvous error %q", res, err, tt.wantErr)
				}
			})
		})
	}
}
