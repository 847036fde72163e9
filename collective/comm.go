package collective

import (
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun/gorun/rendezvous"
)

// TCPOptions configures NewTCP. The zero value is usable. NewTCP reads
// no environment: runtime.Init maps the GORUN_* variables named below to
// these fields (its package documentation has the table of what wins).
type TCPOptions struct {
	// Logger receives connection events at debug and anomalies at warn;
	// the zero value logs nothing.
	Logger zerolog.Logger
	// Host is the address to listen on and advertise. When it is empty,
	// listenHost picks one from Ifname and StoreAddr.
	Host string
	// Ifname is the network interface to listen on (GORUN_SOCKET_IFNAME,
	// GLOO_SOCKET_IFNAME), when Host is empty.
	Ifname string
	// StoreAddr is the store's "host:port" (MASTER_ADDR and MASTER_PORT in
	// torchrun's contract): with neither Host nor Ifname, the rank listens
	// on the local address that routes there.
	StoreAddr string
	// Eager connects to every peer during NewTCP instead of on first use.
	Eager bool
	// Transport chooses how ranks on one host talk (GORUN_TRANSPORT):
	//   - "auto" (or empty): shared memory when every rank of the world
	//     shares this host (shm.go), else Unix sockets between same-host
	//     peers and TCP between hosts;
	//   - "unix": no shared memory, Unix sockets between same-host peers;
	//   - "tcp": TCP between all peers.
	Transport string
	// TCPOnly is Transport "tcp" whatever Transport says (GORUN_TCP_ONLY=1,
	// kept for scripts that set it).
	TCPOnly bool
	// Streams is how many TCP connections each way this rank asks for
	// with each peer on another host (or with every peer, when TCP is
	// forced), 1 to 16; a pair uses the fewer of what its two ends ask.
	// Zero (GORUN_TCP_STREAMS unset) asks for 4 when this rank is alone
	// on its host, and else for 4 shared among its host's connections to
	// the other hosts, one per rank here and host there, at least 1
	// (streamsAsked).
	Streams int
	// HostID names this rank's host (GORUN_HOST_ID): ranks that give the
	// same one share memory and Unix sockets. Empty means the boot id and
	// host name. Tests give ranks of one process different ones to make a
	// job that spans hosts.
	HostID string
	// Algorithm forces the algorithm of the collectives that have it
	// (GORUN_ALGO): "shm" or "shm-flat" (shared memory, when the world has
	// it), "hier" (by host, when the world spans hosts and some host runs
	// two ranks: hierarchy.go), "ring", "rhd", "rd", "tree", "chain",
	// "direct", "bruck" (flat, over sockets). Empty or "auto" chooses by
	// where the ranks run and the size (algorithm.go): by host where hosts
	// run several ranks that share memory (all_gather, reduce_scatter and
	// all_to_all only where every host runs as many: hierarchy_movement.go;
	// "direct" keeps all_to_all pairwise there). Every rank must agree
	// (frames and shared-memory calls carry the algorithm, so ranks that
	// do not fail with ErrMismatch).
	Algorithm string

	// segment overrides the bytes per frame of pipelined algorithms.
	segment int
	// shmSlot overrides the bytes per block of shared-memory algorithms.
	shmSlot int
	// yieldSpin overrides how long an op reading its peer's socket spins
	// with nothing moving before it parks (awaitYieldSpin, and
	// remoteYieldSpin for a peer on another host).
	yieldSpin time.Duration
	// noSingleCopy turns off single-copy reads of peers' memory, as a
	// kernel that forbids them would.
	noSingleCopy bool
}

// transportMode is the transport opts ask for: "auto", "unix" or "tcp".
func (opts TCPOptions) transportMode() (string, error) {
	if opts.TCPOnly {
		return "tcp", nil
	}
	switch mode := strings.ToLower(strings.TrimSpace(opts.Transport)); mode {
	case "", "auto":
		return "auto", nil
	case "unix", "tcp":
		return mode, nil
	default:
		return "", fmt.Errorf("collective: unknown transport %q (want auto, unix or tcp)", mode)
	}
}

// config is what a communicator and its splits share.
type config struct {
	algo      algorithm // forced by TCPOptions.Algorithm; algoAuto chooses by size
	segment   int
	streams   int // TCP streams each way asked of each peer
	yieldSpin time.Duration
	// remoteSpin is yieldSpin for a large frame from a peer on another
	// host (remoteYieldSpin, spinLimit).
	remoteSpin time.Duration
}

// spinLimit is how long an op waiting for a frame of n bytes spins with
// nothing moving before it parks. A large frame from another host comes
// at the link's pace, which spinning cannot speed: remoteSpin. A small
// one, up to what a sender writes at once (remoteSmallMax), comes as
// soon as the peer gets to it, and waiting for it is a matter of wake-ups:
// with more ranks than cores, a rank that parks after remoteSpin must be
// woken and scheduled, behind the peers still spinning, for every frame
// of a latency-bound collective. 4 shaped hosts of 2 ranks on 2 cores
// (bench/links.py), before and after: 8-byte all_reduce 1,033 and 430 us
// (Open MPI 298), 32-byte all_gather 3,716 and 423, all_to_all 3,744 and
// 677; 64 KiB all_gather 0.016 and 0.068 GB/s busbw; 1 and 16 MiB, and
// 2 hosts, unchanged within the runs' noise.
func (c config) spinLimit(remote bool, n int) time.Duration {
	if remote && n > remoteSmallMax {
		return c.remoteSpin
	}
	return c.yieldSpin
}

// worldID is the world communicator's id; splits hash their ids from it.
const worldID = 1

// NewTCP joins the world communicator of size ranks: it listens on a TCP
// port, publishes "host:port" in store under "collective/addr/<rank>", and
// returns a Comm whose peers are found through store. Connections are
// made on first use, or during NewTCP when opts.Eager is set. Closing the
// returned Comm closes the transport that its splits share.
//
// Ranks that publish the same host identity (opts.HostID, else boot id
// and host name) share memory and Unix sockets.
//
// While any communicator of the process is open, GOMAXPROCS is at least
// 2 (see twoPs in procs.go); closing the last puts back what it was.
func NewTCP(ctx context.Context, store rendezvous.Store, rank, size int, opts TCPOptions) (Comm, error) {
	if size < 1 || rank < 0 || rank >= size {
		return nil, fmt.Errorf("collective: rank %d out of range for world size %d", rank, size)
	}
	algo, err := parseAlgorithm(opts.Algorithm)
	if err != nil {
		return nil, err
	}
	streams, err := checkStreams(opts.Streams)
	if err != nil {
		return nil, err
	}
	cfg := config{algo: algo, segment: cmp.Or(opts.segment, defaultSegment), streams: streams, yieldSpin: cmp.Or(opts.yieldSpin, awaitYieldSpin),
		remoteSpin: cmp.Or(opts.yieldSpin, remoteYieldSpin)}
	mode, err := opts.transportMode()
	if err != nil {
		return nil, err
	}
	host, err := listenHost(ctx, opts)
	if err != nil {
		return nil, err
	}
	log := opts.Logger.With().Str("component", "collective").Int("rank", rank).Logger()
	hostID := ""
	if mode != "tcp" {
		hostID = cmp.Or(strings.TrimSpace(opts.HostID), hostIdentity())
	}
	t, err := newTransport(ctx, store, rank, size, host, hostID, cfg, log)
	if err != nil {
		return nil, err
	}
	infos, err := t.peerInfo(ctx)
	if err != nil {
		t.close()
		return nil, err
	}
	t.setLanes(infos)
	hosts := make([]string, size)
	for i, info := range infos {
		hosts[i] = info.hostID
	}
	local := sameHost(hosts, rank)
	slot := opts.shmSlot
	if slot <= 0 {
		slot = defaultShmSlot
	}
	// A part of 64 bytes at least for every rank (subSlot's least): of
	// the host's in the flat forms, of the world's in the hierarchical
	// ones, which a world of over 32,768 ranks makes larger than the
	// default slot.
	slot = max(slot, 64*size)
	if t.shm, err = setupShm(ctx, store, local, slices.Index(local, rank), slot, mode != "unix", !opts.noSingleCopy, log); err != nil {
		t.close()
		return nil, err
	}
	members := make([]int, size)
	for i := range members {
		members[i] = i
	}
	world := newComm(t, worldID, rank, members)
	world.isWorld = true
	if len(local) == size {
		world.shm = t.shm
	} else {
		world.hier = newHierarchy(world, hosts, t.shm, mode != "unix")
		world.grid = newGrid(world.hier, rank)
	}
	if err := t.register(world); err != nil {
		t.close()
		return nil, err
	}
	// Shared memory shows no sign of a peer's death: its sockets must
	// exist to close.
	if opts.Eager || t.shm != nil {
		if err := t.connectAll(ctx); err != nil {
			world.Close()
			return nil, err
		}
	}
	return world, nil
}

// checkStreams is the TCP streams asked for: n, or 0 to let
// streamsAsked choose.
func checkStreams(n int) (int, error) {
	if n < 0 || n > maxStreams {
		return 0, fmt.Errorf("collective: %d TCP streams per peer: want 1 to %d", n, maxStreams)
	}
	return n, nil
}

// connectAll dials every peer at once.
func (t *transport) connectAll(ctx context.Context) error {
	errs := make([]error, t.size)
	var wg sync.WaitGroup
	for dst := range t.size {
		if dst == t.rank {
			continue
		}
		wg.Go(func() {
			if _, err := t.outgoing(ctx, dst); err != nil {
				errs[dst] = &PeerError{Rank: dst, Op: "connect", Err: err}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// comm is a communicator over the TCP transport: the world, or a split of
// it sharing the world's connections.
type comm struct {
	t       *transport
	id      uint64
	rank    int
	world   []int // comm rank -> world rank
	cfg     config
	log     zerolog.Logger
	isWorld bool
	// shm is the shared memory its collectives use: the world's when
	// every rank shares a host, a host's in a view (hierarchy.go).
	shm *shmWorld
	// hier splits the world's collectives by host when the world spans
	// hosts and some host runs more than one rank (hierarchy.go).
	hier *hierarchy
	// grid lays hier out as hosts x ranks when every host runs as many
	// (hierarchy_movement.go).
	grid *grid
	// parent is the communicator a view belongs to: it shares the
	// parent's id, frames and failure, and names ranks in its own terms.
	parent *comm

	seq   uint64    // the last collective's sequence number (calls are sequential)
	coll  op        // the collective in flight, reused
	prev  header    // the last collective's frame template, for mismatch errors
	spans [2][]span // the call's span lists, reused (spanScratch)
	peers []int     // the call's list of peers, reused (peerScratch)

	progress  atomic.Uint64 // the latest collective, for queries (packProgress)
	waitingOn atomic.Int32  // the rank its op blocks on, or -1

	failMu sync.Mutex
	err    error         // the first failure; set before failed is closed
	failed chan struct{} // closed on the first failure or Close
	closed atomic.Bool
}

var _ Comm = (*comm)(nil)

func newComm(t *transport, id uint64, rank int, world []int) *comm {
	c := &comm{
		t:      t,
		id:     id,
		rank:   rank,
		world:  world,
		cfg:    t.cfg,
		log:    t.log.With().Uint64("comm", id).Logger(),
		failed: make(chan struct{}),
	}
	c.waitingOn.Store(-1)
	return c
}

// register makes c reachable by id, applying an abort that came first.
func (t *transport) register(c *comm) error {
	m := t.match
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case m.closed:
		return ErrClosed
	case m.comms[c.id] != nil || m.retired[c.id]:
		return fmt.Errorf("collective: communicator %#x exists already: split ids must be unique", c.id)
	}
	m.comms[c.id] = c
	if note := m.orphans[c.id]; note != nil {
		delete(m.orphans, c.id)
		c.fail(note.errorFor(c.rank))
	}
	return nil
}

// peerScratch returns the call's list of n peers, for it to fill.
func (c *comm) peerScratch(n int) []int {
	if cap(c.peers) < n {
		c.peers = make([]int, n)
	}
	return c.peers[:n]
}

// spanScratch returns span list i (0 or 1) of the call in flight, n
// long, for the call to fill.
func (c *comm) spanScratch(i, n int) []span {
	if cap(c.spans[i]) < n {
		c.spans[i] = make([]span, n)
	}
	return c.spans[i][:n]
}

// shared reports whether c's collectives may go through shared memory:
// the world when every rank shares the host, a view of one host's ranks.
func (c *comm) shared() bool { return c.shm != nil }

// failure is why c failed, once c.failed is closed; a view's is its
// parent's.
func (c *comm) failure() error {
	if c.parent != nil {
		return c.parent.err
	}
	return c.err
}

func (c *comm) Rank() int { return c.rank }
func (c *comm) Size() int { return len(c.world) }
func (c *comm) size() int { return len(c.world) }

// commRank maps a world rank to its rank in c, or fallback.
func (c *comm) commRank(world, fallback int) int {
	if i := slices.Index(c.world, world); i >= 0 {
		return i
	}
	return fallback
}

// fail records the communicator's first failure and wakes its waiting
// op. It reports whether err was the first.
func (c *comm) fail(err error) bool {
	if c.parent != nil {
		return c.parent.fail(c.inParentTerms(err))
	}
	c.failMu.Lock()
	defer c.failMu.Unlock()
	if c.err != nil {
		return false
	}
	c.err = err
	close(c.failed)
	return true
}

// begin starts a collective: it fails fast on a closed or failed
// communicator, and numbers the call.
func (c *comm) begin(ctx context.Context, h header) (*op, error) {
	if c.closed.Load() {
		return nil, ErrClosed
	}
	select {
	case <-c.failed:
		return nil, c.failure()
	default:
	}
	c.seq++
	h.kind, h.comm, h.seq = kindData, c.id, c.seq
	o := &c.coll
	o.reset(c, ctx, h)
	c.progress.Store(packProgress(c.seq, h.coll, true))
	if c.shared() {
		c.shm.publish(c.rank, &h)
	}
	if c.hier != nil && c.hier.host.shared() {
		// The host's ranks check each other's calls there, whatever
		// the algorithm (hierarchy.go).
		c.hier.host.shm.publish(c.hier.host.rank, &h)
	}
	// A member that is gone does not fail the call here: what it sent
	// before it exited may be all the call needs (a broadcast root that
	// returned and exited, say). Receiving from it once its frames are
	// used up, or sending to it, fails at once instead.
	return o, nil
}

// goneMember returns a member that can no longer take part, and why, or
// an error of nil when every member is there.
func (c *comm) goneMember() (int, error) {
	for peer, w := range c.world {
		if peer == c.rank {
			continue
		}
		if err := c.t.peerGone(w); err != nil {
			return peer, err
		}
	}
	return -1, nil
}

// end finishes a collective begun by begin.
func (c *comm) end(o *op, err error) error {
	c.progress.Store(packProgress(o.hdr.seq, o.hdr.coll, false))
	c.prev = o.hdr
	return o.finish(err)
}

// tellOthers sends an abort note describing err to every other member,
// so that their current or next call fails with it. It returns once the
// notes are written, or after noteWait: the caller may exit right after
// its call fails, and the notes must not die with it.
func (c *comm) tellOthers(err error, label string) {
	payload, jerr := json.Marshal(noteFor(err, c.rank, label))
	if jerr != nil {
		return
	}
	h := header{kind: kindAbort, comm: c.id, length: uint32(len(payload))}
	t := c.t
	var sent sync.WaitGroup
	for peer, dst := range c.world {
		if peer == c.rank {
			continue
		}
		t.mu.Lock()
		gone := t.peers[dst].outErr != nil
		t.mu.Unlock()
		if !gone {
			sent.Add(1)
			t.spawn(func() {
				defer sent.Done()
				t.sendControl(dst, &h, payload)
			})
		}
	}
	done := make(chan struct{})
	go func() {
		sent.Wait()
		close(done)
	}()
	timer := time.NewTimer(noteWait)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
	}
}

// sendControl sends one control frame to dst, dialling if need be, giving
// up after abortTimeout or when the transport closes.
func (t *transport) sendControl(dst int, h *header, payload []byte) {
	ctx, cancel := context.WithTimeout(t.life, abortTimeout)
	defer cancel()
	conns, err := t.outgoing(ctx, dst)
	if err != nil {
		return
	}
	oc := conns[0] // control frames take lane 0
	r := &sendReq{payload: payload, done: make(chan struct{}, 1)}
	h.encode(&r.hdr)
	oc.enqueue(r, false)
	select {
	case <-r.done:
	case <-ctx.Done():
	}
}

// control handles a non-data frame from src.
func (t *transport) control(src int, h *header, payload []byte) {
	switch h.kind {
	case kindAbort:
		var note abortNote
		if err := json.Unmarshal(payload, &note); err != nil {
			t.log.Warn().Int("peer", src).Err(err).Msg("bad abort note")
			return
		}
		m := t.match
		m.mu.Lock()
		c := m.comms[h.comm]
		if c == nil {
			if !m.retired[h.comm] {
				m.orphans[h.comm] = &note
			}
			m.mu.Unlock()
			return
		}
		m.mu.Unlock()
		err := note.errorFor(c.rank)
		if c.fail(err) {
			c.log.Debug().Int("peer", src).Err(err).Msg("aborted by peer")
		}
	case kindQuery, kindStatus:
		t.diagnosisFrame(src, h, payload)
	}
}

// abortNote is an abort frame's payload: why the reporter's op failed.
type abortNote struct {
	Reporter int    `json:"reporter"` // comm rank
	Op       string `json:"op"`
	Kind     string `json:"kind"` // "mismatch", "peer", "closed", "error"
	Rank     int    `json:"rank"` // the peer a "peer" note names
	Cause    string `json:"cause"`
	// A mismatch: the two ranks and their frames' headers.
	RankA   int    `json:"rank_a,omitempty"`
	RankB   int    `json:"rank_b,omitempty"`
	HeaderA []byte `json:"header_a,omitempty"`
	HeaderB []byte `json:"header_b,omitempty"`
	Detail  string `json:"detail,omitempty"`
}

func noteFor(err error, reporter int, label string) *abortNote {
	n := &abortNote{Reporter: reporter, Op: label, Kind: "error", Cause: err.Error()}
	var m *MismatchError
	var p *PeerError
	switch {
	case errors.As(err, &m):
		var a, b [headerSize]byte
		m.hdrA.encode(&a)
		m.hdrB.encode(&b)
		n.Kind, n.RankA, n.RankB, n.HeaderA, n.HeaderB, n.Detail = "mismatch", m.RankA, m.RankB, a[:], b[:], m.detail
	case errors.As(err, &p):
		n.Kind, n.Rank, n.Cause = "peer", p.Rank, p.Err.Error()
		if p.Op != "" {
			n.Op = p.Op
		}
	case errors.Is(err, ErrClosed):
		n.Kind = "closed"
	}
	return n
}

// errorFor is the error the note means to the rank viewer.
func (n *abortNote) errorFor(viewer int) error {
	switch n.Kind {
	case "mismatch":
		e := &MismatchError{Viewer: viewer, RankA: n.RankA, RankB: n.RankB, detail: n.Detail}
		if len(n.HeaderA) == headerSize && len(n.HeaderB) == headerSize &&
			e.hdrA.decode(n.HeaderA) == nil && e.hdrB.decode(n.HeaderB) == nil {
			e.fill()
			return e
		}
	case "peer":
		return &PeerError{Rank: n.Rank, Op: n.Op, Err: &remoteError{reporter: n.Reporter, msg: n.Cause}}
	case "closed":
		return &PeerError{Rank: n.Reporter, Op: n.Op, Err: errors.New("closed its communicator during the call")}
	}
	return &PeerError{Rank: n.Reporter, Op: n.Op, Err: &remoteError{reporter: n.Reporter, msg: n.Cause}}
}

// Split creates the communicator of ranks without any store traffic: its
// id hashes this communicator's id, id and ranks, and a barrier whose
// frames carry that hash checks that every rank asked for the same one.
func (c *comm) Split(ctx context.Context, ranks []int, id string) (Comm, error) {
	if len(ranks) == 0 {
		return nil, errors.New("collective: split of no ranks")
	}
	seen := make(map[int]bool, len(ranks))
	for _, r := range ranks {
		if r < 0 || r >= c.size() || seen[r] {
			return nil, fmt.Errorf("collective: split ranks %v: bad or repeated rank %d", ranks, r)
		}
		seen[r] = true
	}
	key := splitID(c.id, id, ranks)
	if err := c.barrier(ctx, collSplit, key); err != nil {
		return nil, err
	}
	me := slices.Index(ranks, c.rank)
	if me < 0 {
		return nil, nil
	}
	world := make([]int, len(ranks))
	for i, r := range ranks {
		world[i] = c.world[r]
	}
	child := newComm(c.t, key, me, world)
	if err := c.t.register(child); err != nil {
		return nil, err
	}
	return child, nil
}

// splitID hashes a split's parent, id and ranks into the child's id.
func splitID(parent uint64, id string, ranks []int) uint64 {
	h := fnv.New64a()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], parent)
	h.Write(b[:])
	h.Write([]byte(id))
	for _, r := range ranks {
		binary.LittleEndian.PutUint64(b[:], uint64(r))
		h.Write(b[:])
	}
	if v := h.Sum64(); v != worldID {
		return v
	}
	return worldID + 1
}

// Close fails the calls pending on c with ErrClosed and forgets its
// mailboxes; closing the world also closes the transport, its
// connections and goroutines, and so every split. Idempotent.
func (c *comm) Close() error {
	if !c.closed.CompareAndSwap(false, true) {
		return nil
	}
	c.fail(ErrClosed)
	t := c.t
	t.match.mu.Lock()
	delete(t.match.comms, c.id)
	t.match.retire(c.id)
	t.match.mu.Unlock()
	if c.isWorld {
		t.close()
	}
	return nil
}
