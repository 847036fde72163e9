package rendezvous

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// testTimeout bounds every blocking step of a test; no test sleeps.
const testTimeout = 10 * time.Second

// logBuffer collects a server's log lines for assertions.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// startServer serves a new Server on 127.0.0.1:0 until the test ends and
// returns it with its address and its log.
func startServer(t testing.TB, opts ServerOptions) (*Server, string, *logBuffer) {
	t.Helper()
	logs := &logBuffer{}
	opts.Logger = zerolog.New(logs).Level(zerolog.DebugLevel)
	srv := NewServer(opts)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if err := <-served; !errors.Is(err, ErrServerClosed) {
			t.Errorf("Serve returned %v, want ErrServerClosed", err)
		}
	})
	return srv, l.Addr().String(), logs
}

func dialClient(t testing.TB, addr string, opts ClientOptions) *Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	c, err := Dial(ctx, addr, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Frame builders for hand-made requests and expected replies.

func u8(b byte) []byte { return []byte{b} }

func u32(v uint32) []byte { return binary.LittleEndian.AppendUint32(nil, v) }

func u64(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }

func i64(v int64) []byte { return u64(uint64(v)) }

// str is a length-prefixed string or byte vector.
func str(s string) []byte { return append(u64(uint64(len(s))), s...) }

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// v2Hello is what a torch >= 2.2 client sends first.
var v2Hello = cat(u8(0), u32(validateMagic))

// rawConn is a hand-driven TCPStore connection.
type rawConn struct {
	t  testing.TB
	nc net.Conn
}

func dialRaw(t testing.TB, addr string) *rawConn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return &rawConn{t: t, nc: nc}
}

// dialV2 opens a connection that has sent VALIDATE.
func dialV2(t testing.TB, addr string) *rawConn {
	c := dialRaw(t, addr)
	c.send(v2Hello)
	return c
}

func (c *rawConn) send(parts ...[]byte) {
	c.t.Helper()
	if _, err := c.nc.Write(cat(parts...)); err != nil {
		c.t.Fatalf("send: %v", err)
	}
}

// expect reads len(want) bytes and compares them with want.
func (c *rawConn) expect(want ...[]byte) {
	c.t.Helper()
	w := cat(want...)
	got := make([]byte, len(w))
	_ = c.nc.SetReadDeadline(time.Now().Add(testTimeout))
	if n, err := io.ReadFull(c.nc, got); err != nil {
		c.t.Fatalf("reading %d reply bytes: got % x, %v", len(w), got[:n], err)
	}
	if !bytes.Equal(got, w) {
		c.t.Fatalf("reply % x, want % x", got, w)
	}
}

// expectSilence checks that nothing arrives for a moment: the reply of a
// request that has none, or of a wait still pending.
func (c *rawConn) expectSilence() {
	c.t.Helper()
	_ = c.nc.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	var b [1]byte
	if n, err := c.nc.Read(b[:]); n > 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		c.t.Fatalf("expected no reply, got % x, %v", b[:n], err)
	}
}

// expectClosed checks that the server closes the connection.
func (c *rawConn) expectClosed() {
	c.t.Helper()
	_ = c.nc.SetReadDeadline(time.Now().Add(testTimeout))
	rest, err := io.ReadAll(c.nc)
	if err != nil && !strings.Contains(err.Error(), "reset") {
		c.t.Fatalf("expected the server to close the connection: %v", err)
	}
	if len(rest) > 0 {
		c.t.Fatalf("unexpected bytes % x before close", rest)
	}
}

// waitPending blocks until the table holds n pending waits: the remote
// WAITs under test have arrived.
func waitPending(t testing.TB, tbl *table, n int) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for tbl.pendingWaits() != n {
		if time.Now().After(deadline) {
			t.Fatalf("pending waits: %d, want %d", tbl.pendingWaits(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func ctxTimeout(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
