package collective

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/internal/acceptloop"
	"github.com/gorun/gorun/rendezvous"
)

// The TCP transport. Each ordered pair of ranks has its own connections:
// rank i dials j the first time it sends to j, announces itself with a
// hello frame, and only writes; j only reads. So each direction is a set
// of FIFO streams, and no two ranks ever race to dial each other. Frames
// are routed into mailboxes (mailbox.go), payloads read straight into
// posted buffers. Every communicator split from the world shares these
// connections.
//
// Who owns what: the transport's mutex guards the connections (which
// are open, why the outgoing ones ended); the matcher (matching.go)
// owns, under a mutex of its own, where frames go: mailboxes, posted
// receives, how far each peer may be read ahead, which lanes ended, and
// the communicators that abort notes and queries go to. Each incoming
// connection's socket and parser belong to whoever holds its read token
// (inConn.turn: a spinning op or the poller), each outgoing one's queue
// to whoever holds its write token (outConn.w: the sender, a spinning op
// or the writer goroutine).
//
// Between hosts, and between all ranks when TCP is forced, a pair has
// several streams each way (lanes; GORUN_TCP_STREAMS, as many as the
// fewer of the two ends asked for). A data frame's lane follows from its
// offset (transport.lane), so successive segments of a large message
// travel side by side and each lane stays a FIFO stream that both ends
// agree on. One loopback stream moves a message slower than several do,
// the kernel copying into one socket while it copies out of another: on
// 2 cores, two ranks' 1 MiB all_reduce took 529 us on one stream, 439 on
// four; four ranks' 2.17 ms and 1.49 (defaultSegment has the frames).
//
// Like MPI's progress engine, an op moves its own bytes: while it waits it
// reads its peer's socket (inconn.go) and writes its queued frames
// (outconn.go) without blocking, so one thread per rank keeps both
// directions going and no frame waits for another thread to be woken.
// Only before an op blocks do its frames pass to a writer goroutine per
// outgoing connection and the reading to the transport's poller
// (poller.go), which also reads whatever comes while no op waits.
//
// Ranks on one host take a shortcut: each also listens on an abstract
// Unix socket (Linux), and a peer on the same host (same boot id and host
// name) dials that instead of the TCP port. Loopback TCP moves 3-4 GB/s on
// a small machine, a Unix stream twice that; the frames are the same. A
// peer in another network namespace cannot reach the socket, and the dial
// falls back to TCP.

const (
	// addrKeyPrefix + rank is where a rank publishes "host:port".
	addrKeyPrefix = "collective/addr/"
	// localKeyPrefix + rank is where it publishes
	// "hostid\nunix-address\nstreams", the address empty when it has no
	// Unix socket.
	localKeyPrefix = "collective/local/"

	// defaultStreams is how many TCP streams each way a rank asks for of
	// each peer on another host when it names no number, alone on its
	// host (streamsAsked); maxStreams the most it may ask for.
	defaultStreams = 4
	maxStreams     = 16

	// helloTimeout bounds how long an accepted connection may take to say
	// who it is; garbage and port scanners are dropped after it.
	helloTimeout = 10 * time.Second
	// readBufferSize buffers headers and small frames; the rest of a
	// payload of at least a quarter of it is read into its destination
	// directly.
	readBufferSize = 32 << 10
	// laneBufferSize is the read buffer of the other lanes, which carry
	// only the later segments of large messages (transport.lane): their
	// headers, the rest read into place. A rank talking to a thousand
	// peers on four lanes holds 128 MiB of buffers at 32 KiB each, 44 MiB
	// this way.
	laneBufferSize = 4 << 10
	// socketBufferSize is asked of the kernel for both directions of a
	// Unix socket, so a pipelined segment or two fits in flight.
	socketBufferSize = 4 << 20
	// awaitSpin is how long an op spins for a frame it cannot read
	// itself before it parks (op.poll).
	awaitSpin = 50 * time.Microsecond
	// awaitYieldSpin is how long an op reading its peer's socket, or
	// writing its frames, spins, yielding the core between looks, before
	// it parks. With more ranks than cores, a peer can be off its core
	// for a time slice or two while nothing moves: parking after 2 ms
	// made a TCP all_reduce of 4 ranks on 2 cores 15-25% slower (4 MiB:
	// 13.9 against 10.6 ms; 16 MiB: 58.7 against 50.6), while 10, 50 and
	// 200 ms measured alike.
	awaitYieldSpin = 10 * time.Millisecond
	// remoteYieldSpin is awaitYieldSpin for a frame over remoteSmallMax
	// from a peer on another host: it comes at the link's pace, which
	// spinning cannot speed, and a spinning rank takes the core from the
	// work that feeds the link (its host peers' shared-memory phases,
	// the kernel's network stack). 4 hosts of 2 ranks on 2 cores, links
	// shaped to 500 Mbit/s, hierarchical all_reduce of 16 MiB, medians
	// of runs interleaved: 10 ms 735 ms, 1 ms 523, 200 us 516; the link
	// idle in 46% of 5 ms windows at 10 ms, 24% at 1 ms.
	remoteYieldSpin = time.Millisecond
	// remoteSmallMax is the largest frame from another host that an op
	// waits for as for a local one (config.spinLimit): see there.
	remoteSmallMax = inlineWriteMax
	// spinLooks is how many looks at its sockets a spinning op takes
	// between yields of the core (op.poll, op.flush). Over TCP on 2
	// cores, medians of 8 runs, 4 against 8: an 8-byte all_reduce of 4
	// ranks took 41.1 against 48.8 us, of 2 ranks 7.9 against 8.1; of 5
	// runs, 4 ranks at 1 MiB 1190 against 1332 us, at 16 MiB 31.7
	// against 33.5 ms.
	spinLooks = 4
	// inlineWriteMax is the largest payload a sender writes at once,
	// before it goes on with its op (outConn.enqueue); larger ones are
	// written while the op waits.
	inlineWriteMax = 64 << 10
	// cancelGrace is how long a failing op waits for a frame being read
	// into, or written from, the caller's buffer before cutting that
	// connection so the buffer is free when the call returns.
	cancelGrace = time.Second
	// abortTimeout bounds telling the other ranks that an op failed.
	abortTimeout = 5 * time.Second
	// noteWait is how long a failing call waits for its abort notes to be
	// written before it returns, and how long one waits for the note of a
	// peer whose connection broke (op.awaitCause).
	noteWait = time.Second
	// unconnectedWait is how long a call waits for a note on connections
	// other than the broken one's (op.awaitCause).
	unconnectedWait = 100 * time.Millisecond
)

type transport struct {
	rank, size int
	store      rendezvous.Store
	log        zerolog.Logger
	cfg        config
	ln         *net.TCPListener
	local      net.Listener // the Unix socket for same-host peers, or nil
	hostID     string
	shm        *shmWorld    // the shared memory of this host's ranks (shm.go), or nil; set before use
	poller     *poller      // reads the incoming connections no op is reading
	parked     atomic.Int32 // ops parked until a frame comes (op.await)
	// moved counts the socket reads and writes that moved bytes: a
	// spinning op parks only once nothing has moved for a while.
	moved atomic.Uint64
	// goroutinePeers: some peer is a goroutine of this process (tests), so
	// a spinning op yields to goroutines rather than to threads (yield).
	goroutinePeers atomic.Bool

	// mu guards the connections: which are open, and why the outgoing
	// ones ended. Where frames go is the matcher's (matching.go), under
	// its own mutex, taken after this one when both are.
	mu       sync.Mutex
	closed   bool
	peers    []peer
	handshak map[net.Conn]bool // accepted, hello not read yet
	match    *matcher

	done    chan struct{}   // closed by close
	life    context.Context // cancelled by close
	endLife context.CancelFunc
	wg      sync.WaitGroup
	bufs    bufferPool
	reqs    reqPool
}

// peer is the transport's view of one other rank's connections. Fields
// other than dial and in are guarded by the transport's mutex; why an
// incoming connection ended is the matcher's (peerMatch.ended).
type peer struct {
	dial   sync.Mutex // serialises dialling it
	lanes  int        // streams each way (transport.lane); set before the first op, never changed
	remote bool       // on another host (setLanes); set and kept as lanes is
	out    []*outConn // one per lane once dialled
	outErr error      // why an outgoing one ended: nothing more can be sent
	// in is the open incoming connection of each lane: published by
	// serve and withdrawn by lostIncoming under the transport's mutex,
	// looked up without it by spinning ops and the poller, which then
	// hold it only through its read token (inConn.turn).
	in [maxStreams]atomic.Pointer[inConn]
}

// newTransport listens and publishes this rank's addresses and the
// streams it asks for; hostID names its host (empty: TCP to every peer, no
// Unix socket). Each peer gets one lane until setLanes.
func newTransport(ctx context.Context, store rendezvous.Store, rank, size int, host, hostID string, cfg config, log zerolog.Logger) (*transport, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return nil, fmt.Errorf("collective: listen on %s: %w", host, err)
	}
	t := &transport{
		rank:     rank,
		size:     size,
		store:    store,
		log:      log,
		cfg:      cfg,
		ln:       ln.(*net.TCPListener),
		peers:    make([]peer, size),
		handshak: make(map[net.Conn]bool),
		done:     make(chan struct{}),
	}
	t.match = newMatcher(size, &t.bufs)
	for i := range t.peers {
		t.peers[i].lanes = 1
	}
	t.life, t.endLife = context.WithCancel(context.Background())
	if twoPs.hold() {
		log.Debug().Msg("GOMAXPROCS raised to 2 for the transport's poller, until the last transport closes")
	}
	if t.poller, err = newPoller(t); err != nil {
		ln.Close()
		twoPs.release()
		return nil, fmt.Errorf("collective: poller: %w", err)
	}
	t.wg.Add(1)
	go t.poller.run()
	local := ""
	if t.hostID = hostID; t.hostID != "" {
		if l, err := listenLocal(); err == nil {
			t.local, local = l, l.Addr().String()
		} else {
			log.Debug().Err(err).Msg("no unix socket; same-host peers use tcp")
		}
	}
	addr := net.JoinHostPort(host, strconv.Itoa(t.ln.Addr().(*net.TCPAddr).Port))
	t.wg.Add(1)
	go t.accept(t.ln)
	if t.local != nil {
		t.wg.Add(1)
		go t.accept(t.local)
	}
	// The local key first: a peer that finds the address finds both.
	err = store.MultiSet(ctx,
		[]string{localKeyPrefix + strconv.Itoa(rank), addrKeyPrefix + strconv.Itoa(rank)},
		[][]byte{[]byte(fmt.Sprintf("%s\n%s\n%d", t.hostID, local, cfg.streams)), []byte(addr)})
	if err != nil {
		t.close()
		return nil, fmt.Errorf("collective: publish address: %w", err)
	}
	t.log.Debug().Str("addr", addr).Str("unix", local).Msg("listening")
	return t, nil
}

// accept serves incoming connections until the transport closes
// (acceptloop, which rides out EMFILE and the like).
func (t *transport) accept(ln net.Listener) {
	defer t.wg.Done()
	acceptloop.Serve(ln, t.done, t.log, t.admit)
}

// admit starts serving an accepted connection, unless the transport has
// closed.
func (t *transport) admit(c net.Conn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		c.Close()
		return false
	}
	t.handshak[c] = true
	t.wg.Add(1)
	go t.serve(c)
	return true
}

// serve reads the hello of an accepted connection, then its frames until
// it ends.
func (t *transport) serve(c net.Conn) {
	defer t.wg.Done()
	defer c.Close()
	src, lane, err := t.handshake(c)
	var ic *inConn
	if err == nil {
		ic, err = newInConn(t, src, lane, c)
	}
	t.mu.Lock()
	delete(t.handshak, c)
	if err == nil {
		switch p := &t.peers[src]; {
		case t.closed:
			err = ErrClosed
		case p.in[lane].Load() != nil || t.laneEnded(src, lane) != nil:
			err = fmt.Errorf("collective: second connection from rank %d on lane %d", src, lane)
		default:
			p.in[lane].Store(ic)
		}
	}
	t.mu.Unlock()
	if err != nil && ic != nil {
		unix.Close(ic.fd) // c's duplicate: closing c left it open
	}
	if err == nil {
		if err = t.poller.add(ic); err != nil {
			ic.take().retire(err)
			return
		}
	}
	if err != nil {
		t.log.Warn().Err(err).Stringer("remote", c.RemoteAddr()).Msg("rejected connection")
	}
}

// handshake reads the hello, and nothing after it: the frames that follow
// are the inConn's to read. The hello names the sender and the lane.
func (t *transport) handshake(c net.Conn) (src, lane int, err error) {
	tune(c)
	c.SetReadDeadline(time.Now().Add(helloTimeout))
	var b [headerSize]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return 0, 0, fmt.Errorf("collective: read hello: %w", err)
	}
	var h header
	if err := h.decode(b[:]); err != nil {
		return 0, 0, err
	}
	src, lane = int(h.root), int(h.tag)
	if h.kind != kindHello || src < 0 || src >= t.size || src == t.rank || h.count != uint64(t.size) || lane < 0 || lane >= maxStreams {
		return 0, 0, fmt.Errorf("collective: bad hello (kind %d, rank %d, world size %d, lane %d)", h.kind, src, h.count, lane)
	}
	c.SetReadDeadline(time.Time{})
	if h.seq == uint64(os.Getpid()) {
		t.goroutinePeers.Store(true)
	}
	return src, lane, nil
}

// lostIncoming records that src's connection to us on lane ended:
// receives from src on that lane fail now, and so will later ones, and
// on its other lanes too unless it ended between frames (laneEnd).
func (t *transport) lostIncoming(src, lane int, err error) {
	t.mu.Lock()
	closing := t.closed
	t.peers[src].in[lane].Store(nil)
	t.match.mu.Lock()
	err = t.match.endLane(src, lane, err)
	t.match.mu.Unlock()
	t.mu.Unlock()
	if !closing {
		t.log.Debug().Int("peer", src).Err(err).Msg("incoming connection ended")
	}
}

// laneEnded reports why src's connection to us on lane ended, or nil.
func (t *transport) laneEnded(src, lane int) error {
	t.match.mu.Lock()
	defer t.match.mu.Unlock()
	return t.match.laneEnded(src, lane)
}

// dropIncoming cuts src's connection to us on lane, used when a frame is
// stuck half-read into a buffer whose op gave up.
func (t *transport) dropIncoming(src, lane int) {
	if ic := t.peers[src].in[lane].Load(); ic != nil {
		ic.cut()
	}
}

// outgoing returns the connections to dst, one per lane, dialling them
// on first use.
func (t *transport) outgoing(ctx context.Context, dst int) ([]*outConn, error) {
	p := &t.peers[dst]
	if o, err := t.outState(p); o != nil || err != nil {
		return o, err
	}
	p.dial.Lock()
	defer p.dial.Unlock()
	if o, err := t.outState(p); o != nil || err != nil {
		return o, err
	}
	conns := make([]*outConn, p.lanes)
	closeAll := func() {
		for _, o := range conns {
			if o != nil {
				o.conn.Close()
			}
		}
	}
	for lane := range conns {
		c, err := t.dial(ctx, dst, lane)
		if err == nil {
			if conns[lane], err = newOutConn(t, dst, c); err != nil {
				c.Close()
			}
		}
		if err != nil {
			closeAll()
			// A context that ended leaves the next call free to dial
			// again, unless lanes were connected: the peer saw them end.
			if ctx.Err() == nil || lane > 0 {
				t.mu.Lock()
				if p.outErr == nil {
					p.outErr = err
				}
				t.mu.Unlock()
			}
			return nil, err
		}
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		closeAll()
		return nil, ErrClosed
	}
	p.out = conns
	t.wg.Add(2 * len(conns))
	t.mu.Unlock()
	for _, o := range conns {
		go o.write()
		go o.watch()
	}
	return conns, nil
}

func (t *transport) outState(p *peer) ([]*outConn, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.closed:
		return nil, ErrClosed
	case p.outErr != nil:
		return nil, p.outErr
	}
	return p.out, nil
}

// dial connects to dst for lane, by its Unix socket when it is on this
// host, else by TCP, and says hello.
func (t *transport) dial(ctx context.Context, dst, lane int) (net.Conn, error) {
	c, err := t.dialLocal(ctx, dst)
	if c == nil && err == nil {
		c, err = t.dialTCP(ctx, dst)
	}
	if err != nil {
		return nil, err
	}
	tune(c)
	var b [headerSize]byte
	hello := header{kind: kindHello, root: int32(t.rank), count: uint64(t.size), seq: uint64(os.Getpid()), tag: int32(lane)}
	hello.encode(&b)
	if _, err := c.Write(b[:]); err != nil {
		c.Close()
		return nil, err
	}
	t.log.Debug().Int("peer", dst).Int("lane", lane).Stringer("addr", c.RemoteAddr()).Msg("connected")
	return c, nil
}

// dialLocal connects to dst's Unix socket when dst shares our host; it
// returns nil and no error when TCP should be used instead.
func (t *transport) dialLocal(ctx context.Context, dst int) (net.Conn, error) {
	if t.local == nil {
		return nil, nil
	}
	v, err := t.store.Get(ctx, localKeyPrefix+strconv.Itoa(dst))
	if err != nil {
		return nil, fmt.Errorf("look up address: %w", err)
	}
	info := parseLocal(v)
	if info.hostID != t.hostID || info.unix == "" {
		return nil, nil
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", info.unix)
	if err != nil {
		// Another network namespace, say: TCP still works.
		t.log.Debug().Int("peer", dst).Err(err).Msg("unix socket unreachable; using tcp")
		return nil, nil
	}
	return c, nil
}

// localInfo is what a rank publishes under its local key.
type localInfo struct {
	hostID  string // "" when it uses TCP only
	unix    string // its Unix socket's address, or ""
	streams int    // the TCP streams each way it asks for; 0: streamsAsked chooses
}

// parseLocal reads a local key's value: "hostid\nunix-address\nstreams".
func parseLocal(v []byte) localInfo {
	var info localInfo
	rest := string(v)
	info.hostID, rest, _ = strings.Cut(rest, "\n")
	info.unix, rest, _ = strings.Cut(rest, "\n")
	info.streams, _ = strconv.Atoi(rest)
	info.streams = min(max(info.streams, 0), maxStreams) // 0: streamsAsked chooses
	return info
}

func (t *transport) dialTCP(ctx context.Context, dst int) (net.Conn, error) {
	addr, err := t.store.Get(ctx, addrKeyPrefix+strconv.Itoa(dst))
	if err != nil {
		return nil, fmt.Errorf("look up address: %w", err)
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", string(addr))
}

// lostOutgoing records that our connection to dst ended: queued and later
// sends to dst fail.
func (t *transport) lostOutgoing(dst int, err error) {
	t.mu.Lock()
	closing := t.closed
	p := &t.peers[dst]
	if errors.Is(err, io.EOF) {
		err = errors.New("connection closed by the peer")
	} else {
		err = fmt.Errorf("connection lost: %w", err)
	}
	if p.outErr == nil {
		p.outErr = err
	}
	conns := p.out
	t.mu.Unlock()
	for _, o := range conns {
		o.fail(err)
	}
	if !closing {
		t.log.Debug().Int("peer", dst).Err(err).Msg("outgoing connection ended")
	}
}

// incoming returns src's connection to us on lane, or nil (AnySource,
// not connected yet, or gone).
func (t *transport) incoming(src, lane int) *inConn {
	if src < 0 {
		return nil
	}
	return t.peers[src].in[lane].Load()
}

// lane is the connection that carries a data frame with header h between
// this rank and peer: 0 for other frames and for peers with one lane,
// else the frame's stripe (a segment's worth of the logical buffer)
// modulo the lanes. Both ends compute it from the header they agree on,
// and a message's first frame, at offset 0, always takes lane 0, where
// an AnySource receive waits for it.
func (t *transport) lane(peer int, h *header) int {
	if peer < 0 || h.kind != kindData {
		return 0
	}
	n := t.peers[peer].lanes
	if n == 1 {
		return 0
	}
	return int(h.offset / uint64(t.cfg.segment) % uint64(n))
}

// setLanes sets the lanes to each peer from what every rank published:
// one to a peer on this host (a Unix socket, or shared memory), else the
// fewer streams of the two ends (streamsAsked); and which peers are known
// to run on another host (both ends named theirs).
func (t *transport) setLanes(peers []localInfo) {
	onHost := map[string]int{}
	for _, p := range peers {
		if p.hostID != "" {
			onHost[p.hostID]++
		}
	}
	asked := func(p localInfo) int { return streamsAsked(p, onHost[p.hostID], len(onHost)) }
	me := peers[t.rank]
	mine := asked(me)
	for i, p := range peers {
		t.peers[i].remote = remoteHost(me.hostID, p.hostID)
		if p.hostID != "" && p.hostID == me.hostID {
			continue
		}
		t.peers[i].lanes = min(mine, asked(p))
	}
}

// streamsAsked is the TCP streams each way a rank asks for of each peer
// on another host: what it published, or, where it named none,
// defaultStreams shared among the connections its host's link carries
// to the other hosts in the hierarchical collectives: one per rank of
// the host (hostRanks) and other host (hosts-1), at least one. A rank
// alone on its host (or of unknown host, with TCP forced) asks for
// defaultStreams: a flat algorithm keeps the kernel copying into one
// stream while it copies out of another (transport.lane).
//
// More flows than that overflow a shaped link's queue when every rank
// sends to every other host at once. On 4 emulated hosts of 2 ranks at
// 500 Mbit/s, 16 MiB: all_gather 52% of the link's bound over 4 streams
// per pair (1,559 packets dropped) and 85% over 1 (none), reduce_scatter
// 54% and 86%, all_reduce 82-87% and 90-91%. On 2 hosts of 2 ranks at
// 2 Gbit/s, 2 streams against 4: all_reduce 0.349 against 0.308 GB/s at
// 16 MiB, the others within a single run's noise.
func streamsAsked(p localInfo, hostRanks, hosts int) int {
	switch {
	case p.streams > 0:
		return p.streams
	case hostRanks < 2 || hosts < 2:
		return defaultStreams
	}
	return max(1, defaultStreams/(hostRanks*(hosts-1)))
}

// remoteHost says whether a peer that published host id peer runs on
// another host than ours, me: only when both are known.
func remoteHost(me, peer string) bool { return me != "" && peer != "" && me != peer }

// yield lets what a spinning op waits for run: another process's thread,
// or, when peers are goroutines of this process, another goroutine.
func (t *transport) yield() {
	if t.goroutinePeers.Load() {
		goruntime.Gosched()
	} else {
		yieldProcessor()
	}
}

// peerGone reports why dst can no longer take part, or nil.
func (t *transport) peerGone(dst int) error {
	t.match.mu.Lock()
	err := t.match.peerEnded(dst)
	t.match.mu.Unlock()
	if err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.peers[dst].outErr
}

// close shuts the listener and every connection and waits for the
// transport's goroutines. Idempotent.
func (t *transport) close() {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		t.wg.Wait()
		return
	}
	t.closed = true
	close(t.done)
	t.endLife()
	var conns []net.Conn
	var outs []*outConn
	for i := range t.peers {
		outs = append(outs, t.peers[i].out...)
	}
	for c := range t.handshak {
		conns = append(conns, c)
	}
	t.match.mu.Lock()
	t.match.closed = true
	comms := make([]*comm, 0, len(t.match.comms))
	for _, c := range t.match.comms {
		comms = append(comms, c)
	}
	t.match.mu.Unlock()
	t.mu.Unlock()

	t.poller.interrupt()
	t.ln.Close()
	if t.local != nil {
		t.local.Close()
	}
	for _, c := range conns {
		c.Close()
	}
	for _, o := range outs {
		o.fail(ErrClosed)
	}
	for _, c := range comms {
		c.fail(ErrClosed)
	}
	t.wg.Wait()
	if t.shm != nil {
		t.shm.close()
	}
	twoPs.release()
}

// rawConn is c's descriptor, for the system calls the runtime does not
// make for us.
func rawConn(c net.Conn) (syscall.RawConn, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil, fmt.Errorf("collective: %T has no file descriptor", c)
	}
	return sc.SyscallConn()
}

// tune sets what every connection wants: no Nagle delay (Go's default
// for TCP, restated), and for Unix sockets kernel buffers that hold a
// pipelined segment or two. TCP keeps the kernel's own sizing, which
// grows a busy connection's buffers past what we would ask (setting them
// turns that off): on loopback a 16 MiB all_reduce of 2 ranks took 16 ms
// with 4 MiB asked for, 13 ms left to the kernel.
func tune(c net.Conn) {
	switch c := c.(type) {
	case *net.TCPConn:
		c.SetNoDelay(true)
	case *net.UnixConn:
		c.SetReadBuffer(socketBufferSize)
		c.SetWriteBuffer(socketBufferSize)
	}
}

// peerInfo reads what every rank published under its local key.
func (t *transport) peerInfo(ctx context.Context) ([]localInfo, error) {
	keys := make([]string, t.size)
	for i := range keys {
		keys[i] = localKeyPrefix + strconv.Itoa(i)
	}
	vals, err := t.store.MultiGet(ctx, keys)
	if err != nil {
		return nil, fmt.Errorf("collective: look up hosts: %w", err)
	}
	infos := make([]localInfo, t.size)
	for i, v := range vals {
		infos[i] = parseLocal(v)
	}
	return infos, nil
}

// sameHost lists the ranks whose host is rank's, ascending; only rank
// when its host is unknown.
func sameHost(hosts []string, rank int) []int {
	if hosts[rank] == "" {
		return []int{rank}
	}
	var ranks []int
	for r, id := range hosts {
		if id == hosts[rank] {
			ranks = append(ranks, r)
		}
	}
	return ranks
}
