package rendezvous

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// goodClients keeps clients of both dialects busy on their own keys,
// checking every result, until the returned stop is called; stop reports
// how many rounds each completed.
func goodClients(t *testing.T, addr string, n int) (stop func() []int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	rounds := make([]int, n)
	var wg sync.WaitGroup
	for i := range n {
		dialect := DialectV2
		if i%2 == 1 {
			dialect = Dialect113
		}
		c := dialClient(t, addr, ClientOptions{Dialect: dialect, Timeout: testTimeout})
		wg.Add(1)
		go func() {
			defer wg.Done()
			prefix := fmt.Sprintf("good/%d/", i)
			for r := 1; ctx.Err() == nil; r++ {
				want := strconv.Itoa(r)
				if err := c.Set(context.Background(), prefix+"v", []byte(want)); err != nil {
					t.Errorf("good client %d: %v", i, err)
					return
				}
				v, err := c.Get(context.Background(), prefix+"v")
				if err != nil || string(v) != want {
					t.Errorf("good client %d: get = %q, %v; want %s", i, v, err, want)
					return
				}
				n, err := c.Add(context.Background(), prefix+"n", 1)
				if err != nil || n != int64(r) {
					t.Errorf("good client %d: add = %d, %v; want %d", i, n, err, r)
					return
				}
				rounds[i] = r
			}
		}()
	}
	return func() []int {
		cancel()
		wg.Wait()
		for i, r := range rounds {
			if r == 0 {
				t.Errorf("good client %d completed no round", i)
			}
		}
		return rounds
	}
}

// logEntry is one zerolog line of the server.
type logEntry struct {
	Level   string `json:"level"`
	Remote  string `json:"remote"`
	Error   string `json:"error"`
	Message string `json:"message"`
}

// findLog returns the server's log entry about the connection from
// remote, if any.
func findLog(t *testing.T, logs *logBuffer, remote string) (logEntry, bool) {
	t.Helper()
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var e logEntry
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("bad log line %q: %v", line, err)
		}
		if e.Remote == remote {
			return e, true
		}
	}
	return logEntry{}, false
}

func TestServerSurvivesBadInput(t *testing.T) {
	const maxValue = 1 << 20
	srv, addr, logs := startServer(t, ServerOptions{MaxValueLen: maxValue})
	stop := goodClients(t, addr, 4)

	for _, tc := range []struct {
		name   string
		send   []byte
		reason string // in the warning logged
	}{
		{"garbage", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), "unknown torch-1.13 query type 71"},
		{"u64 max key length, 1.13", cat(u8(0), u64(math.MaxUint64)), "key length 18446744073709551615 over the limit 8192"},
		{"u64 max key length, v2", cat(v2Hello, u8(1), u64(math.MaxUint64)), "key length 18446744073709551615 over the limit"},
		{"value over the limit", cat(v2Hello, u8(1), str("/k"), u64(maxValue+1)), "value length 1048577 over the limit 1048576"},
		{"compare_set value over the limit", cat(u8(1), str("/k"), str(""), u64(math.MaxUint64)), "value length"},
		{"key count over the limit", cat(v2Hello, u8(6), u64(DefaultMaxKeysPerRequest+1)), "key count 131073 over the limit 131072"},
		{"multi_set count over the limit", cat(v2Hello, u8(11), i64(-1)), "key count"},
		{"multi_get key over the limit", cat(v2Hello, u8(10), u64(2), str("/a"), u64(1<<40)), "key length"},
		{"unknown v2 type", cat(v2Hello, u8(200)), "unknown torch-2 query type 200"},
		{"bad validate magic", cat(v2Hello, u8(0), u32(1)), "bad validate magic"},
		{"truncated frame", cat(v2Hello, u8(1), str("/k"), u64(10), []byte("abc")), "truncated set frame"},
		{"truncated dialect detection", u8(0), "truncated first frame"},
		{"truncated key count", cat(u8(5), []byte{1, 0, 0}), "truncated wait frame"},
		{"add to a non-integer", cat(v2Hello, setV2("/bad", "P"), addV2("/bad", 1)), "not an integer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialRaw(t, addr)
			c.send(tc.send)
			_ = c.nc.(*net.TCPConn).CloseWrite() // truncates whatever is unfinished
			c.expectClosed()
			var e logEntry
			waitUntil(t, func() (found bool) {
				e, found = findLog(t, logs, c.nc.LocalAddr().String())
				return found
			})
			if e.Level != "warn" || !strings.Contains(e.Error, tc.reason) {
				t.Errorf("logged %+v, want a warning with %q", e, tc.reason)
			}
		})
	}

	t.Run("get of a missing key is logged at debug", func(t *testing.T) {
		c := dialRaw(t, addr)
		c.send(get113("/nope"))
		c.expectClosed()
		var e logEntry
		waitUntil(t, func() (found bool) {
			e, found = findLog(t, logs, c.nc.LocalAddr().String())
			return found
		})
		if e.Level != "debug" || !strings.Contains(e.Error, `"/nope"`) {
			t.Errorf("logged %+v", e)
		}
	})

	t.Run("half-open frame is kept until the client goes", func(t *testing.T) {
		c := dialV2(t, addr)
		c.send(u8(1), u64(5), []byte("/k"))
		c.expectSilence()
		check := dialV2(t, addr)
		check.send(pingV2(3))
		check.expect(u32(3))
	})

	t.Run("client vanishing mid-wait", func(t *testing.T) {
		before := srv.table.pendingWaits()
		for _, hello := range [][]byte{nil, v2Hello} {
			c := dialRaw(t, addr)
			c.send(hello, waitFor(hello, "/vanish"))
			waitPending(t, srv.table, before+1)
			c.nc.Close()
			waitPending(t, srv.table, before)
		}
	})

	for i, r := range stop() {
		if got := mustGet(t, srv.Store(), fmt.Sprintf("/good/%d/n", i)); got != strconv.Itoa(r) {
			t.Errorf("good client %d: counter %s after %d rounds", i, got, r)
		}
	}
}

// waitFor is a WAIT in the dialect hello selects.
func waitFor(hello []byte, key string) []byte {
	if hello == nil {
		return wait113(key)
	}
	return waitV2(key)
}

func TestServerThousandIdleConnections(t *testing.T) {
	srv, addr, _ := startServer(t, ServerOptions{})
	stop := goodClients(t, addr, 4)
	const idle = 1000
	conns := make([]*rawConn, idle)
	for i := range conns {
		conns[i] = dialRaw(t, addr)
		if i%2 == 0 {
			conns[i].send(v2Hello) // a v2 client that says no more
		}
	}
	waitUntil(t, func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return len(srv.conns) >= idle+4
	})
	stop()
	// Every idle connection is still served.
	for _, i := range []int{0, 1, idle / 2, idle - 1} {
		if i%2 == 0 {
			conns[i].send(pingV2(uint32(i)))
			conns[i].expect(u32(uint32(i)))
		} else {
			conns[i].send(numKeys113())
			conns[i].expect(i64(mustNumKeys(t, srv)))
		}
	}
	for _, c := range conns {
		c.nc.Close()
	}
	waitUntil(t, func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return len(srv.conns) <= 4
	})
}

func mustNumKeys(t *testing.T, srv *Server) int64 {
	n, err := srv.Store().NumKeys(context.Background())
	mustDo(t, err)
	return n
}
