package elastic

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/gorun/gorun/launcher"
	"github.com/gorun/gorun/rendezvous"
)

// The agent's tests drive it through Options with the fakes here: worker
// groups that are goroutines (Options.StartGroup) and rendezvous handlers
// over an in-memory store, so that testing/synctest's clock runs the job.

// plan is how one fake worker behaves: it exits with code after run,
// unless a signal ends it first (128+signal); notices are noted and
// ignored, and so is SIGTERM when it ignoresTerm.
type plan struct {
	run         time.Duration
	code        int
	ignoresTerm bool
}

// fakeWorkers starts fake groups by plan, and remembers each start.
type fakeWorkers struct {
	// plan tells how the worker in slot behaves in the start-th start.
	plan func(start, slot int) plan

	mu     sync.Mutex
	groups []*fakeGroup
}

func (w *fakeWorkers) start(specs []launcher.WorkerSpec, opts launcher.GroupOptions) (WorkerGroup, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	g := &fakeGroup{specs: specs, now: opts.Now, started: opts.Now(), exits: make(chan launcher.Exit, len(specs)), done: make(chan struct{})}
	var running sync.WaitGroup
	for slot, s := range specs {
		p := w.plan(len(w.groups), slot)
		sigs := make(chan syscall.Signal, 8)
		g.inbox = append(g.inbox, sigs)
		running.Go(func() { g.exits <- g.run(s, p, sigs) })
	}
	go func() {
		running.Wait()
		close(g.exits)
		close(g.done)
	}()
	w.groups = append(w.groups, g)
	return g, nil
}

// started returns the groups started so far.
func (w *fakeWorkers) started() []*fakeGroup {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.groups)
}

// fakeGroup is a WorkerGroup of goroutines.
type fakeGroup struct {
	specs   []launcher.WorkerSpec
	now     func() time.Time
	started time.Time
	exits   chan launcher.Exit
	done    chan struct{}
	inbox   []chan syscall.Signal // by slot

	mu      sync.Mutex
	signals []syscall.Signal // what Signal and Stop sent, in order
}

func (g *fakeGroup) run(s launcher.WorkerSpec, p plan, sigs <-chan syscall.Signal) launcher.Exit {
	e := launcher.Exit{LocalRank: s.LocalRank, Rank: s.Rank, Pid: fakePid(s.LocalRank)}
	t := time.NewTimer(p.run)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			e.ExitCode = p.code
		case sig := <-sigs:
			if isNotice(sig) || (sig == syscall.SIGTERM && p.ignoresTerm) {
				continue
			}
			e.ExitCode, e.Signal = 128+int(sig), sig
		}
		e.Time = g.now()
		return e
	}
}

// fakePid is a pid no process has: the board and the timeline only
// record it.
func fakePid(slot int) int { return 1<<22 + slot }

func (g *fakeGroup) Exits() <-chan launcher.Exit { return g.exits }

func (g *fakeGroup) Pids() []int {
	pids := make([]int, len(g.specs))
	for i := range pids {
		pids[i] = fakePid(i)
	}
	return pids
}

func (g *fakeGroup) Signal(sig syscall.Signal) error {
	g.mu.Lock()
	g.signals = append(g.signals, sig)
	g.mu.Unlock()
	for _, in := range g.inbox {
		select {
		case in <- sig:
		default:
		}
	}
	return nil
}

func (g *fakeGroup) SignalWorker(slot int, sig syscall.Signal) error {
	g.inbox[slot] <- sig
	return nil
}

// Stop is launcher.Group's: sig, grace, then SIGKILL.
func (g *fakeGroup) Stop(sig syscall.Signal, grace time.Duration) {
	_ = g.Signal(sig)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-g.done:
		return
	case <-t.C:
	}
	_ = g.Signal(syscall.SIGKILL)
	<-g.done
}

// sent returns the signals the agent sent the group.
func (g *fakeGroup) sent() []syscall.Signal {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.signals)
}

// env returns the value of key in slot's environment.
func (g *fakeGroup) env(slot int, key string) string {
	v, _ := envValue(g.specs[slot].Env, key)
	return v
}

// staticHandler is a static rendezvous over an in-memory store: node
// rank of nodes, the store shared with the other nodes' handlers.
type staticHandler struct {
	store       rendezvous.Store
	rank, nodes int
}

func (h *staticHandler) Next(context.Context) (*rendezvous.Round, error) {
	return &rendezvous.Round{Store: h.store, GroupRank: h.rank, GroupWorldSize: h.nodes, StoreHost: "127.0.0.1", StorePort: 29500}, nil
}
func (h *staticHandler) Leave(context.Context) error { return nil }
func (h *staticHandler) Close() error                { return nil }

// fakeElastic is an elastic rendezvous of two nodes, of which the test
// plays the other: it ends rounds (endRound), decides when the other node
// is seen alive, and answers the exit barrier (barrier). Like Dynamic, it
// spends a restart on the first failure of a round still current, and
// nothing on a round already superseded.
type fakeElastic struct {
	store       rendezvous.Store
	maxRestarts int
	// barrier answers Done, the n-th call (from 0); nil = every node
	// succeeded.
	barrier func(ctx context.Context, n int) error
	// join, when set, may refuse the n-th Next (from 0).
	join func(n int) error
	// weighing receives once per Weigh call.
	weighing chan struct{}

	mu       sync.Mutex
	round    *rendezvous.RoundInfo
	rounds   int
	restarts int
	reports  [][]byte
	weighs   int // Weigh calls whose end was called
	dones    int
	left     bool
}

var _ rendezvous.Elastic = (*fakeElastic)(nil)

func newFakeElastic(maxRestarts int) *fakeElastic {
	return &fakeElastic{store: rendezvous.NewMemoryStore(time.Minute), maxRestarts: maxRestarts, weighing: make(chan struct{}, 8)}
}

func (f *fakeElastic) Next(ctx context.Context) (*rendezvous.Round, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.join != nil {
		if err := f.join(f.rounds); err != nil {
			return nil, err
		}
	}
	if f.round != nil {
		f.round.End("this node rejoins")
	}
	f.round = rendezvous.NewRoundInfo(f.rounds, f.restarts, 0, 2, 0, 4)
	f.rounds++
	// Each round's store is the round's alone.
	store := rendezvous.NewPrefixStore("round/"+strconv.Itoa(f.rounds), f.store)
	return &rendezvous.Round{Store: store, GroupRank: 0, GroupWorldSize: 2, StoreHost: "127.0.0.1"}, nil
}

func (f *fakeElastic) Current() *rendezvous.RoundInfo {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.round
}

// endRound supersedes the current round, as a lost node would.
func (f *fakeElastic) endRound(reason string) { f.Current().End(reason) }

func (f *fakeElastic) Fail(ctx context.Context, report []byte) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reports = append(f.reports, report)
	if f.round.Reason() != "" {
		return true, nil // superseded: spends nothing
	}
	if f.restarts >= f.maxRestarts {
		return false, nil
	}
	f.restarts++
	f.round.End("a node's workers failed")
	return true, nil
}

func (f *fakeElastic) Weigh(context.Context) (func(), error) {
	f.weighing <- struct{}{}
	return func() {
		f.mu.Lock()
		f.weighs++
		f.mu.Unlock()
	}, nil
}

// AwaitAlive: the other node never shows it is alive; the grace decides.
func (f *fakeElastic) AwaitAlive(ctx context.Context) bool {
	<-ctx.Done()
	return false
}

func (f *fakeElastic) AwaitReports(context.Context, time.Duration) error { return nil }

func (f *fakeElastic) Failures(context.Context) ([][]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.reports), nil
}

func (f *fakeElastic) Nodes(context.Context) ([]rendezvous.NodeInfo, error) { return nil, nil }

func (f *fakeElastic) Done(ctx context.Context, timeout time.Duration) error {
	f.mu.Lock()
	n := f.dones
	f.dones++
	f.mu.Unlock()
	if f.barrier == nil {
		return nil
	}
	return f.barrier(ctx, n)
}

func (f *fakeElastic) Leave(context.Context) error {
	f.mu.Lock()
	f.left = true
	f.mu.Unlock()
	return nil
}

func (f *fakeElastic) Close() error { return nil }

// state reads what the fake counted.
func (f *fakeElastic) state() (rounds, restarts, reports, weighs int, left bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rounds, f.restarts, len(f.reports), f.weighs, f.left
}
