package etcd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/etcdtest"
	"github.com/gorun/gorun/rendezvous"
)

// testOptions are short timings for node n of a 2:3 job.
func testOptions(run string, n int) Options {
	return Options{
		ElasticOptions: rendezvous.ElasticOptions{
			RunID: run, MinNodes: 2, MaxNodes: 3, NodeID: fmt.Sprintf("n%d", n), Host: "h", NProc: 2, NodeRank: -1,
			LastCallTimeout: 500 * time.Millisecond, JoinTimeout: 20 * time.Second, CloseTimeout: 2 * time.Second,
			MaxRestarts: 1,
		},
		LeaseTTL: 2 * time.Second, RequestTimeout: 5 * time.Second,
	}
}

func newHandler(t *testing.T, c *etcdtest.Cluster, o Options) *Handler {
	t.Helper()
	cli, err := Dial(c.Endpoints(), nil)
	if err != nil {
		t.Fatal(err)
	}
	h := New(cli, o)
	t.Cleanup(func() { h.Close() })
	return h
}

// nextAll runs Next on every handler at once.
func nextAll(t *testing.T, hs []*Handler) []*rendezvous.Round {
	t.Helper()
	rounds := make([]*rendezvous.Round, len(hs))
	errs := make([]error, len(hs))
	var wg sync.WaitGroup
	for i, h := range hs {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			rounds[i], errs[i] = h.Next(ctx)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return rounds
}

func awaitChanged(t *testing.T, ri *rendezvous.RoundInfo, within time.Duration) string {
	t.Helper()
	select {
	case <-ri.Changed():
		return ri.Reason()
	case <-time.After(within):
		t.Fatalf("round %d did not change within %v", ri.Number, within)
		return ""
	}
}

func TestRoundsOnEtcd(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	hs := []*Handler{
		newHandler(t, c, testOptions("rounds", 0)),
		newHandler(t, c, testOptions("rounds", 1)),
		newHandler(t, c, testOptions("rounds", 2)),
	}
	rounds := nextAll(t, hs)
	seen := map[int]bool{}
	for i, rd := range rounds {
		ri := hs[i].Current()
		if rd.GroupWorldSize != 3 || ri.WorldSize != 6 || ri.FirstRank != 2*rd.GroupRank {
			t.Fatalf("node %d: round %+v, info %+v", i, rd, ri)
		}
		seen[rd.GroupRank] = true
	}
	if len(seen) != 3 {
		t.Fatalf("group ranks %v, want 0, 1, 2", seen)
	}
	// The round's store is shared: group rank 0 publishes, others read.
	ctx := context.Background()
	if err := rounds[0].Store.Set(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if v, err := rounds[2].Store.Get(ctx, "k"); err != nil || string(v) != "v" {
		t.Fatalf("Get = %q, %v", v, err)
	}

	// Node 0 dies without a word: its client stops, its lease lapses.
	dead := hs[0]
	dead.quit()
	dead.cli.Close()
	start := time.Now()
	for _, h := range hs[1:] {
		reason := awaitChanged(t, h.Current(), 3*h.opts.LeaseTTL)
		if !strings.Contains(reason, "n0 on h is gone") {
			t.Fatalf("reason %q, want node n0 gone", reason)
		}
	}
	t.Logf("a lost node was noticed after %v (lease TTL %v)", time.Since(start), hs[1].opts.LeaseTTL)
	before := []int{hs[1].Current().GroupRank, hs[2].Current().GroupRank}
	rounds = nextAll(t, hs[1:])
	if rounds[0].GroupWorldSize != 2 || rounds[0].GroupRank == rounds[1].GroupRank {
		t.Fatalf("re-formed rounds: %+v %+v", rounds[0], rounds[1])
	}
	// The survivors keep their order, whichever arrived first this time.
	if (before[0] < before[1]) != (rounds[0].GroupRank < rounds[1].GroupRank) {
		t.Fatalf("group ranks %v became %d, %d", before, rounds[0].GroupRank, rounds[1].GroupRank)
	}

	// A failure spends the job's one restart; the next spends the rest.
	restart, err := hs[1].Fail(ctx, []byte(`{"rank":2}`))
	if err != nil || !restart {
		t.Fatalf("Fail = %v, %v; want a restart", restart, err)
	}
	awaitChanged(t, hs[2].Current(), 5*time.Second)
	nextAll(t, hs[1:])
	if r := hs[1].Current(); r.Restarts != 1 {
		t.Fatalf("restarts %d, want 1", r.Restarts)
	}
	// The exit barrier: both finish; the job ends for later joiners.
	errs := make(chan error, 2)
	for _, h := range hs[1:] {
		go func() { errs <- h.Done(ctx, 10*time.Second) }()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatalf("Done: %v", err)
		}
	}
	late := newHandler(t, c, testOptions("rounds", 9))
	if _, err := late.Next(ctx); !errors.Is(err, rendezvous.ErrJobEnded) {
		t.Fatalf("Next after the job: %v, want ErrJobEnded", err)
	}
	fs, err := late.Failures(ctx)
	if err != nil || len(fs) != 1 || string(fs[0]) != `{"rank":2}` {
		t.Fatalf("Failures = %q, %v", fs, err)
	}
}

func TestBudgetSpent(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	o0, o1 := testOptions("budget", 0), testOptions("budget", 1)
	o0.MaxRestarts, o1.MaxRestarts = 0, 0
	hs := []*Handler{newHandler(t, c, o0), newHandler(t, c, o1)}
	nextAll(t, hs)
	ctx := context.Background()
	end, err := hs[1].Weigh(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// hs[0] weighs too: hs[1] hears that every other node is alive.
	end0, err := hs[0].Weigh(ctx)
	if err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	if !hs[1].AwaitAlive(actx) {
		t.Fatal("AwaitAlive: false while every node weighs")
	}
	cancel()
	if restart, err := hs[0].Fail(ctx, []byte(`{"rank":0}`)); err != nil || restart {
		t.Fatalf("Fail = %v, %v; want the job failed", restart, err)
	}
	end0()
	// hs[1] still weighs: AwaitReports waits for it, out to its timeout...
	const grace = 300 * time.Millisecond
	start := time.Now()
	if err := hs[0].AwaitReports(ctx, grace); err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(start); waited < grace {
		t.Fatalf("AwaitReports returned after %v while a node weighs, before its timeout of %v", waited, grace)
	}
	// ...or until its report.
	reported := make(chan error, 1)
	go func() { reported <- hs[0].AwaitReports(ctx, 10*time.Second) }()
	hs[1].Fail(ctx, []byte(`{"rank":3}`))
	end()
	if err := <-reported; err != nil {
		t.Fatal(err)
	}
	fs, _ := hs[0].Failures(ctx)
	if len(fs) != 2 {
		t.Fatalf("failures %q, want both nodes'", fs)
	}
	if _, err := hs[1].Next(ctx); !errors.Is(err, rendezvous.ErrJobFailed) {
		t.Fatalf("Next: %v, want ErrJobFailed", err)
	}
}

func TestLeaveAndLateJoiner(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	hs := []*Handler{newHandler(t, c, testOptions("leave", 0)), newHandler(t, c, testOptions("leave", 1))}
	nextAll(t, hs)
	// A late joiner opens a new round for everyone.
	late := newHandler(t, c, testOptions("leave", 2))
	got := make(chan error, 1)
	go func() {
		_, err := late.Next(context.Background())
		got <- err
	}()
	reason := awaitChanged(t, hs[0].Current(), 10*time.Second)
	if !strings.Contains(reason, "waits to join") {
		t.Fatalf("reason %q", reason)
	}
	nextAll(t, hs)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if n := hs[0].Current().GroupWorldSize; n != 3 {
		t.Fatalf("round of %d, want 3", n)
	}
	// Leave: the others go on at once, without a lease TTL.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := late.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	reason = awaitChanged(t, hs[1].Current(), time.Second)
	if !strings.Contains(reason, "n2 on h left") {
		t.Fatalf("reason %q", reason)
	}
}

func TestEtcdDown(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	eps := c.Endpoints()
	for _, m := range c.Members {
		c.Kill(m)
	}
	cli, err := Dial(eps, nil)
	if err != nil {
		t.Fatal(err)
	}
	o := testOptions("down", 0)
	o.RequestTimeout = time.Second
	h := New(cli, o)
	defer h.Close()
	_, err = h.Next(context.Background())
	if err == nil || !strings.Contains(err.Error(), "no answer from a quorum of etcd members") {
		t.Fatalf("Next with etcd down: %v", err)
	}
}

func TestTLS(t *testing.T) {
	certs := etcdtest.NewCerts(t, "127.0.0.1")
	c := etcdtest.Start(t, etcdtest.Options{Members: 1, TLS: certs})
	cfg, err := TLSConfig(certs.CA, certs.ClientCert, certs.ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	var hs []*Handler
	for i := range 2 {
		cli, err := Dial(c.Endpoints(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		o := testOptions("tls", i)
		o.MaxNodes = 2
		h := New(cli, o)
		t.Cleanup(func() { h.Close() })
		hs = append(hs, h)
	}
	nextAll(t, hs)
	// Without the client certificate the members refuse.
	noCert, _ := TLSConfig(certs.CA, "", "")
	cli, _ := Dial(c.Endpoints(), noCert)
	o := testOptions("tls", 5)
	o.RequestTimeout = 2 * time.Second
	h := New(cli, o)
	defer h.Close()
	if _, err := h.Next(context.Background()); err == nil {
		t.Fatal("joined without a client certificate")
	}
}

// A node that finds the round full waits as a spare, and takes the place
// of a node that leaves.
func TestSpare(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	opts := func(n int) Options {
		o := testOptions("spare", n)
		o.MaxNodes = 2
		return o
	}
	hs := []*Handler{newHandler(t, c, opts(0)), newHandler(t, c, opts(1))}
	nextAll(t, hs)
	spare := newHandler(t, c, opts(2))
	got := make(chan error, 1)
	go func() {
		_, err := spare.Next(context.Background())
		got <- err
	}()
	// The spare must not disturb the full round.
	select {
	case <-hs[0].Current().Changed():
		t.Fatalf("a spare changed the full round: %s", hs[0].Current().Reason())
	case err := <-got:
		t.Fatalf("the spare got a place in a full round: %v", err)
	case <-time.After(time.Second):
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := hs[1].Leave(ctx); err != nil {
		t.Fatal(err)
	}
	awaitChanged(t, hs[0].Current(), 5*time.Second)
	nextAll(t, hs[:1])
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if n := spare.Current().GroupWorldSize; n != 2 {
		t.Fatalf("the spare's round has %d nodes, want 2", n)
	}
}
