package collective

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/rs/zerolog"

	"github.com/gorun/gorun/internal/shmname"
	"github.com/gorun/gorun/rendezvous"
)

// The shared-memory transport, for the ranks that run on one host: the
// whole world, or one host's ranks of a job that spans hosts
// (hierarchy.go). Each rank owns one segment: a control block of
// counters other ranks watch, and two slots that take turns holding the
// blocks of the collective in flight. A rank writes its data into its own slot once;
// peers read (and reduce) it straight from there, so a byte is copied in
// once and out once instead of crossing two socket buffers, with no
// system call while the ranks keep pace (see shmwait.go for waiting).
//
// The segments are files in /dev/shm named after their creator and at
// random (internal/shmname); ranks publish the names through the store, map each other's, agree that every rank
// managed to, and unlink their own file at once: from then on only the
// mappings hold the memory, and an exit or a crash frees it.
//
// Every collective of the world has a shared-memory algorithm
// (shmops.go, allreduce_shm.go, movement_shm.go). The sockets stay: they
// carry the communicators split from the world, send and receive, the
// algorithms GORUN_ALGO forces, abort notes and diagnosis queries, and
// tell us at once when a peer process dies (its sockets close), which a
// counter in shared memory never would.

const (
	// shmKeyPrefix + rank holds the rank's process id, the address of its
	// segment in its own process (hex) and the segment's name, "pid addr
	// name", the name "-" when it has none; shmReadyKeyPrefix + rank then
	// says whether it mapped every peer's ("1") or not ("0"), and, after
	// a "1", whether it could also read every peer's memory with
	// process_vm_readv ("c").
	shmKeyPrefix      = "collective/shm/"
	shmReadyKeyPrefix = "collective/shm-ready/"

	// defaultShmSlot is the bytes of one block: large enough that the
	// three synchronisations of a block are amortised, small enough that
	// two slots per rank stay modest in /dev/shm (docker gives 64 MiB).
	defaultShmSlot = 2 << 20
	// shmHistory is how many published call headers a rank keeps.
	shmHistory = 8
)

// The control block. Each counter has its own cache line, so a rank
// polling one does not slow down the owner writing another.
const (
	ctlWritten   = 0   // stamp of the last block whose data is in a slot
	ctlReduced   = 64  // stamp of the last block whose own chunk is reduced
	ctlConsumed  = 128 // stamp of the last block read from every peer
	ctlPublished = 192 // low 32 bits of the last call's sequence number
	ctlSleepers  = 256 // peers sleeping on one of the counters above
	ctlRounds    = 320 // two words 64 bytes apart, by block parity (all_to_all)
	ctlHistory   = 448 // shmHistory entries of 64 bytes: seq, header
	ctlMagic     = 960 // a random word, for peers to test process_vm_readv on
	// ctlPieces starts two piece tables, by block parity: what the
	// all_to_all or all_gather starting at a block of that parity sends
	// (see shmRegion.pieces).
	ctlPieces = 1024
)

// shmControlSize is the bytes of the control block of a world of n
// ranks, whole pages so that the slots after it start on one.
func shmControlSize(n int) int { return (ctlPieces + 2*pieceTableSize(n) + 4095) &^ 4095 }

// pieceTableSize is the bytes of a piece table of n ranks: a count and an
// offset per rank, and a base address.
func pieceTableSize(n int) int { return 8 * (2*n + 1) }

// shmRegion is one rank's segment seen through its fields.
type shmRegion struct {
	written, reduced, consumed, published, sleepers *atomic.Uint32
	// rounds[g%2] is how many blocks the all_to_all starting at block g
	// needs for this rank's pieces; written before block g is.
	rounds  [2]*atomic.Uint32
	magic   *atomic.Uint64
	tables  [2]pieceTable
	history []byte
	slots   [2][]byte
}

// pieceTable describes the pieces a rank sends in an all_to_all (or
// all_gather) for its peers to find them: for each destination, the
// elements it sends and, when single-copy reads are on (shmWorld.cma),
// their offset from base, the address of its input in its own process.
type pieceTable []uint64

func (t pieceTable) ranks() int                     { return len(t) / 2 }
func (t pieceTable) count(dst int) uint64           { return t[dst] }
func (t pieceTable) offset(dst int) uint64          { return t[t.ranks()+dst] }
func (t pieceTable) base() uintptr                  { return uintptr(t[2*t.ranks()]) }
func (t pieceTable) set(dst int, count, off uint64) { t[dst], t[t.ranks()+dst] = count, off }
func (t pieceTable) setBase(addr uintptr)           { t[2*t.ranks()] = uint64(addr) }

// pieces is the piece table of the collective starting at block g.
func (r *shmRegion) pieces(g uint32) pieceTable { return r.tables[g%2] }

func newShmRegion(mem []byte, slot, n int) shmRegion {
	table := func(par int) pieceTable {
		return unsafe.Slice((*uint64)(unsafe.Pointer(&mem[ctlPieces+par*pieceTableSize(n)])), 2*n+1)
	}
	ctl := shmControlSize(n)
	word := func(off int) *atomic.Uint32 { return (*atomic.Uint32)(unsafe.Pointer(&mem[off])) }
	return shmRegion{
		written:   word(ctlWritten),
		reduced:   word(ctlReduced),
		consumed:  word(ctlConsumed),
		published: word(ctlPublished),
		sleepers:  word(ctlSleepers),
		rounds:    [2]*atomic.Uint32{word(ctlRounds), word(ctlRounds + 64)},
		magic:     magicWord(mem),
		tables:    [2]pieceTable{table(0), table(1)},
		history:   mem[ctlHistory : ctlHistory+shmHistory*64],
		slots: [2][]byte{
			mem[ctl : ctl+slot],
			mem[ctl+slot : ctl+2*slot],
		},
	}
}

func shmSegmentSize(slot, n int) int { return shmControlSize(n) + 2*slot }

// magicWord is the word of segment mem that peers test process_vm_readv
// on.
func magicWord(mem []byte) *atomic.Uint64 { return (*atomic.Uint64)(unsafe.Pointer(&mem[ctlMagic])) }

// shmWorld is the shared memory of the ranks on this host: the world
// communicator's when the world runs on one host, else the host view's
// (hierarchy.go). It holds every member's region, mapped. The fields
// after mu are the collective in flight (calls on a communicator are
// sequential).
type shmWorld struct {
	slot    int
	regions []shmRegion // by member: the rank in the communicator using it
	segs    []*segment

	stamp   uint32 // the last block stamp used; 0 before the first
	checked []bool // peers whose call matched ours in the current op

	// inProcess marks the members in this process, which tests run as
	// goroutines: waiting for one yields to the Go scheduler rather than
	// the kernel's (see awaitShared).
	inProcess []bool
	// cma says every rank can read and write every other's memory with
	// process_vm_readv and _writev (readPeer, writePeer); pids are their
	// processes.
	cma  bool
	pids []int
	// polls is how many times a waiter looks before it yields the core
	// (pollsFor); crowded says the members may have to take turns on
	// cores (see shmwait.go), so waiters yield between looks rather than
	// keep polling.
	polls   int
	crowded bool

	mu     sync.Mutex
	closed bool
	active sync.WaitGroup // ops using the mappings
}

// setupShm builds the shared memory of members, the world ranks that
// share this host (ascending; me is this rank's index among them): the
// whole world, or one host's ranks of a job that spans hosts (see
// hierarchy.go). Regions are indexed by member. It returns nil, and no
// error, when the members cannot or will not all use it
// (TCPOptions.Transport, a full /dev/shm): every member reaches the same
// verdict, from what they published in the store.
func setupShm(ctx context.Context, store rendezvous.Store, members []int, me, slot int, want, singleCopy bool, log zerolog.Logger) (*shmWorld, error) {
	size, rank := len(members), me
	if size < 2 {
		return nil, nil
	}
	keys := func(prefix string) []string {
		k := make([]string, size)
		for i, w := range members {
			k[i] = prefix + strconv.Itoa(w)
		}
		return k
	}
	var err error
	segs := make([]*segment, size)
	unmapAll := func() {
		for _, s := range segs {
			if s != nil {
				s.unlink()
				s.unmap()
			}
		}
	}
	name := "-"
	if want {
		n, err := newSegmentName(members[rank])
		if err == nil {
			segs[rank], err = createSegment(n, shmSegmentSize(slot, size))
		}
		if err == nil {
			name = n
		} else {
			log.Debug().Err(err).Msg("no shared memory; same-host peers use sockets")
		}
	}
	self := strconv.Itoa(os.Getpid())
	addr := "0"
	if segs[rank] != nil {
		var magic [8]byte
		rand.Read(magic[:])
		magicWord(segs[rank].mem).Store(binary.LittleEndian.Uint64(magic[:]))
		addr = strconv.FormatUint(uint64(addressOf(segs[rank].mem)), 16)
	}
	if err := store.Set(ctx, shmKeyPrefix+strconv.Itoa(members[rank]), []byte(self+" "+addr+" "+name)); err != nil {
		unmapAll()
		return nil, fmt.Errorf("collective: publish shared memory: %w", err)
	}
	if name == "-" {
		return nil, nil
	}
	published, err := store.MultiGet(ctx, keys(shmKeyPrefix))
	if err != nil {
		unmapAll()
		return nil, fmt.Errorf("collective: look up shared memory: %w", err)
	}
	names := make([]string, size)
	pids := make([]int, size)
	addrs := make([]uintptr, size)
	inProcess := make([]bool, size) // ranks of this very process (tests)
	for peer, v := range published {
		f := strings.Fields(string(v))
		if len(f) != 3 || f[2] == "-" {
			unmapAll()
			return nil, nil
		}
		pid, _ := strconv.Atoi(f[0])
		if !validSegmentName(f[2], pid) {
			// Every member reads the same values and gives up alike.
			log.Warn().Int("peer", peer).Str("name", f[2]).Msg("a peer published a shared-memory name gorun does not make; using sockets")
			unmapAll()
			return nil, nil
		}
		addr, _ := strconv.ParseUint(f[1], 16, 64)
		names[peer], pids[peer], addrs[peer], inProcess[peer] = f[2], pid, uintptr(addr), f[0] == self
	}
	ready := "1"
	for peer, n := range names {
		if peer == rank {
			continue
		}
		if segs[peer], err = openSegment(n, shmSegmentSize(slot, size)); err != nil {
			log.Debug().Err(err).Int("peer", peer).Msg("cannot map a peer's shared memory; using sockets")
			ready = "0"
			break
		}
	}
	if ready == "1" && singleCopy && canReachPeers(segs, pids, addrs, rank, log) {
		ready = "1c"
	}
	err = store.Set(ctx, shmReadyKeyPrefix+strconv.Itoa(members[rank]), []byte(ready))
	var readies [][]byte
	if err == nil {
		readies, err = store.MultiGet(ctx, keys(shmReadyKeyPrefix))
	}
	// Every rank has mapped our segment or given up: the file can go.
	segs[rank].unlink()
	if err != nil {
		unmapAll()
		return nil, fmt.Errorf("collective: agree on shared memory: %w", err)
	}
	cma := true
	for _, r := range readies {
		if !strings.HasPrefix(string(r), "1") {
			unmapAll()
			return nil, nil
		}
		cma = cma && string(r) == "1c"
	}
	cpus, apart := cpusOf(pids)
	if cpus == 0 {
		cpus = runtime.NumCPU()
	}
	s := &shmWorld{slot: slot, segs: segs, regions: make([]shmRegion, size), checked: make([]bool, size),
		inProcess: inProcess, pids: pids, cma: cma, polls: pollsFor(size, cpus),
		crowded: crowded(apart, slices.Contains(inProcess[:rank], true) || slices.Contains(inProcess[rank+1:], true))}
	for i, seg := range segs {
		s.regions[i] = newShmRegion(seg.mem, slot, size)
	}
	return s, nil
}

// newSegmentName names the segment of world rank rank: its creator, this
// process, is in the name, so that a segment left behind by a process
// killed before it could unlink it is swept once the process is gone
// (shmname.Sweep).
func newSegmentName(rank int) (string, error) {
	c, err := shmname.Self()
	if err != nil {
		return "", fmt.Errorf("collective: name shared memory: %w", err)
	}
	var b [8]byte
	rand.Read(b[:])
	return shmname.Name{Creator: c, Random: hex.EncodeToString(b[:]), Rank: rank}.String(), nil
}

// validSegmentName accepts a peer's segment name read from the store
// only in exactly the form newSegmentName makes, created by pid, the
// process that published it: anything else could name a file outside
// the shared-memory folder ("../../tmp/x") or another job's segment.
func validSegmentName(name string, pid int) bool {
	n, ok := shmname.Parse(name)
	return ok && n.Pid == pid
}

// canReachPeers reports whether this rank can read and write every peer's
// memory with process_vm_readv and _writev: it reads each peer's magic
// word from the peer's address space, compares it with what the peer's
// segment, mapped here, holds, and writes it back, unchanged.
func canReachPeers(segs []*segment, pids []int, addrs []uintptr, rank int, log zerolog.Logger) bool {
	for peer, seg := range segs {
		if peer == rank {
			continue
		}
		var got [8]byte
		err := readPeer(pids[peer], addrs[peer]+ctlMagic, got[:])
		want := magicWord(seg.mem).Load()
		if err == nil && binary.LittleEndian.Uint64(got[:]) != want {
			err = errors.New("process_vm_readv read another word than the peer's segment holds")
		}
		if err == nil {
			err = writePeer(pids[peer], addrs[peer]+ctlMagic, got[:])
		}
		if err != nil {
			log.Debug().Err(err).Int("peer", peer).Msg("no single-copy reads between ranks; copying through shared memory")
			return false
		}
	}
	return true
}

// enter marks an op using the mappings; false once closing.
func (s *shmWorld) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.active.Add(1)
	return true
}

func (s *shmWorld) exit() { s.active.Done() }

// close waits for the ops using the mappings (their communicator has
// failed, so they return within a nap) and unmaps every segment.
func (s *shmWorld) close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	for i := range s.regions {
		r := &s.regions[i]
		futexWake(r.written)
		futexWake(r.reduced)
		futexWake(r.consumed)
		futexWake(r.published)
	}
	s.active.Wait()
	for _, seg := range s.segs {
		seg.unmap()
	}
}

// signal sets one of rank's counters to stamp and wakes its sleepers.
// The sleepers count is read after the store, and sleepers register
// before their last look at the counter (sequentially consistent
// atomics), so either they see the stamp or we see them.
func (s *shmWorld) signal(rank int, word *atomic.Uint32, stamp uint32) {
	word.Store(stamp)
	if s.regions[rank].sleepers.Load() != 0 {
		futexWake(word)
	}
}

// reached reports whether counter value v has got to stamp, modulo 2^32.
func reached(v, stamp uint32) bool { return int32(v-stamp) >= 0 }

// historyEntry is the 8 words of the slot for seq in rank's history: the
// sequence number, then the encoded header.
func (s *shmWorld) historyEntry(rank int, seq uint64) *[8]atomic.Uint64 {
	h := s.regions[rank].history
	return (*[8]atomic.Uint64)(unsafe.Pointer(&h[(seq%shmHistory)*64]))
}

// publish records the call this rank makes at h.seq, for peers to check
// theirs against, and wakes peers waiting for it to arrive. Every call on
// the world publishes, whatever its transport: a peer in a shared-memory
// op learns of our different call only from here.
func (s *shmWorld) publish(rank int, h *header) {
	e := s.historyEntry(rank, h.seq)
	var b [headerSize]byte
	h.encode(&b)
	e[0].Store(0) // readers ignore the entry while it changes
	for i := range 7 {
		e[1+i].Store(binary.LittleEndian.Uint64(b[8*i:]))
	}
	e[0].Store(h.seq)
	s.signal(rank, s.regions[rank].published, uint32(h.seq))
}

// movedOn reports whether rank has published so many calls after seq
// that its entry for seq is gone.
func (s *shmWorld) movedOn(rank int, seq uint64) bool {
	return int32(s.regions[rank].published.Load()-uint32(seq)) >= shmHistory
}

// lookup returns the call rank published for seq, if it still holds it.
func (s *shmWorld) lookup(rank int, seq uint64) (header, bool) {
	e := s.historyEntry(rank, seq)
	for {
		if e[0].Load() != seq {
			return header{}, false
		}
		var b [headerSize]byte
		for i := range 7 {
			binary.LittleEndian.PutUint64(b[8*i:], e[1+i].Load())
		}
		if e[0].Load() != seq {
			continue // rewritten while we read
		}
		var h header
		if h.decode(b[:]) != nil {
			return header{}, false
		}
		return h, true
	}
}
