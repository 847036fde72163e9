package rendezvous

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
)

// table is the store's state and the one implementation of TCPStore's
// semantics (protocol §3); MemoryStore and every server connection act on
// it. Stored values are never mutated where a reader can see: a write
// replaces the slice, and an append writes only past the length any reader
// was given, so readers may keep what they got without copying.
//
// Everything the table holds is charged to mem. Operations take an origin:
// a remote client's write that does not fit is refused with ErrOverBudget,
// the in-process store's is charged regardless.
type table struct {
	mu       sync.Mutex
	values   map[string][]byte
	waiting  map[string]*waitList // key -> registrations still missing it
	watchers map[string][]*watcher
	queues   map[string][][]byte // a namespace apart from values
	nWaiters int                 // registrations not yet released

	mem         *budget
	maxValueLen int // bounds APPEND's result; 0: unbounded
}

// origin says whose request an operation serves.
type origin bool

const (
	local  origin = false // the process hosting the store: charged, never refused
	remote origin = true  // a client: refused past the budget
)

func newTable() *table {
	return &table{
		values:   make(map[string][]byte),
		waiting:  make(map[string]*waitList),
		watchers: make(map[string][]*watcher),
		queues:   make(map[string][][]byte),
		mem:      newBudget(0),
	}
}

// charge accounts delta bytes for a write by o; false refuses it.
func (t *table) charge(o origin, delta int64) bool {
	if delta <= 0 || o == local {
		t.mem.force(delta)
		return true
	}
	return t.mem.reserve(delta, delta > largeWrite)
}

func valueCost(key string, value []byte) int64 {
	return int64(entryCost + len(key) + cap(value))
}

// waiter is a WAIT registration: a count of keys still missing, counted
// down as each of them is created. It costs O(keys) and no goroutine: a
// release closes done (in-process waits) or calls fire (connections).
type waiter struct {
	nodes    []waitNode // one per missing key (repeats counted, as torch does)
	missing  int
	released bool          // fired or cancelled; guarded by table.mu
	done     chan struct{} // closed on release, if not nil
	fire     func(*waiter) // called under table.mu on release, if not nil
	cost     int64
}

// waitNode links a waiter into the list of one key's waiters, so that
// cancelling it is O(1) per key however many others wait on the key.
type waitNode struct {
	w          *waiter
	key        string
	prev, next *waitNode
	linked     bool
}

// waitList is a key's waiters, oldest first.
type waitList struct{ head, tail *waitNode }

func (l *waitList) push(n *waitNode) {
	n.prev, n.next, n.linked = l.tail, nil, true
	if l.tail != nil {
		l.tail.next = n
	} else {
		l.head = n
	}
	l.tail = n
}

func (l *waitList) remove(n *waitNode) {
	if n.prev != nil {
		n.prev.next = n.next
	} else {
		l.head = n.next
	}
	if n.next != nil {
		n.next.prev = n.prev
	} else {
		l.tail = n.prev
	}
	n.prev, n.next, n.linked = nil, nil, false
}

// countDown notes the creation of one awaited key.
func (t *table) countDown(w *waiter) {
	w.missing--
	if w.missing == 0 {
		t.release(w)
	}
}

func (t *table) release(w *waiter) {
	w.released = true
	t.nWaiters--
	t.mem.release(w.cost)
	if w.done != nil {
		close(w.done)
	}
	if w.fire != nil {
		w.fire(w)
	}
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
	cost       int64
}

func newWatcher() *watcher {
	return &watcher{events: make(chan watchEvent, watchBacklog)}
}

// store writes value under key, then reports it to watchers and waiters as
// every successful write does. appended selects KEY_APPENDED over
// KEY_UPDATED for a key that existed. The caller has charged the change
// of cost (storeCost).
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

// storeCost is what storing value under key adds to the budget.
func (t *table) storeCost(key string, value []byte) int64 {
	delta := valueCost(key, value)
	if old, ok := t.values[key]; ok {
		delta -= valueCost(key, old)
	}
	return delta
}

// put charges and stores one write.
func (t *table) put(o origin, key string, value []byte, appended bool) error {
	if !t.charge(o, t.storeCost(key, value)) {
		return ErrOverBudget
	}
	t.store(key, value, appended)
	return nil
}

// wakeAll counts the creation of key down on every waiter missing it.
func (t *table) wakeAll(key string) {
	l, ok := t.waiting[key]
	if !ok {
		return
	}
	delete(t.waiting, key)
	for n := l.head; n != nil; {
		next := n.next
		n.prev, n.next, n.linked = nil, nil, false
		t.countDown(n.w)
		n = next
	}
}

// wakeOne counts key down on its oldest waiter only, as a queue push
// makes one value available.
func (t *table) wakeOne(key string) {
	l, ok := t.waiting[key]
	if !ok {
		return
	}
	n := l.head
	t.unlink(n)
	t.countDown(n.w)
}

// unlink takes n out of its key's list.
func (t *table) unlink(n *waitNode) {
	l := t.waiting[n.key]
	l.remove(n)
	if l.head == nil {
		delete(t.waiting, n.key)
	}
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

func (t *table) set(o origin, key string, value []byte) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.put(o, key, value, false)
}

// multiSet stores every pair, or none when they do not fit together.
func (t *table) multiSet(o origin, keys []string, values [][]byte) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	// Charge the change to each distinct key's final value; a key given
	// twice is stored twice but ends with its last value.
	final := make(map[string][]byte, len(keys))
	for i, k := range keys {
		final[k] = values[i]
	}
	var delta int64
	for k, v := range final {
		delta += t.storeCost(k, v)
	}
	if !t.charge(o, delta) {
		return ErrOverBudget
	}
	for i, k := range keys {
		t.store(k, values[i], false)
	}
	return nil
}

// errValueTooLarge refuses an APPEND whose result would pass the value cap.
var errValueTooLarge = errors.New("rendezvous: appended value over the value length limit")

// append adds value to the end of key's value, creating it. It is
// amortised O(len(value)): the stored slice grows by doubling, up to the
// value cap, and bytes are written only past the length any reader holds.
// When it must grow, it copies outside the lock, so that a large value
// does not stall other clients, and retries if the key changed meanwhile.
func (t *table) append(o origin, key string, value []byte) error {
	t.mu.Lock()
	for {
		old := t.values[key]
		n := len(old) + len(value)
		if t.maxValueLen > 0 && n > t.maxValueLen {
			t.mu.Unlock()
			return errValueTooLarge
		}
		if n <= cap(old) {
			err := t.put(o, key, append(old, value...), true)
			t.mu.Unlock()
			return err
		}
		newCap := max(n, 2*cap(old))
		if t.maxValueLen > 0 {
			newCap = min(newCap, t.maxValueLen)
		}
		t.mu.Unlock()

		grown := make([]byte, len(old), newCap)
		copy(grown, old)

		t.mu.Lock()
		cur := t.values[key]
		if len(cur) == len(old) && (len(old) == 0 || &cur[0] == &old[0]) {
			err := t.put(o, key, append(grown, value...), true)
			t.mu.Unlock()
			return err
		}
		// Written meanwhile: start over from the new value.
	}
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
func (t *table) add(o origin, key string, delta int64) (int64, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if old, ok := t.values[key]; ok {
		n, err := parseStoll(old)
		if err != nil {
			return 0, err
		}
		delta += n
	}
	if err := t.put(o, key, strconv.AppendInt(nil, delta, 10), false); err != nil {
		return 0, err
	}
	return delta, nil
}

// compareSet is torch's compare_set, including its reply of expected for
// a missing key. Creating the key wakes its waiters, as torch's libuv
// server does (1.13's does not).
func (t *table) compareSet(o origin, key string, expected, desired []byte) ([]byte, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	current, ok := t.values[key]
	switch {
	case !ok && len(expected) == 0:
		return desired, t.put(o, key, desired, false)
	case !ok:
		return expected, nil
	case bytes.Equal(current, expected):
		return desired, t.put(o, key, desired, false)
	default:
		return current, nil
	}
}

// delete removes key and reports whether it existed. It wakes nobody.
func (t *table) delete(key string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	old, ok := t.values[key]
	if ok {
		delete(t.values, key)
		t.mem.release(valueCost(key, old))
		t.notify(keyDeleted, key, old, nil)
	}
	return ok
}

func (t *table) numKeys() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return int64(len(t.values))
}

// list returns every key, sorted. Only the copy is made under the lock,
// a few milliseconds for millions of keys; the sort is not. A remote
// caller's copy is charged while it lives and refused if it does not fit;
// release it with the returned cost.
func (t *table) list(o origin) ([]string, int64, error) {
	t.mu.Lock()
	cost := int64(len(t.values)) * keyHeaderCost
	if !t.charge(o, cost) {
		t.mu.Unlock()
		return nil, 0, ErrOverBudget
	}
	keys := make([]string, 0, len(t.values))
	for k := range t.values {
		keys = append(keys, k)
	}
	t.mu.Unlock()
	slices.Sort(keys)
	return keys, cost, nil
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

// wait returns nil when every key exists, else a waiter whose done is
// closed once each missing key has been created. A caller giving up must
// cancel it.
func (t *table) wait(keys []string) *waiter {
	t.mu.Lock()
	defer t.mu.Unlock()
	w, _ := t.registerLocked(local, keys, t.exists, nil)
	return w
}

// waitFunc is wait for a connection: fire is called, under the table's
// lock, when the waiter is released. It fails only for the budget.
func (t *table) waitFunc(o origin, keys []string, fire func(*waiter)) (*waiter, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.registerLocked(o, keys, t.exists, fire)
}

// lookup returns the values of keys when they all exist, else a waiter for
// the missing ones.
func (t *table) lookup(keys []string) ([][]byte, *waiter) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if values, ok := t.lookupLocked(keys); ok {
		return values, nil
	}
	w, _ := t.registerLocked(local, keys, func(k string) bool {
		_, ok := t.values[k]
		return ok
	}, nil)
	return nil, w
}

func (t *table) registerLocked(o origin, keys []string, present func(string) bool, fire func(*waiter)) (*waiter, error) {
	missing := 0
	cost := int64(waiterCost)
	for _, k := range keys {
		if !present(k) {
			missing++
			cost += int64(waitNodeCost + len(k))
		}
	}
	if missing == 0 {
		return nil, nil
	}
	if !t.charge(o, cost) {
		return nil, ErrOverBudget
	}
	w := &waiter{nodes: make([]waitNode, 0, missing), missing: missing, fire: fire, cost: cost}
	if fire == nil {
		w.done = make(chan struct{})
	}
	for _, k := range keys {
		if present(k) {
			continue
		}
		w.nodes = append(w.nodes, waitNode{w: w, key: k})
		l, ok := t.waiting[k]
		if !ok {
			l = &waitList{}
			t.waiting[k] = l
		}
		l.push(&w.nodes[len(w.nodes)-1])
	}
	t.nWaiters++
	return w, nil
}

// cancel withdraws w and reports whether it was still pending; false means
// it has fired (or was cancelled before). It is O(keys of w).
func (t *table) cancel(w *waiter) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.cancelLocked(w)
}

func (t *table) cancelLocked(w *waiter) bool {
	if w.released {
		return false
	}
	for i := range w.nodes {
		if w.nodes[i].linked {
			t.unlink(&w.nodes[i])
		}
	}
	w.fire = nil // the canceller answers for it
	t.release(w)
	return true
}

// watch makes w receive the events of key.
func (t *table) watch(o origin, key string, w *watcher) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if w.dropped {
		return nil
	}
	cost := int64(entryCost + len(key))
	if w.cost == 0 {
		cost += watcherCost
	}
	if !t.charge(o, cost) {
		return ErrOverBudget
	}
	w.cost += cost
	w.keys = append(w.keys, key)
	t.watchers[key] = append(t.watchers[key], w)
	return nil
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
	t.mem.release(w.cost)
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

func (t *table) queuePush(o origin, key string, value []byte) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.charge(o, valueCost(key, value)) {
		return ErrOverBudget
	}
	t.queues[key] = append(t.queues[key], value)
	t.wakeOne(key)
	return nil
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
	t.mem.release(valueCost(key, q[0]))
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
	return t.nWaiters
}

// waitingOn counts the registrations waiting for key.
func (t *table) waitingOn(key string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	if l, ok := t.waiting[key]; ok {
		for x := l.head; x != nil; x = x.next {
			n++
		}
	}
	return n
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
