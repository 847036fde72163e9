package collective

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestMismatchFailsEveryRank: ranks that call different collectives, or
// the same one with other shapes, all fail with ErrMismatch, in the call
// itself or, for a rank whose call completed (a broadcast root only
// sends), in the next one.
func TestMismatchFailsEveryRank(t *testing.T) {
	cases := []struct {
		name  string
		n     int
		call  func(ctx context.Context, r int, c Comm) error
		wants []string // substrings of the detecting rank's message
	}{
		{
			name: "all_reduce vs broadcast",
			n:    3,
			call: func(ctx context.Context, r int, c Comm) error {
				buf := make([]byte, 4096)
				if r == 0 {
					return c.Broadcast(ctx, buf, Float32, 0)
				}
				return c.AllReduce(ctx, buf, Float32, Sum)
			},
			wants: []string{"all_reduce(float32 x 1024, sum, seq 1)", "broadcast(float32 x 1024, root 0, seq 1)"},
		},
		{
			name: "counts",
			n:    4,
			call: func(ctx context.Context, r int, c Comm) error {
				n := 1024
				if r == 2 {
					n = 2048
				}
				return c.AllReduce(ctx, make([]byte, 4*n), Float32, Sum)
			},
			wants: []string{"float32 x 1024", "float32 x 2048"},
		},
		{
			name: "dtypes",
			n:    5,
			call: func(ctx context.Context, r int, c Comm) error {
				dt := Float32
				if r == 4 {
					dt = Int32
				}
				return c.AllReduce(ctx, make([]byte, 400000), dt, Sum)
			},
			wants: []string{"int32 x 100000", "float32 x 100000"},
		},
		{
			name: "reduction ops",
			n:    2,
			call: func(ctx context.Context, r int, c Comm) error {
				op := Sum
				if r == 1 {
					op = Max
				}
				return c.AllReduce(ctx, make([]byte, 64), Float64, op)
			},
			wants: []string{"sum", "max"},
		},
		{
			name: "roots",
			n:    3,
			call: func(ctx context.Context, r int, c Comm) error {
				root := 0
				if r == 1 {
					root = 1
				}
				return c.Broadcast(ctx, make([]byte, 64), Uint8, root)
			},
			wants: []string{"root 0", "root 1"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			comms := testWorld(t, tc.n, TCPOptions{TCPOnly: tc.n%2 == 1})
			ctx := testContext(t, 20*time.Second)
			start := time.Now()
			errs := onAll(comms, func(r int, c Comm) error {
				if err := tc.call(ctx, r, c); err != nil {
					return err
				}
				return c.Barrier(ctx) // a call that completed fails in the next
			})
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("took %v: a mismatch must fail at once", d)
			}
			detected := false
			for r, err := range errs {
				var m *MismatchError
				if !errors.As(err, &m) || !errors.Is(err, ErrMismatch) {
					t.Fatalf("rank %d: %v, want a mismatch", r, err)
				}
				if m.Viewer != r {
					t.Errorf("rank %d: error written for rank %d", r, m.Viewer)
				}
				msg := err.Error()
				for _, w := range tc.wants {
					if !strings.Contains(msg, w) {
						t.Errorf("rank %d: %q lacks %q", r, msg, w)
					}
				}
				detected = detected || strings.HasPrefix(msg, "collective: mismatch with rank")
				t.Logf("rank %d: %v", r, err)
			}
			if !detected {
				t.Error("no rank reported the mismatch as its own")
			}
			// The communicator stays failed.
			for r, c := range comms {
				if err := c.Barrier(ctx); !errors.Is(err, ErrMismatch) {
					t.Errorf("rank %d: later call: %v", r, err)
				}
			}
		})
	}
}

// TestHangNamesTheRank: a rank that stops calling makes the others fail at
// their deadline, naming it.
func TestHangNamesTheRank(t *testing.T) {
	for _, n := range []int{2, 4, 5} {
		t.Run(fmt.Sprintf("world=%d", n), func(t *testing.T) {
			comms := testWorld(t, n, TCPOptions{})
			const hung = 1
			const deadline = 700 * time.Millisecond
			ctx := testContext(t, 20*time.Second)
			mustAll(t, "warm-up", onAll(comms, func(_ int, c Comm) error { return c.Barrier(ctx) }))
			start := time.Now()
			errs := onAll(comms, func(r int, c Comm) error {
				if r == hung {
					return nil
				}
				ctx, cancel := context.WithTimeout(ctx, deadline)
				defer cancel()
				return c.AllReduce(ctx, make([]byte, 1<<20), Float32, Sum)
			})
			elapsed := time.Since(start)
			for r, err := range errs {
				if r == hung {
					continue
				}
				var pe *PeerError
				if !errors.As(err, &pe) {
					t.Fatalf("rank %d: %v, want a PeerError", r, err)
				}
				if !strings.Contains(err.Error(), fmt.Sprintf("rank %d", hung)) {
					t.Errorf("rank %d: %q does not name rank %d", r, err, hung)
				}
				t.Logf("rank %d: %v", r, err)
			}
			if elapsed < deadline || elapsed > deadline+3*time.Second {
				t.Errorf("failed after %v, deadline %v", elapsed, deadline)
			}
		})
	}
}

// TestPeerDeathFailsAtOnce: a rank whose transport goes away (its sockets
// close, as when the process dies) fails everyone's pending all_reduce
// with a PeerError naming it, long before any deadline.
func TestPeerDeathFailsAtOnce(t *testing.T) {
	const n, victim = 4, 2
	comms := testWorld(t, n, TCPOptions{TCPOnly: true})
	ctx := testContext(t, 60*time.Second)
	size := 16 << 20
	if raceEnabled {
		size = 1 << 20
	}
	mustAll(t, "warm-up", onAll(comms, func(_ int, c Comm) error {
		return c.AllReduce(ctx, make([]byte, 1024), Float32, Sum)
	}))
	closeDuringAllReduce(t, ctx, comms, victim, size)
	// Later calls fail fast.
	for r, c := range comms {
		if r == victim {
			continue
		}
		start := time.Now()
		if err := c.Barrier(ctx); err == nil || time.Since(start) > time.Second {
			t.Errorf("rank %d: later barrier: %v after %v", r, err, time.Since(start))
		}
	}
}

// TestGarbageOnThePort: bytes that are not our protocol, sent to a rank's
// listening port, are dropped with their connection; the rank goes on.
func TestGarbageOnThePort(t *testing.T) {
	comms := testWorld(t, 3, TCPOptions{})
	ctx := testContext(t, 20*time.Second)
	target := comms[1].(*comm).t.ln.Addr().String()
	rng := rand.New(rand.NewPCG(5, 6))
	hello := func(rank, size int) []byte {
		var b [headerSize]byte
		h := header{kind: kindHello, root: int32(rank), count: uint64(size)}
		h.encode(&b)
		return b[:]
	}
	payloads := [][]byte{
		[]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
		make([]byte, headerSize), // zeros
		hello(7, 3),              // a rank out of range
		hello(1, 3),              // itself
		hello(0, 9),              // another world size
	}
	for range 20 {
		junk := make([]byte, rng.IntN(4096)+1)
		for i := range junk {
			junk[i] = byte(rng.Uint32())
		}
		payloads = append(payloads, junk)
	}
	for _, p := range payloads {
		c, err := net.Dial("tcp", target)
		if err != nil {
			t.Fatal(err)
		}
		c.Write(p)
		c.Close()
	}
	// A connection that says nothing at all does not block anyone either.
	idle, err := net.Dial("tcp", target)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()

	for i := range 3 {
		mustAll(t, "all_reduce after garbage", onAll(comms, func(_ int, c Comm) error {
			buf := bytesOf([]float32{1, 2, 3})
			if err := c.AllReduce(ctx, buf, Float32, Sum); err != nil {
				return err
			}
			if got := view[float32](buf); got[2] != 9 {
				return fmt.Errorf("round %d: got %v", i, got)
			}
			return nil
		}))
	}
}

// TestGarbageFromAPeer: a connected peer that breaks the protocol fails
// the receives that depend on it with a PeerError, not a panic.
func TestGarbageFromAPeer(t *testing.T) {
	// Without shared memory, which connects every pair at once: the
	// impersonation must come before rank 0's own connection.
	comms := testWorld(t, 2, TCPOptions{Transport: "unix"})
	ctx := testContext(t, 20*time.Second)
	target := comms[1].(*comm).t.ln.Addr().String()
	// Impersonate rank 0 before it connects itself.
	c, err := net.Dial("tcp", target)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var b [headerSize]byte
	h := header{kind: kindHello, root: 0, count: 2}
	h.encode(&b)
	c.Write(b[:])
	c.Write([]byte("this is not a frame header, not at all, no no no no, not even close to one"))
	start := time.Now()
	_, err = comms[1].Recv(ctx, make([]byte, 4), Float32, 0, 0)
	if time.Since(start) > 5*time.Second {
		t.Errorf("took %v", time.Since(start))
	}
	var pe *PeerError
	if !errors.As(err, &pe) || pe.Rank != 0 {
		t.Fatalf("recv: %v, want a PeerError naming rank 0", err)
	}
}

// TestCloseFailsPendingCalls: Close wakes a blocked call with ErrClosed,
// is idempotent, and leaves no goroutine behind.
func TestCloseFailsPendingCalls(t *testing.T) {
	before := runtime.NumGoroutine()
	comms := testWorld(t, 3, TCPOptions{Eager: true})
	ctx := testContext(t, 20*time.Second)
	mustAll(t, "warm-up", onAll(comms, func(_ int, c Comm) error { return c.Barrier(ctx) }))
	errc := make(chan error, 1)
	go func() { errc <- comms[0].AllReduce(ctx, make([]byte, 64), Float32, Sum) }()
	// Wait until the call is blocked on its peers.
	for comms[0].(*comm).waitingOn.Load() < 0 {
		runtime.Gosched()
	}
	comms[0].Close()
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Fatalf("pending call: %v, want ErrClosed", err)
	}
	if err := comms[0].Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if err := comms[0].Barrier(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("call after close: %v", err)
	}
	for _, c := range comms[1:] {
		c.Close()
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		runtime.Gosched()
	}
	if n := runtime.NumGoroutine(); n > before {
		buf := make([]byte, 1<<16)
		t.Fatalf("%d goroutines before, %d after closing:\n%s", before, n, buf[:runtime.Stack(buf, true)])
	}
}

// TestTimeoutNamesPeer: with two ranks, a receive that never comes times
// out naming the sender, and wraps the context's error.
func TestTimeoutNamesPeer(t *testing.T) {
	comms := testWorld(t, 2, TCPOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := comms[0].Recv(ctx, make([]byte, 8), Float32, 1, 3)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "timed out waiting for rank 1") {
		t.Fatalf("got %v", err)
	}
}

// A root that broadcasts and closes at once (a worker that exits right
// after its last collective) must not fail the others' receives of what it
// already sent.
func TestBroadcastFromARootThatClosed(t *testing.T) {
	for _, transport := range []string{"tcp", "unix"} {
		t.Run(transport, func(t *testing.T) {
			comms := testWorld(t, 3, TCPOptions{Transport: transport})
			ctx := testContext(t, 10*time.Second)
			rootDone := make(chan struct{})
			errs := onAll(comms, func(rank int, c Comm) error {
				for i, n := range []int{8, 1 << 20} {
					buf := make([]byte, n)
					if rank == 0 {
						for j := range buf {
							buf[j] = byte(i + j)
						}
					} else if i == 0 {
						// Every later call starts once this rank has seen
						// the root's connection end.
						<-rootDone
						tr := c.(*comm).t
						for deadline := time.Now().Add(5 * time.Second); tr.peerGone(0) == nil && time.Now().Before(deadline); {
							time.Sleep(time.Millisecond)
						}
					}
					if err := c.Broadcast(ctx, buf, Uint8, 0); err != nil {
						return fmt.Errorf("broadcast %d: %w", i, err)
					}
					if rank == 0 && i == 1 {
						err := c.Close()
						close(rootDone)
						return err
					}
					for j := range buf {
						if buf[j] != byte(i+j) {
							return fmt.Errorf("broadcast %d: byte %d = %d", i, j, buf[j])
						}
					}
				}
				return nil
			})
			mustAll(t, "broadcast from a closed root", errs)
		})
	}
}
