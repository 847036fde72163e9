package collective

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// bigCount is an element count whose buffer exceeds 1 MiB for every type.
func bigCount(dt DType) int { return (1<<20)/dt.Size() + 3 }

// testLengths are the element counts every collective is checked with:
// empty, single, odd, not divisible by any world size, and over 1 MiB.
func testLengths(dt DType) []int {
	if testing.Short() || raceEnabled {
		return []int{0, 1, 7, 1000}
	}
	return []int{0, 1, 7, 1000, 65537, bigCount(dt)}
}

// checkReductions runs all_reduce, reduce and reduce_scatter with dt and
// op on count elements, comparing every rank with the reference.
func checkReductions(t *testing.T, comms []Comm, dt DType, op Op, count int, seed uint64) {
	t.Helper()
	n, es := len(comms), dt.Size()
	inputs := make([][]byte, n)
	for r := range inputs {
		inputs[r] = make([]byte, count*es)
		fill(inputs[r], dt, seed, r)
	}
	want := reference(t, inputs, dt, op)
	ctx := testContext(t, 60*time.Second)
	what := fmt.Sprintf("%v %v x %d on %d ranks", dt, op, count, n)

	// all_reduce: every rank gets the reference, bit for bit.
	bufs := make([][]byte, n)
	mustAll(t, "all_reduce "+what, onAll(comms, func(r int, c Comm) error {
		bufs[r] = bytes.Clone(inputs[r])
		return c.AllReduce(ctx, bufs[r], dt, op)
	}))
	for r, b := range bufs {
		if !bytes.Equal(b, want) {
			t.Fatalf("all_reduce %s: rank %d differs from the reference: %s", what, r, firstDiff(b, want))
		}
	}

	// reduce to a root that moves with the seed.
	root := int(seed % uint64(n))
	mustAll(t, "reduce "+what, onAll(comms, func(r int, c Comm) error {
		bufs[r] = bytes.Clone(inputs[r])
		return c.Reduce(ctx, bufs[r], dt, op, root)
	}))
	if !bytes.Equal(bufs[root], want) {
		t.Fatalf("reduce %s root %d: %s", what, root, firstDiff(bufs[root], want))
	}

	// reduce_scatter with uneven counts: rank i gets i+1 parts in n(n+1)/2.
	counts := make([]int, n)
	left := count
	for i := range counts {
		counts[i] = count * (i + 1) / (n * (n + 1) / 2)
		left -= counts[i]
	}
	counts[0] += left
	spans := countSpans(counts, es)
	outs := make([][]byte, n)
	mustAll(t, "reduce_scatter "+what, onAll(comms, func(r int, c Comm) error {
		outs[r] = make([]byte, counts[r]*es)
		in := bytes.Clone(inputs[r])
		if err := c.ReduceScatter(ctx, outs[r], in, dt, op, counts); err != nil {
			return err
		}
		if !bytes.Equal(in, inputs[r]) {
			return fmt.Errorf("reduce_scatter changed its input")
		}
		return nil
	}))
	for r, out := range outs {
		if w := spans[r].of(want); !bytes.Equal(out, w) {
			t.Fatalf("reduce_scatter %s: rank %d: %s", what, r, firstDiff(out, w))
		}
	}
}

// checkMovement runs broadcast, all_gather, gather, scatter and all_to_all
// with count elements of dt per rank.
func checkMovement(t *testing.T, comms []Comm, dt DType, count int, seed uint64) {
	t.Helper()
	n, es := len(comms), dt.Size()
	size := count * es
	inputs := make([][]byte, n)
	for r := range inputs {
		inputs[r] = make([]byte, size)
		fill(inputs[r], dt, seed, r)
	}
	ctx := testContext(t, 60*time.Second)
	what := fmt.Sprintf("%v x %d on %d ranks", dt, count, n)
	root := int(seed % uint64(n))
	concat := bytes.Join(inputs, nil)

	bufs := make([][]byte, n)
	mustAll(t, "broadcast "+what, onAll(comms, func(r int, c Comm) error {
		bufs[r] = bytes.Clone(inputs[r])
		return c.Broadcast(ctx, bufs[r], dt, root)
	}))
	for r, b := range bufs {
		if !bytes.Equal(b, inputs[root]) {
			t.Fatalf("broadcast %s from %d: rank %d: %s", what, root, r, firstDiff(b, inputs[root]))
		}
	}

	mustAll(t, "all_gather "+what, onAll(comms, func(r int, c Comm) error {
		bufs[r] = make([]byte, n*size)
		return c.AllGather(ctx, bufs[r], inputs[r], dt)
	}))
	for r, b := range bufs {
		if !bytes.Equal(b, concat) {
			t.Fatalf("all_gather %s: rank %d: %s", what, r, firstDiff(b, concat))
		}
	}

	mustAll(t, "gather "+what, onAll(comms, func(r int, c Comm) error {
		bufs[r] = nil
		if r == root {
			bufs[r] = make([]byte, n*size)
		}
		return c.Gather(ctx, bufs[r], inputs[r], dt, root)
	}))
	if !bytes.Equal(bufs[root], concat) {
		t.Fatalf("gather %s to %d: %s", what, root, firstDiff(bufs[root], concat))
	}

	// scatter root's n pieces of count elements.
	pieces := make([]byte, n*size)
	fill(pieces, dt, seed+1, root)
	mustAll(t, "scatter "+what, onAll(comms, func(r int, c Comm) error {
		bufs[r] = make([]byte, size)
		var in []byte
		if r == root {
			in = pieces
		}
		return c.Scatter(ctx, bufs[r], in, dt, root)
	}))
	for r, b := range bufs {
		if w := pieces[r*size : (r+1)*size]; !bytes.Equal(b, w) {
			t.Fatalf("scatter %s from %d: rank %d: %s", what, root, r, firstDiff(b, w))
		}
	}

	// all_to_all with counts that differ per pair: rank i sends j
	// (count+i+2j) % (count+1) elements.
	pair := func(from, to int) int { return (count + from + 2*to) % (count + 1) }
	sendData := make([][]byte, n)
	mustAll(t, "all_to_all "+what, onAll(comms, func(r int, c Comm) error {
		sendCounts, recvCounts := make([]int, n), make([]int, n)
		for j := range n {
			sendCounts[j], recvCounts[j] = pair(r, j), pair(j, r)
		}
		total := func(cs []int) (s int) {
			for _, c := range cs {
				s += c
			}
			return s
		}
		sendData[r] = make([]byte, total(sendCounts)*es)
		fill(sendData[r], dt, seed+2, r)
		bufs[r] = make([]byte, total(recvCounts)*es)
		return c.AllToAll(ctx, bufs[r], sendData[r], dt, sendCounts, recvCounts)
	}))
	checkAllToAllPieces(t, "all_to_all "+what, bufs, sendData, pair, es)
}

// checkAllToAllPieces checks what an all_to_all brought every rank r
// (outs[r]) against what each rank j sent it (ins[j]), pair(from, to)
// elements of es bytes from each to each.
func checkAllToAllPieces(t *testing.T, what string, outs, ins [][]byte, pair func(from, to int) int, es int) {
	t.Helper()
	for r := range outs {
		off := 0
		for j := range ins {
			// rank j's piece for r starts after its pieces for 0..r-1.
			from := 0
			for k := range r {
				from += pair(j, k) * es
			}
			want := ins[j][from : from+pair(j, r)*es]
			if got := outs[r][off : off+len(want)]; !bytes.Equal(got, want) {
				t.Fatalf("%s: rank %d's piece from %d: %s", what, r, j, firstDiff(got, want))
			}
			off += len(want)
		}
	}
}

// checkSendRecv passes a message around the ring, half the ranks using
// AnySource.
func checkSendRecv(t *testing.T, comms []Comm, dt DType, count int, seed uint64) {
	t.Helper()
	n := len(comms)
	if n == 1 {
		return
	}
	ctx := testContext(t, 60*time.Second)
	msgs := make([][]byte, n)
	got := make([][]byte, n)
	mustAll(t, "send/recv", onAll(comms, func(r int, c Comm) error {
		msgs[r] = make([]byte, count*dt.Size())
		fill(msgs[r], dt, seed, r)
		got[r] = make([]byte, len(msgs[r]))
		errc := make(chan error, 1)
		go func() { errc <- c.Send(ctx, msgs[r], dt, (r+1)%n, 7) }()
		from := (r + n - 1) % n
		peer := from
		if r%2 == 1 {
			peer = AnySource
		}
		src, err := c.Recv(ctx, got[r], dt, peer, 7)
		if err != nil {
			return err
		}
		if src != from {
			return fmt.Errorf("recv from %d reports sender %d", from, src)
		}
		return <-errc
	}))
	for r := range n {
		if w := msgs[(r+n-1)%n]; !bytes.Equal(got[r], w) {
			t.Fatalf("send/recv %v x %d: rank %d: %s", dt, count, r, firstDiff(got[r], w))
		}
	}
}

// TestCollectivesMatchReference checks every collective, type, operator
// and length on every world size, through the default transport (shared
// memory, these ranks sharing a host), and through TCP on a few sizes.
func TestCollectivesMatchReference(t *testing.T) {
	type world struct {
		n         int
		transport string
	}
	var worlds []world
	sizes := []int{1, 2, 3, 4, 5, 6, 7, 8}
	if testing.Short() || raceEnabled {
		sizes = []int{1, 2, 3, 5}
	}
	for _, n := range sizes {
		worlds = append(worlds, world{n, "auto"})
	}
	for _, n := range []int{2, 3, 5} {
		worlds = append(worlds, world{n, "tcp"})
	}
	for _, w := range worlds {
		n := w.n
		t.Run(fmt.Sprintf("%s/world=%d", w.transport, n), func(t *testing.T) {
			comms := testWorld(t, n, TCPOptions{Transport: w.transport})
			if shared := comms[0].(*comm).t.shm != nil; shared != (n > 1 && w.transport == "auto") {
				t.Fatalf("shared memory: %v", shared)
			}
			seed := uint64(n)
			for _, dt := range allDTypes {
				for _, count := range testLengths(dt) {
					for _, op := range opsFor(dt) {
						seed++
						checkReductions(t, comms, dt, op, count, seed)
					}
					checkMovement(t, comms, dt, count, seed)
					checkSendRecv(t, comms, dt, count, seed)
					mustAll(t, "barrier", onAll(comms, func(_ int, c Comm) error {
						return c.Barrier(testContext(t, 30*time.Second))
					}))
				}
			}
		})
	}
}

// TestForcedAlgorithms runs every algorithm on world sizes 2, 3, 4, 5 and
// 8, with small segments so that pipelining spans many frames.
func TestForcedAlgorithms(t *testing.T) {
	pairs := []struct {
		dt DType
		op Op
	}{{Float32, Sum}, {Int32, BXor}, {BFloat16, Avg}, {Float16, Max}, {Int64, Product}, {Float64, Min}, {Uint8, Sum}}
	lengths := []int{0, 1, 7, 1000, 65537}
	if testing.Short() || raceEnabled {
		lengths = []int{0, 1, 7, 1000}
	}
	for _, algo := range []string{"ring", "rhd", "rd", "tree", "chain", "bruck"} {
		for _, n := range []int{2, 3, 4, 5, 8} {
			t.Run(fmt.Sprintf("%s/world=%d", algo, n), func(t *testing.T) {
				// Over TCP: the other tests mostly take the same-host Unix sockets.
				comms := testWorld(t, n, TCPOptions{Algorithm: algo, segment: 4 << 10, TCPOnly: true})
				seed := uint64(100 * n)
				for _, count := range lengths {
					for _, p := range pairs {
						seed++
						checkReductions(t, comms, p.dt, p.op, count, seed)
					}
					checkMovement(t, comms, Float32, count, seed)
				}
			})
		}
	}
}

// TestAllReduceBitwiseIdentical reduces random floats, whose sums round
// differently in every order, and checks that all ranks agree bit for bit.
func TestAllReduceBitwiseIdentical(t *testing.T) {
	for _, algo := range []string{"ring", "rhd", "rd"} {
		for _, n := range []int{3, 5, 8} {
			t.Run(fmt.Sprintf("%s/world=%d", algo, n), func(t *testing.T) {
				comms := testWorld(t, n, TCPOptions{Algorithm: algo, segment: 8 << 10})
				ctx := testContext(t, 30*time.Second)
				for _, dt := range []DType{Float32, Float64, Float16, BFloat16} {
					for _, op := range []Op{Sum, Product, Avg} {
						bufs := make([][]byte, n)
						mustAll(t, "all_reduce", onAll(comms, func(r int, c Comm) error {
							rng := rand.New(rand.NewPCG(uint64(r), uint64(dt)))
							bufs[r] = make([]byte, 10007*dt.Size())
							randomFloats(bufs[r], dt, rng)
							return c.AllReduce(ctx, bufs[r], dt, op)
						}))
						for r := 1; r < n; r++ {
							if !bytes.Equal(bufs[r], bufs[0]) {
								t.Fatalf("%v %v: rank %d differs from rank 0: %s", dt, op, r, firstDiff(bufs[r], bufs[0]))
							}
						}
					}
				}
			})
		}
	}
}

func randomFloats(buf []byte, dt DType, rng *rand.Rand) {
	switch dt {
	case Float32:
		v := view[float32](buf)
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
	case Float64:
		v := view[float64](buf)
		for i := range v {
			v[i] = rng.NormFloat64()
		}
	case Float16:
		v := view[uint16](buf)
		for i := range v {
			v[i] = Float32ToFloat16(float32(rng.NormFloat64()))
		}
	case BFloat16:
		v := view[uint16](buf)
		for i := range v {
			v[i] = Float32ToBFloat16(float32(rng.NormFloat64()))
		}
	}
}

func TestSplit(t *testing.T) {
	comms := testWorld(t, 5, TCPOptions{})
	ctx := testContext(t, 30*time.Second)
	evens, odds := []int{4, 2, 0}, []int{1, 3}
	subs := make([]Comm, 5)
	mustAll(t, "split", onAll(comms, func(r int, c Comm) error {
		ranks := evens
		if r%2 == 1 {
			ranks = odds
		}
		// Everyone takes part in both splits; each rank is in one.
		a, err := c.Split(ctx, evens, "evens")
		if err != nil {
			return err
		}
		b, err := c.Split(ctx, odds, "odds")
		if err != nil {
			return err
		}
		subs[r] = a
		if b != nil {
			subs[r] = b
		}
		if want := slices.Index(ranks, r); subs[r].Rank() != want || subs[r].Size() != len(ranks) {
			return fmt.Errorf("sub rank %d of %d, want %d of %d", subs[r].Rank(), subs[r].Size(), want, len(ranks))
		}
		return nil
	}))
	// The world and both splits run concurrently without interfering.
	results := make([][]float32, 5)
	worldResults := make([][]float32, 5)
	mustAll(t, "concurrent", onAll(comms, func(r int, c Comm) error {
		errc := make(chan error, 1)
		go func() {
			buf := make([]float32, 1000)
			for i := range buf {
				buf[i] = float32(r)
			}
			b := bytesOf(buf)
			for range 20 {
				if err := subs[r].AllReduce(ctx, b, Float32, Max); err != nil {
					errc <- err
					return
				}
			}
			results[r] = buf
			errc <- nil
		}()
		buf := make([]float32, 100000)
		for i := range buf {
			buf[i] = 1
		}
		for range 5 {
			if err := c.AllReduce(ctx, bytesOf(buf), Float32, Sum); err != nil {
				return err
			}
		}
		worldResults[r] = buf
		return <-errc
	}))
	for r := range 5 {
		want := float32(4)
		if r%2 == 1 {
			want = 3
		}
		if results[r][999] != want || worldResults[r][0] != 5*5*5*5*5 {
			t.Fatalf("rank %d: sub max %v (want %v), world sum %v", r, results[r][999], want, worldResults[r][0])
		}
	}
	for _, s := range subs {
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	// The world still works after its splits closed.
	mustAll(t, "barrier", onAll(comms, func(_ int, c Comm) error { return c.Barrier(ctx) }))
}

func bytesOf[T any](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafeBytes(s)
}

func TestSplitMismatchedRanks(t *testing.T) {
	comms := testWorld(t, 3, TCPOptions{})
	ctx := testContext(t, 10*time.Second)
	errs := onAll(comms, func(r int, c Comm) error {
		ranks := []int{0, 1}
		if r == 2 {
			ranks = []int{0, 2}
		}
		_, err := c.Split(ctx, ranks, "x")
		return err
	})
	for r, err := range errs {
		if !errorsIsMismatch(err) {
			t.Fatalf("rank %d: %v, want a mismatch", r, err)
		}
	}
}

func TestConcurrentTags(t *testing.T) {
	comms := testWorld(t, 2, TCPOptions{segment: 1 << 10})
	ctx := testContext(t, 30*time.Second)
	const tags = 8
	mustAll(t, "tags", onAll(comms, func(r int, c Comm) error {
		errc := make(chan error, tags)
		for tag := range tags {
			go func() {
				buf := make([]byte, 10000+tag)
				if r == 0 {
					for i := range buf {
						buf[i] = byte(tag)
					}
					errc <- c.Send(ctx, buf, Uint8, 1, tag)
					return
				}
				if _, err := c.Recv(ctx, buf, Uint8, 0, tag); err != nil {
					errc <- err
					return
				}
				for _, b := range buf {
					if b != byte(tag) {
						errc <- fmt.Errorf("tag %d got a byte %d", tag, b)
						return
					}
				}
				errc <- nil
			}()
		}
		for range tags {
			if err := <-errc; err != nil {
				return err
			}
		}
		return nil
	}))
}

func TestArgumentErrors(t *testing.T) {
	comms := testWorld(t, 1, TCPOptions{})
	c := comms[0]
	ctx := context.Background()
	for name, err := range map[string]error{
		"avg of ints":       c.AllReduce(ctx, make([]byte, 4), Int32, Avg),
		"bxor of floats":    c.AllReduce(ctx, make([]byte, 4), Float32, BXor),
		"partial element":   c.AllReduce(ctx, make([]byte, 3), Float32, Sum),
		"bad root":          c.Broadcast(ctx, nil, Float32, 1),
		"bad gather out":    c.AllGather(ctx, make([]byte, 3), make([]byte, 4), Float32),
		"send to self":      c.Send(ctx, nil, Float32, 0, 0),
		"reduce_scatter n":  c.ReduceScatter(ctx, nil, nil, Float32, Sum, []int{0, 0}),
		"unknown dtype":     c.AllReduce(ctx, nil, DType(3), Sum),
		"all_to_all counts": c.AllToAll(ctx, nil, make([]byte, 4), Float32, []int{0}, []int{0}),
	} {
		if err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	// The communicator is still usable: argument errors happen before any
	// traffic.
	if err := c.AllReduce(ctx, make([]byte, 8), Float32, Sum); err != nil {
		t.Fatal(err)
	}
}
