package rendezvous

import (
	"errors"
	"math"
	"net"
	"strings"
	"testing"
	"time"
)

// step is one exchange of a hand-made wire script: bytes sent, then the
// exact reply expected (none when want is empty), or the connection closed.
type step struct {
	send   []byte
	want   []byte
	closed bool
}

func runScript(t *testing.T, c *rawConn, steps []step) {
	t.Helper()
	for i, s := range steps {
		c.send(s.send)
		switch {
		case s.closed:
			c.expectClosed()
		case len(s.want) > 0:
			c.expect(s.want)
		}
		if t.Failed() {
			t.Fatalf("at step %d", i)
		}
	}
}

// 1.13 requests, by their type bytes.
func set113(k, v string) []byte { return cat(u8(0), str(k), str(v)) }
func cs113(k, exp, des string) []byte {
	return cat(u8(1), str(k), str(exp), str(des))
}
func get113(k string) []byte          { return cat(u8(2), str(k)) }
func add113(k string, d int64) []byte { return cat(u8(3), str(k), i64(d)) }
func check113(keys ...string) []byte  { return cat(u8(4), keyList(keys)) }
func wait113(keys ...string) []byte   { return cat(u8(5), keyList(keys)) }
func numKeys113() []byte              { return u8(6) }
func watch113(k string) []byte        { return cat(u8(7), str(k)) }
func delete113(k string) []byte       { return cat(u8(8), str(k)) }

// v2 requests.
func setV2(k, v string) []byte         { return cat(u8(1), str(k), str(v)) }
func csV2(k, exp, des string) []byte   { return cat(u8(2), str(k), str(exp), str(des)) }
func getV2(k string) []byte            { return cat(u8(3), str(k)) }
func addV2(k string, d int64) []byte   { return cat(u8(4), str(k), i64(d)) }
func checkV2(keys ...string) []byte    { return cat(u8(5), keyList(keys)) }
func waitV2(keys ...string) []byte     { return cat(u8(6), keyList(keys)) }
func numKeysV2() []byte                { return u8(7) }
func deleteV2(k string) []byte         { return cat(u8(8), str(k)) }
func appendV2(k, v string) []byte      { return cat(u8(9), str(k), str(v)) }
func multiGetV2(keys ...string) []byte { return cat(u8(10), keyList(keys)) }
func cancelWaitV2() []byte             { return u8(12) }
func pingV2(nonce uint32) []byte       { return cat(u8(13), u32(nonce)) }
func queuePushV2(k, v string) []byte   { return cat(u8(14), str(k), str(v)) }
func queuePopV2(k string) []byte       { return cat(u8(15), str(k)) }
func queueLenV2(k string) []byte       { return cat(u8(16), str(k)) }
func listV2() []byte                   { return u8(17) }
func multiSetV2(kvs ...string) []byte {
	b := cat(u8(11), i64(int64(len(kvs)/2)))
	for _, s := range kvs {
		b = cat(b, str(s))
	}
	return b
}

func keyList(keys []string) []byte {
	b := u64(uint64(len(keys)))
	for _, k := range keys {
		b = cat(b, str(k))
	}
	return b
}

func TestServerWire113(t *testing.T) {
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"add init/ as a 1.13 agent does", []step{
			{send: add113("init/", 1), want: i64(1)},
			{send: add113("init/", 1), want: i64(2)},
		}},
		{"get numkeys as a lone first byte", []step{
			{send: numKeys113(), want: i64(0)},
		}},
		{"set first, then get = wait + get", []step{
			{send: set113("/k1", "v1")},
			{send: wait113("/k1"), want: u8(stopWaiting)},
			{send: get113("/k1"), want: str("v1")},
			{send: numKeys113(), want: i64(1)},
		}},
		{"add quirks", []step{
			{send: set113("/a", "12abc")}, {send: add113("/a", 1), want: i64(13)},
			{send: set113("/b", "  7")}, {send: add113("/b", 1), want: i64(8)},
			{send: set113("/c", "+4")}, {send: add113("/c", 1), want: i64(5)},
			{send: set113("/d", "0x10")}, {send: add113("/d", 1), want: i64(1)},
			{send: set113("/e", "9223372036854775807")}, {send: add113("/e", 1), want: i64(math.MinInt64)},
			{send: get113("/a"), want: str("13")},
		}},
		{"add to a non-integer closes the connection", []step{
			{send: set113("/p", "P")},
			{send: add113("/p", 1), closed: true},
		}},
		{"add to an empty value closes the connection", []step{
			{send: set113("/p", "")},
			{send: add113("/p", 1), closed: true},
		}},
		{"add out of range closes the connection", []step{
			{send: set113("/p", "99999999999999999999")},
			{send: add113("/p", 1), closed: true},
		}},
		{"compare_set", []step{
			{send: cs113("/miss2", "abc", "y"), want: str("abc")},
			{send: cs113("/cs", "", "first"), want: str("first")},
			{send: cs113("/cs", "first", "second"), want: str("second")},
			{send: cs113("/cs", "stale", "x"), want: str("second")},
			{send: cs113("/empty", "", ""), want: str("")},
			{send: check113("/empty", "/cs"), want: u8(checkReady)},
			{send: check113("/miss2"), want: u8(checkNotReady)},
		}},
		{"check", []step{
			{send: check113(), want: u8(checkReady)},
			{send: set113("/cnt", "1")},
			{send: check113("/cnt", "/nokey"), want: u8(checkNotReady)},
			{send: check113("/cnt"), want: u8(checkReady)},
		}},
		{"wait on zero keys", []step{
			{send: wait113(), want: u8(stopWaiting)},
		}},
		{"delete", []step{
			{send: set113("/k", "v")},
			{send: delete113("/k"), want: i64(1)},
			{send: delete113("/k"), want: i64(0)},
			{send: numKeys113(), want: i64(0)},
		}},
		{"get of a missing key closes the connection", []step{
			{send: get113("/missing"), closed: true},
		}},
		{"unknown type byte closes the connection", []step{
			{send: u8(9), closed: true},
		}},
		{"v2 numbers are not 1.13's: APPEND (9) is unknown", []step{
			{send: cat(u8(9), str("/k"), str("v")), closed: true},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, addr, _ := startServer(t, ServerOptions{})
			runScript(t, dialRaw(t, addr), tc.steps)
		})
	}
}

func TestServerWireV2(t *testing.T) {
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"validate then ping echoes", []step{
			{send: pingV2(0x00006710), want: u32(0x00006710)},
			{send: pingV2(0xdeadbeef), want: u32(0xdeadbeef)},
		}},
		{"set, wait, get", []step{
			{send: setV2("/k1", "v1")},
			{send: waitV2("/k1"), want: u8(stopWaiting)},
			{send: getV2("/k1"), want: str("v1")},
		}},
		{"add init/ and quirks", []step{
			{send: addV2("init/", 1), want: i64(1)},
			{send: setV2("/a", "12abc")}, {send: addV2("/a", 1), want: i64(13)},
			{send: setV2("/d", "0x10")}, {send: addV2("/d", -3), want: i64(-3)},
		}},
		{"add to a non-integer closes the connection", []step{
			{send: setV2("/p", "P")},
			{send: addV2("/p", 1), closed: true},
		}},
		{"compare_set", []step{
			{send: csV2("/miss", "abc", "y"), want: str("abc")},
			{send: csV2("/cs", "", "first"), want: str("first")},
			{send: csV2("/cs", "first", "second"), want: str("second")},
			{send: csV2("/cs", "stale", "x"), want: str("second")},
		}},
		{"check, num_keys, delete", []step{
			{send: setV2("/a", "")},
			{send: checkV2("/a"), want: u8(checkReady)},
			{send: checkV2("/a", "/b"), want: u8(checkNotReady)},
			{send: numKeysV2(), want: i64(1)},
			{send: deleteV2("/a"), want: i64(1)},
			{send: deleteV2("/a"), want: i64(0)},
			{send: numKeysV2(), want: i64(0)},
		}},
		{"append", []step{
			{send: appendV2("/ap", "ab")},
			{send: appendV2("/ap", "cd")},
			{send: getV2("/ap"), want: str("abcd")},
		}},
		{"multi_set and multi_get", []step{
			{send: multiSetV2("/x", "1", "/y", "22")},
			{send: waitV2("/x", "/y"), want: u8(stopWaiting)},
			{send: multiGetV2("/y", "/x"), want: cat(str("22"), str("1"))},
		}},
		{"multi_get of a missing key closes the connection", []step{
			{send: setV2("/x", "1")},
			{send: multiGetV2("/x", "/nope"), closed: true},
		}},
		{"cancel_wait without pending waits", []step{
			{send: cancelWaitV2(), want: u8(waitCanceled)},
		}},
		{"cancel_wait drops the pending wait", []step{
			{send: waitV2("/never")},
			{send: cancelWaitV2(), want: u8(waitCanceled)},
			{send: setV2("/never", "now")},    // no late STOP_WAITING...
			{send: numKeysV2(), want: i64(1)}, // ...the next byte is this reply
			{send: waitV2("/never"), want: u8(stopWaiting)},
		}},
		{"queues", []step{
			{send: queuePopV2("/q"), want: i64(0)},
			{send: queuePushV2("/q", "one")},
			{send: queuePushV2("/q", "two")},
			{send: queueLenV2("/q"), want: i64(2)},
			{send: checkV2("/q"), want: u8(checkReady)},
			{send: queuePopV2("/q"), want: cat(i64(2), str("one"))},
			{send: queuePopV2("/q"), want: cat(i64(1), str("two"))},
			{send: queueLenV2("/q"), want: i64(0)},
			{send: numKeysV2(), want: i64(0)}, // a namespace apart
		}},
		{"list", []step{
			{send: setV2("/b", "")},
			{send: addV2("init/", 1), want: i64(1)},
			{send: setV2("/a", "")},
			{send: listV2(), want: cat(i64(3), str("/a"), str("/b"), str("init/"))},
		}},
		{"a second validate is accepted", []step{
			{send: v2Hello},
			{send: pingV2(1), want: u32(1)},
		}},
		{"a bad validate magic closes the connection", []step{
			{send: cat(u8(0), u32(0x12345678)), closed: true},
		}},
		{"get of a missing key closes the connection", []step{
			{send: getV2("/missing"), closed: true},
		}},
		{"unknown type byte closes the connection", []step{
			{send: u8(18), closed: true},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, addr, _ := startServer(t, ServerOptions{})
			runScript(t, dialV2(t, addr), tc.steps)
		})
	}
}

// TestServerWaitWakeUps: a WAIT from one connection is answered when
// another connection creates the keys, by any creating write.
func TestServerWaitWakeUps(t *testing.T) {
	for _, tc := range []struct {
		name   string
		create []byte // creates /a and then /b, with no reply
	}{
		{"set", cat(setV2("/a", "1"), setV2("/b", "2"))},
		{"append", cat(appendV2("/a", "1"), appendV2("/b", "2"))},
		{"multi_set", multiSetV2("/a", "1", "/b", "2")},
		{"queue_push", cat(setV2("/a", "1"), queuePushV2("/b", "2"))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, addr, _ := startServer(t, ServerOptions{})
			waiter, writer := dialV2(t, addr), dialV2(t, addr)
			waiter.send(waitV2("/a", "/b"))
			waitPending(t, srv.table, 1)
			writer.send(tc.create)
			waiter.expect(u8(stopWaiting))
		})
	}
	t.Run("add and compare_set", func(t *testing.T) {
		srv, addr, _ := startServer(t, ServerOptions{})
		waiter, writer := dialRaw(t, addr), dialRaw(t, addr)
		waiter.send(wait113("/a", "/b"))
		waitPending(t, srv.table, 1)
		writer.send(add113("/a", 1))
		writer.expect(i64(1))
		waiter.expectSilence()
		writer.send(cs113("/b", "", "x"))
		writer.expect(str("x"))
		waiter.expect(u8(stopWaiting))
	})
	t.Run("1.13: a wait abandoned by the client still answers late", func(t *testing.T) {
		srv, addr, _ := startServer(t, ServerOptions{})
		waiter, writer := dialRaw(t, addr), dialRaw(t, addr)
		waiter.send(wait113("/k"))
		waitPending(t, srv.table, 1)
		waiter.expectSilence()
		writer.send(set113("/k", "v"))
		waiter.expect(u8(stopWaiting)) // the stray byte torch 1.13 leaves
	})
	// A wait whose key appeared but whose STOP_WAITING is not out yet
	// when CANCEL_WAIT comes: torch's client accepts 00 then 01 in either
	// order of the two writers, and nothing more.
	t.Run("v2: cancel_wait before the fired wait's flush sends 00 then 01", func(t *testing.T) {
		srv, addr, _ := startServer(t, ServerOptions{})
		c := dialV2(t, addr)
		c.send(waitV2("/k"))
		waitPending(t, srv.table, 1)
		// Pretend a flusher runs: the fired wait then stays queued, and
		// CANCEL_WAIT is handled before any flusher could answer it.
		conn := onlyConn(t, srv)
		conn.fmu.Lock()
		conn.flushing = true
		conn.fmu.Unlock()
		_ = srv.table.set(local, "/k", nil)
		c.send(cancelWaitV2())
		c.expect(u8(stopWaiting), u8(waitCanceled))
		// The late flusher finds the wait answered and sends nothing.
		srv.wg.Add(1)
		conn.flushFired()
		c.send(pingV2(7))
		c.expect(u32(7))
	})
	t.Run("v2: cancel_wait after the fired wait's flush sends 01", func(t *testing.T) {
		srv, addr, _ := startServer(t, ServerOptions{})
		c := dialV2(t, addr)
		c.send(waitV2("/k"))
		waitPending(t, srv.table, 1)
		_ = srv.table.set(local, "/k", nil)
		c.expect(u8(stopWaiting))
		c.send(cancelWaitV2())
		c.expect(u8(waitCanceled))
		c.send(pingV2(7))
		c.expect(u32(7))
	})
	t.Run("queue_push wakes one waiter", func(t *testing.T) {
		srv, addr, _ := startServer(t, ServerOptions{})
		w1, w2, pusher := dialV2(t, addr), dialV2(t, addr), dialV2(t, addr)
		w1.send(waitV2("/q"))
		waitPending(t, srv.table, 1)
		w2.send(waitV2("/q"))
		waitPending(t, srv.table, 2)
		pusher.send(queuePushV2("/q", "job"))
		w1.expect(u8(stopWaiting))
		w2.expectSilence()
		w1.send(queuePopV2("/q"))
		w1.expect(i64(1), str("job"))
	})
}

func onlyConn(t *testing.T, srv *Server) *conn {
	t.Helper()
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if len(srv.conns) != 1 {
		t.Fatalf("%d connections, want 1", len(srv.conns))
	}
	for c := range srv.conns {
		return c
	}
	return nil
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestServerWatchKey113(t *testing.T) {
	srv, addr, _ := startServer(t, ServerOptions{})
	main, watch := dialRaw(t, addr), dialRaw(t, addr)
	watch.send(watch113("/wk"))
	watch.expect(u8(keyWatchRegistered))
	main.send(set113("/wk", "one"))
	watch.expect(u8(keyCreated), str("/wk"), str(""), str("one"))
	main.send(set113("/wk", "two"))
	watch.expect(u8(keyUpdated), str("/wk"), str("one"), str("two"))
	main.send(set113("/other", "x"))
	main.send(delete113("/wk"))
	main.expect(i64(1))
	watch.expect(u8(keyDeleted), str("/wk"), str("two"), str(""))
	// Closing the watch socket unregisters it.
	watch.nc.Close()
	waitUntil(t, func() bool {
		srv.table.mu.Lock()
		defer srv.table.mu.Unlock()
		return len(srv.table.watchers) == 0
	})
	main.send(set113("/wk", "three"))
	main.send(get113("/wk"))
	main.expect(str("three"))
}

// TestServerIdleSecondConnection: torch 1.13 opens a silent second
// connection per store; it stays open until the client closes it.
func TestServerIdleSecondConnection(t *testing.T) {
	srv, addr, _ := startServer(t, ServerOptions{})
	active, idle := dialRaw(t, addr), dialRaw(t, addr)
	active.send(add113("init/", 1))
	active.expect(i64(1))
	idle.expectSilence()
	active.send(numKeys113())
	active.expect(i64(1))
	idle.send(numKeys113())
	idle.expect(i64(1))
	idle.nc.Close()
	waitUntil(t, func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return len(srv.conns) == 1
	})
}

// TestServerFragmentedFrames: requests arriving a byte at a time, split
// inside the dialect detection too.
func TestServerFragmentedFrames(t *testing.T) {
	for _, tc := range []struct {
		name         string
		hello, frame []byte
	}{
		{"1.13 set first", nil, cat(set113("/k", "v"), get113("/k"))},
		{"v2", v2Hello, cat(setV2("/k", "v"), getV2("/k"))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, addr, _ := startServer(t, ServerOptions{})
			c := dialRaw(t, addr)
			for _, b := range cat(tc.hello, tc.frame) {
				c.send(u8(b))
			}
			c.expect(str("v"))
		})
	}
}

// TestServerPipelinedRequests: replies to requests sent in one write come
// back in order.
func TestServerPipelinedRequests(t *testing.T) {
	_, addr, _ := startServer(t, ServerOptions{})
	c := dialV2(t, addr)
	var batch, want []byte
	for i := int64(1); i <= 100; i++ {
		batch = cat(batch, addV2("/n", 1))
		want = cat(want, i64(i))
	}
	c.send(batch)
	c.expect(want)
}

func TestServerShutdown(t *testing.T) {
	srv := NewServer(ServerOptions{})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	mustDo(t, err)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	c := dialRaw(t, l.Addr().String())
	c.send(wait113("/never"))
	waitPending(t, srv.table, 1)
	idle := dialRaw(t, l.Addr().String())
	idle.send(numKeys113())
	idle.expect(i64(0))

	mustDo(t, srv.Shutdown(ctxTimeout(t, testTimeout)))
	if err := <-served; !errors.Is(err, ErrServerClosed) {
		t.Fatalf("Serve returned %v", err)
	}
	c.expectClosed()
	idle.expectClosed()
	if n := srv.table.pendingWaits(); n != 0 {
		t.Fatalf("%d waits left after shutdown", n)
	}
	if err := srv.Serve(l); !errors.Is(err, ErrServerClosed) {
		t.Fatalf("Serve after Shutdown returned %v", err)
	}
	if srv.Addr() == nil || srv.Addr().String() != l.Addr().String() {
		t.Fatalf("Addr() = %v", srv.Addr())
	}
	mustDo(t, srv.Close())
}

func TestServerClose(t *testing.T) {
	srv := NewServer(ServerOptions{})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	mustDo(t, err)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	c := dialClient(t, l.Addr().String(), ClientOptions{})
	mustDo(t, c.Set(ctxTimeout(t, testTimeout), "k", nil))
	mustDo(t, srv.Close())
	if err := <-served; !errors.Is(err, ErrServerClosed) {
		t.Fatalf("Serve returned %v", err)
	}
	if _, err := c.NumKeys(ctxTimeout(t, testTimeout)); err == nil {
		t.Fatal("num_keys on a closed server succeeded")
	}
	_, err = c.NumKeys(ctxTimeout(t, 300*time.Millisecond))
	if err == nil || !strings.Contains(err.Error(), "connect to "+l.Addr().String()) {
		t.Fatalf("num_keys after the server closed: %v, want a connect error naming the address", err)
	}
}
