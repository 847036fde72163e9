package collective

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestGrid: a world is a grid when every host runs as many ranks, two
// or more, with the hosts in their leaders' order and each host's ranks
// ascending.
func TestGrid(t *testing.T) {
	cases := []struct {
		hosts []int
		grid  []int // ranks by host, then index; nil: no grid
		local int
	}{
		{[]int{0, 0, 1, 1}, []int{0, 1, 2, 3}, 2},
		{[]int{0, 1, 0, 1}, []int{0, 2, 1, 3}, 2},
		{[]int{1, 0, 2, 2, 0, 1}, []int{0, 5, 1, 4, 2, 3}, 2},
		{[]int{0, 0, 0, 1, 1, 2}, nil, 0},
		{[]int{0, 0, 0, 1}, nil, 0},
		{[]int{0, 1, 2}, nil, 0}, // no hierarchy: nobody shares a host
	}
	for _, tc := range cases {
		t.Run(fmt.Sprint(tc.hosts), func(t *testing.T) {
			comms := hostsWorld(t, tc.hosts, TCPOptions{})
			for r, c := range comms {
				g := c.(*comm).grid
				if (g != nil) != (tc.grid != nil) {
					t.Fatalf("rank %d: grid %v, want one: %v", r, g != nil, tc.grid != nil)
				}
				if g == nil {
					continue
				}
				if !slices.Equal(g.ranks, tc.grid) || g.local != tc.local || g.hosts*g.local != len(tc.hosts) {
					t.Fatalf("rank %d: grid %v of %d x %d, want %v of %d per host", r, g.ranks, g.hosts, g.local, tc.grid, tc.local)
				}
				if g.at(g.host, g.index) != r {
					t.Errorf("rank %d places itself at host %d index %d, which holds %d", r, g.host, g.index, g.at(g.host, g.index))
				}
			}
		})
	}
}

// TestChooseMovement: all_gather, reduce_scatter and all_to_all go by
// hosts on a grid, and as before elsewhere.
func TestChooseMovement(t *testing.T) {
	oneHost := topology{ranks: 4, shared: true}
	flat := topology{ranks: 4}
	uneven := topology{ranks: 6, hier: true}
	grid := topology{ranks: 4, hier: true, grid: true}
	cases := []struct {
		name                     string
		t                        topology
		n                        int
		allGather, reduceScatter algorithm
	}{
		{"one host, 8 B", oneHost, 8, algoBruck, algoShm}, // AllGather takes shared memory first
		{"hosts of one rank, 8 B", flat, 8, algoBruck, algoRD},
		{"hosts of one rank, 16 MiB", flat, 16 << 20, algoRing, algoRing},
		{"hosts of 3, 2 and 1 rank, 1 MiB", uneven, 1 << 20, algoRing, algoRing},
		{"grid, 8 B", grid, 8, algoHier, algoHier},
		{"grid, 1 MiB", grid, 1 << 20, algoHier, algoHier},
		{"grid, 64 MiB", grid, 64 << 20, algoHier, algoHier},
	}
	for _, tc := range cases {
		if got := chooseAllGather(tc.t, tc.n); got != tc.allGather {
			t.Errorf("%s: all_gather %v, want %v", tc.name, got, tc.allGather)
		}
		if got := chooseReduceScatter(tc.t, tc.n); got != tc.reduceScatter {
			t.Errorf("%s: reduce_scatter %v, want %v", tc.name, got, tc.reduceScatter)
		}
	}
	for _, tc := range []struct {
		t    topology
		want algorithm
	}{{oneHost, algoShm}, {flat, algoDirect}, {uneven, algoDirect}, {grid, algoHier}} {
		if got := chooseAllToAll(tc.t); got != tc.want {
			t.Errorf("all_to_all on %+v: %v, want %v", tc.t, got, tc.want)
		}
	}
}

// movementLayouts are the hosts of the tests below: grids (hosts
// interleaved, and three), and a world that is no grid, where the
// collectives stay flat.
var movementLayouts = [][]int{{0, 0, 1, 1}, {0, 1, 0, 1}, {0, 0, 1, 1, 2, 2}, {0, 0, 0, 1, 1, 2}}

// smallPieces makes the hierarchical forms run many blocks and windows
// on small buffers: 4 KiB shared-memory slots, 1 KiB frames.
var smallPieces = TCPOptions{shmSlot: 4 << 10, segment: 1 << 10}

// TestHierarchicalAllGather: every rank gets every rank's block in rank
// order, by the hierarchical form on grids (which the default and
// GORUN_ALGO=hier choose) and the flat ring elsewhere.
func TestHierarchicalAllGather(t *testing.T) {
	for _, hosts := range movementLayouts {
		for _, algo := range []string{"auto", "hier"} {
			t.Run(fmt.Sprintf("%v/%s", hosts, algo), func(t *testing.T) {
				opts := smallPieces
				opts.Algorithm = algo
				comms := hostsWorld(t, hosts, opts)
				ctx := testContext(t, 60*time.Second)
				n := len(comms)
				grid := comms[0].(*comm).grid != nil
				for _, size := range []int{0, 8, 1000, 24 << 10, 48 << 10} {
					ins := make([][]byte, n)
					outs := make([][]byte, n)
					var all []byte
					for r := range n {
						ins[r] = make([]byte, size)
						fill(ins[r], Uint8, uint64(size), r)
						all = append(all, ins[r]...)
						outs[r] = make([]byte, n*size)
					}
					mustAll(t, "all_gather", onAll(comms, func(r int, c Comm) error {
						if got := c.(*comm).allGatherAlgorithm(n * size); (got == algoHier) != grid {
							return fmt.Errorf("chose %v on a world whose grid is %v", got, c.(*comm).grid)
						}
						return c.AllGather(ctx, outs[r], ins[r], Uint8)
					}))
					for r := range n {
						if !bytes.Equal(outs[r], all) {
							t.Fatalf("%d bytes: rank %d: %s", size, r, firstDiff(outs[r], all))
						}
					}
				}
			})
		}
	}
}

// TestHierarchicalReduceScatter: every rank gets its piece of the flat
// reference's reduction, for every type and operator, even and uneven
// counts (empty pieces among them), by the hierarchical form on grids
// and the flat one elsewhere; and the hierarchical result equals the
// flat ring's bit for bit.
func TestHierarchicalReduceScatter(t *testing.T) {
	for _, hosts := range movementLayouts {
		t.Run(fmt.Sprint(hosts), func(t *testing.T) {
			comms := hostsWorld(t, hosts, smallPieces)
			ring := hostsWorld(t, hosts, TCPOptions{Algorithm: "ring"})
			ctx := testContext(t, 60*time.Second)
			n := len(comms)
			grid := comms[0].(*comm).grid != nil
			// Inputs through the leaders and, from 4-byte types on, the
			// larger uneven ones through the rails.
			even := make([]int, n)
			uneven := make([]int, n)
			larger := make([]int, n)
			for r := range n {
				even[r] = 3000
				uneven[r] = (r * 1237) % 5000 // rank 0's is empty
				larger[r] = (r * 12373) % 50000
			}
			uneven[n-1], larger[n-1] = 0, 0
			for _, counts := range [][]int{even, uneven, larger} {
				for _, dt := range allDTypes {
					for _, op := range opsFor(dt) {
						total := 0
						for _, c := range counts {
							total += c
						}
						chunks := countSpans(counts, dt.Size())
						inputs := make([][]byte, n)
						for r := range n {
							inputs[r] = make([]byte, total*dt.Size())
							fill(inputs[r], dt, uint64(total)+uint64(op), r)
						}
						ref := reference(t, inputs, dt, op)
						run := func(comms []Comm, hier bool) [][]byte {
							outs := make([][]byte, n)
							mustAll(t, "reduce_scatter", onAll(comms, func(r int, c Comm) error {
								outs[r] = make([]byte, chunks[r].len)
								if got := c.(*comm).reduceScatterAlgorithm(len(inputs[r])); (got == algoHier) != hier {
									return fmt.Errorf("chose %v, want hier: %v", got, hier)
								}
								return c.ReduceScatter(ctx, outs[r], inputs[r], dt, op, counts)
							}))
							return outs
						}
						got, flat := run(comms, grid), run(ring, false)
						for r := range n {
							if !bytes.Equal(got[r], chunks[r].of(ref)) {
								t.Fatalf("%v %v counts %v: rank %d: %s", dt, op, counts, r, firstDiff(got[r], chunks[r].of(ref)))
							}
							if !bytes.Equal(got[r], flat[r]) {
								t.Fatalf("%v %v counts %v: rank %d differs from the ring: %s", dt, op, counts, r, firstDiff(got[r], flat[r]))
							}
						}
					}
				}
			}
		})
	}
}

// TestHierarchicalAllToAll: every rank gets every rank's piece for it,
// with even counts and counts that differ per pair (empty pieces among
// them, pieces longer than a window, and in "mixed" pieces that go alone
// beside pieces through the rails, for every dtype but Uint8; in "alone"
// none through the slots), by the
// hierarchical form on grids (which the default and GORUN_ALGO=hier
// choose) and pairwise exchange elsewhere.
func TestHierarchicalAllToAll(t *testing.T) {
	for _, hosts := range movementLayouts {
		t.Run(fmt.Sprint(hosts), func(t *testing.T) {
			comms := hostsWorld(t, hosts, smallPieces)
			ctx := testContext(t, 60*time.Second)
			n := len(comms)
			grid := comms[0].(*comm).grid != nil
			pairs := map[string]func(from, to int) int{
				"even":   func(int, int) int { return 700 },
				"uneven": func(from, to int) int { return (from*977 + to*1543) % 3001 },
				"empty":  func(int, int) int { return 0 },
				"mixed": func(from, to int) int {
					if (from+to)%2 == 0 {
						return allToAllAloneMin/4 + 1 // alone from 4-byte elements on, across 3 hosts
					}
					return 300
				},
				// Every piece alone from 4-byte elements on, across 3
				// hosts: the host's ranks then skip the slots.
				"alone": func(int, int) int { return allToAllAloneMin/4 + 1 },
				"alone within hosts": func(from, to int) int {
					if hosts[from] == hosts[to] {
						return allToAllAloneMin/4 + 1
					}
					return 300
				},
			}
			for name, pair := range pairs {
				for _, dt := range []DType{Uint8, Float32, Float64} {
					es := dt.Size()
					ins := make([][]byte, n)
					outs := make([][]byte, n)
					mustAll(t, "all_to_all", onAll(comms, func(r int, c Comm) error {
						if got := c.(*comm).allToAllAlgorithm(); (got == algoHier) != grid {
							return fmt.Errorf("chose %v on a world whose grid is %v", got, c.(*comm).grid)
						}
						sendCounts, recvCounts := make([]int, n), make([]int, n)
						sends, recvs := 0, 0
						for j := range n {
							sendCounts[j], recvCounts[j] = pair(r, j), pair(j, r)
							sends, recvs = sends+sendCounts[j], recvs+recvCounts[j]
						}
						ins[r] = make([]byte, sends*es)
						fill(ins[r], dt, 5, r)
						outs[r] = make([]byte, recvs*es)
						return c.AllToAll(ctx, outs[r], ins[r], dt, sendCounts, recvCounts)
					}))
					checkAllToAllPieces(t, fmt.Sprintf("%s %v", name, dt), outs, ins, pair, es)
				}
			}
		})
	}
}

// TestHierarchicalAllToAllCountsApart: where a slot cannot hold the
// host's counts beside every rank's part (a 384-byte slot, parts of 64
// bytes for 6 ranks), the host's ranks share their counts in a meeting
// of their own first, and every piece still arrives.
func TestHierarchicalAllToAllCountsApart(t *testing.T) {
	hosts := []int{0, 0, 1, 1, 2, 2}
	comms := hostsWorld(t, hosts, TCPOptions{shmSlot: 384, segment: 1 << 10})
	ctx := testContext(t, 30*time.Second)
	n := len(comms)
	pair := func(from, to int) int { return (from*977 + to*1543) % 301 }
	ins := make([][]byte, n)
	outs := make([][]byte, n)
	mustAll(t, "all_to_all", onAll(comms, func(r int, c Comm) error {
		sendCounts, recvCounts := make([]int, n), make([]int, n)
		for j := range n {
			sendCounts[j], recvCounts[j] = pair(r, j), pair(j, r)
		}
		ins[r] = make([]byte, 4*sum(sendCounts))
		fill(ins[r], Float32, 5, r)
		outs[r] = make([]byte, 4*sum(recvCounts))
		return c.AllToAll(ctx, outs[r], ins[r], Float32, sendCounts, recvCounts)
	}))
	checkAllToAllPieces(t, "uneven", outs, ins, pair, 4)
}

// TestHierarchicalMovementInPlace: a reduce_scatter whose out is part of
// its in, and an all_gather whose in is part of its out, as torch's
// _base variants pass them.
func TestHierarchicalMovementInPlace(t *testing.T) {
	comms := hostsWorld(t, []int{0, 1, 0, 1}, smallPieces)
	ctx := testContext(t, 30*time.Second)
	n, per := len(comms), 5000
	inputs := make([][]byte, n)
	bufs := make([][]byte, n)
	for r := range n {
		inputs[r] = make([]byte, n*per*4)
		fill(inputs[r], Float32, 11, r)
		bufs[r] = bytes.Clone(inputs[r])
	}
	ref := reference(t, inputs, Float32, Sum)
	counts := []int{per, per, per, per}
	mustAll(t, "reduce_scatter", onAll(comms, func(r int, c Comm) error {
		return c.ReduceScatter(ctx, bufs[r][r*per*4:][:per*4], bufs[r], Float32, Sum, counts)
	}))
	mustAll(t, "all_gather", onAll(comms, func(r int, c Comm) error {
		return c.AllGather(ctx, bufs[r], bufs[r][r*per*4:][:per*4], Float32)
	}))
	for r := range n {
		if !bytes.Equal(bufs[r], ref) {
			t.Fatalf("rank %d: %s", r, firstDiff(bufs[r], ref))
		}
	}
}

// TestHierarchicalMovementMismatch: a rank that calls with another size
// or counts, on the caller's host or another, or forces a flat
// algorithm, fails every rank with a mismatch, at once.
func TestHierarchicalMovementMismatch(t *testing.T) {
	cases := []struct {
		name string
		flat int // the rank that forces the ring, or -1
		call func(ctx context.Context, r int, c Comm) error
	}{
		{"all_gather size on another host", -1, func(ctx context.Context, r int, c Comm) error {
			n := 4096
			if r == 2 {
				n = 8192
			}
			return c.AllGather(ctx, make([]byte, 4*n), make([]byte, n), Uint8)
		}},
		{"all_gather size on the host", -1, func(ctx context.Context, r int, c Comm) error {
			n := 4096
			if r == 1 {
				n = 8192
			}
			return c.AllGather(ctx, make([]byte, 4*n), make([]byte, n), Uint8)
		}},
		{"all_gather size by the rails", -1, func(ctx context.Context, r int, c Comm) error {
			n := 64 << 10
			if r == 2 {
				n = 96 << 10
			}
			return c.AllGather(ctx, make([]byte, 4*n), make([]byte, n), Uint8)
		}},
		{"all_gather through the leaders against the rails", -1, func(ctx context.Context, r int, c Comm) error {
			n := 64 << 10
			if r == 3 {
				n = 4096
			}
			return c.AllGather(ctx, make([]byte, 4*n), make([]byte, n), Uint8)
		}},
		{"reduce_scatter counts", -1, func(ctx context.Context, r int, c Comm) error {
			counts := []int{1000, 1000, 1000, 1000}
			if r == 3 {
				counts = []int{1000, 1000, 500, 1500}
			}
			return c.ReduceScatter(ctx, make([]byte, 4*counts[r]), make([]byte, 4*4000), Float32, Sum, counts)
		}},
		{"reduce_scatter counts by the rails", -1, func(ctx context.Context, r int, c Comm) error {
			counts := []int{40000, 40000, 40000, 40000}
			if r == 3 {
				counts = []int{40000, 40000, 20000, 60000}
			}
			return c.ReduceScatter(ctx, make([]byte, 4*counts[r]), make([]byte, 4*160000), Float32, Sum, counts)
		}},
		{"all_to_all pair on the host", -1, func(ctx context.Context, r int, c Comm) error {
			counts := []int{100, 100, 100, 100}
			recv := slices.Clone(counts)
			if r == 1 {
				recv[0] = 50 // rank 0 sends 100
			}
			return c.AllToAll(ctx, make([]byte, 4*sum(recv)), make([]byte, 4*400), Float32, counts, recv)
		}},
		{"all_to_all pair across hosts", -1, func(ctx context.Context, r int, c Comm) error {
			counts := []int{100, 100, 100, 100}
			send := slices.Clone(counts)
			if r == 3 {
				send[0] = 150 // rank 0 expects 100
			}
			return c.AllToAll(ctx, make([]byte, 4*400), make([]byte, 4*sum(send)), Float32, send, counts)
		}},
		{"all_to_all pairwise on one rank", 2, func(ctx context.Context, r int, c Comm) error {
			counts := []int{100, 100, 100, 100}
			return c.AllToAll(ctx, make([]byte, 4*400), make([]byte, 4*400), Float32, counts, counts)
		}},
		{"reduce_scatter by the ring on one rank", 3, func(ctx context.Context, r int, c Comm) error {
			return c.ReduceScatter(ctx, make([]byte, 4096), make([]byte, 4*4096), Float32, Sum, []int{1024, 1024, 1024, 1024})
		}},
		{"all_gather by the ring on one rank", 0, func(ctx context.Context, r int, c Comm) error {
			return c.AllGather(ctx, make([]byte, 4*4096), make([]byte, 4096), Uint8)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			comms := testWorldOf(t, 4, func(r int) TCPOptions {
				o := smallPieces
				o.HostID = fmt.Sprintf("test-host-%d", r/2)
				if r == tc.flat {
					o.Algorithm = "ring"
					if strings.HasPrefix(tc.name, "all_to_all") {
						o.Algorithm = "direct"
					}
				}
				return o
			})
			expectMismatch(t, comms, tc.call)
		})
	}
}

// TestHierarchicalAllToAllWayMismatch: a rank whose count for a piece
// from another host puts it on another way than its sender does (alone
// against through the rail, each way round, the sender on the rank's
// rail or not) fails its own call with a mismatch that says so, at once:
// it does not wait for a frame that will not come, nor for its peers'
// next call to show it.
func TestHierarchicalAllToAllWayMismatch(t *testing.T) {
	cases := []struct {
		name          string
		sender        int // rank 2 is on rank 0's rail, rank 3 not
		receiverAlone bool
	}{
		{"alone from a rail's sender", 2, false},
		{"alone for the receiver from a rail's sender", 2, true},
		{"alone from another sender", 3, false},
		{"alone for the receiver from another sender", 3, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			comms := hostsWorld(t, []int{0, 0, 1, 1, 2, 2}, TCPOptions{})
			ctx := testContext(t, 20*time.Second)
			start := time.Now()
			errs := onAll(comms, func(r int, c Comm) error {
				send, recv := slices.Repeat([]int{100}, 6), slices.Repeat([]int{100}, 6)
				switch {
				case r == tc.sender && !tc.receiverAlone:
					send[0] = allToAllAloneMin // alone: 4-byte elements
				case r == 0 && tc.receiverAlone:
					recv[tc.sender] = allToAllAloneMin
				}
				return c.AllToAll(ctx, make([]byte, 4*sum(recv)), make([]byte, 4*sum(send)), Float32, send, recv)
			})
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("took %v: a mismatch must fail at once", d)
			}
			err := errs[0]
			if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "counts") {
				t.Fatalf("rank 0: %v, want a mismatch of counts", err)
			}
			t.Logf("rank 0: %v", err)
		})
	}
}

// TestHierarchicalMovementPeerDeath: a rank that dies mid-call, on the
// host or across, is named by every other rank, at once; on 3 hosts too,
// where all_to_all's pieces go alone.
func TestHierarchicalMovementPeerDeath(t *testing.T) {
	size := 1 << 20
	calls := map[string]func(ctx context.Context, c Comm, in, out []byte) error{
		"all_gather": func(ctx context.Context, c Comm, in, out []byte) error {
			return c.AllGather(ctx, out[:c.Size()*len(in)], in, Float32)
		},
		"all_to_all": func(ctx context.Context, c Comm, in, out []byte) error {
			q := len(in) / 4 / c.Size()
			counts := slices.Repeat([]int{q}, c.Size())
			return c.AllToAll(ctx, out[:4*q*c.Size()], in[:4*q*c.Size()], Float32, counts, counts)
		},
		"reduce_scatter": func(ctx context.Context, c Comm, in, out []byte) error {
			q := len(in) / 4 / c.Size()
			return c.ReduceScatter(ctx, out[:4*q], in[:4*q*c.Size()], Float32, Sum, slices.Repeat([]int{q}, c.Size()))
		},
	}
	for _, hosts := range [][]int{{0, 0, 1, 1}, {0, 0, 1, 1, 2, 2}} {
		for name, call := range calls {
			for _, victim := range []int{1, 2} {
				t.Run(fmt.Sprintf("%v/%s/rank %d", hosts, name, victim), func(t *testing.T) {
					comms := hostsWorld(t, hosts, TCPOptions{Algorithm: "hier"})
					ctx := testContext(t, 60*time.Second)
					closeDuring(t, comms, victim, func(c Comm) func() error {
						in, out := make([]byte, size), make([]byte, len(hosts)*size)
						return func() error { return call(ctx, c, in, out) }
					})
				})
			}
		}
	}
}

func sum(counts []int) (s int) {
	for _, n := range counts {
		s += n
	}
	return s
}

// TestHierarchicalTinySlot: where a slot is smaller than a part of 64
// bytes for every rank of the world (as the 2 MiB default is beyond
// 32,768 ranks), the hierarchical forms still keep each part within
// its slot: every collective's result is whole on 4 hosts x 2 ranks
// whose slots were asked for at 64 bytes.
func TestHierarchicalTinySlot(t *testing.T) {
	hosts := []int{0, 0, 1, 1, 2, 2, 3, 3}
	comms := hostsWorld(t, hosts, TCPOptions{shmSlot: 64, segment: 1 << 10})
	ctx := testContext(t, 60*time.Second)
	n := len(comms)
	for _, size := range []int{8, 1000, 20 << 10} { // 20 KiB a rank: rails past 64 KiB
		ins := make([][]byte, n)
		gathered := make([][]byte, n)
		var all []byte
		for r := range n {
			ins[r] = make([]byte, size)
			fill(ins[r], Uint8, uint64(size), r)
			all = append(all, ins[r]...)
			gathered[r] = make([]byte, n*size)
		}
		mustAll(t, "all_gather", onAll(comms, func(r int, c Comm) error {
			return c.AllGather(ctx, gathered[r], ins[r], Uint8)
		}))
		for r := range n {
			if !bytes.Equal(gathered[r], all) {
				t.Fatalf("all_gather of %d bytes: rank %d: %s", size, r, firstDiff(gathered[r], all))
			}
		}

		counts := make([]int, n)
		for r := range counts {
			counts[r] = size / 4
		}
		chunks := countSpans(counts, 4)
		inputs := make([][]byte, n)
		for r := range n {
			inputs[r] = make([]byte, n*size/4*4)
			fill(inputs[r], Float32, uint64(size), r)
		}
		ref := reference(t, inputs, Float32, Sum)
		outs := make([][]byte, n)
		mustAll(t, "reduce_scatter", onAll(comms, func(r int, c Comm) error {
			outs[r] = make([]byte, chunks[r].len)
			return c.ReduceScatter(ctx, outs[r], inputs[r], Float32, Sum, counts)
		}))
		for r := range n {
			if !bytes.Equal(outs[r], chunks[r].of(ref)) {
				t.Fatalf("reduce_scatter of %d bytes: rank %d: %s", size, r, firstDiff(outs[r], chunks[r].of(ref)))
			}
		}

		pair := func(from, to int) int { return (size/4 + from*31 + to*17) % (size/4 + 1) }
		pieces := make([][]byte, n)
		mustAll(t, "all_to_all", onAll(comms, func(r int, c Comm) error {
			sendCounts, recvCounts := make([]int, n), make([]int, n)
			for j := range n {
				sendCounts[j], recvCounts[j] = pair(r, j), pair(j, r)
			}
			pieces[r] = make([]byte, 4*sum(recvCounts))
			in := make([]byte, 4*sum(sendCounts))
			fill(in, Float32, 9, r)
			inputs[r] = in
			return c.AllToAll(ctx, pieces[r], in, Float32, sendCounts, recvCounts)
		}))
		checkAllToAllPieces(t, fmt.Sprintf("%d bytes", size), pieces, inputs, pair, 4)
	}
}
