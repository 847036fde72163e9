package rendezvous

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

func TestClientDialects(t *testing.T) {
	_, addr, _ := startServer(t, ServerOptions{})
	for _, tc := range []struct {
		asked, want Dialect
	}{
		{DialectAuto, DialectV2}, {DialectV2, DialectV2}, {Dialect113, Dialect113},
	} {
		c := dialClient(t, addr, ClientOptions{Dialect: tc.asked})
		if c.Dialect() != tc.want {
			t.Errorf("asked %v, got %v; want %v", tc.asked, c.Dialect(), tc.want)
		}
		err := c.Ping(ctxTimeout(t, testTimeout))
		if tc.want == DialectV2 && err != nil {
			t.Errorf("%v: ping: %v", tc.asked, err)
		}
		if tc.want == Dialect113 && !errors.Is(err, errors.ErrUnsupported) {
			t.Errorf("%v: ping: %v, want ErrUnsupported", tc.asked, err)
		}
	}
}

func TestClientDialNamesAddress(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	mustDo(t, err)
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	_, err = Dial(ctxTimeout(t, 200*time.Millisecond), addr, ClientOptions{})
	if err == nil {
		t.Fatal("dial succeeded")
	}
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "connect to "+addr) ||
		!strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("dial error %q must name the address and the reason", err)
	}
}

// TestClientDialRetries: Dial keeps trying until the server is up, as
// workers do while the launcher starts its store. Dial runs in a synctest
// bubble, so the 50 ms before the server comes are on its fake clock:
// they pass only while Dial waits between attempts, after at least three
// refused ones (at 0, 10 and 30 ms). The server lives outside the bubble,
// and the clock stands still until it listens.
func TestClientDialRetries(t *testing.T) {
	// Another process may take the freed port meanwhile; a few tries with
	// fresh ports make that race harmless.
	for try := 0; try < 5; try++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		mustDo(t, err)
		addr := l.Addr().String()
		l.Close()
		listen, listening := make(chan struct{}), make(chan error)
		srv := NewServer(ServerOptions{})
		go func() {
			<-listen
			l, err := net.Listen("tcp", addr)
			listening <- err
			if err == nil {
				srv.Serve(l)
			}
		}()
		var dialErr, listenErr error
		synctest.Test(t, func(t *testing.T) {
			dialed := make(chan error, 1)
			go func() {
				c, err := Dial(context.Background(), addr, ClientOptions{Timeout: time.Minute})
				if err == nil {
					c.Close()
				}
				dialed <- err
			}()
			time.Sleep(50 * time.Millisecond)
			listen <- struct{}{}
			if listenErr = <-listening; listenErr == nil {
				dialErr = <-dialed
			} else {
				<-dialed // Dial gives up at its timeout, in an instant
			}
		})
		srv.Close()
		if listenErr != nil {
			continue
		}
		mustDo(t, dialErr)
		return
	}
	t.Fatal("no free port stayed free in 5 tries")
}

func TestClientTimeoutsNameKeys(t *testing.T) {
	_, addr, _ := startServer(t, ServerOptions{})
	for _, d := range []Dialect{DialectV2, Dialect113} {
		c := dialClient(t, addr, ClientOptions{Dialect: d})
		err := c.Wait(ctxTimeout(t, shortWait), []string{"a", "b"})
		if !errors.Is(err, ErrTimeout) || err.Error() != `rendezvous: wait ["/a" "/b"]: wait timed out` {
			t.Errorf("%v: wait error %q", d, err)
		}
		_, err = c.Get(ctxTimeout(t, shortWait), "k")
		if !errors.Is(err, ErrTimeout) || err.Error() != `rendezvous: get "/k": wait timed out` {
			t.Errorf("%v: get error %q", d, err)
		}
		c2 := dialClient(t, addr, ClientOptions{Dialect: d, Timeout: shortWait})
		if _, err := c2.Get(context.Background(), "k"); !errors.Is(err, ErrTimeout) {
			t.Errorf("%v: ClientOptions.Timeout not applied: %v", d, err)
		}
	}
}

// TestClientWaitTimeoutConnection: after a timed-out wait a v2 client
// cancels it and keeps its connection; a 1.13 client, which cannot, dials
// a new one.
func TestClientWaitTimeoutConnection(t *testing.T) {
	srv, addr, _ := startServer(t, ServerOptions{})
	for _, tc := range []struct {
		dialect  Dialect
		sameConn bool
	}{{DialectV2, true}, {Dialect113, false}} {
		c := dialClient(t, addr, ClientOptions{Dialect: tc.dialect})
		before := c.conn
		if err := c.Wait(ctxTimeout(t, shortWait), []string{"never"}); !errors.Is(err, ErrTimeout) {
			t.Fatal(err)
		}
		if tc.sameConn && c.conn != before || !tc.sameConn && c.conn != nil {
			t.Errorf("%v: connection kept = %v, want %v", tc.dialect, c.conn == before, tc.sameConn)
		}
		waitPending(t, srv.table, 0)
		mustDo(t, c.Set(ctxTimeout(t, testTimeout), "after", []byte(tc.dialect.String())))
		if got := mustGet(t, c, "after"); got != tc.dialect.String() {
			t.Errorf("get = %q", got)
		}
	}
}

func TestClientCancelAndClose(t *testing.T) {
	srv, addr, _ := startServer(t, ServerOptions{})
	for _, d := range []Dialect{DialectV2, Dialect113} {
		c := dialClient(t, addr, ClientOptions{Dialect: d})
		ctx, cancel := context.WithCancel(context.Background())
		got := make(chan error, 1)
		go func() { _, err := c.Get(ctx, "never"); got <- err }()
		waitPending(t, srv.table, 1)
		cancel()
		if err := <-got; !errors.Is(err, context.Canceled) {
			t.Errorf("%v: get after cancel: %v", d, err)
		}
		waitPending(t, srv.table, 0)

		go func() { _, err := c.Get(context.Background(), "never"); got <- err }()
		waitPending(t, srv.table, 1)
		mustDo(t, c.Close())
		if err := <-got; !errors.Is(err, ErrClosed) {
			t.Errorf("%v: get after close: %v", d, err)
		}
		if err := c.Set(context.Background(), "k", nil); !errors.Is(err, ErrClosed) {
			t.Errorf("%v: set after close: %v", d, err)
		}
		waitPending(t, srv.table, 0)
	}
}

func TestClientValueLimits(t *testing.T) {
	_, addr, logs := startServer(t, ServerOptions{MaxValueLen: 1 << 20})
	c := dialClient(t, addr, ClientOptions{})
	ctx := ctxTimeout(t, testTimeout)
	big := bytes.Repeat([]byte("x"), 1<<20)
	mustDo(t, c.Set(ctx, "big", big))
	got, err := c.Get(ctx, "big")
	if err != nil || !bytes.Equal(got, big) {
		t.Fatalf("1 MiB value: %d bytes, %v", len(got), err)
	}
	// One byte over: the server drops the connection; the client notices
	// at its next reply and dials again after.
	_ = c.Set(ctx, "too-big", append(big, 'x'))
	if _, err := c.NumKeys(ctx); err == nil {
		t.Fatal("num_keys on a connection the server closed succeeded")
	}
	if n, err := c.NumKeys(ctx); err != nil || n != 1 {
		t.Fatalf("num_keys after redial = %d, %v", n, err)
	}
	if !strings.Contains(logs.String(), "value length 1048577 over the limit 1048576") {
		t.Error("oversized value not logged")
	}
}

// TestConcurrentClients: many clients, each used by several goroutines,
// on shared and own keys.
func TestConcurrentClients(t *testing.T) {
	_, addr, _ := startServer(t, ServerOptions{})
	const clients, goroutines, rounds = 16, 4, 20
	var wg sync.WaitGroup
	for i := range clients {
		d := DialectV2
		if i%2 == 1 {
			d = Dialect113
		}
		c := dialClient(t, addr, ClientOptions{Dialect: d})
		for g := range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx := ctxTimeout(t, testTimeout)
				own := "own/" + strconv.Itoa(i) + "/" + strconv.Itoa(g)
				for r := range rounds {
					v := []byte(strconv.Itoa(r))
					if err := c.Set(ctx, own, v); err != nil {
						t.Error(err)
						return
					}
					if got, err := c.Get(ctx, own); err != nil || !bytes.Equal(got, v) {
						t.Errorf("get %s = %q, %v; want %s", own, got, err, v)
						return
					}
					if _, err := c.Add(ctx, "shared", 1); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	c := dialClient(t, addr, ClientOptions{})
	if got := mustGet(t, c, "shared"); got != strconv.Itoa(clients*goroutines*rounds) {
		t.Fatalf("shared counter %s, want %d", got, clients*goroutines*rounds)
	}
}
