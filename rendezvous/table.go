package rendezvous

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"sync"
)

// table is the store's state and the one implementation of TCPStore's
// semantics (protocol §3); MemoryStore and every server connection act on
// it. Stored values are never mutated in place: a write replaces the slice,
// so readers may keep what they got without copying.
type table struct {
	mu       sync.Mutex
	values   map[string][]byte
	waiting  map[string][]*waiter // key -> registrations still missing it
	watchers map[string][]*watcher
	queues   map[string][][]byte // a namespace apart from values
}

func newTable() *table {
	return &table{
		values:   make(map[string][]byte),
		waiting:  make(map[string][]*waiter),
		watchers: make(map[string][]*watcher),
		queues:   make(map[string][][]byte),
	}
}

// waiter is a WAIT registration: a count of keys still missing, counted
// down as each of them is created.
type waiter struct {
	keys     []string // registered under these (repeats counted, as torch does)
	missing  int
	released bool          // fired or cancelled; guarded by table.mu
	done     chan struct{} // closed on release
}

// countDown notes the creation of one awaited key.
func (w *waiter) countDown() {
	w.missing--
	if w.missing == 0 {
		w.release()
	}
}

func (w *waiter) release() {
	w.released = true
	close(w.done)
}

// watchBacklog is how many 1.13 watch events may queue for a connection
// before it is deemed unable to keep up and dropped.
const watchBacklog = 1024

// watchEvent is one 1.13 watch notification.
type watchEvent struct {
	kind             byte
	key              string
	oldValue, newVal []byte
}

// watcher receives the events of the keys a 1.13 watch socket registered.
type watcher struct {
	events     chan watchEvent // closed by the table when it drops the watcher
	keys       []string
	overflowed bool // set before events is closed for a full backlog
	dropped    bool // guarded by table.mu
}

func newWatcher() *watcher {
	return &watcher{events: make(chan watchEvent, watchBacklog)}
}

// store writes value under key, then reports it to watchers and waiters as
// every successful write does. appended selects KEY_APPENDED over
// KEY_UPDATED for a key that existed.
func (t *table) store(key string, value []byte, appended bool) {
	old, existed := t.values[key]
	t.values[key] = value
	kind := keyCreated
	switch {
	case existed && appended:
		kind = keyAppended
	case existed:
		kind = keyUpdated
	}
	t.notify(kind, key, old, value)
	t.wakeAll(key)
}

// wakeAll counts the creation of key down on every waiter missing it.
func (t *table) wakeAll(key string) {
	ws, ok := t.waiting[key]
	if !ok {
		return
	}
	delete(t.waiting, key)
	for _, w := range ws {
		w.countDown()
	}
}

// wakeOne counts key down on its oldest waiter only, as a queue push
// makes one value available.
func (t *table) wakeOne(key string) {
	ws := t.waiting[key]
	if len(ws) == 0 {
		return
	}
	if len(ws) == 1 {
		delete(t.waiting, key)
	} else {
		t.waiting[key] = ws[1:]
	}
	ws[0].countDown()
}

func (t *table) notify(kind byte, key string, old, value []byte) {
	var overflowed []*watcher
	for _, w := range t.watchers[key] {
		select {
		case w.events <- watchEvent{kind: kind, key: key, oldValue: old, newVal: value}:
		default:
			overflowed = append(overflowed, w)
		}
	}
	for _, w := range overflowed {
		w.overflowed = true
		t.dropWatcher(w)
	}
}

func (t *table) set(key string, value []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.store(key, value, false)
}

func (t *table) multiSet(keys []string, values [][]byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i, k := range keys {
		t.store(k, values[i], false)
	}
}

func (t *table) append(key string, value []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.store(key, slices.Concat(t.values[key], value), true)
}

func (t *table) get(key string) ([]byte, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	v, ok := t.values[key]
	return v, ok
}

// multiGet returns the values of keys, or false when one is missing.
func (t *table) multiGet(keys []string) ([][]byte, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.lookupLocked(keys)
}

func (t *table) lookupLocked(keys []string) ([][]byte, bool) {
	values := make([][]byte, len(keys))
	for i, k := range keys {
		v, ok := t.values[k]
		if !ok {
			return nil, false
		}
		values[i] = v
	}
	return values, true
}

// add adds delta to the integer under key (missing counts as 0), stores
// the sum in decimal and returns it. The sum wraps on overflow, as torch's
// int64 arithmetic does in practice.
func (t *table) add(key string, delta int64) (int64, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if old, ok := t.values[key]; ok {
		n, err := parseStoll(old)
		if err != nil {
			return 0, err
		}
		delta += n
	}
	t.store(key, strconv.AppendInt(nil, delta, 10), false)
	return delta, nil
}

// compareSet is torch's compare_set, including its reply of expected for
// a missing key. Creating the key wakes its waiters, as torch's libuv
// server does (1.13's does not).
func (t *table) compareSet(key string, expected, desired []byte) []byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	current, ok := t.values[key]
	switch {
	case !ok && len(expected) == 0:
		t.store(key, desired, false)
		return desired
	case !ok:
		return expected
	case bytes.Equal(current, expected):
		t.store(key, desired, false)
		return desired
	default:
		return current
	}
}

// delete removes key and reports whether it existed. It wakes nobody.
func (t *table) delete(key string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	old, ok := t.values[key]
	if ok {
		delete(t.values, key)
		t.notify(keyDeleted, key, old, nil)
	}
	return ok
}

func (t *table) numKeys() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return int64(len(t.values))
}

// list returns every key, sorted.
func (t *table) list() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	keys := make([]string, 0, len(t.values))
	for k := range t.values {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// exists is CHECK's notion of a key: a value, or a non-empty queue.
func (t *table) exists(key string) bool {
	if _, ok := t.values[key]; ok {
		return true
	}
	return len(t.queues[key]) > 0
}

func (t *table) check(keys []string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, k := range keys {
		if !t.exists(k) {
			return false
		}
	}
	return true
}

// wait returns nil when every key exists, else a waiter that is released
// once each missing key has been created. A caller giving up must cancel
// it.
func (t *table) wait(keys []string) *waiter {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.registerLocked(keys, t.exists)
}

// lookup returns the values of keys when they all exist, else a waiter for
// the missing ones.
func (t *table) lookup(keys []string) ([][]byte, *waiter) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if values, ok := t.lookupLocked(keys); ok {
		return values, nil
	}
	return nil, t.registerLocked(keys, func(k string) bool {
		_, ok := t.values[k]
		return ok
	})
}

func (t *table) registerLocked(keys []string, present func(string) bool) *waiter {
	var w *waiter
	for _, k := range keys {
		if present(k) {
			continue
		}
		if w == nil {
			w = &waiter{done: make(chan struct{})}
		}
		w.keys = append(w.keys, k)
		t.waiting[k] = append(t.waiting[k], w)
	}
	if w != nil {
		w.missing = len(w.keys)
	}
	return w
}

// cancel withdraws w and reports whether it was still pending; false means
// it has fired (or was cancelled before).
func (t *table) cancel(w *waiter) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if w.released {
		return false
	}
	for _, k := range w.keys {
		ws := slices.DeleteFunc(t.waiting[k], func(x *waiter) bool { return x == w })
		if len(ws) == 0 {
			delete(t.waiting, k)
		} else {
			t.waiting[k] = ws
		}
	}
	w.release()
	return true
}

// watch makes w receive the events of key.
func (t *table) watch(key string, w *watcher) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if w.dropped {
		return
	}
	w.keys = append(w.keys, key)
	t.watchers[key] = append(t.watchers[key], w)
}

// unwatch stops w's events and closes its channel.
func (t *table) unwatch(w *watcher) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.dropWatcher(w)
}

func (t *table) dropWatcher(w *watcher) {
	if w.dropped {
		return
	}
	w.dropped = true
	for _, k := range w.keys {
		ws := slices.DeleteFunc(t.watchers[k], func(x *watcher) bool { return x == w })
		if len(ws) == 0 {
			delete(t.watchers, k)
		} else {
			t.watchers[k] = ws
		}
	}
	close(w.events)
}

func (t *table) queuePush(key string, value []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.queues[key] = append(t.queues[key], value)
	t.wakeOne(key)
}

// queuePop removes the head of key's queue. It returns the queue's length
// before the pop, which is what torch replies; the value only when that
// length is positive.
func (t *table) queuePop(key string) (int64, []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	q := t.queues[key]
	if len(q) == 0 {
		return 0, nil
	}
	if len(q) == 1 {
		delete(t.queues, key)
	} else {
		t.queues[key] = q[1:]
	}
	return int64(len(q)), q[0]
}

func (t *table) queueLen(key string) int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return int64(len(t.queues[key]))
}

// pendingWaits counts registrations still waiting; tests use it to know a
// remote WAIT has arrived.
func (t *table) pendingWaits() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	seen := make(map[*waiter]bool)
	for _, ws := range t.waiting {
		for _, w := range ws {
			seen[w] = true
		}
	}
	return len(seen)
}

// parseStoll parses b as C++'s std::stoll(s, nullptr, 10), which torch's
// ADD applies to the stored value: leading white space, an optional sign,
// then the longest run of decimal digits; whatever follows is ignored
// ("12abc" is 12, "0x10" is 0). No digits, or a value out of int64's range,
// is an error, on which torch's server closes the connection.
func parseStoll(b []byte) (int64, error) {
	i := 0
	for i < len(b) && isCSpace(b[i]) {
		i++
	}
	signed := i
	if i < len(b) && (b[i] == '+' || b[i] == '-') {
		i++
	}
	digits := i
	for i < len(b) && '0' <= b[i] && b[i] <= '9' {
		i++
	}
	if i == digits {
		return 0, fmt.Errorf("rendezvous: stored value %s is not an integer", quoteValue(b))
	}
	n, err := strconv.ParseInt(string(b[signed:i]), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("rendezvous: stored value %s is out of int64's range", quoteValue(b))
	}
	return n, nil
}

// isCSpace is C's isspace in the "C" locale.
func isCSpace(c byte) bool {
	return c == ' ' || ('\t' <= c && c <= '\r')
}

// quoteValue quotes a value for an error message, truncating long ones.
func quoteValue(b []byte) string {
	const max = 32
	if len(b) > max {
		return fmt.Sprintf("%q…", b[:max])
	}
	return fmt.Sprintf("%q", b)
}
