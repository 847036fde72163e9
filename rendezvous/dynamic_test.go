package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/rs/zerolog"
)

// Most tests run in a synctest bubble on an in-process store: the clock is
// fake, so torch's default timeouts (5 s heartbeats, 30 s last call,
// 10 min join timeout) cost nothing, and the bubble fails a test that
// leaves a goroutine behind. TestDynamicOverTCP and the scale test use a
// real Server, real clients and real time.

const hb = DefaultHeartbeatInterval

// testJob is one job's nodes, sharing a store.
type testJob struct {
	t testing.TB
	// store returns a node's own view of the store, or connection to it,
	// as each agent has its own; the node's handler closes it.
	store func() Store
	opts  DynamicOptions
}

func newTestJob(t testing.TB, minNodes, maxNodes int) *testJob {
	mem := NewMemoryStore(0)
	return &testJob{t: t, store: func() Store { return NewPrefixStore("", mem) }, opts: DynamicOptions{ElasticOptions: ElasticOptions{
		RunID:    "job",
		MinNodes: minNodes, MaxNodes: maxNodes,
		NodeRank: -1,
		Logger:   zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel),
	}}}
}

// tcpJob is a testJob whose nodes dial a Server on 127.0.0.1.
func tcpJob(t testing.TB, minNodes, maxNodes int) *testJob {
	_, addr, _ := startServer(t, ServerOptions{})
	job := newTestJob(t, minNodes, maxNodes)
	job.store = func() Store { return dialClient(t, addr, ClientOptions{Timeout: testTimeout}) }
	return job
}

// node returns the handler of node name, which Close ends with the test.
func (j *testJob) node(name string, edit ...func(*DynamicOptions)) *Dynamic {
	o := j.opts
	o.NodeID, o.Host = name, "host-"+name
	for _, e := range edit {
		e(&o)
	}
	d := NewDynamic(j.store(), o)
	j.t.Cleanup(func() {
		if err := d.Close(); err != nil {
			j.t.Errorf("close %s: %v", name, err)
		}
	})
	return d
}

func (j *testJob) nodes(names ...string) []*Dynamic {
	ds := make([]*Dynamic, len(names))
	for i, name := range names {
		ds[i] = j.node(name)
	}
	return ds
}

type nextResult struct {
	d     *Dynamic
	round *Round
	err   error
}

// startNext calls Next on every node at once; the results arrive in the
// order the calls return.
func startNext(nodes ...*Dynamic) <-chan nextResult {
	results := make(chan nextResult, len(nodes))
	for _, d := range nodes {
		go func() {
			round, err := d.Next(context.Background())
			results <- nextResult{d, round, err}
		}()
	}
	return results
}

// nextAll runs Next on every node at once and checks that all of them
// take part in one round, which it returns.
func nextAll(t testing.TB, nodes ...*Dynamic) int {
	t.Helper()
	results := startNext(nodes...)
	for range nodes {
		if r := <-results; r.err != nil {
			t.Fatalf("%s: Next: %v", r.d.opts.NodeID, r.err)
		}
	}
	return checkRound(t, nodes...)
}

// checkRound checks that nodes, and only they, form one round, and
// returns its number.
func checkRound(t testing.TB, nodes ...*Dynamic) int {
	t.Helper()
	first := nodes[0].Current()
	roster := participants(t, nodes[0])
	if len(roster) != len(nodes) {
		t.Fatalf("round %d has %d nodes, want %d", first.Number, len(roster), len(nodes))
	}
	for _, d := range nodes {
		ri := d.Current()
		if ri.Number != first.Number || ri.Restarts != first.Restarts || ri.GroupWorldSize != len(nodes) || ri.WorldSize != first.WorldSize {
			t.Fatalf("%s: round %+v; %s: round %+v", d.opts.NodeID, ri, nodes[0].opts.NodeID, first)
		}
		if n := roster[ri.GroupRank]; n.ID != d.opts.NodeID || n.FirstRank != ri.FirstRank {
			t.Fatalf("%s has group rank %d and first rank %d; the roster says %+v", d.opts.NodeID, ri.GroupRank, ri.FirstRank, n)
		}
	}
	return first.Number
}

// participants returns the nodes of d's round, in group-rank order.
func participants(t testing.TB, d *Dynamic) []NodeInfo {
	t.Helper()
	nodes, err := d.Nodes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return nodes
}

// order returns the node ids of d's round by group rank.
func order(t testing.TB, d *Dynamic) []string {
	t.Helper()
	var ids []string
	for _, n := range participants(t, d) {
		ids = append(ids, n.ID)
	}
	return ids
}

// awaitChanged waits for the round of d to be superseded, at most within,
// and returns how long it took and why.
func awaitChanged(t testing.TB, d *Dynamic, within time.Duration) (time.Duration, string) {
	t.Helper()
	start := time.Now()
	ri := d.Current()
	select {
	case <-ri.Changed():
		return time.Since(start), ri.Reason()
	case <-time.After(within):
		t.Fatalf("%s: round %d not superseded within %v", d.opts.NodeID, ri.Number, within)
		return 0, ""
	}
}

// kill stops the heartbeats of d without leaving: the node is dead to the
// others.
func kill(d *Dynamic) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stopWatchLocked()
}

func TestDynamicFirstRound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		job := newTestJob(t, 2, 3)
		nproc := map[string]int{"a": 2, "b": 1, "c": 4}
		var nodes []*Dynamic
		for _, name := range []string{"a", "b", "c"} {
			nodes = append(nodes, job.node(name, func(o *DynamicOptions) { o.NProc = nproc[name] }))
		}
		start := time.Now()
		results := startNext(nodes...)
		for range nodes {
			r := <-results
			if r.err != nil {
				t.Fatal(r.err)
			}
			ri := r.d.Current()
			if r.round.GroupRank != ri.GroupRank || r.round.GroupWorldSize != 3 {
				t.Errorf("%s: Round %+v, RoundInfo rank %d", r.d.opts.NodeID, r.round, ri.GroupRank)
			}
		}
		// Max nodes completes a round at once: no last call.
		if waited := time.Since(start); waited >= time.Second {
			t.Errorf("a full round took %v", waited)
		}
		checkRound(t, nodes...)
		ri := nodes[0].Current()
		if ri.Number != 0 || ri.Restarts != 0 || ri.WorldSize != 7 {
			t.Errorf("round %d, restarts %d, world size %d; want 0, 0, 7", ri.Number, ri.Restarts, ri.WorldSize)
		}
		first := 0
		for _, n := range participants(t, nodes[0]) {
			if n.NProc != nproc[n.ID] || n.FirstRank != first || n.Host != "host-"+n.ID {
				t.Errorf("node %+v: want nproc %d, first rank %d", n, nproc[n.ID], first)
			}
			first += n.NProc
		}
	})
}

func TestDynamicRequestedRanks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		job := newTestJob(t, 3, 3)
		var nodes []*Dynamic
		for name, rank := range map[string]int{"x": 2, "y": 0, "z": 1} {
			nodes = append(nodes, job.node(name, func(o *DynamicOptions) { o.NodeRank = rank }))
		}
		nextAll(t, nodes...)
		if got := order(t, nodes[0]); !slices.Equal(got, []string{"y", "z", "x"}) {
			t.Errorf("group-rank order %v, want the requested [y z x]", got)
		}
	})
}

func TestDynamicLastCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		job := newTestJob(t, 2, 3)
		nodes := job.nodes("a", "b")
		start := time.Now()
		nextAll(t, nodes...)
		// Min nodes gives latecomers the last call, then starts.
		waited := time.Since(start)
		if waited < DefaultLastCallTimeout || waited > DefaultLastCallTimeout+hb {
			t.Errorf("a round of min nodes started after %v, want the last call of %v", waited, DefaultLastCallTimeout)
		}
	})
}

func TestDynamicDeadNode(t *testing.T) {
	for _, heartbeats := range []string{"shared", "own"} {
		t.Run("heartbeat_store="+heartbeats, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				job := newTestJob(t, 2, 3)
				var nodes []*Dynamic
				for _, name := range []string{"a", "b", "c"} {
					nodes = append(nodes, job.node(name, func(o *DynamicOptions) {
						if heartbeats == "own" {
							o.HeartbeatStore = job.store()
						}
					}))
				}
				a, b, c := nodes[0], nodes[1], nodes[2]
				nextAll(t, a, b, c)
				before := order(t, a)

				kill(b)
				killed := time.Now()
				var seen []time.Duration
				for _, d := range []*Dynamic{a, c} {
					_, reason := awaitChanged(t, d, 10*hb)
					seen = append(seen, time.Since(killed))
					if want := "node b on host-b missed 3 heartbeats"; reason != want {
						t.Errorf("%s: reason %q, want %q", d.opts.NodeID, reason, want)
					}
				}
				t.Logf("a and c saw the death after %v", seen)
				// The node before b declares it dead after 3 intervals without a
				// change, of its clock, counted from the change it saw last
				// (1 interval before or after the death, at its ticks). The
				// others hear of it at once with their own heartbeat
				// connection, else at their next tick.
				spread := slices.Max(seen) - slices.Min(seen)
				if slices.Min(seen) < 2*hb || slices.Max(seen) > 5*hb || heartbeats == "own" && spread != 0 {
					t.Errorf("death seen after %v, want within 2-5 heartbeat intervals (at once by all with their own connection)", seen)
				}

				if r := nextAll(t, a, c); r != 1 {
					t.Errorf("round %d after the death, want 1", r)
				}
				want := slices.DeleteFunc(before, func(id string) bool { return id == "b" })
				if got := order(t, a); !slices.Equal(got, want) {
					t.Errorf("order %v after b died, want %v (was %v)", got, want, before)
				}
				if got := a.Current().Restarts; got != 0 {
					t.Errorf("a death spent %d restarts", got)
				}
			})
		})
	}
}

func TestDynamicNewNodeJoinsRunningJob(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		job := newTestJob(t, 2, 3)
		a, b, c := job.node("a"), job.node("b"), job.node("c")
		nextAll(t, a, b)
		before := order(t, a)

		late := startNext(c)
		for _, d := range []*Dynamic{a, b} {
			_, reason := awaitChanged(t, d, 2*hb)
			if !strings.HasPrefix(reason, "node c on host-c waits to join") {
				t.Errorf("%s: reason %q", d.opts.NodeID, reason)
			}
		}
		results := startNext(a, b)
		for range 3 {
			var r nextResult
			select {
			case r = <-late:
			case r = <-results:
			}
			if r.err != nil {
				t.Fatal(r.err)
			}
		}
		checkRound(t, a, b, c)
		if got, want := order(t, a), append(before, "c"); !slices.Equal(got, want) {
			t.Errorf("order %v, want %v", got, want)
		}
		if got := a.Current().Restarts; got != 0 {
			t.Errorf("a new node spent %d restarts", got)
		}
	})
}

func TestDynamicSpare(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		job := newTestJob(t, 2, 3)
		nodes := job.nodes("a", "b", "c", "d")
		results := startNext(nodes...)
		var running []*Dynamic
		for range 3 {
			r := <-results
			if r.err != nil {
				t.Fatal(r.err)
			}
			running = append(running, r.d)
		}
		checkRound(t, running...)
		spare := slices.DeleteFunc(slices.Clone(nodes), func(d *Dynamic) bool { return slices.Contains(running, d) })[0]

		// The spare does not disturb the round...
		select {
		case <-running[0].Current().Changed():
			t.Fatalf("a spare superseded the round: %s", running[0].Current().Reason())
		case <-time.After(10 * hb):
		}
		// ...and takes the place of a dead node.
		dead := running[1]
		kill(dead)
		survivors := []*Dynamic{running[0], running[2]}
		for _, d := range survivors {
			awaitChanged(t, d, 10*hb)
		}
		rejoined := startNext(survivors...)
		for _, ch := range []<-chan nextResult{results, rejoined, rejoined} {
			if r := <-ch; r.err != nil {
				t.Fatal(r.err)
			}
		}
		checkRound(t, append(survivors, spare)...)
		ri := spare.Current()
		if ri.Number != 1 || ri.Restarts != 0 || ri.GroupRank != 2 {
			t.Errorf("spare in round %d, restarts %d, group rank %d; want 1, 0, 2 (the newcomer last)", ri.Number, ri.Restarts, ri.GroupRank)
		}
	})
}

func TestDynamicFailSpendsGlobalBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		job := newTestJob(t, 2, 2)
		job.opts.MaxRestarts = 1
		a, b := job.node("a"), job.node("b")
		nextAll(t, a, b)

		if restart, err := a.Fail(context.Background(), []byte(`{"node":"a"}`+"\n")); err != nil || !restart {
			t.Fatalf("first Fail = %v, %v; want a restart", restart, err)
		}
		for _, d := range []*Dynamic{a, b} {
			if _, reason := awaitChanged(t, d, 2*hb); reason != "node a on host-a failed: restart 1 of 1" {
				t.Errorf("%s: reason %q", d.opts.NodeID, reason)
			}
		}
		nextAll(t, a, b)
		if got := b.Current().Restarts; got != 1 {
			t.Errorf("round after a failure: restarts %d, want 1", got)
		}

		if restart, err := b.Fail(context.Background(), []byte(`{"node":"b"}`)); err != nil || restart {
			t.Fatalf("second Fail = %v, %v; want the job failed", restart, err)
		}
		for _, d := range []*Dynamic{a, b} {
			_, reason := awaitChanged(t, d, 2*hb)
			if !strings.Contains(reason, "restart budget of 1 spent") {
				t.Errorf("%s: reason %q", d.opts.NodeID, reason)
			}
			_, err := d.Next(context.Background())
			if !errors.Is(err, ErrJobFailed) {
				t.Errorf("%s: Next after the job failed: %v", d.opts.NodeID, err)
			}
		}
		reports, err := a.Failures(context.Background())
		if err != nil || len(reports) != 2 || string(reports[0]) != `{"node":"a"}` || string(reports[1]) != `{"node":"b"}` {
			t.Errorf("Failures = %q, %v", reports, err)
		}
	})
}

func TestDynamicFailuresInOneRoundSpendOneRestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		job := newTestJob(t, 3, 3)
		job.opts.MaxRestarts = 5
		nodes := job.nodes("a", "b", "c")
		nextAll(t, nodes...)
		var wg sync.WaitGroup
		for _, d := range nodes {
			wg.Go(func() {
				if restart, err := d.Fail(context.Background(), []byte(`{}`)); err != nil || !restart {
					t.Errorf("%s: Fail = %v, %v", d.opts.NodeID, restart, err)
				}
			})
		}
		wg.Wait()
		nextAll(t, nodes...)
		if got := nodes[0].Current().Restarts; got != 1 {
			t.Errorf("three failures in one round spent %d restarts, want 1", got)
		}
	})
}

// AwaitAlive says within two heartbeats that every node lives, and never
// while one is dead.
func TestDynamicAwaitAlive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		job := newTestJob(t, 3, 3)
		nodes := job.nodes("a", "b", "c")
		nextAll(t, nodes...)
		start := time.Now()
		if ok := nodes[0].AwaitAlive(context.Background()); !ok {
			t.Fatalf("AwaitAlive = %v with every node alive", ok)
		}
		if waited := time.Since(start); waited > 2*hb+hb/5 {
			t.Errorf("took %s to see live nodes heartbeat twice (interval %s)", waited, hb)
		}

		kill(nodes[2])
		ctx, cancel := context.WithTimeout(context.Background(), 10*hb)
		defer cancel()
		if ok := nodes[0].AwaitAlive(ctx); ok {
			t.Errorf("AwaitAlive = %v with node c dead", ok)
		}
	})
}

// A node that ends the job waits for the nodes still weighing a failure,
// and no longer than its grace for one that never finishes.
func TestDynamicAwaitReports(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		job := newTestJob(t, 2, 2)
		nodes := job.nodes("a", "b")
		nextAll(t, nodes...)
		ctx := context.Background()
		end, err := nodes[1].Weigh(ctx)
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			time.Sleep(3 * time.Second)
			end()
		}()
		start := time.Now()
		if err := nodes[0].AwaitReports(ctx, time.Minute); err != nil {
			t.Fatal(err)
		}
		if waited := time.Since(start); waited < 3*time.Second || waited > 4*time.Second {
			t.Errorf("waited %s for a report that came after 3s", waited)
		}

		// b weighs and dies: a waits out its grace, then goes on.
		if _, err := nodes[1].Weigh(ctx); err != nil {
			t.Fatal(err)
		}
		start = time.Now()
		if err := nodes[0].AwaitReports(ctx, 20*time.Second); err != nil {
			t.Fatal(err)
		}
		if waited := time.Since(start); waited != 20*time.Second {
			t.Errorf("waited %s, want the grace of 20s", waited)
		}
	})
}

// A node that died weighing a failure holds up the reports of its own
// round only: when a later round fails the job, nobody waits for it.
func TestDynamicAwaitReportsForgetsEarlierRounds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		job := newTestJob(t, 1, 2)
		a, b := job.node("a"), job.node("b")
		nextAll(t, a, b)
		ctx := context.Background()
		if _, err := b.Weigh(ctx); err != nil {
			t.Fatal(err)
		}
		kill(b)
		awaitChanged(t, a, 10*hb)
		nextAll(t, a)
		if restart, err := a.Fail(ctx, []byte(`{"node":"a"}`)); err != nil || restart {
			t.Fatalf("Fail = %v, %v; want the job failed", restart, err)
		}
		start := time.Now()
		if err := a.AwaitReports(ctx, 20*time.Second); err != nil {
			t.Fatal(err)
		}
		if waited := time.Since(start); waited >= time.Second {
			t.Errorf("waited %s for a node that died weighing a failure of an earlier round", waited)
		}
	})
}

func TestDynamicDone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		job := newTestJob(t, 3, 3)
		nodes := job.nodes("a", "b", "c")
		nextAll(t, nodes...)
		var wg sync.WaitGroup
		for _, d := range nodes {
			wg.Go(func() {
				if err := d.Done(context.Background(), time.Minute); err != nil {
					t.Errorf("%s: Done: %v", d.opts.NodeID, err)
				}
			})
		}
		wg.Wait()
		// Success ends the job: a spare or a late node goes home.
		_, err := job.node("late").Next(context.Background())
		if !errors.Is(err, ErrJobEnded) {
			t.Errorf("Next after success: %v", err)
		}
	})
}

func TestDynamicDoneRacingFail(t *testing.T) {
	for _, tc := range []struct {
		maxRestarts int
		want        error
	}{
		{1, ErrRoundChanged},
		{0, ErrJobFailed},
	} {
		t.Run(fmt.Sprintf("max_restarts=%d", tc.maxRestarts), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				job := newTestJob(t, 2, 2)
				job.opts.MaxRestarts = tc.maxRestarts
				a, b := job.node("a"), job.node("b")
				nextAll(t, a, b)
				done := make(chan error)
				go func() { done <- a.Done(context.Background(), 0) }()
				synctest.Wait() // a is in the barrier
				if _, err := b.Fail(context.Background(), []byte(`{}`)); err != nil {
					t.Fatal(err)
				}
				if err := <-done; !errors.Is(err, tc.want) {
					t.Errorf("Done = %v, want %v", err, tc.want)
				}
			})
		})
	}
}

func TestDynamicDoneTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		job := newTestJob(t, 2, 2)
		a, b := job.node("a"), job.node("b")
		nextAll(t, a, b)
		err := a.Done(context.Background(), time.Minute)
		if want := "rendezvous: exit barrier timeout after 1m0s: 1 of 2 nodes finished round 0"; err == nil || err.Error() != want {
			t.Errorf("Done = %v, want %q", err, want)
		}
	})
}

func TestDynamicJoinTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		job := newTestJob(t, 2, 3)
		start := time.Now()
		_, err := job.node("a").Next(context.Background())
		if want := "rendezvous: join timeout after 10m0s: 1 of min 2 nodes joined round 0; missing: 1 node (up to 2)"; err == nil || err.Error() != want {
			t.Fatalf("Next = %v, want %q", err, want)
		}
		if !errors.Is(err, ErrJoinTimeout) {
			t.Errorf("%v is not ErrJoinTimeout", err)
		}
		if waited := time.Since(start); waited != DefaultJoinTimeout {
			t.Errorf("gave up after %v", waited)
		}
		// The node withdrew: the round it left does not hold a place for it.
		b, c := job.node("b"), job.node("c")
		nextAll(t, b, c)
		if n := b.Current().Number; n != 1 {
			t.Errorf("the next nodes met in round %d, want 1 (round 0 was voided)", n)
		}
	})
}

func TestDynamicSurvivorBelowMinTimesOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		job := newTestJob(t, 2, 2)
		a, b := job.node("a"), job.node("b")
		nextAll(t, a, b)
		kill(b)
		awaitChanged(t, a, 10*hb)
		_, err := a.Next(context.Background())
		if want := "rendezvous: join timeout after 10m0s: 1 of min 2 nodes joined round 1; missing: 1 node"; err == nil || err.Error() != want {
			t.Errorf("Next = %v, want %q", err, want)
		}
	})
}

func TestDynamicNextAgainOpensNewRound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		job := newTestJob(t, 2, 2)
		a, b := job.node("a"), job.node("b")
		nextAll(t, a, b)
		again := startNext(a)
		if _, reason := awaitChanged(t, b, 2*hb); reason != "node a on host-a asked for a new round" {
			t.Errorf("reason %q", reason)
		}
		if r := <-startNext(b); r.err != nil {
			t.Fatal(r.err)
		}
		if r := <-again; r.err != nil {
			t.Fatal(r.err)
		}
		if n := checkRound(t, a, b); n != 1 {
			t.Errorf("round %d, want 1", n)
		}
	})
}

func TestDynamicCloseLeavesShutdownEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		job := newTestJob(t, 2, 3)
		a, b, c := job.node("a"), job.node("b"), job.node("c")
		nextAll(t, a, b, c)

		// Ctrl-C on c: the others go on without it, told at their next tick.
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Next(context.Background()); !errors.Is(err, ErrHandlerClosed) {
			t.Errorf("Next after Close: %v", err)
		}
		for _, d := range []*Dynamic{a, b} {
			took, reason := awaitChanged(t, d, 2*hb)
			if reason != "node c on host-c left" || took > hb {
				t.Errorf("%s: reason %q after %v, want c's leaving within a heartbeat", d.opts.NodeID, reason, took)
			}
		}
		nextAll(t, a, b)

		// A deliberate end closes the rendezvous for all.
		if err := a.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		if _, reason := awaitChanged(t, b, 2*hb); reason != "job ended: node a on host-a shut it down" {
			t.Errorf("reason %q", reason)
		}
		for _, d := range []*Dynamic{b, job.node("d")} {
			_, err := d.Next(context.Background())
			if want := "rendezvous: job job has ended (job ended: node a on host-a shut it down)"; err == nil || err.Error() != want || !errors.Is(err, ErrJobEnded) {
				t.Errorf("%s: Next = %v, want %q", d.opts.NodeID, err, want)
			}
		}
	})
}

func TestDynamicCloseDuringJoin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		job := newTestJob(t, 2, 2)
		a := job.node("a")
		waiting := startNext(a)
		synctest.Wait() // a has joined round 0 and waits
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
		if r := <-waiting; !errors.Is(r.err, ErrHandlerClosed) {
			t.Errorf("Next interrupted by Close: %v", r.err)
		}
		// a withdrew, so b and c do not start a round with a ghost.
		b, c := job.node("b"), job.node("c")
		nextAll(t, b, c)
		if ids := order(t, b); slices.Contains(ids, "a") {
			t.Errorf("round %d includes the node that left: %v", b.Current().Number, ids)
		}
	})
}

func TestDynamicSpareReleasedByShutdown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		job := newTestJob(t, 1, 1)
		a, spare := job.node("a"), job.node("spare")
		nextAll(t, a)
		waiting := startNext(spare)
		synctest.Wait()
		if err := a.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		if r := <-waiting; !errors.Is(r.err, ErrJobEnded) {
			t.Errorf("spare's Next = %v, want ErrJobEnded", r.err)
		}
	})
}

func TestDynamicLostStore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		job := newTestJob(t, 2, 2)
		mem := NewMemoryStore(0)
		job.store = func() Store { return NewPrefixStore("", mem) }
		a, b := job.node("a"), job.node("b")
		nextAll(t, a, b)
		mem.Close()
		for _, d := range []*Dynamic{a, b} {
			took, reason := awaitChanged(t, d, 10*hb)
			if !strings.HasPrefix(reason, "lost the rendezvous store: ") || took > 4*hb {
				t.Errorf("%s: reason %q after %v", d.opts.NodeID, reason, took)
			}
		}
	})
}

func TestRoster(t *testing.T) {
	ds := []descriptor{
		{ID: "new", NProc: 1, Rank: -1, Since: [2]int{3, 0}},
		{ID: "old", NProc: 8, Rank: -1, Since: [2]int{0, 5}},
		{ID: "older", NProc: 2, Rank: -1, Since: [2]int{0, 1}},
	}
	nodes, rankOf := roster(ds)
	var got []string
	for _, n := range nodes {
		got = append(got, fmt.Sprintf("%s:%d:%d", n.ID, n.GroupRank, n.FirstRank))
	}
	if want := []string{"older:0:0", "old:1:2", "new:2:10"}; !slices.Equal(got, want) {
		t.Errorf("roster %v, want %v", got, want)
	}
	if !slices.Equal(rankOf, []int{2, 1, 0}) {
		t.Errorf("rankOf %v", rankOf)
	}
}

// TestDynamicOverTCP runs a job over our server with real clients, real
// time and short heartbeats: a death noticed, a new round, success.
func TestDynamicOverTCP(t *testing.T) {
	job := tcpJob(t, 2, 3)
	job.opts.HeartbeatInterval = 50 * time.Millisecond
	job.opts.LastCallTimeout = 100 * time.Millisecond
	a, b, c := job.node("a"), job.node("b"), job.node("c")
	nextAll(t, a, b, c)
	kill(b)
	for _, d := range []*Dynamic{a, c} {
		took, reason := awaitChanged(t, d, testTimeout)
		t.Logf("%s saw %q after %v", d.opts.NodeID, reason, took)
	}
	nextAll(t, a, c)
	var wg sync.WaitGroup
	for _, d := range []*Dynamic{a, c} {
		wg.Go(func() {
			if err := d.Done(context.Background(), testTimeout); err != nil {
				t.Errorf("%s: Done: %v", d.opts.NodeID, err)
			}
		})
	}
	wg.Wait()
}

// TestDynamicJoinScale is the default-size run of BenchmarkDynamicJoin.
func TestDynamicJoinScale(t *testing.T) {
	for _, store := range []string{"memory", "tcp"} {
		t.Run("store="+store, func(t *testing.T) {
			m := joinAtScale(t, store, 32, "scale")
			t.Logf("32 nodes met in %v with %.1f store requests per node", m.took, m.requests)
		})
	}
}

// BenchmarkDynamicJoin measures one round of n nodes, all joining at once
// (min = max = n, so no last call) against one store: in process, and over
// TCP with a connection per node, as real agents have (4,096 nodes hold
// 8,192 descriptors here, client and server side; each iteration closes
// its own). Each iteration is a new job. Beyond the round's wall time it
// reports the process's CPU time per round, which the machine's other
// load disturbs less:
//
//	go test -run '^$' -bench DynamicJoin -benchtime 3x ./rendezvous/
func BenchmarkDynamicJoin(b *testing.B) {
	for _, store := range []string{"memory", "tcp"} {
		for _, n := range []int{200, 1000, 4096} {
			b.Run(fmt.Sprintf("store=%s/nodes=%d", store, n), func(b *testing.B) {
				var total, cpu time.Duration
				var requests float64
				for i := range b.N {
					m := joinAtScale(b, store, n, fmt.Sprintf("bench-%d", i))
					total += m.took
					cpu += m.cpu
					requests += m.requests
				}
				b.ReportMetric(total.Seconds()*1e3/float64(b.N), "ms/round")
				b.ReportMetric(cpu.Seconds()*1e3/float64(b.N), "cpu-ms/round")
				b.ReportMetric(requests/float64(b.N), "requests/node")
				b.ReportMetric(0, "ns/op") // meaningless here: setup dominates
			})
		}
	}
}

// scaleRun is what joinAtScale measured of one round.
type scaleRun struct {
	took     time.Duration // from the first Next to the last return
	cpu      time.Duration // this process's CPU time in between
	requests float64       // store requests per node
}

// joinAtScale has n nodes of job runID meet once, on an in-process store
// or over TCP, and closes everything it opened before it returns, so that
// a benchmark's iterations do not pile up connections.
func joinAtScale(tb testing.TB, store string, n int, runID string) scaleRun {
	tb.Helper()
	var stores []Store
	switch store {
	case "memory":
		mem := NewMemoryStore(0)
		for range n {
			stores = append(stores, NewPrefixStore("", mem))
		}
	case "tcp":
		srv := NewServer(ServerOptions{Logger: zerolog.Nop()})
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		served := make(chan error, 1)
		go func() { served <- srv.Serve(l) }()
		defer func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := srv.Shutdown(ctx); err != nil {
				tb.Errorf("shutdown: %v", err)
			}
			<-served
		}()
		stores = dialAll(tb, l.Addr().String(), n)
	}
	var calls atomic.Int64
	nodes := make([]*Dynamic, n)
	for i := range nodes {
		name := fmt.Sprintf("n%04d", i)
		nodes[i] = NewDynamic(&countingStore{Store: stores[i], n: &calls}, DynamicOptions{
			ElasticOptions: ElasticOptions{
				RunID: runID, MinNodes: n, MaxNodes: n, NodeRank: -1,
				NodeID: name, Host: "host-" + name, Logger: zerolog.Nop(),
				JoinTimeout: 5 * time.Minute,
			},
			HeartbeatInterval: time.Minute, // quiet: joins only
		})
	}
	defer closeAll(tb, nodes)
	cpu0 := processCPU()
	start := time.Now()
	results := startNext(nodes...)
	for range nodes {
		if r := <-results; r.err != nil {
			tb.Fatalf("%s: Next: %v", r.d.opts.NodeID, r.err)
		}
	}
	m := scaleRun{took: time.Since(start), cpu: processCPU() - cpu0}
	checkRound(tb, nodes...)
	m.requests = float64(calls.Load()) / float64(n)
	return m
}

// dialAll dials n clients of addr, a few at a time.
func dialAll(tb testing.TB, addr string, n int) []Store {
	tb.Helper()
	stores := make([]Store, n)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for i := range stores {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			c, err := Dial(ctx, addr, ClientOptions{Timeout: time.Minute})
			if err != nil {
				errs <- err
				return
			}
			stores[i] = c
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		for _, s := range stores {
			if s != nil {
				s.Close()
			}
		}
		tb.Fatal(err)
	}
	return stores
}

// closeAll closes every node at once.
func closeAll(tb testing.TB, nodes []*Dynamic) {
	var wg sync.WaitGroup
	for _, d := range nodes {
		wg.Go(func() {
			if err := d.Close(); err != nil {
				tb.Errorf("close %s: %v", d.opts.NodeID, err)
			}
		})
	}
	wg.Wait()
}

// countingStore counts the requests made through it in n, which
// several may share.
type countingStore struct {
	Store
	n *atomic.Int64
}

func (c *countingStore) count() { c.n.Add(1) }

func (c *countingStore) Set(ctx context.Context, key string, value []byte) error {
	c.count()
	return c.Store.Set(ctx, key, value)
}

func (c *countingStore) Get(ctx context.Context, key string) ([]byte, error) {
	c.count()
	return c.Store.Get(ctx, key)
}

func (c *countingStore) Add(ctx context.Context, key string, delta int64) (int64, error) {
	c.count()
	return c.Store.Add(ctx, key, delta)
}

func (c *countingStore) CompareSet(ctx context.Context, key string, expected, desired []byte) ([]byte, error) {
	c.count()
	return c.Store.CompareSet(ctx, key, expected, desired)
}

func (c *countingStore) MultiGet(ctx context.Context, keys []string) ([][]byte, error) {
	c.count()
	return c.Store.MultiGet(ctx, keys)
}

// An agent stopped by a signal cancels Next and then leaves within a
// bound of its own: its arrival is withdrawn by Leave, not by Next, so
// the nodes that come next form a round without it.
func TestDynamicLeaveWithdrawsAnAbandonedJoin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		job := newTestJob(t, 3, 3)
		a, b := job.node("a"), job.node("b")
		waiting := startNext(b)
		ctx, cancel := context.WithCancel(context.Background())
		abandoned := make(chan error, 1)
		go func() {
			_, err := a.Next(ctx)
			abandoned <- err
		}()
		synctest.Wait() // a and b have joined round 0 and wait
		cancel()
		if err := <-abandoned; !errors.Is(err, context.Canceled) {
			t.Fatalf("abandoned Next = %v", err)
		}
		if err := a.Leave(ctxTimeout(t, time.Second)); err != nil {
			t.Fatal(err)
		}
		c, d := job.node("c"), job.node("d")
		late := startNext(c, d)
		for range 2 {
			if r := <-late; r.err != nil {
				t.Fatalf("%s: %v", r.d.opts.NodeID, r.err)
			}
		}
		if r := <-waiting; r.err != nil {
			t.Fatalf("b: %v", r.err)
		}
		if ids := order(t, b); slices.Contains(ids, "a") || len(ids) != 3 {
			t.Errorf("round %d: %v, want b, c and d", b.Current().Number, ids)
		}
	})
}

// The store's host leaving ends the job: a node waiting for a round wakes
// at once and learns why.
func TestDynamicHostLeavingEndsTheJob(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		job := newTestJob(t, 3, 3)
		host := job.node("host", func(o *DynamicOptions) { o.HostsStore = true })
		b := job.node("b")
		waiting := startNext(host, b)
		synctest.Wait() // both have joined round 0 and wait
		start := time.Now()
		if err := host.Close(); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			r := <-waiting
			if r.d == host {
				continue
			}
			want := "rendezvous: job job has ended (job ended: node host on host-host, which hosts the store, left)"
			if r.err == nil || r.err.Error() != want || !errors.Is(r.err, ErrJobEnded) {
				t.Errorf("b's Next = %v, want %q", r.err, want)
			}
			if took := time.Since(start); took > 0 {
				t.Errorf("b learned it after %v, want at once, not at its next look", took)
			}
		}
	})
}
