package collective

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// hostsWorld builds ranks in this process that claim the hosts given,
// rank r on host hosts[r]: a job that spans hosts, on one machine.
func hostsWorld(t testing.TB, hosts []int, opts TCPOptions) []Comm {
	t.Helper()
	return testWorldOf(t, len(hosts), func(r int) TCPOptions {
		o := opts
		o.HostID = fmt.Sprintf("test-host-%d", hosts[r])
		return o
	})
}

// TestHierarchySetup: the views exist exactly when a job spans hosts and
// some host runs two ranks, with shared memory on those hosts.
func TestHierarchySetup(t *testing.T) {
	cases := []struct {
		hosts   []int
		hier    bool
		leaders []int // ranks with a leaders' view
	}{
		{[]int{0, 0, 1, 1}, true, []int{0, 2}},
		{[]int{0, 1, 0, 1}, true, []int{0, 1}},
		{[]int{0, 0, 0, 1}, true, []int{0, 3}},
		{[]int{0, 1, 2}, false, nil},
		{[]int{0, 0, 0}, false, nil},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprint(tc.hosts), func(t *testing.T) {
			comms := hostsWorld(t, tc.hosts, TCPOptions{})
			var leaders []int
			for r, c := range comms {
				h := c.(*comm).hier
				if (h != nil) != tc.hier {
					t.Fatalf("rank %d: hierarchy %v, want %v", r, h != nil, tc.hier)
				}
				if h == nil {
					continue
				}
				if h.leaders != nil {
					leaders = append(leaders, r)
				}
				if want := h.railRanks(h.localOf[r]); fmt.Sprint(h.rail.world) != fmt.Sprint(want) || h.rail.world[h.rail.rank] != r {
					t.Errorf("rank %d: rail %v (rank %d in it), want %v", r, h.rail.world, h.rail.rank, want)
				}
				if h.host.size() > 1 && !h.host.shared() {
					t.Errorf("rank %d: host of %d ranks without shared memory", r, h.host.size())
				}
			}
			if fmt.Sprint(leaders) != fmt.Sprint(tc.leaders) {
				t.Errorf("leaders %v, want %v", leaders, tc.leaders)
			}
		})
	}
}

// TestLayOut: hosts numbered by their lowest rank, local indices, rails
// (one rank of each host that has the index, in host order), and no
// hierarchy where it would save nothing.
func TestLayOut(t *testing.T) {
	cases := []struct {
		hosts    []string
		none     bool
		host     []int   // host index of each rank
		local    []int   // local index of each rank
		rails    [][]int // rail l's world ranks
		minLocal int
	}{
		{hosts: []string{"a", "a", "b", "b"}, host: []int{0, 0, 1, 1}, local: []int{0, 1, 0, 1}, rails: [][]int{{0, 2}, {1, 3}}, minLocal: 2},
		{hosts: []string{"a", "b", "a", "b"}, host: []int{0, 1, 0, 1}, local: []int{0, 0, 1, 1}, rails: [][]int{{0, 1}, {2, 3}}, minLocal: 2},
		{hosts: []string{"b", "a", "a", "b"}, host: []int{0, 1, 1, 0}, local: []int{0, 0, 1, 1}, rails: [][]int{{0, 1}, {3, 2}}, minLocal: 2},
		{hosts: []string{"a", "a", "a", "b"}, host: []int{0, 0, 0, 1}, local: []int{0, 1, 2, 0}, rails: [][]int{{0, 3}, {1}, {2}}, minLocal: 1},
		{hosts: []string{"a", "b", "c", "a", "b", "b", "c"}, host: []int{0, 1, 2, 0, 1, 1, 2}, local: []int{0, 0, 0, 1, 1, 2, 1}, rails: [][]int{{0, 1, 2}, {3, 4, 6}, {5}}, minLocal: 2},
		{hosts: []string{"a", "", "a", ""}, host: []int{0, 1, 0, 2}, local: []int{0, 0, 1, 0}, rails: [][]int{{0, 1, 3}, {2}}, minLocal: 1},
		{hosts: []string{"a", "b", "c"}, none: true},
		{hosts: []string{"a", "a", "a"}, none: true},
		{hosts: []string{"", ""}, none: true},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprint(tc.hosts), func(t *testing.T) {
			h := layOut(tc.hosts)
			if (h == nil) != tc.none {
				t.Fatalf("hierarchy %v, want %v", h != nil, !tc.none)
			}
			if h == nil {
				return
			}
			var host, local []int
			for r := range tc.hosts {
				host = append(host, h.hostOf(r))
				local = append(local, h.localOf[r])
			}
			var rails [][]int
			for l := 0; len(h.railRanks(l)) > 0; l++ {
				rails = append(rails, h.railRanks(l))
			}
			got := fmt.Sprint(host, local, rails, h.minLocal())
			if want := fmt.Sprint(tc.host, tc.local, tc.rails, tc.minLocal); got != want {
				t.Errorf("host, local, rails, min local = %s, want %s", got, want)
			}
		})
	}
}

// TestHierarchicalAllReduce: for every type and operator, on layouts
// with several ranks per host, every rank gets the bits of the flat
// reference (the test data make every order of combining exact) and the
// same bits as every other rank; broadcast and barrier work too.
func TestHierarchicalAllReduce(t *testing.T) {
	// Two and three hosts, even and uneven; with one rank on a host only
	// the leaders' rail carries the sums.
	// Three ranks a host give three rails.
	layouts := [][]int{{0, 0, 1, 1}, {0, 0, 0, 1}, {0, 1, 0, 1, 1}, {0, 1, 2, 0, 1, 1, 2}, {0, 1, 0, 1, 0, 1}}
	// Through the leaders (up to hierLeadersMax), one piece by recursive
	// doubling across (on three rails), one piece by parts, pieces
	// beyond a shared-memory slot, and more pieces than the 2D all_reduce
	// keeps buffers for (railDepth; hierarchy_allreduce.go).
	sizes := []int{8, 4096, 150<<10 + 48, 300<<10 + 48, 3<<20 + 24, 7<<20 + 24}
	for _, transport := range []string{"auto", "unix"} {
		for _, hosts := range layouts {
			t.Run(fmt.Sprintf("%s/%v", transport, hosts), func(t *testing.T) {
				comms := hostsWorld(t, hosts, TCPOptions{Transport: transport, Algorithm: "hier"})
				if comms[0].(*comm).hier == nil {
					t.Fatal("no hierarchy")
				}
				// A bound for a hang, not a timing: every type and
				// operator under the race detector on 2 loaded cores
				// took over a minute.
				ctx := testContext(t, 5*time.Minute)
				n := len(comms)
				for _, dt := range allDTypes {
					for _, op := range opsFor(dt) {
						for _, size := range sizes {
							if size > 4096 && dt != Float32 && dt != Int64 || size > 4<<20 && (dt != Float32 || op != Sum) {
								continue // the phases are the same for every type: keep the test short
							}
							size -= size % 8
							inputs := make([][]byte, n)
							bufs := make([][]byte, n)
							for r := range n {
								inputs[r] = make([]byte, size)
								fill(inputs[r], dt, uint64(size)+uint64(op), r)
								bufs[r] = bytes.Clone(inputs[r])
							}
							want := reference(t, inputs, dt, op)
							mustAll(t, "all_reduce", onAll(comms, func(r int, c Comm) error {
								return c.AllReduce(ctx, bufs[r], dt, op)
							}))
							for r := range n {
								if !bytes.Equal(bufs[r], want) {
									t.Fatalf("%v %v %dB: rank %d: %s", dt, op, size, r, firstDiff(bufs[r], want))
								}
							}
						}
					}
				}
				for root := range n {
					bufs := make([][]byte, n)
					for r := range n {
						bufs[r] = make([]byte, 1<<20)
						fill(bufs[r], Uint8, 7, r)
					}
					want := bytes.Clone(bufs[root])
					mustAll(t, "broadcast", onAll(comms, func(r int, c Comm) error {
						return c.Broadcast(ctx, bufs[r], Uint8, root)
					}))
					for r := range n {
						if !bytes.Equal(bufs[r], want) {
							t.Fatalf("broadcast from %d: rank %d: %s", root, r, firstDiff(bufs[r], want))
						}
					}
				}
				mustAll(t, "barrier", onAll(comms, func(_ int, c Comm) error { return c.Barrier(ctx) }))
			})
		}
	}
}

// TestHierarchicalMatchesFlat: the hierarchical result equals the flat
// one bit for bit, whichever algorithm GORUN_ALGO forces.
func TestHierarchicalMatchesFlat(t *testing.T) {
	hosts := []int{0, 0, 1, 1}
	results := map[string][]byte{}
	for _, algo := range []string{"hier", "ring", "rhd", "rd"} {
		comms := hostsWorld(t, hosts, TCPOptions{Algorithm: algo})
		ctx := testContext(t, 20*time.Second)
		bufs := make([][]byte, len(comms))
		for r := range bufs {
			bufs[r] = make([]byte, 1<<20)
			fill(bufs[r], Float32, 3, r)
		}
		mustAll(t, algo, onAll(comms, func(r int, c Comm) error {
			got := c.(*comm).allReduceAlgorithm(len(bufs[r])).String()
			if got != algo {
				return fmt.Errorf("GORUN_ALGO=%s chose %s", algo, got)
			}
			return c.AllReduce(ctx, bufs[r], Float32, Sum)
		}))
		for r := range bufs {
			if !bytes.Equal(bufs[r], bufs[0]) {
				t.Fatalf("%s: rank %d differs from rank 0: %s", algo, r, firstDiff(bufs[r], bufs[0]))
			}
		}
		results[algo] = bufs[0]
	}
	for algo, got := range results {
		if !bytes.Equal(got, results["hier"]) {
			t.Errorf("%s differs from hier: %s", algo, firstDiff(got, results["hier"]))
		}
	}
}

// TestHierarchicalMismatch: a rank that calls something else, on its
// leader's host or on another, fails every rank with a mismatch.
func TestHierarchicalMismatch(t *testing.T) {
	cases := []struct {
		name string
		call func(ctx context.Context, r int, c Comm) error
	}{
		{"count on another host", func(ctx context.Context, r int, c Comm) error {
			n := 1024
			if r == 3 {
				n = 2048
			}
			return c.AllReduce(ctx, make([]byte, 4*n), Float32, Sum)
		}},
		{"count of a leader", func(ctx context.Context, r int, c Comm) error {
			n := 1024
			if r == 2 {
				n = 2048
			}
			return c.AllReduce(ctx, make([]byte, 4*n), Float32, Sum)
		}},
		{"pieces: count on another host", func(ctx context.Context, r int, c Comm) error {
			n := 1 << 20
			if r == 3 {
				n = 3 << 19
			}
			return c.AllReduce(ctx, make([]byte, 4*n), Float32, Sum)
		}},
		{"pieces: broadcast on the other rail", func(ctx context.Context, r int, c Comm) error {
			buf := make([]byte, 4<<20)
			if r == 1 {
				return c.Broadcast(ctx, buf, Float32, 0)
			}
			return c.AllReduce(ctx, buf, Float32, Sum)
		}},
		{"send and barrier vs all_reduce", func(ctx context.Context, r int, c Comm) error {
			buf := make([]byte, 4096)
			if r == 1 {
				return c.Send(ctx, buf, Float32, 0, 5)
			}
			return c.AllReduce(ctx, buf, Float32, Sum)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			comms := hostsWorld(t, []int{0, 0, 1, 1}, TCPOptions{Algorithm: "hier"})
			expectMismatch(t, comms, tc.call)
		})
	}
}

// expectMismatch has every rank make its call, then a barrier, and
// checks that every rank failed with a mismatch, at once.
func expectMismatch(t *testing.T, comms []Comm, call func(ctx context.Context, r int, c Comm) error) {
	t.Helper()
	ctx := testContext(t, 20*time.Second)
	start := time.Now()
	errs := onAll(comms, func(r int, c Comm) error {
		if err := call(ctx, r, c); err != nil {
			return err
		}
		return c.Barrier(ctx)
	})
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v: a mismatch must fail at once", d)
	}
	for r, err := range errs {
		t.Logf("rank %d: %v", r, err)
		if !errors.Is(err, ErrMismatch) {
			t.Errorf("rank %d: %v, want a mismatch", r, err)
		}
	}
}

// TestHierarchicalPeerDeath: a rank that dies mid-call, a leader or not,
// is named by every other rank, on its host and on the other, at once.
func TestHierarchicalPeerDeath(t *testing.T) {
	for _, victim := range []int{3, 2, 1} {
		t.Run(fmt.Sprintf("rank %d", victim), func(t *testing.T) {
			comms := hostsWorld(t, []int{0, 0, 1, 1}, TCPOptions{Algorithm: "hier"})
			closeDuringAllReduce(t, testContext(t, 60*time.Second), comms, victim, 4<<20)
		})
	}
	// Three hosts of 2, 3 and 2 ranks, by default: a rank on a rail, and
	// one on no rail (the host of 3's third).
	for _, victim := range []int{4, 5} {
		t.Run(fmt.Sprintf("uneven/rank %d", victim), func(t *testing.T) {
			comms := hostsWorld(t, []int{0, 1, 2, 0, 1, 1, 2}, TCPOptions{})
			closeDuringAllReduce(t, testContext(t, 60*time.Second), comms, victim, 4<<20)
		})
	}
}

// BenchmarkHierarchicalAllReduce compares, on 2 hosts of 2 ranks faked
// in this process (TCP between them), the hierarchical all_reduce with
// the flat algorithms GORUN_ALGO can force.
func BenchmarkHierarchicalAllReduce(b *testing.B) {
	for _, algo := range []string{"hier", "ring", "rhd"} {
		for _, s := range benchSizes[1:] {
			b.Run(fmt.Sprintf("%s/%s", algo, s.name), func(b *testing.B) {
				comms := hostsWorld(b, []int{0, 0, 1, 1}, TCPOptions{Algorithm: algo})
				ctx := context.Background()
				bufs := make([][]byte, len(comms))
				for r := range bufs {
					bufs[r] = make([]byte, s.bytes)
				}
				run := func() {
					mustAll(b, "all_reduce", onAll(comms, func(r int, c Comm) error {
						return c.AllReduce(ctx, bufs[r], Float32, Sum)
					}))
				}
				timeAllReduce(b, s.bytes, len(comms), run)
			})
		}
	}
}

// TestAutomaticChoice: the algorithm each collective takes by itself,
// from where the ranks run and the size.
func TestAutomaticChoice(t *testing.T) {
	oneHost := topology{ranks: 4, shared: true}
	flat := topology{ranks: 4}
	flat3 := topology{ranks: 3}
	hier := topology{ranks: 4, hier: true}
	cases := []struct {
		name      string
		t         topology
		n         int
		allReduce algorithm
		broadcast algorithm
	}{
		{"one host, small", oneHost, 8, algoShmFlat, algoShm},
		{"one host, large", oneHost, 16 << 20, algoShm, algoShm},
		{"hosts of one rank, 8 B", flat, 8, algoRD, algoTree},
		{"hosts of one rank, 1 MiB", flat, 1 << 20, algoRHD, algoChain},
		{"hosts of one rank, 16 MiB", flat, 16 << 20, algoRing, algoChain},
		{"3 hosts of one rank, 1 MiB", flat3, 1 << 20, algoRing, algoChain},
		{"hosts of several ranks, 8 B", hier, 8, algoHier, algoHier},
		{"hosts of several ranks, 64 KiB", hier, 64 << 10, algoHier, algoHier},
		{"hosts of several ranks, 1 MiB", hier, 1 << 20, algoHier, algoHier},
		{"hosts of several ranks, 64 MiB", hier, 64 << 20, algoHier, algoHier},
	}
	for _, tc := range cases {
		if got := chooseAllReduce(tc.t, tc.n); got != tc.allReduce {
			t.Errorf("%s: all_reduce %v, want %v", tc.name, got, tc.allReduce)
		}
		if got := chooseBroadcast(tc.t, tc.n); got != tc.broadcast {
			t.Errorf("%s: broadcast %v, want %v", tc.name, got, tc.broadcast)
		}
	}
	for _, tc := range []struct {
		t    topology
		want algorithm
	}{{oneHost, algoShmFlat}, {flat, algoDissemination}, {hier, algoHier}} {
		if got := chooseBarrier(tc.t); got != tc.want {
			t.Errorf("barrier on %+v: %v, want %v", tc.t, got, tc.want)
		}
	}
}

// TestHierarchyByDefault: on hosts of several ranks with shared memory,
// the collectives go by hosts unless GORUN_ALGO forces a flat one; with
// GORUN_TRANSPORT=unix they stay flat.
func TestHierarchyByDefault(t *testing.T) {
	cases := []struct {
		opts TCPOptions
		want algorithm
	}{
		{TCPOptions{}, algoHier},
		{TCPOptions{Algorithm: "ring"}, algoRing},
		{TCPOptions{Transport: "unix"}, algoRing},
	}
	for _, tc := range cases {
		comms := hostsWorld(t, []int{0, 0, 1, 1}, tc.opts)
		c := comms[0].(*comm)
		if got := c.allReduceAlgorithm(16 << 20); got != tc.want {
			t.Errorf("%+v: all_reduce of 16 MiB by %v, want %v", tc.opts, got, tc.want)
		}
	}
}

// TestByRails: the all_reduce goes by the rails above hierLeadersMax,
// where the hosts share memory.
func TestByRails(t *testing.T) {
	for _, c := range []struct {
		shared bool
		n      int
		want   bool
	}{
		{true, 8, false},
		{true, hierLeadersMax, false},
		{true, hierLeadersMax + 1, true},
		{true, 16 << 20, true},
		{false, 16 << 20, false},
		{false, 8, false},
	} {
		if got := byRails(c.shared, c.n); got != c.want {
			t.Errorf("byRails(%v, %d) = %v, want %v", c.shared, c.n, got, c.want)
		}
	}
}

// TestByLeaders: a hierarchical all_gather or reduce_scatter goes
// through the leaders up to hierLeadersMovementMax, by the rails above.
func TestByLeaders(t *testing.T) {
	for _, c := range []struct {
		n    int
		want bool
	}{
		{0, true},
		{8, true},
		{hierLeadersMovementMax, true},
		{hierLeadersMovementMax + 1, false},
		{16 << 20, false},
	} {
		if got := byLeaders(c.n); got != c.want {
			t.Errorf("byLeaders(%d) = %v, want %v", c.n, got, c.want)
		}
	}
}

// TestRailPieces: the 2D all_reduce's pieces are at least hierPieceMin
// (one piece below it), at most hierPieceMax, and hierPieces where
// that keeps them within both.
func TestRailPieces(t *testing.T) {
	cases := []struct{ n, pieces int }{
		{0, 1},
		{8, 1},
		{1<<20 - 8, 1},
		{1 << 20, 1},
		{4 << 20, 4},
		{16 << 20, 8},
		{16<<20 + 8, 9}, // 8 pieces would be over 2 MiB
		{64 << 20, 32},
	}
	for _, c := range cases {
		if got := railPiecesOf(c.n); got != c.pieces {
			t.Errorf("railPiecesOf(%d) = %d, want %d", c.n, got, c.pieces)
		}
	}
}

// TestRemoteHost: a peer counts as on another host only when both ends
// named their hosts, differently.
func TestRemoteHost(t *testing.T) {
	cases := []struct {
		me, peer string
		remote   bool
	}{
		{"a", "b", true},
		{"a", "a", false},
		{"", "b", false},
		{"a", "", false},
		{"", "", false},
	}
	for _, c := range cases {
		if got := remoteHost(c.me, c.peer); got != c.remote {
			t.Errorf("remoteHost(%q, %q) = %v, want %v", c.me, c.peer, got, c.remote)
		}
	}
}

// TestSpinLimit: only a large frame from another host is waited for at
// the link's pace; a small one, or any from this host, as a local one.
func TestSpinLimit(t *testing.T) {
	c := config{yieldSpin: 10 * time.Millisecond, remoteSpin: time.Millisecond}
	cases := []struct {
		remote bool
		n      int
		want   time.Duration
	}{
		{false, 8, c.yieldSpin},
		{false, 16 << 20, c.yieldSpin},
		{true, 8, c.yieldSpin},
		{true, remoteSmallMax, c.yieldSpin},
		{true, remoteSmallMax + 1, c.remoteSpin},
		{true, 16 << 20, c.remoteSpin},
	}
	for _, k := range cases {
		if got := c.spinLimit(k.remote, k.n); got != k.want {
			t.Errorf("spinLimit(remote %v, %d bytes) = %v, want %v", k.remote, k.n, got, k.want)
		}
	}
}
