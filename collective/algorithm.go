package collective

import (
	"fmt"
	"math/bits"
	"slices"
	"strings"
)

// algorithm names how a collective moves its data. Frames carry it, so
// ranks that chose differently (say, GORUN_ALGO set on some only) fail
// with a mismatch instead of exchanging garbage.
type algorithm uint8

const (
	algoAuto          algorithm = iota
	algoRing                    // ring reduce-scatter + ring all-gather; ring all-gather
	algoRHD                     // recursive halving-doubling (Rabenseifner)
	algoRD                      // recursive doubling
	algoTree                    // binomial tree
	algoChain                   // pipelined chain
	algoDirect                  // every rank talks to the root / every peer directly
	algoDissemination           // barrier rounds at distances 1, 2, 4, ...
	algoShm                     // shared memory: each rank reduces its chunk of every rank's slot
	algoShmFlat                 // shared memory: each rank reduces all of every rank's slot
	algoHier                    // by host: shared memory within, the leaders across (hierarchy.go)
	algoBruck                   // all-gather in ceil(log2 n) rounds at distances 1, 2, 4, ...
)

var algorithmNames = [...]string{
	algoAuto:          "auto",
	algoRing:          "ring",
	algoRHD:           "rhd",
	algoRD:            "rd",
	algoTree:          "tree",
	algoChain:         "chain",
	algoDirect:        "direct",
	algoDissemination: "dissemination",
	algoShm:           "shm",
	algoShmFlat:       "shm-flat",
	algoHier:          "hier",
	algoBruck:         "bruck",
}

func (a algorithm) String() string {
	if int(a) < len(algorithmNames) {
		return algorithmNames[a]
	}
	return fmt.Sprintf("algorithm(%d)", uint8(a))
}

// parseAlgorithm reads TCPOptions.Algorithm (GORUN_ALGO, through
// runtime): "" or "auto" for the defaults, else one of the names above.
func parseAlgorithm(s string) (algorithm, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	if s == "" {
		return algoAuto, nil
	}
	for a, name := range algorithmNames {
		if s == name {
			return algorithm(a), nil
		}
	}
	return algoAuto, fmt.Errorf("collective: unknown algorithm %q (want one of %s)", s, strings.Join(algorithmNames[:], ", "))
}

// Size thresholds, in bytes of the caller's buffer. Below a threshold the
// fewer, latency-bound rounds win; above it the bandwidth-optimal ring,
// which moves 2(n-1)/n of the buffer per rank in n-1 pipelined steps.
const (
	// allReduceDoublingMax: recursive doubling, log2(n) rounds of the whole
	// buffer, up to this size.
	allReduceDoublingMax = 16 << 10
	// allReduceHalvingMax: Rabenseifner (the ring's volume in 2 log2(n)
	// rounds) up to this size; the ring above it. Non-powers of two pay an
	// extra full-buffer exchange to fold the extra ranks, so they switch to
	// the ring earlier.
	allReduceHalvingMax     = 4 << 20
	allReduceHalvingMaxFold = 256 << 10
	// hierAllReduceMin and hierBroadcastMin: between hosts some of which
	// run several ranks sharing memory, the hierarchical algorithms
	// (hierarchy.go) from this size on; hierBarrier, the barrier by
	// hosts. Measured on 2 hosts of 2 ranks joined by a 2 Gbit/s link
	// (bench/links.py): see the README's table.
	hierAllReduceMin = 0
	hierBroadcastMin = 0
	hierBarrier      = true
	// broadcastTreeMax: binomial tree up to this size, pipelined chain above.
	broadcastTreeMax = 256 << 10
	// reduceTreeMax: binomial tree up to this size, ring reduce-scatter and
	// a gather to the root above.
	reduceTreeMax = 256 << 10
	// reduceScatterDoublingMax: an all-reduce by recursive doubling on a
	// copy up to this size, the ring above.
	reduceScatterDoublingMax = 16 << 10
	// allGatherBruckMax: Bruck's all-gather up to this size of the
	// gathered buffer on 4 ranks or more, the ring above (and on 2 or 3,
	// where the ring takes as many steps). Bruck's ceil(log2 n) rounds
	// move what the ring's n-1 steps move, in fewer and larger messages,
	// plus one local copy of the whole buffer. Over TCP on 2 cores, 4
	// ranks, medians of 6 runs (ring, Bruck, OpenMPI's): 16 bytes 78, 53
	// and 39 us; 16 KiB 81 and 57; 64 KiB 97 and 81; 128 KiB 133 and 122;
	// 256 KiB 198 and 222; 1 MiB 665 and 814.
	allGatherBruckMax = 128 << 10

	// allReduceShmFlatWork: in shared memory, every rank reduces the whole
	// buffer (one synchronisation) while the buffer times the ranks stays
	// under this, each its 1/n above it (two synchronisations, n times
	// less reducing). Measured on 2 cores through allreduce-perf: flat
	// wins up to 64 KiB on 2 ranks (13.5 vs 18 us), up to 16 KiB on 4
	// (17 vs 25 us) but loses at 64 KiB there (38 vs 32 us).
	allReduceShmFlatWork = 128 << 10

	// defaultSegment is the payload of one frame in pipelined algorithms:
	// large enough to amortise a frame's cost (wake-ups, syscalls), small
	// enough that a rank reduces or forwards one segment while the next
	// is on the wire, and that a megabyte spreads over a pair's TCP
	// streams (transport.lane). Over forced TCP on 2 cores, a 1 MiB
	// all_reduce of 2 ranks took 529 us in 1 MiB frames on one stream and
	// 439 in 256 KiB frames on four; at 16 MiB, and over Unix sockets,
	// 256 KiB and 1 MiB measured alike.
	defaultSegment = 256 << 10
)

// forcedAlgorithm is the algorithm GORUN_ALGO forces on an operation
// whose forms are own (over sockets, or in shared memory when the world
// has it), and hier where byHost (the world has the views that the
// operation's hierarchical form needs); false when it forces none of
// them, and the operation chooses for itself.
func (c *comm) forcedAlgorithm(byHost bool, own ...algorithm) (algorithm, bool) {
	switch a := c.cfg.algo; a {
	case algoAuto:
		return a, false
	case algoHier:
		return a, byHost
	case algoShm, algoShmFlat:
		return a, c.shared() && slices.Contains(own, a)
	default:
		return a, slices.Contains(own, a)
	}
}

func (c *comm) allReduceAlgorithm(n int) algorithm {
	if a, ok := c.forcedAlgorithm(c.hier != nil, algoRing, algoRHD, algoRD, algoShm, algoShmFlat); ok {
		return a
	}
	return chooseAllReduce(c.topology(), n)
}

// topology is what the automatic choices know of where a communicator's
// ranks run: what the ranks published when they joined (host ids, and
// so ranks per host).
type topology struct {
	ranks  int  // the communicator's
	shared bool // all on one host, with shared memory
	// hier: the ranks span hosts and some host runs several, with
	// shared memory among them (a hierarchy in two dimensions).
	hier bool
	// grid: hier, every host running as many ranks, which the
	// hierarchical movement forms need (hierarchy_movement.go).
	grid bool
}

// topology is c's.
func (c *comm) topology() topology {
	return topology{
		ranks:  c.size(),
		shared: c.shared(),
		hier:   c.hier != nil && c.hier.twoD,
		grid:   c.grid != nil,
	}
}

// chooseAllReduce is the all_reduce algorithm for n bytes on t.
func chooseAllReduce(t topology, n int) algorithm {
	switch {
	case t.shared && n*t.ranks <= allReduceShmFlatWork:
		return algoShmFlat
	case t.shared:
		return algoShm
	case t.hier && n >= hierAllReduceMin:
		return algoHier
	case n <= allReduceDoublingMax:
		return algoRD
	case isPowerOfTwo(t.ranks) && n <= allReduceHalvingMax,
		n <= allReduceHalvingMaxFold:
		return algoRHD
	}
	return algoRing
}

// singleCopyAllReduce says whether a shared-memory all_reduce of n bytes
// reads the peer's buffer (allReducePairSingleCopy) rather than going
// through the slots.
func (c *comm) singleCopyAllReduce(n int) bool {
	return c.shm.cma && c.size() == 2 && n >= singleCopyAllReduceMin && n <= singleCopyAllReduceMax
}

func (c *comm) broadcastAlgorithm(n int) algorithm {
	if a, ok := c.forcedAlgorithm(c.hier != nil, algoTree, algoChain); ok {
		return a
	}
	return chooseBroadcast(c.topology(), n)
}

// chooseBroadcast is the broadcast algorithm for n bytes on t.
func chooseBroadcast(t topology, n int) algorithm {
	switch {
	case t.shared:
		return algoShm
	case t.hier && n >= hierBroadcastMin:
		return algoHier
	case n <= broadcastTreeMax:
		return algoTree
	}
	return algoChain
}

// barrierAlgorithm is the barrier's: by hosts, in shared memory, or by
// dissemination over sockets.
func (c *comm) barrierAlgorithm() algorithm {
	if a, ok := c.forcedAlgorithm(c.hier != nil, algoDissemination); ok {
		return a
	}
	return chooseBarrier(c.topology())
}

// chooseBarrier is the barrier's algorithm on t.
func chooseBarrier(t topology) algorithm {
	switch {
	case t.shared:
		return algoShmFlat
	case t.hier && hierBarrier:
		return algoHier
	}
	return algoDissemination
}

func (c *comm) reduceAlgorithm(n int) algorithm {
	switch c.cfg.algo {
	case algoTree, algoRing:
		return c.cfg.algo
	}
	if c.shared() {
		return algoShm
	}
	if n <= reduceTreeMax {
		return algoTree
	}
	return algoRing
}

func (c *comm) allGatherAlgorithm(n int) algorithm {
	if a, ok := c.forcedAlgorithm(c.grid != nil, algoRing, algoBruck); ok {
		return a
	}
	return chooseAllGather(c.topology(), n)
}

func (c *comm) reduceScatterAlgorithm(n int) algorithm {
	if a, ok := c.forcedAlgorithm(c.grid != nil, algoRing, algoRD); ok {
		return a
	}
	return chooseReduceScatter(c.topology(), n)
}

// allToAllAlgorithm is all_to_all's. Ranks with uneven counts hold
// buffers of different sizes, so it goes by the topology alone.
func (c *comm) allToAllAlgorithm() algorithm {
	if a, ok := c.forcedAlgorithm(c.grid != nil, algoDirect); ok {
		return a
	}
	return chooseAllToAll(c.topology())
}

// movementAlgorithm is the algorithm of a collective that has one over
// sockets, sockets, and one in shared memory: sockets when GORUN_ALGO
// names it or there is no shared memory.
func (c *comm) movementAlgorithm(sockets algorithm) algorithm {
	if c.cfg.algo != sockets && c.shared() {
		return algoShm
	}
	return sockets
}

func isPowerOfTwo(n int) bool { return n > 0 && n&(n-1) == 0 }

// floorPowerOfTwo is the largest power of two not above n (n >= 1).
func floorPowerOfTwo(n int) int { return 1 << (bits.Len(uint(n)) - 1) }

// span is a byte range of a buffer.
type span struct{ off, len int }

func (s span) of(b []byte) []byte { return b[s.off : s.off+s.len] }

// The span lists below fill a slice the caller owns (an op's scratch, see
// op.spans), so that steady-state calls allocate nothing.

// fillEvenSpans cuts count elements of size bytes into len(spans)
// near-equal ranges, the first count%len(spans) one element longer.
func fillEvenSpans(spans []span, count, size int) []span {
	for i := range spans {
		spans[i] = evenSpan(count, size, len(spans), i)
	}
	return spans
}

// fillCountSpans turns per-rank element counts into byte ranges.
func fillCountSpans(spans []span, counts []int, size int) []span {
	off := 0
	for i, n := range counts {
		spans[i] = span{off, n * size}
		off += n * size
	}
	return spans
}

// fillEqualSpans cuts len(spans) ranks' worth of size bytes each.
func fillEqualSpans(spans []span, size int) []span {
	for i := range spans {
		spans[i] = span{i * size, size}
	}
	return spans
}
