package collective

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/rendezvous"
)

// testWorld builds n ranks in this process, each with its own transport
// on 127.0.0.1, meeting through an in-memory store; they close when the
// test ends.
func testWorld(t testing.TB, n int, opts TCPOptions) []Comm {
	t.Helper()
	return testWorldOf(t, n, func(int) TCPOptions { return opts })
}

// testWorldOf is testWorld with rank r's options optsOf(r).
func testWorldOf(t testing.TB, n int, optsOf func(rank int) TCPOptions) []Comm {
	t.Helper()
	store := rendezvous.NewMemoryStore(20 * time.Second)
	comms := make([]Comm, n)
	errs := make([]error, n)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for r := range n {
		opts := optsOf(r)
		opts.Host = "127.0.0.1"
		wg.Go(func() { comms[r], errs[r] = NewTCP(ctx, store, r, n, opts) })
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, c := range comms {
			if c != nil {
				c.Close()
			}
		}
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: NewTCP: %v", r, err)
		}
	}
	return comms
}

// onAll runs f on every rank at once and returns each rank's error.
func onAll(comms []Comm, f func(rank int, c Comm) error) []error {
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Go(func() { errs[r] = f(r, c) })
	}
	wg.Wait()
	return errs
}

// mustAll fails the test when any rank failed.
func mustAll(t testing.TB, what string, errs []error) {
	t.Helper()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("%s: rank %d: %v", what, r, err)
		}
	}
}

func testContext(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// fill writes reproducible data for (seed, rank) into buf. Floating-point
// values are small integers in [-2, 2], so sums and products of up to
// eight of them are exact in every float type and any combine order gives
// the reference's bits; integers use all their bits (they wrap, which is
// associative anyway).
func fill(buf []byte, dt DType, seed uint64, rank int) {
	x := seed*0x9e3779b97f4a7c15 + uint64(rank+1)*0xbf58476d1ce4e5b9 + 1
	next := func() uint64 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		return x
	}
	if !dt.IsFloat() {
		for i := 0; i < len(buf); i += 8 {
			var w [8]byte
			binary.LittleEndian.PutUint64(w[:], next())
			copy(buf[i:], w[:])
		}
		return
	}
	es := dt.Size()
	for i := 0; i+es <= len(buf); i += es {
		v := float64(int(next()%5) - 2)
		switch dt {
		case Float32:
			binary.LittleEndian.PutUint32(buf[i:], math.Float32bits(float32(v)))
		case Float64:
			binary.LittleEndian.PutUint64(buf[i:], math.Float64bits(v))
		case Float16:
			binary.LittleEndian.PutUint16(buf[i:], Float32ToFloat16(float32(v)))
		case BFloat16:
			binary.LittleEndian.PutUint16(buf[i:], Float32ToBFloat16(float32(v)))
		}
	}
}

// reference reduces inputs in rank order, as the ranks should.
func reference(t testing.TB, inputs [][]byte, dt DType, op Op) []byte {
	t.Helper()
	out := append([]byte(nil), inputs[0]...)
	for _, in := range inputs[1:] {
		if err := ReduceInto(out, in, dt, op); err != nil {
			t.Fatal(err)
		}
	}
	if op == Avg {
		divideBy(out, dt, len(inputs))
	}
	return out
}

var allDTypes = []DType{Int8, Uint8, Int32, Int64, Float16, BFloat16, Float32, Float64}

// opsFor lists the reductions that apply to dt.
func opsFor(dt DType) []Op {
	if dt.IsFloat() {
		return []Op{Sum, Product, Max, Min, Avg}
	}
	return []Op{Sum, Product, Max, Min, BAnd, BOr, BXor}
}

// firstDiff locates the first differing byte of two buffers, for messages.
func firstDiff(a, b []byte) string {
	if len(a) != len(b) {
		return fmt.Sprintf("lengths %d and %d", len(a), len(b))
	}
	for i := range a {
		if a[i] != b[i] {
			return fmt.Sprintf("first difference at byte %d: %#x vs %#x", i, a[i], b[i])
		}
	}
	return "equal"
}

func errorsIsMismatch(err error) bool { return errors.Is(err, ErrMismatch) }

// countSpans turns per-rank element counts into byte ranges.
func countSpans(counts []int, size int) []span {
	return fillCountSpans(make([]span, len(counts)), counts, size)
}

// closeDuringAllReduce has every rank run all_reduces of size bytes until
// victim's transport closes, as closeDuring says.
func closeDuringAllReduce(t *testing.T, ctx context.Context, comms []Comm, victim, size int) {
	t.Helper()
	closeDuring(t, comms, victim, func(c Comm) func() error {
		buf := make([]byte, size)
		return func() error { return c.AllReduce(ctx, buf, Float32, Sum) }
	})
}

// closeDuring has every rank make its call (newCall gives each rank's,
// with buffers of its own) again and again until victim's transport
// closes at its third (no goodbye: its sockets just close, as when its
// process dies), and checks that every other rank failed within 5 s with
// a PeerError naming victim.
func closeDuring(t *testing.T, comms []Comm, victim int, newCall func(c Comm) func() error) {
	t.Helper()
	var killed time.Time
	var once sync.Once
	errs := onAll(comms, func(r int, c Comm) error {
		call := newCall(c)
		for i := 0; ; i++ {
			if r == victim && i == 2 {
				once.Do(func() { killed = time.Now() })
				c.(*comm).t.close()
				return nil
			}
			if err := call(); err != nil {
				return err
			}
			if i > 1000 {
				return errors.New("never failed")
			}
		}
	})
	if took := time.Since(killed); took > 5*time.Second {
		t.Errorf("the others failed %v after the death", took)
	}
	for r, err := range errs {
		if r == victim {
			continue
		}
		t.Logf("rank %d: %v", r, err)
		var pe *PeerError
		if !errors.As(err, &pe) || pe.Rank != victim {
			t.Errorf("rank %d: %v, want a PeerError naming rank %d", r, err, victim)
		}
	}
}
