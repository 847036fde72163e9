package rendezvous

import (
	"net"
	"testing"
	"time"
)

// TestHandshakeRoomEvictsOnlySilentConnections: over MaxHandshakes, the
// oldest handshake makes room only if it has been silent a while; one
// whose first request waits in its socket is a client the server has not
// got to yet, and one that connected a moment ago may be a rank whose own
// process has not written yet (thousands of ranks connecting at once):
// both stay, the new connection admitted all the same.
func TestHandshakeRoomEvictsOnlySilentConnections(t *testing.T) {
	for _, tc := range []struct {
		name       string
		firstSpoke bool
		age        time.Duration
		evicted    bool
	}{
		{"oldest silent for a while is evicted", false, DefaultHandshakeTimeout, true},
		{"oldest with a request waiting stays", true, DefaultHandshakeTimeout, false},
		{"oldest connected a moment ago stays", false, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewServer(ServerOptions{MaxHandshakes: 1})
			first, firstClient := acceptedPair(t)
			if tc.firstSpoke {
				if _, err := firstClient.Write(numKeys113()); err != nil {
					t.Fatal(err)
				}
				pollUntil(t, "the request to reach the server's socket", func() bool { return hasInput(first) })
			}
			second, _ := acceptedPair(t)

			s.mu.Lock()
			a, b := newConn(s, first), newConn(s, second)
			for _, c := range []*conn{a, b} {
				if !s.admitLocked(c) {
					s.mu.Unlock()
					t.Fatal("a connection was refused")
				}
				s.conns[c] = struct{}{}
				c.opened = c.opened.Add(-tc.age)
			}
			_, kept := s.conns[a]
			handshaking := s.handshaking.Len()
			s.mu.Unlock()

			if evicted := s.Stats().EvictedConns == 1; evicted != tc.evicted || kept == tc.evicted {
				t.Fatalf("first connection evicted %v (kept %v), want evicted %v", evicted, kept, tc.evicted)
			}
			want := 2
			if tc.evicted {
				want = 1
			}
			if handshaking != want {
				t.Fatalf("%d connections handshaking, want %d", handshaking, want)
			}
		})
	}
}

// acceptedPair returns the server side of a fresh loopback connection and
// its client side, both closed when the test ends.
func acceptedPair(t *testing.T) (server, client net.Conn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	client, err = net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	if server, err = l.Accept(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Close() })
	return server, client
}

// pollUntil polls cond until it holds, failing the test after 10 s.
func pollUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
