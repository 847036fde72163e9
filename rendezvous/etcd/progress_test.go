package etcd

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun/gorun/internal/etcdtest"
	"github.com/gorun/gorun/rendezvous"
)

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// A node waiting on etcd reports who is there and which expected hosts are
// not, and its join timeout names them.
func TestProgressOnEtcd(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	var logs lockedBuffer
	o := testOptions("progress", 0)
	o.MinNodes, o.MaxNodes, o.Host = 3, 3, "ha"
	o.Expected = []string{"ha", "hb", "hc"}
	o.JoinTimeout = 4 * time.Second
	o.Logger = zerolog.New(&logs)
	h := newHandler(t, c, o)
	start := time.Now()
	_, err := h.Next(context.Background())
	if want := "rendezvous: join timeout after 4s: 1 of min 3 nodes joined round 0; missing: hb, hc"; err == nil ||
		err.Error() != want || !errors.Is(err, rendezvous.ErrJoinTimeout) {
		t.Errorf("Next = %v, want %q", err, want)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("gave up after %v", took)
	}
	out := logs.String()
	for _, want := range []string{`"message":"waiting for nodes"`, `"joined":1`, `"nodes":"ha"`, `"missing":"hb, hc"`, `"until":"join timeout"`} {
		if !strings.Contains(out, want) {
			t.Errorf("no report with %s:\n%s", want, out)
		}
	}
}

// In a round of more than rendezvous.NamedReportNodes, a waiting node
// other than the first reports what it read last: the reports of 70
// nodes cost etcd a few reads, not one per node per report.
func TestProgressOfALargeRoundReadsLittle(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	const nodes = rendezvous.NamedReportNodes + 6
	var logs lockedBuffer
	hs := make([]*Handler, nodes)
	for i := range hs {
		o := testOptions("large", i)
		o.MinNodes, o.MaxNodes = nodes+1, nodes+1 // one never comes
		o.JoinTimeout = 12 * time.Second
		o.Logger = zerolog.New(&logs)
		hs[i] = newHandler(t, c, o)
	}
	errs := make(chan error, nodes)
	for _, h := range hs {
		go func() {
			_, err := h.Next(context.Background())
			errs <- err
		}()
	}
	reports := func() int { return strings.Count(logs.String(), `"message":"waiting for nodes"`) }
	// Every node's first report (at 2.5 s) is made; then count the reads
	// until every node's second (at 7.5 s).
	if !waitUntil(10*time.Second, func() bool { return reports() >= nodes }) {
		t.Fatalf("%d reports, want %d:\n%s", reports(), nodes, logs.String())
	}
	before := reads(t, c)
	if !waitUntil(10*time.Second, func() bool { return reports() >= 2*nodes }) {
		t.Fatalf("%d reports, want %d", reports(), 2*nodes)
	}
	if n := reads(t, c) - before; n > 10 {
		t.Errorf("the second reports of %d nodes cost etcd %d reads, want a few (the first arrival's)", nodes, n)
	}
	if !strings.Contains(logs.String(), `"counted_ago":"`) {
		t.Errorf("no report says how old its count is:\n%s", logs.String())
	}
	for range hs {
		if err := <-errs; !errors.Is(err, rendezvous.ErrJoinTimeout) {
			t.Errorf("Next = %v, want a join timeout", err)
		}
	}
}

// reads counts the reads (Range and Txn requests) etcd has taken.
func reads(t *testing.T, c *etcdtest.Cluster) int {
	t.Helper()
	counts, err := c.Requests()
	if err != nil {
		t.Fatal(err)
	}
	return counts["Range"] + counts["Txn"]
}

// waitUntil polls cond until it holds or within passes.
func waitUntil(within time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}
