package rendezvous

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/rs/zerolog"
)

func TestMissingNodes(t *testing.T) {
	d := func(host string, rank int) descriptor { return descriptor{Host: host, Rank: rank} }
	for _, tc := range []struct {
		name     string
		there    []descriptor
		expected []string
		min, max int
		want     []string
	}{
		{name: "ranks asked", there: []descriptor{d("a", 0)}, min: 2, max: 2, want: []string{"node rank 1"}},
		{name: "ranks out of order", there: []descriptor{d("a", 2), d("b", 0)}, min: 4, max: 4,
			want: []string{"node rank 1", "node rank 3"}},
		{name: "a node asks none", there: []descriptor{d("a", 0), d("b", -1)}, min: 3, max: 3},
		{name: "rank beyond max", there: []descriptor{d("a", 5)}, min: 2, max: 2},
		{name: "elastic range: ranks say nothing", there: []descriptor{d("a", 0)}, min: 1, max: 2},
		{name: "hosts expected", there: []descriptor{d("gpu2", -1)}, expected: []string{"gpu1", "gpu2", "gpu3"},
			min: 1, max: 3, want: []string{"gpu1", "gpu3"}},
		{name: "a host twice", there: []descriptor{d("h", -1)}, expected: []string{"h", "h"},
			min: 2, max: 2, want: []string{"h"}},
		{name: "hosts by rank", there: []descriptor{d("gpu1.example", 0)}, expected: []string{"gpu1", "gpu2"},
			min: 2, max: 2, want: []string{"gpu2 (node rank 1)"}},
		{name: "hosts by rank, not all known", there: []descriptor{d("a", 0)}, expected: []string{"a", "b"},
			min: 3, max: 3, want: []string{"node rank 1", "node rank 2"}},
		{name: "hosts by name when a node asks no rank", there: []descriptor{d("h", 0), d("g", -1)}, expected: []string{"h", "g", "f"},
			min: 3, max: 3, want: []string{"f"}},
		{name: "everyone there", there: []descriptor{d("a", 1), d("b", 0)}, min: 2, max: 2},
	} {
		var hosts []string
		var ranks []int
		for _, d := range tc.there {
			hosts, ranks = append(hosts, d.Host), append(ranks, d.Rank)
		}
		got := MissingNodes(hosts, ranks, tc.expected, tc.min, tc.max)
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: MissingNodes = %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestWaitingMissingText(t *testing.T) {
	for _, tc := range []struct {
		w    Waiting
		want string
	}{
		{Waiting{Joined: 1, Min: 2, Max: 2, Missing: []string{"node rank 1"}}, "node rank 1"},
		{Waiting{Joined: 1, Min: 3, Max: 3, Missing: []string{"gpu1", "gpu3"}}, "gpu1, gpu3"},
		{Waiting{Joined: 1, Min: 2, Max: 2}, "1 node"},
		{Waiting{Joined: 1, Min: 4, Max: 4}, "3 nodes"},
		{Waiting{Joined: 1, Min: 2, Max: 5}, "1 node (up to 4)"},
		{Waiting{Joined: 2, Min: 2, Max: 4}, "none (up to 2 nodes more may join)"},
		{Waiting{Joined: 3, Min: 2, Max: 4}, "none (up to 1 node more may join)"},
		{Waiting{Joined: 4, Min: 2, Max: 4}, "none"},
	} {
		if got := tc.w.MissingText(); got != tc.want {
			t.Errorf("%+v: MissingText = %q, want %q", tc.w, got, tc.want)
		}
	}
}

func TestMissingNamesAndRanks(t *testing.T) {
	if got, want := MissingRanks(3, []int{1, 1}), []string{"node rank 0", "node rank 2"}; !slices.Equal(got, want) {
		t.Errorf("MissingRanks = %q, want %q", got, want)
	}
	if got := MissingRanks(2, []int{0, 1}); got != nil {
		t.Errorf("MissingRanks of everyone = %q, want none", got)
	}
	if got, want := MissingNames([]string{"a", "b", "a"}, []string{"a", "c"}), []string{"b", "a"}; !slices.Equal(got, want) {
		t.Errorf("MissingNames = %q, want %q", got, want)
	}
}

func TestProgressDue(t *testing.T) {
	start := time.Unix(1000, 0)
	for _, tc := range []struct {
		last, want time.Time
	}{
		{time.Time{}, start.Add(FirstProgress)},
		{start.Add(3 * time.Second), start.Add(3*time.Second + ProgressPeriod)},
	} {
		if got := NextProgress(start, tc.last); !got.Equal(tc.want) {
			t.Errorf("NextProgress(start, %v) = %v, want %v", tc.last, got, tc.want)
		}
	}
}

func TestWaitingLog(t *testing.T) {
	var buf bytes.Buffer
	w := Waiting{Joined: 1, Names: []string{"gpu1"}, Missing: []string{"node rank 1"}, Min: 2, Max: 2,
		Left: 9*time.Minute + 50*time.Second + 400*time.Millisecond, Until: "join timeout"}
	w.Log(zerolog.New(&buf))
	for _, want := range []string{`"level":"info"`, `"joined":1`, `"min":2`, `"max":2`, `"nodes":"gpu1"`,
		`"missing":"node rank 1"`, `"left":"9m50s"`, `"until":"join timeout"`, `"message":"waiting for nodes"`} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("report %s lacks %s", buf.String(), want)
		}
	}
}

// lockedBuffer collects a logger's lines from any goroutine.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) lines() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Split(strings.TrimSpace(b.buf.String()), "\n")
}

// A node waiting for a round reports who is there and who is not after
// FirstProgress, then every ProgressPeriod, each report one read, and its
// join timeout names the nodes missing; a round that forms at once says
// nothing.
func TestDynamicProgress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		job := newTestJob(t, 3, 3)
		var logs lockedBuffer
		job.opts.Logger = zerolog.New(&logs)
		job.opts.JoinTimeout = 20 * time.Second
		a := job.node("a", func(o *DynamicOptions) { o.NodeRank = 2 })
		b := job.node("b", func(o *DynamicOptions) { o.NodeRank = 0 })
		start := time.Now()
		done := make(chan error)
		go func() {
			_, err := a.Next(context.Background())
			done <- err
		}()
		go func() {
			_, err := b.Next(context.Background())
			done <- err
		}()
		time.Sleep(FirstProgress + time.Millisecond) // synctest's fake clock
		synctest.Wait()
		var reports []string
		for _, l := range logs.lines() {
			if strings.Contains(l, "waiting for nodes") {
				reports = append(reports, l)
			}
		}
		if len(reports) != 2 {
			t.Fatalf("%d reports after %v, want one per node:\n%s", len(reports), FirstProgress, strings.Join(logs.lines(), "\n"))
		}
		for _, want := range []string{`"joined":2`, `"min":3`, `"missing":"node rank 1"`, `"left":"18s"`, `"until":"join timeout"`} {
			if !strings.Contains(reports[0], want) {
				t.Errorf("report %s lacks %s", reports[0], want)
			}
		}
		if !strings.Contains(reports[0], `"nodes":"host-a, host-b"`) && !strings.Contains(reports[0], `"nodes":"host-b, host-a"`) {
			t.Errorf("report %s does not name host-a and host-b", reports[0])
		}
		// The first node out voids the round; the other then finds itself
		// alone in the next one, at the same deadline.
		named := false
		for range 2 {
			err := <-done
			if err == nil || !errors.Is(err, ErrJoinTimeout) || !strings.Contains(err.Error(), "; missing: ") {
				t.Errorf("Next = %v, want a join timeout naming the nodes missing", err)
				continue
			}
			named = named || strings.HasSuffix(err.Error(), "2 of min 3 nodes joined round 0; missing: node rank 1")
		}
		if !named {
			t.Error("no join timeout named node rank 1 as the only node missing of round 0")
		}
		if waited := time.Since(start); waited != 20*time.Second {
			t.Errorf("gave up after %v", waited)
		}
		n := 0
		for _, l := range logs.lines() {
			if strings.Contains(l, "waiting for nodes") {
				n++
			}
		}
		// 2.5 s, 7.5 s, 12.5 s, 17.5 s: four reports per node.
		if n != 8 {
			t.Errorf("%d reports in 20 s of two nodes, want 8", n)
		}

		// Everyone there at once: no report.
		job2 := newTestJob(t, 2, 2)
		var logs2 lockedBuffer
		job2.opts.Logger = zerolog.New(&logs2)
		nextAll(t, job2.node("c"), job2.node("d"))
		if s := strings.Join(logs2.lines(), "\n"); strings.Contains(s, "waiting for nodes") {
			t.Errorf("a round that formed at once reported progress:\n%s", s)
		}
	})
}
