package rendezvous

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// exchange sends req on nc and reads exactly len(want) bytes, which must
// be want; safe to call from any goroutine.
func exchange(nc net.Conn, req, want []byte) error {
	if _, err := nc.Write(req); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	got := make([]byte, len(want))
	_ = nc.SetReadDeadline(time.Now().Add(testTimeout))
	if _, err := io.ReadFull(nc, got); err != nil {
		return fmt.Errorf("reading %d bytes: %w", len(want), err)
	}
	if !bytes.Equal(got, want) {
		return fmt.Errorf("reply % x, want % x", got, want)
	}
	return nil
}

// loopOf returns the server's event loop once a connection has parked.
func loopOf(t *testing.T, srv *Server) *eventLoop {
	t.Helper()
	waitUntil(t, func() bool { return srv.loop() != nil })
	return srv.loop()
}

// TestLoopHandOffUnderLoad: connections go from the loop to goroutines
// and back while others are served inline: some WAIT until released,
// some send their frames cut in two, some pipeline bursts. Every reply
// is right, and at the end every connection is parked again.
func TestLoopHandOffUnderLoad(t *testing.T) {
	const perGroup, rounds = 40, 20
	srv, addr, logs := startServer(t, ServerOptions{})
	var conns []net.Conn
	for range 3 * perGroup {
		nc, err := net.Dial("tcp", addr)
		mustDo(t, err)
		t.Cleanup(func() { nc.Close() })
		conns = append(conns, nc)
	}
	l := loopOf(t, srv)
	errs := make(chan error, len(conns))
	var wg sync.WaitGroup
	run := func(nc net.Conn, f func(net.Conn) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(nc); err != nil {
				errs <- err
			}
		}()
	}
	for i, nc := range conns[:perGroup] { // waiters
		run(nc, func(nc net.Conn) error {
			if err := exchange(nc, cat(v2Hello, pingV2(uint32(i))), u32(uint32(i))); err != nil {
				return err
			}
			if err := exchange(nc, waitV2("/release"), u8(stopWaiting)); err != nil {
				return fmt.Errorf("waiter %d: %w", i, err)
			}
			return exchange(nc, getV2("/release"), str("go"))
		})
	}
	for i, nc := range conns[perGroup : 2*perGroup] { // frames cut in two
		run(nc, func(nc net.Conn) error {
			key := fmt.Sprintf("/cut/%d", i)
			for r := 1; r <= rounds; r++ {
				frame := add113(key, 1)
				cut := 1 + r%(len(frame)-1)
				if _, err := nc.Write(frame[:cut]); err != nil {
					return err
				}
				if i == 0 && r == 1 {
					// Make sure of one hand-off: the rest waits until the
					// loop has read the first part alone.
					for deadline := time.Now().Add(testTimeout); l.handedOff.Load() == 0; time.Sleep(time.Millisecond) {
						if time.Now().After(deadline) {
							return fmt.Errorf("the loop handed off no cut frame")
						}
					}
				}
				if err := exchange(nc, frame[cut:], i64(int64(r))); err != nil {
					return fmt.Errorf("cut %d round %d: %w", i, r, err)
				}
			}
			return nil
		})
	}
	for i, nc := range conns[2*perGroup:] { // pipelined bursts
		run(nc, func(nc net.Conn) error {
			if _, err := nc.Write(v2Hello); err != nil {
				return err
			}
			key := fmt.Sprintf("/burst/%d", i)
			for r := 1; r <= rounds; r++ {
				v := strings.Repeat("x", r)
				req := cat(setV2(key, v), getV2(key), addV2(key+"/n", 2), checkV2(key))
				if err := exchange(nc, req, cat(str(v), i64(int64(2*r)), u8(checkReady))); err != nil {
					return fmt.Errorf("burst %d round %d: %w", i, r, err)
				}
			}
			return nil
		})
	}
	waitPending(t, srv.table, perGroup)
	mustDo(t, srv.Store().Set(ctxTimeout(t, testTimeout), "/release", []byte("go")))
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	waitUntil(t, func() bool { return l.parkedConns() == len(conns) })
	if l.inline.Load() == 0 || l.handedOff.Load() == 0 {
		t.Errorf("loop served %d batches inline and handed off %d; want both", l.inline.Load(), l.handedOff.Load())
	}
	if strings.Contains(logs.String(), `"level":"warn"`) {
		t.Errorf("warnings logged:\n%s", logs)
	}
}

// TestLoopShutdownDrainsParked: Shutdown ends parked connections as it
// ends idle ones: a SET sent just before it is applied, pending WAITs
// are dropped, every connection is closed, and the loop stops.
func TestLoopShutdownDrainsParked(t *testing.T) {
	srv, addr, _ := startServer(t, ServerOptions{})
	var clients []*rawConn
	for i := range 10 {
		c := dialV2(t, addr)
		c.send(pingV2(uint32(i)))
		c.expect(u32(uint32(i)))
		if i%2 == 0 {
			c.send(waitV2("/never"))
		}
		clients = append(clients, c)
	}
	waitPending(t, srv.table, 5)
	l := loopOf(t, srv)
	waitUntil(t, func() bool { return l.parkedConns() == len(clients) })

	clients[1].send(setV2("/last", "word")) // no reply: only its effect shows
	mustDo(t, srv.Shutdown(ctxTimeout(t, testTimeout)))
	if v, ok := srv.table.get("/last"); !ok || string(v) != "word" {
		t.Errorf("SET sent before Shutdown: %q, %v", v, ok)
	}
	for _, c := range clients {
		c.expectClosed()
	}
	if n := srv.table.pendingWaits(); n != 0 {
		t.Errorf("%d waits left after Shutdown", n)
	}
	if n := srv.Clients(); n != 0 {
		t.Errorf("%d clients after Shutdown", n)
	}
	if !l.isStopped() || l.parkedConns() != 0 {
		t.Errorf("loop after Shutdown: stopped %v, %d parked", l.isStopped(), l.parkedConns())
	}
}

// TestLoopPeerHangsUp: a parked connection whose peer hangs up is ended
// by the loop, with its pending WAIT withdrawn, and no warning.
func TestLoopPeerHangsUp(t *testing.T) {
	srv, addr, logs := startServer(t, ServerOptions{})
	stay := dialV2(t, addr)
	stay.send(pingV2(1))
	stay.expect(u32(1))
	for n, waits := range []bool{false, true} {
		c := dialRaw(t, addr)
		c.send(add113("/n", 1))
		c.expect(i64(int64(n + 1)))
		if waits {
			c.send(wait113("/never"))
			waitPending(t, srv.table, 1)
		}
		l := loopOf(t, srv)
		waitUntil(t, func() bool { return l.parkedConns() == 2 })
		c.nc.Close()
		waitUntil(t, func() bool { return srv.Clients() == 1 })
		waitPending(t, srv.table, 0)
	}
	stay.send(numKeysV2())
	stay.expect(i64(1))
	if strings.Contains(logs.String(), `"level":"warn"`) {
		t.Errorf("warnings logged:\n%s", logs)
	}
	if !strings.Contains(logs.String(), "connection closed by peer") {
		t.Errorf("hang-ups not logged:\n%s", logs)
	}
}

// TestLoopClientKilledMidFrame: a client that dies inside a frame, its
// first part read by the loop and handed to a goroutine, is ended there;
// what its request reserved is released, and other clients go on.
func TestLoopClientKilledMidFrame(t *testing.T) {
	srv, addr, _ := startServer(t, ServerOptions{})
	other := dialV2(t, addr)
	other.send(pingV2(9))
	other.expect(u32(9))
	base := srv.Stats().Memory

	victim := dialV2(t, addr)
	victim.send(pingV2(1))
	victim.expect(u32(1))
	l := loopOf(t, srv)
	waitUntil(t, func() bool { return l.parkedConns() == 2 })
	handedOff := l.handedOff.Load()
	// A SET announcing 1 MiB, of which 1 KiB comes.
	frame := cat(u8(1), str("/big"), u64(1<<20), make([]byte, 1<<10))
	victim.send(frame)
	waitUntil(t, func() bool { return l.handedOff.Load() > handedOff })
	waitUntil(t, func() bool { return srv.Stats().Memory > base })
	mustDo(t, victim.nc.(*net.TCPConn).SetLinger(0)) // reset, as a killed process's kernel may
	victim.nc.Close()
	waitUntil(t, func() bool { return srv.Clients() == 1 })
	waitUntil(t, func() bool { return srv.Stats().Memory == base })
	if _, ok := srv.table.get("/big"); ok {
		t.Error("a cut SET was applied")
	}
	other.send(addV2("/n", 5))
	other.expect(i64(5))
}

// TestLoopHandshakeTimeout: a connection parked at accept that never
// speaks is closed when its handshake time is up, and counted.
func TestLoopHandshakeTimeout(t *testing.T) {
	srv, addr, _ := startServer(t, ServerOptions{HandshakeTimeout: 100 * time.Millisecond})
	silent := dialRaw(t, addr)
	waitUntil(t, func() bool { return srv.loop() != nil && srv.loop().parkedConns() == 1 })
	silent.expectClosed()
	waitUntil(t, func() bool { return srv.Clients() == 0 })
	if n := srv.Stats().TimedOutConns; n != 1 {
		t.Errorf("timed out %d connections, want 1", n)
	}
	// One that spoke in time stays, parked, past the timeout.
	c := dialV2(t, addr)
	c.send(pingV2(3))
	c.expect(u32(3))
	for range 3 { // 150 ms, past its handshake time
		c.expectSilence()
	}
	c.send(pingV2(4))
	c.expect(u32(4))
}

// TestLoopSlowReaderHoldsOneReply: a client that pipelines requests for
// a large value and reads none of the replies makes the loop hand it to
// a goroutine once the socket is full, holding at most one reply it
// could not send; the replies then all arrive, whole and in order.
func TestLoopSlowReaderHoldsOneReply(t *testing.T) {
	const gets, size = 200, 1 << 20
	srv, addr, _ := startServer(t, ServerOptions{})
	value := bytes.Repeat([]byte("v"), size)
	mustDo(t, srv.Store().Set(ctxTimeout(t, testTimeout), "/big", value))
	c := dialV2(t, addr)
	c.send(pingV2(1))
	c.expect(u32(1))
	l := loopOf(t, srv)
	waitUntil(t, func() bool { return l.parkedConns() == 1 })
	base, handedOff := srv.Stats().Memory, l.handedOff.Load()

	var burst []byte
	for range gets {
		burst = append(burst, getV2("/big")...)
	}
	c.send(burst)
	waitUntil(t, func() bool { return l.handedOff.Load() > handedOff })
	if held := srv.Stats().PeakMemory - base; held > 2*size {
		t.Errorf("held %d bytes for a reader that reads nothing, want at most one reply (%d)", held, size)
	}
	want := str(string(value))
	for i := range gets {
		got := make([]byte, len(want))
		_ = c.nc.SetReadDeadline(time.Now().Add(testTimeout))
		if _, err := io.ReadFull(c.nc, got); err != nil {
			t.Fatalf("reply %d: %v", i, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("reply %d differs", i)
		}
	}
	waitUntil(t, func() bool { return l.parkedConns() == 1 && srv.Stats().Memory == base })
}
