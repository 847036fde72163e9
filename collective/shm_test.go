package collective

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/rendezvous"
)

// sharedSegments lists this package's files in /dev/shm.
func sharedSegments(t testing.TB) []string {
	t.Helper()
	entries, err := os.ReadDir(shmDir)
	if err != nil {
		t.Fatalf("no %s: %v", shmDir, err)
	}
	var names []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "gorun-collective-") {
			names = append(names, e.Name())
		}
	}
	return names
}

// expectNoNewSegments fails unless every segment not in before is gone
// within a few seconds (another job's may come and go meanwhile).
func expectNoNewSegments(t testing.TB, before []string) {
	t.Helper()
	var left []string
	for deadline := time.Now().Add(5 * time.Second); ; {
		left = left[:0]
		for _, name := range sharedSegments(t) {
			if !slices.Contains(before, name) {
				left = append(left, name)
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(left) > 0 {
		t.Errorf("left behind in %s: %v", shmDir, left)
	}
}

// TestSharedMemoryChoice: ranks on one host share memory unless told
// not to, and no segment outlives the setup.
func TestSharedMemoryChoice(t *testing.T) {
	for _, tc := range []struct {
		opts   TCPOptions
		shared bool
	}{
		{TCPOptions{}, true},
		{TCPOptions{Transport: "auto"}, true},
		{TCPOptions{Transport: "tcp"}, false},
		{TCPOptions{Transport: "unix"}, false},
		{TCPOptions{TCPOnly: true}, false},
	} {
		t.Run(fmt.Sprintf("transport=%q/tcp-only=%v", tc.opts.Transport, tc.opts.TCPOnly), func(t *testing.T) {
			before := sharedSegments(t)
			comms := testWorld(t, 3, tc.opts)
			for r, c := range comms {
				if got := c.(*comm).t.shm != nil; got != tc.shared {
					t.Errorf("rank %d: shared memory %v, want %v", r, got, tc.shared)
				}
			}
			expectNoNewSegments(t, before)
			ctx := testContext(t, 10*time.Second)
			mustAll(t, "all_reduce", onAll(comms, func(r int, c Comm) error {
				return c.AllReduce(ctx, make([]byte, 4<<20), Float32, Sum)
			}))
		})
	}
}

// TestSharedMemoryOneRankOptsOut: when one rank may not use shared
// memory, every rank falls back to sockets, and they still agree.
func TestSharedMemoryOneRankOptsOut(t *testing.T) {
	store := rendezvous.NewMemoryStore(20 * time.Second)
	comms := make([]Comm, 3)
	errs := onAll(comms, func(r int, _ Comm) error {
		opts := TCPOptions{Host: "127.0.0.1"}
		if r == 1 {
			opts.Transport = "unix"
		}
		var err error
		comms[r], err = NewTCP(testContext(t, 20*time.Second), store, r, 3, opts)
		return err
	})
	mustAll(t, "join", errs)
	t.Cleanup(func() {
		for _, c := range comms {
			c.Close()
		}
	})
	for r, c := range comms {
		if c.(*comm).t.shm != nil {
			t.Errorf("rank %d uses shared memory", r)
		}
	}
	ctx := testContext(t, 10*time.Second)
	mustAll(t, "all_reduce", onAll(comms, func(r int, c Comm) error {
		return c.AllReduce(ctx, make([]byte, 1<<20), Float32, Sum)
	}))
}

// TestSharedMemoryBlocks runs the shared-memory algorithms of every
// collective with blocks far smaller than the buffers, so that slots are
// reused many times and blocks do not divide evenly among ranks.
func TestSharedMemoryBlocks(t *testing.T) {
	for _, algo := range []string{"shm", "shm-flat", "shm/no-single-copy"} {
		for _, n := range []int{2, 3, 4} {
			t.Run(fmt.Sprintf("%s/world=%d", algo, n), func(t *testing.T) {
				name, variant, _ := strings.Cut(algo, "/")
				comms := testWorld(t, n, TCPOptions{Algorithm: name, shmSlot: 4 << 10, noSingleCopy: variant != ""})
				if cma := comms[0].(*comm).t.shm.cma; variant == "" {
					t.Logf("single-copy reads between ranks: %v", cma)
				} else if cma {
					t.Fatal("single-copy reads on when turned off")
				}
				seed := uint64(1000 * n)
				for _, count := range []int{0, 1, 7, 1000, 65537} {
					for _, p := range []struct {
						dt DType
						op Op
					}{{Float32, Sum}, {BFloat16, Avg}, {Int64, BXor}, {Float64, Min}, {Uint8, Product}} {
						seed++
						checkReductions(t, comms, p.dt, p.op, count, seed)
					}
					checkMovement(t, comms, Float32, count, seed)
					checkMovement(t, comms, Int8, count, seed)
				}
				// Calls over sockets in between keep the sequence numbers
				// shared memory checks in step.
				ctx := testContext(t, 10*time.Second)
				mustAll(t, "mixed", onAll(comms, func(r int, c Comm) error {
					for i := range 20 {
						buf := make([]byte, 4*(i*331%2000))
						if err := c.Broadcast(ctx, buf, Float32, i%n); err != nil {
							return err
						}
						if err := c.AllReduce(ctx, buf, Float32, Max); err != nil {
							return err
						}
						if err := c.Barrier(ctx); err != nil {
							return err
						}
					}
					return nil
				}))
			})
		}
	}
}

// TestSharedMemoryMismatchAcrossTransports: a rank in a shared-memory
// all_reduce learns of a peer's socket collective from what the peer
// published, and both fail at once instead of at their deadline.
func TestSharedMemoryMismatchAcrossTransports(t *testing.T) {
	comms := testWorld(t, 2, TCPOptions{})
	ctx := testContext(t, 20*time.Second)
	start := time.Now()
	errs := onAll(comms, func(r int, c Comm) error {
		buf := make([]byte, 1<<20)
		if r == 0 {
			return c.AllGather(ctx, make([]byte, 2*len(buf)), buf, Float32)
		}
		return c.AllReduce(ctx, buf, Float32, Sum)
	})
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v", d)
	}
	for r, err := range errs {
		if !errorsIsMismatch(err) || !strings.Contains(err.Error(), "all_gather") || !strings.Contains(err.Error(), "all_reduce") {
			t.Errorf("rank %d: %v, want a mismatch naming both calls", r, err)
		}
	}
}

// TestSharedMemoryAllToAllPieces runs all_to_all with pieces of every
// kind at once: empty, small (through the slots), and large ones, read
// straight from the sender when single-copy reads are on, with slots far
// smaller than the pieces.
func TestSharedMemoryAllToAllPieces(t *testing.T) {
	for _, single := range []bool{true, false} {
		for _, n := range []int{2, 3, 4} {
			t.Run(fmt.Sprintf("single-copy=%v/world=%d", single, n), func(t *testing.T) {
				comms := testWorld(t, n, TCPOptions{shmSlot: 8 << 10, noSingleCopy: !single})
				ctx := testContext(t, 20*time.Second)
				// Rank i sends j a piece of pieces[(i+j)%len] float32s.
				pieces := []int{0, 3, cmaMin/4 + 5, 100, 3 * cmaMin / 4, cmaMin/4 - 1}
				count := func(from, to int) int { return pieces[(from+2*to)%len(pieces)] }
				sent := make([][]byte, n)
				got := make([][]byte, n)
				for round := range 3 { // the piece tables of both parities, and reuse
					mustAll(t, "all_to_all", onAll(comms, func(r int, c Comm) error {
						sendCounts, recvCounts := make([]int, n), make([]int, n)
						total := [2]int{}
						for j := range n {
							sendCounts[j], recvCounts[j] = count(r, j), count(j, r)
							total[0] += sendCounts[j]
							total[1] += recvCounts[j]
						}
						sent[r] = make([]byte, 4*total[0])
						fill(sent[r], Float32, uint64(round), r)
						got[r] = make([]byte, 4*total[1])
						return c.AllToAll(ctx, got[r], sent[r], Float32, sendCounts, recvCounts)
					}))
					for r := range n {
						off := 0
						for j := range n {
							from := 0
							for k := range r {
								from += 4 * count(j, k)
							}
							want := sent[j][from : from+4*count(j, r)]
							if g := got[r][off : off+len(want)]; !slices.Equal(g, want) {
								t.Fatalf("round %d: rank %d's piece from %d: %s", round, r, j, firstDiff(g, want))
							}
							off += len(want)
						}
					}
				}
			})
		}
	}
}

// TestSharedMemoryPeerMovedOn: a peer that signalled our block and then
// ran shmHistory calls ahead (socket calls that wait for nobody, as a
// broadcast root's when GORUN_ALGO forces a tree) has overwritten its
// entry for our call; that is no mismatch. A different call in the entry
// still is.
func TestSharedMemoryPeerMovedOn(t *testing.T) {
	comms := testWorld(t, 2, TCPOptions{})
	c0, c1 := comms[0].(*comm), comms[1].(*comm)
	s := c0.t.shm
	const seq = 40
	call := header{kind: kindData, comm: worldID, coll: collBarrier, algo: algoShmFlat, seq: seq}
	o := &op{}
	o.reset(c1, testContext(t, 5*time.Second), call)
	check := func() error {
		c1.t.shm.checked[0] = false
		return o.checkSharedPeer(0, true)
	}

	other := call
	other.coll = collAllReduce
	s.publish(0, &other)
	if err := check(); !errorsIsMismatch(err) {
		t.Fatalf("a different call at seq %d: %v, want a mismatch", seq, err)
	}
	for i := uint64(1); i < shmHistory; i++ {
		later := call
		later.seq = seq + i
		s.publish(0, &later)
	}
	if err := check(); !errorsIsMismatch(err) {
		t.Fatalf("a different call at seq %d, the peer %d calls ahead: %v, want a mismatch", seq, shmHistory-1, err)
	}
	later := call
	later.seq = seq + shmHistory
	s.publish(0, &later)
	if err := check(); err != nil {
		t.Fatalf("peer %d calls ahead: %v, want no error", shmHistory, err)
	}
}

// TestSharedMemoryPairSingleCopy: two ranks reduce large buffers by
// reading each other's halves (allReducePairSingleCopy), bit for bit the
// reference, for counts that do not halve evenly and every element width.
func TestSharedMemoryPairSingleCopy(t *testing.T) {
	comms := testWorld(t, 2, TCPOptions{})
	c := comms[0].(*comm)
	if !c.t.shm.cma {
		t.Fatal("goroutines of one process cannot read each other's memory")
	}
	for i, p := range []struct {
		dt    DType
		op    Op
		count int
	}{
		{Float32, Sum, singleCopyAllReduceMin/4 + 1},
		{BFloat16, Avg, singleCopyAllReduceMin/2 + 3},
		{Int64, BXor, (singleCopyAllReduceMin+singleCopyPiece)/8 + 1},
		{Uint8, Max, singleCopyAllReduceMin + 7},
	} {
		if !c.singleCopyAllReduce(p.count * p.dt.Size()) {
			t.Fatalf("%v x %d does not take the single-copy all_reduce", p.dt, p.count)
		}
		checkReductions(t, comms, p.dt, p.op, p.count, uint64(i+1))
	}
}

// TestSharedMemoryBroadcastSingleCopy: the root writes the head of its
// buffer into every receiver's while they read the tail from it
// (broadcastSingleCopy): every rank ends with the root's bytes, the
// root's own unchanged, from every root, for lengths that do not divide
// among the ranks.
func TestSharedMemoryBroadcastSingleCopy(t *testing.T) {
	for _, n := range []int{2, 3, 4} {
		t.Run(fmt.Sprintf("world=%d", n), func(t *testing.T) {
			comms := testWorld(t, n, TCPOptions{})
			if !comms[0].(*comm).t.shm.cma {
				t.Fatal("goroutines of one process cannot reach each other's memory")
			}
			ctx := testContext(t, 20*time.Second)
			least := singleCopyBroadcastMin(n)
			for i, size := range []int{least, least + 5, 3<<20 + 1} {
				for root := range n {
					seed := uint64(100*i + root)
					want := streamBytes(size, seed)
					mustAll(t, "broadcast", onAll(comms, func(r int, c Comm) error {
						buf := streamBytes(size, seed+uint64(r+1)*1000) // differs on every rank
						if r == root {
							buf = bytes.Clone(want)
						}
						if err := c.Broadcast(ctx, buf, Uint8, root); err != nil {
							return err
						}
						if !bytes.Equal(buf, want) {
							return fmt.Errorf("%d bytes from root %d: %s", size, root, firstDiff(buf, want))
						}
						return nil
					}))
				}
			}
		})
	}
}

// TestSharedMemoryFirstWritten: a rank waiting for several peers' blocks
// takes the one that is written, not the first in its order; when none
// is, it settles for the first after spinning.
func TestSharedMemoryFirstWritten(t *testing.T) {
	comms := testWorld(t, 4, TCPOptions{})
	c := comms[0].(*comm)
	o := &op{}
	o.reset(c, testContext(t, 5*time.Second), header{kind: kindData, comm: worldID, coll: collAllGather, algo: algoShm, seq: 1})
	regions := c.t.shm.regions
	g := regions[1].written.Load() + 1
	peers := []int{1, 2, 3}

	start := time.Now()
	if got, _ := o.firstWritten(peers, g); got != 0 {
		t.Fatalf("with no peer written, firstWritten = %d, want 0 (the first)", got)
	}
	if spun := time.Since(start); spun < shmSpin {
		t.Fatalf("with no peer written, firstWritten gave up after %v, before shmSpin (%v)", spun, shmSpin)
	}
	regions[3].written.Store(g)
	if got, _ := o.firstWritten(peers, g); got != 2 {
		t.Fatalf("with only rank 3 written, firstWritten = %d, want 2", got)
	}
	regions[2].written.Store(g)
	if got, _ := o.firstWritten(peers, g); got != 1 {
		t.Fatalf("with ranks 2 and 3 written, firstWritten = %d, want 1 (the first of them)", got)
	}
}

// TestPollsFor: waiters poll long only while every rank of the host has
// a core to itself.
func TestPollsFor(t *testing.T) {
	for _, c := range []struct{ ranks, cpus, want int }{
		{2, 2, shmPolls}, {2, 16, shmPolls}, {8, 8, shmPolls},
		{3, 2, shmPollsCrowded}, {4, 2, shmPollsCrowded}, {16, 8, shmPollsCrowded},
	} {
		if got := pollsFor(c.ranks, c.cpus); got != c.want {
			t.Errorf("pollsFor(%d ranks, %d cpus) = %d, want %d", c.ranks, c.cpus, got, c.want)
		}
	}
}

// TestSingleCopyThresholds: two ranks read each other's memory from
// smaller pieces and broadcasts than more ranks do, where a copy into a
// slot serves several readers.
func TestSingleCopyThresholds(t *testing.T) {
	for _, c := range []struct{ ranks, piece, broadcast int }{
		{2, 16 << 10, 64 << 10}, {3, 64 << 10, 512 << 10}, {4, 64 << 10, 512 << 10}, {8, 64 << 10, 512 << 10},
	} {
		if got := singleCopyMin(c.ranks); got != c.piece {
			t.Errorf("singleCopyMin(%d) = %d, want %d", c.ranks, got, c.piece)
		}
		if got := singleCopyBroadcastMin(c.ranks); got != c.broadcast {
			t.Errorf("singleCopyBroadcastMin(%d) = %d, want %d", c.ranks, got, c.broadcast)
		}
	}
}

// TestCrowded: waiters yield their core only where a rank may need it:
// ranks not bound to cores of their own, or goroutines of one process.
func TestCrowded(t *testing.T) {
	for _, c := range []struct{ apart, goroutines, want bool }{
		{true, false, false}, {false, false, true}, {true, true, true}, {false, true, true},
	} {
		if got := crowded(c.apart, c.goroutines); got != c.want {
			t.Errorf("crowded(apart %v, goroutines %v) = %v, want %v", c.apart, c.goroutines, got, c.want)
		}
	}
}

// TestCPUsOf: the cores a set of processes may run on together are the
// union of their affinity masks, this process's own among them.
func TestCPUsOf(t *testing.T) {
	var mine unix.CPUSet
	if err := unix.SchedGetaffinity(0, &mine); err != nil {
		t.Fatalf("sched_getaffinity: %v", err)
	}
	pid := os.Getpid()
	if got, apart := cpusOf([]int{pid}); got != mine.Count() || !apart {
		t.Errorf("cpusOf(this process) = %d, %v; want its %d cores, apart", got, apart, mine.Count())
	}
	if got, apart := cpusOf([]int{pid, pid}); got != mine.Count() || apart {
		t.Errorf("cpusOf(this process twice) = %d, %v; want its %d cores, not apart", got, apart, mine.Count())
	}
	if got, apart := cpusOf([]int{pid, -1}); got != 0 || apart {
		t.Errorf("cpusOf with a pid that does not exist = %d, %v; want 0, false", got, apart)
	}
}
