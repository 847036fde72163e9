package collective

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/rs/zerolog"

	"github.com/gorun/gorun/rendezvous"
)

// The shared-memory transport, for a world whose ranks all run on one
// host. Each rank owns one segment: a control block of counters other
// ranks watch, and two slots that take turns holding the blocks of the
// collective in flight. A rank writes its data into its own slot once;
// peers read (and reduce) it straight from there, so a byte is copied in
// once and out once instead of crossing two socket buffers, with no
// system call while the ranks keep pace (see shmwait.go for waiting).
//
// The segments are files in /dev/shm named at random; ranks publish the
// names through the store, map each other's, agree that every rank
// managed to, and unlink their own file at once: from then on only the
// mappings hold the memory, and an exit or a crash frees it.
//
// The sockets stay: they carry the collectives that have no shared-memory
// algorithm, the communicators split from the world, abort notes and
// diagnosis queries, and tell us at once when a peer process dies (its
// sockets close), which a counter in shared memory never would.

const (
	// shmKeyPrefix + rank holds the rank's segment name, or "-" when it
	// has none; shmReadyKeyPrefix + rank then says whether it mapped every
	// peer's ("1") or not ("0").
	shmKeyPrefix      = "collective/shm/"
	shmReadyKeyPrefix = "collective/shm-ready/"

	shmControlSize = 4 << 10
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
	ctlWritten  = 0   // stamp of the last block whose input is in a slot
	ctlReduced  = 64  // stamp of the last block whose own chunk is reduced
	ctlConsumed = 128 // stamp of the last block read from every peer
	ctlSleepers = 192 // peers sleeping on one of the counters above
	ctlHistory  = 256 // shmHistory entries of 64 bytes: seq, header
)

// shmRegion is one rank's segment seen through its fields.
type shmRegion struct {
	written, reduced, consumed, sleepers *atomic.Uint32
	history                              []byte
	slots                                [2][]byte
}

func newShmRegion(mem []byte, slot int) shmRegion {
	word := func(off int) *atomic.Uint32 { return (*atomic.Uint32)(unsafe.Pointer(&mem[off])) }
	return shmRegion{
		written:  word(ctlWritten),
		reduced:  word(ctlReduced),
		consumed: word(ctlConsumed),
		sleepers: word(ctlSleepers),
		history:  mem[ctlHistory : ctlHistory+shmHistory*64],
		slots: [2][]byte{
			mem[shmControlSize : shmControlSize+slot],
			mem[shmControlSize+slot : shmControlSize+2*slot],
		},
	}
}

func shmSegmentSize(slot int) int { return shmControlSize + 2*slot }

// shmWorld is the world communicator's shared memory: every rank's
// region, mapped. The fields after mu are the world's collective in
// flight (calls on a communicator are sequential).
type shmWorld struct {
	slot    int
	regions []shmRegion // by world rank
	segs    []*segment

	stamp   uint32 // the last block stamp used; 0 before the first
	checked []bool // peers whose call matched ours in the current op

	mu     sync.Mutex
	closed bool
	active sync.WaitGroup // ops using the mappings
}

// setupShm builds the world's shared memory when every rank shares this
// host. It returns nil, and no error, when the ranks cannot or will not
// all use it (another host, GORUN_TRANSPORT, a full /dev/shm): all ranks
// reach the same verdict, from what they published in the store.
func setupShm(ctx context.Context, store rendezvous.Store, rank, size, slot int, want bool, hostID string, log zerolog.Logger) (*shmWorld, error) {
	if size < 2 || hostID == "" {
		return nil, nil
	}
	keys := func(prefix string) []string {
		k := make([]string, size)
		for i := range k {
			k[i] = prefix + strconv.Itoa(i)
		}
		return k
	}
	locals, err := store.MultiGet(ctx, keys(localKeyPrefix))
	if err != nil {
		return nil, fmt.Errorf("collective: look up hosts: %w", err)
	}
	for _, v := range locals {
		if id, _, _ := splitLocal(v); id != hostID {
			return nil, nil // some rank elsewhere, or one that uses tcp only
		}
	}

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
		var b [8]byte
		rand.Read(b[:])
		n := fmt.Sprintf("gorun-collective-%s-%d", hex.EncodeToString(b[:]), rank)
		if segs[rank], err = createSegment(n, shmSegmentSize(slot)); err == nil {
			name = n
		} else {
			log.Debug().Err(err).Msg("no shared memory; same-host peers use sockets")
		}
	}
	if err := store.Set(ctx, shmKeyPrefix+strconv.Itoa(rank), []byte(name)); err != nil {
		unmapAll()
		return nil, fmt.Errorf("collective: publish shared memory: %w", err)
	}
	if name == "-" {
		return nil, nil
	}
	names, err := store.MultiGet(ctx, keys(shmKeyPrefix))
	if err != nil {
		unmapAll()
		return nil, fmt.Errorf("collective: look up shared memory: %w", err)
	}
	for _, n := range names {
		if string(n) == "-" {
			unmapAll()
			return nil, nil
		}
	}
	ready := "1"
	for peer, n := range names {
		if peer == rank {
			continue
		}
		if segs[peer], err = openSegment(string(n), shmSegmentSize(slot)); err != nil {
			log.Debug().Err(err).Int("peer", peer).Msg("cannot map a peer's shared memory; using sockets")
			ready = "0"
			break
		}
	}
	err = store.Set(ctx, shmReadyKeyPrefix+strconv.Itoa(rank), []byte(ready))
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
	for _, r := range readies {
		if string(r) != "1" {
			unmapAll()
			return nil, nil
		}
	}
	s := &shmWorld{slot: slot, segs: segs, regions: make([]shmRegion, size), checked: make([]bool, size)}
	for i, seg := range segs {
		s.regions[i] = newShmRegion(seg.mem, slot)
	}
	return s, nil
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
// theirs against. Every call on the world publishes, whatever its
// transport: a peer in a shared-memory op learns of our different call
// only from here.
func (s *shmWorld) publish(rank int, h *header) {
	e := s.historyEntry(rank, h.seq)
	var b [headerSize]byte
	h.encode(&b)
	e[0].Store(0) // readers ignore the entry while it changes
	for i := range 7 {
		e[1+i].Store(binary.LittleEndian.Uint64(b[8*i:]))
	}
	e[0].Store(h.seq)
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
