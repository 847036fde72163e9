package rendezvous

import (
	"bytes"
	"math"
	"strconv"
	"testing"
)

func TestParseStoll(t *testing.T) {
	for _, tc := range []struct {
		in    string
		want  int64
		fails bool
	}{
		{in: "12abc", want: 12},
		{in: "  7", want: 7},
		{in: "\t\n\v\f\r 7", want: 7},
		{in: "+4", want: 4},
		{in: "-4", want: -4},
		{in: "0x10", want: 0},
		{in: "007", want: 7},
		{in: "5\x006", want: 5},
		{in: "9223372036854775807", want: math.MaxInt64},
		{in: "-9223372036854775808", want: math.MinInt64},
		{in: "", fails: true},
		{in: "P", fails: true},
		{in: "+", fails: true},
		{in: " -x", fails: true},
		{in: "99999999999999999999", fails: true},
		{in: "-9223372036854775809", fails: true},
	} {
		got, err := parseStoll([]byte(tc.in))
		if tc.fails {
			if err == nil {
				t.Errorf("parseStoll(%q) = %d, want an error", tc.in, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("parseStoll(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
}

func TestTableAdd(t *testing.T) {
	tbl := newTable()
	for _, tc := range []struct {
		stored string
		want   int64
	}{
		{"12abc", 13}, {"  7", 8}, {"+4", 5}, {"0x10", 1},
		{strconv.FormatInt(math.MaxInt64, 10), math.MinInt64}, // wraps
	} {
		_ = tbl.set(local, "k", []byte(tc.stored))
		got, err := tbl.add(local, "k", 1)
		if err != nil || got != tc.want {
			t.Errorf("add 1 to %q = %d, %v; want %d", tc.stored, got, err, tc.want)
		}
		if v, _ := tbl.get("k"); string(v) != strconv.FormatInt(tc.want, 10) {
			t.Errorf("after add to %q the key holds %q", tc.stored, v)
		}
	}
	for _, bad := range []string{"", "P", "99999999999999999999"} {
		_ = tbl.set(local, "k", []byte(bad))
		if _, err := tbl.add(local, "k", 1); err == nil {
			t.Errorf("add to %q succeeded", bad)
		}
		if v, _ := tbl.get("k"); string(v) != bad {
			t.Errorf("failed add changed %q to %q", bad, v)
		}
	}
	if n, err := tbl.add(local, "missing", -3); n != -3 || err != nil {
		t.Errorf("add to a missing key = %d, %v; want -3", n, err)
	}
}

func TestTableCompareSet(t *testing.T) {
	for _, tc := range []struct {
		name              string
		stored            *string
		expected, desired string
		reply, wantStored string
		wantExists        bool
	}{
		{name: "missing, empty expected: created", expected: "", desired: "new", reply: "new", wantStored: "new", wantExists: true},
		{name: "missing, empty desired: created empty", expected: "", desired: "", reply: "", wantStored: "", wantExists: true},
		{name: "missing, expected given: reply expected", expected: "old", desired: "new", reply: "old"},
		{name: "present, matching", stored: ptr("old"), expected: "old", desired: "new", reply: "new", wantStored: "new", wantExists: true},
		{name: "present, not matching", stored: ptr("cur"), expected: "old", desired: "new", reply: "cur", wantStored: "cur", wantExists: true},
		{name: "present empty, empty expected", stored: ptr(""), expected: "", desired: "new", reply: "new", wantStored: "new", wantExists: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tbl := newTable()
			if tc.stored != nil {
				_ = tbl.set(local, "k", []byte(*tc.stored))
			}
			if got, _ := tbl.compareSet(local, "k", []byte(tc.expected), []byte(tc.desired)); string(got) != tc.reply {
				t.Errorf("reply %q, want %q", got, tc.reply)
			}
			v, ok := tbl.get("k")
			if ok != tc.wantExists || string(v) != tc.wantStored {
				t.Errorf("stored %q (exists %v), want %q (exists %v)", v, ok, tc.wantStored, tc.wantExists)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// TestTableWakeUps covers which writes count as a key's creation.
func TestTableWakeUps(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write func(*table)
		wakes bool
	}{
		{"set", func(t *table) { _ = t.set(local, "k", []byte("v")) }, true},
		{"add", func(t *table) { _, _ = t.add(local, "k", 1) }, true},
		{"append", func(t *table) { _ = t.append(local, "k", []byte("v")) }, true},
		{"multi_set", func(t *table) { _ = t.multiSet(local, []string{"x", "k"}, [][]byte{nil, nil}) }, true},
		{"compare_set creating", func(t *table) { _, _ = t.compareSet(local, "k", nil, []byte("v")) }, true},
		{"compare_set failing", func(t *table) { _, _ = t.compareSet(local, "k", []byte("x"), []byte("v")) }, false},
		{"delete", func(t *table) { t.delete("k") }, false},
		{"other key", func(t *table) { _ = t.set(local, "other", nil) }, false},
		{"queue_push", func(t *table) { _ = t.queuePush(local, "k", []byte("v")) }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tbl := newTable()
			w := tbl.wait([]string{"k"})
			if w == nil {
				t.Fatal("wait on a missing key returned ready")
			}
			tc.write(tbl)
			if fired := isDone(w); fired != tc.wakes {
				t.Fatalf("fired = %v, want %v", fired, tc.wakes)
			}
			if cancelled := tbl.cancel(w); cancelled == tc.wakes {
				t.Errorf("cancel after the write = %v", cancelled)
			}
			if n := tbl.pendingWaits(); n != 0 {
				t.Errorf("%d waits left registered", n)
			}
		})
	}
}

func isDone(w *waiter) bool {
	select {
	case <-w.done:
		return true
	default:
		return false
	}
}

func TestTableWaitCountsMissingKeys(t *testing.T) {
	tbl := newTable()
	_ = tbl.set(local, "a", nil)
	if w := tbl.wait(nil); w != nil {
		t.Fatal("a wait on no keys must be ready at once")
	}
	if w := tbl.wait([]string{"a"}); w != nil {
		t.Fatal("a wait on present keys must be ready at once")
	}
	w := tbl.wait([]string{"a", "b", "c", "b"})
	_ = tbl.set(local, "b", nil)
	if isDone(w) {
		t.Fatal("fired with c missing")
	}
	_ = tbl.set(local, "b", nil) // a second write is no second creation
	tbl.delete("a")              // nor does a delete count
	if isDone(w) {
		t.Fatal("fired with c missing")
	}
	_ = tbl.set(local, "c", nil)
	if !isDone(w) {
		t.Fatal("not fired once every key exists")
	}
}

func TestTableQueues(t *testing.T) {
	tbl := newTable()
	if n, v := tbl.queuePop("q"); n != 0 || v != nil {
		t.Fatalf("pop of an empty queue = %d, %q", n, v)
	}
	w1 := tbl.wait([]string{"q"})
	w2 := tbl.wait([]string{"q"})
	_ = tbl.queuePush(local, "q", []byte("one"))
	if !isDone(w1) || isDone(w2) {
		t.Fatalf("a push must wake exactly the oldest waiter: %v %v", isDone(w1), isDone(w2))
	}
	if !tbl.check([]string{"q"}) {
		t.Error("a non-empty queue counts as existing for check")
	}
	_ = tbl.queuePush(local, "q", []byte("two"))
	if !isDone(w2) {
		t.Fatal("the second push must wake the second waiter")
	}
	if n := tbl.queueLen("q"); n != 2 {
		t.Fatalf("queue_len = %d", n)
	}
	if n, v := tbl.queuePop("q"); n != 2 || string(v) != "one" {
		t.Fatalf("pop = %d, %q; want 2, one", n, v)
	}
	if _, ok := tbl.get("q"); ok {
		t.Error("queues are a namespace apart from keys")
	}
	if n, v := tbl.queuePop("q"); n != 1 || string(v) != "two" {
		t.Fatalf("pop = %d, %q; want 1, two", n, v)
	}
	if tbl.check([]string{"q"}) {
		t.Error("an empty queue does not exist")
	}
}

func TestTableWatchEvents(t *testing.T) {
	tbl := newTable()
	w := newWatcher()
	_ = tbl.watch(local, "k", w)
	_ = tbl.set(local, "k", []byte("one"))
	_ = tbl.set(local, "k", []byte("two"))
	_ = tbl.append(local, "k", []byte("+"))
	_, _ = tbl.add(local, "n", 1) // not watched
	_, _ = tbl.compareSet(local, "k", []byte("two+"), []byte("3"))
	tbl.delete("k")
	tbl.unwatch(w)
	want := []watchEvent{
		{kind: keyCreated, key: "k", newVal: []byte("one")},
		{kind: keyUpdated, key: "k", oldValue: []byte("one"), newVal: []byte("two")},
		{kind: keyAppended, key: "k", oldValue: []byte("two"), newVal: []byte("two+")},
		{kind: keyUpdated, key: "k", oldValue: []byte("two+"), newVal: []byte("3")},
		{kind: keyDeleted, key: "k", oldValue: []byte("3")},
	}
	var got []watchEvent
	for ev := range w.events {
		got = append(got, ev)
	}
	if len(got) != len(want) {
		t.Fatalf("got %d events, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.kind != w.kind || g.key != w.key || !bytes.Equal(g.oldValue, w.oldValue) || !bytes.Equal(g.newVal, w.newVal) {
			t.Errorf("event %d = %+v, want %+v", i, g, w)
		}
	}
}

func TestTableWatchOverflowDropsWatcher(t *testing.T) {
	tbl := newTable()
	w := newWatcher()
	_ = tbl.watch(local, "k", w)
	for i := 0; i <= watchBacklog; i++ {
		_ = tbl.set(local, "k", nil)
	}
	n := 0
	for range w.events {
		n++
	}
	if !w.overflowed || n != watchBacklog {
		t.Fatalf("overflowed = %v after %d events", w.overflowed, n)
	}
	_ = tbl.set(local, "k", nil) // no send on the closed channel
}
