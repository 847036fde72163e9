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

	"github.com/gorun/gorun/rendezvous"
)

// The TCP transport. Each ordered pair of ranks has its own connection:
// rank i dials j the first time it sends to j, announces itself with a
// hello frame, and only writes; j only reads. So each direction is one
// FIFO stream, and no two ranks ever race to dial each other. Frames
// are routed into mailboxes (mailbox.go), payloads read straight into
// posted buffers. Every communicator split from the world shares these
// connections.
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
	// localKeyPrefix + rank is where it publishes "hostid\nunix-address",
	// or nothing after the newline when it has no Unix socket.
	localKeyPrefix = "collective/local/"

	// helloTimeout bounds how long an accepted connection may take to say
	// who it is; garbage and port scanners are dropped after it.
	helloTimeout = 10 * time.Second
	// readBufferSize buffers headers and small frames; the rest of a
	// payload of at least a quarter of it is read into its destination
	// directly.
	readBufferSize = 32 << 10
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
	spin       bool         // ops spin briefly for frames (op.poll)
	poller     *poller      // reads the incoming connections no op is reading
	parked     atomic.Int32 // ops parked until a frame comes (op.await)
	// moved counts the socket reads and writes that moved bytes: a
	// spinning op parks only once nothing has moved for a while.
	moved atomic.Uint64
	// goroutinePeers: some peer is a goroutine of this process (tests), so
	// a spinning op yields to goroutines rather than to threads (yield).
	goroutinePeers atomic.Bool

	mu       sync.Mutex
	closed   bool
	peers    []peer
	boxes    map[boxKey]*mailbox
	comms    map[uint64]*comm
	orphans  map[uint64]*abortNote // aborts for communicators not split yet
	retired  map[uint64]bool       // closed communicators
	queries  map[uint64]chan statusReply
	handshak map[net.Conn]bool // accepted, hello not read yet

	done    chan struct{}   // closed by close
	life    context.Context // cancelled by close
	endLife context.CancelFunc
	wg      sync.WaitGroup
	bufs    bufferPool
	reqs    reqPool
	// anyWanted counts the AnySource receives waiting (guarded by mu):
	// any peer's frame may be what one of them waits for.
	anyWanted int
}

// peer is the transport's view of one other rank. Fields other than dial
// are guarded by the transport's mutex (in is also read without it).
type peer struct {
	dial   sync.Mutex // serialises dialling it
	out    *outConn
	in     atomic.Pointer[inConn] // set under the mutex; read without it by spinning ops and the poller
	inErr  error                  // why the incoming connection ended: nothing more will come
	outErr error                  // why the outgoing one did: nothing more can be sent

	// Guarded by the transport's mutex: the bytes of this peer's frames
	// read before anyone asked for them (held, in mailboxes or being
	// read), and the receives posted for its frames, still waiting
	// (wanted). inConn.begin stops reading ahead on them (heldLimit).
	held, wanted int
}

// newTransport listens and publishes this rank's addresses; hostID names
// its host (empty: TCP to every peer, no Unix socket).
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
		boxes:    make(map[boxKey]*mailbox),
		comms:    make(map[uint64]*comm),
		orphans:  make(map[uint64]*abortNote),
		retired:  make(map[uint64]bool),
		queries:  make(map[uint64]chan statusReply),
		handshak: make(map[net.Conn]bool),
		done:     make(chan struct{}),
		spin:     goruntime.GOMAXPROCS(0) > 1,
	}
	t.life, t.endLife = context.WithCancel(context.Background())
	if t.poller, err = newPoller(t); err != nil {
		ln.Close()
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
		[][]byte{[]byte(t.hostID + "\n" + local), []byte(addr)})
	if err != nil {
		t.close()
		return nil, fmt.Errorf("collective: publish address: %w", err)
	}
	t.log.Debug().Str("addr", addr).Str("unix", local).Msg("listening")
	return t, nil
}

// accept serves incoming connections until the listener is closed,
// pausing 5 ms doubling to 1 s after errors other than that, as net/http
// does.
func (t *transport) accept(ln net.Listener) {
	defer t.wg.Done()
	var pause time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			select {
			case <-t.done:
				return
			default:
			}
			pause = min(max(2*pause, 5*time.Millisecond), time.Second)
			t.log.Warn().Err(err).Dur("retry_in", pause).Msg("accept failed")
			select {
			case <-time.After(pause):
			case <-t.done:
				return
			}
			continue
		}
		pause = 0
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			c.Close()
			return
		}
		t.handshak[c] = true
		t.wg.Add(1)
		t.mu.Unlock()
		go t.serve(c)
	}
}

// serve reads the hello of an accepted connection, then its frames until
// it ends.
func (t *transport) serve(c net.Conn) {
	defer t.wg.Done()
	defer c.Close()
	src, err := t.handshake(c)
	var ic *inConn
	if err == nil {
		ic, err = newInConn(t, src, c)
	}
	t.mu.Lock()
	delete(t.handshak, c)
	if err == nil {
		switch p := &t.peers[src]; {
		case t.closed:
			err = ErrClosed
		case p.in.Load() != nil || p.inErr != nil:
			err = fmt.Errorf("collective: second connection from rank %d", src)
		default:
			p.in.Store(ic)
		}
	}
	t.mu.Unlock()
	if err == nil {
		if err = t.poller.add(ic); err != nil {
			ic.mu.Lock()
			ic.retire(err)
			return
		}
	}
	if err != nil {
		t.log.Warn().Err(err).Stringer("remote", c.RemoteAddr()).Msg("rejected connection")
	}
}

// handshake reads the hello, and nothing after it: the frames that follow
// are the inConn's to read.
func (t *transport) handshake(c net.Conn) (int, error) {
	tune(c)
	c.SetReadDeadline(time.Now().Add(helloTimeout))
	var b [headerSize]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return 0, fmt.Errorf("collective: read hello: %w", err)
	}
	var h header
	if err := h.decode(b[:]); err != nil {
		return 0, err
	}
	src := int(h.root)
	if h.kind != kindHello || src < 0 || src >= t.size || src == t.rank || h.count != uint64(t.size) {
		return 0, fmt.Errorf("collective: bad hello (kind %d, rank %d, world size %d)", h.kind, src, h.count)
	}
	c.SetReadDeadline(time.Time{})
	if h.seq == uint64(os.Getpid()) {
		t.goroutinePeers.Store(true)
	}
	return src, nil
}

// lostIncoming records that src's connection to us ended: receives from
// src that nothing can fill any more fail now, and so will later ones.
func (t *transport) lostIncoming(src int, err error) {
	t.mu.Lock()
	closing := t.closed
	p := &t.peers[src]
	p.in.Store(nil)
	switch {
	case errors.Is(err, io.EOF):
		err = errors.New("connection closed (the process exited or closed its communicator)")
	case errors.Is(err, io.ErrUnexpectedEOF):
		err = errors.New("connection closed in the middle of a frame (the process died)")
	}
	if p.inErr == nil {
		p.inErr = err
	}
	t.failPostedLocked(src, p.inErr)
	t.mu.Unlock()
	if !closing {
		t.log.Debug().Int("peer", src).Err(err).Msg("incoming connection ended")
	}
}

// dropIncoming cuts src's connection to us, used when a frame is stuck
// half-read into a buffer whose op gave up.
func (t *transport) dropIncoming(src int) {
	if ic := t.peers[src].in.Load(); ic != nil {
		ic.cut()
	}
}

// outgoing returns the connection to dst, dialling it on first use.
func (t *transport) outgoing(ctx context.Context, dst int) (*outConn, error) {
	p := &t.peers[dst]
	if o, err := t.outState(p); o != nil || err != nil {
		return o, err
	}
	p.dial.Lock()
	defer p.dial.Unlock()
	if o, err := t.outState(p); o != nil || err != nil {
		return o, err
	}
	c, err := t.dial(ctx, dst)
	if err != nil {
		if ctx.Err() == nil {
			t.mu.Lock()
			if p.outErr == nil {
				p.outErr = err
			}
			t.mu.Unlock()
		}
		return nil, err
	}
	o, err := newOutConn(t, dst, c)
	if err != nil {
		c.Close()
		return nil, err
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		c.Close()
		return nil, ErrClosed
	}
	p.out = o
	t.wg.Add(2)
	t.mu.Unlock()
	go o.write()
	go o.watch()
	return o, nil
}

func (t *transport) outState(p *peer) (*outConn, error) {
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

// dial connects to dst, by its Unix socket when it is on this host, else
// by TCP, and says hello.
func (t *transport) dial(ctx context.Context, dst int) (net.Conn, error) {
	c, err := t.dialLocal(ctx, dst)
	if c == nil && err == nil {
		c, err = t.dialTCP(ctx, dst)
	}
	if err != nil {
		return nil, err
	}
	tune(c)
	var b [headerSize]byte
	hello := header{kind: kindHello, root: int32(t.rank), count: uint64(t.size), seq: uint64(os.Getpid())}
	hello.encode(&b)
	if _, err := c.Write(b[:]); err != nil {
		c.Close()
		return nil, err
	}
	t.log.Debug().Int("peer", dst).Stringer("addr", c.RemoteAddr()).Msg("connected")
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
	id, addr, _ := splitLocal(v)
	if id != t.hostID || addr == "" {
		return nil, nil
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", addr)
	if err != nil {
		// Another network namespace, say: TCP still works.
		t.log.Debug().Int("peer", dst).Err(err).Msg("unix socket unreachable; using tcp")
		return nil, nil
	}
	return c, nil
}

// splitLocal parses a local key's value: "hostid\nunix-address".
func splitLocal(v []byte) (hostID, addr string, ok bool) {
	return strings.Cut(string(v), "\n")
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
	o := p.out
	t.mu.Unlock()
	if o != nil {
		o.fail(err)
	}
	if !closing {
		t.log.Debug().Int("peer", dst).Err(err).Msg("outgoing connection ended")
	}
}

// incoming returns src's connection to us, or nil (AnySource, not
// connected yet, or gone).
func (t *transport) incoming(src int) *inConn {
	if src < 0 {
		return nil
	}
	return t.peers[src].in.Load()
}

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
	t.mu.Lock()
	defer t.mu.Unlock()
	p := &t.peers[dst]
	if p.inErr != nil {
		return p.inErr
	}
	return p.outErr
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
		if o := t.peers[i].out; o != nil {
			outs = append(outs, o)
		}
	}
	for c := range t.handshak {
		conns = append(conns, c)
	}
	comms := make([]*comm, 0, len(t.comms))
	for _, c := range t.comms {
		comms = append(comms, c)
	}
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

// hostIDs reads every rank's host identity from the store ("" for a rank
// that uses TCP only).
func (t *transport) hostIDs(ctx context.Context) ([]string, error) {
	keys := make([]string, t.size)
	for i := range keys {
		keys[i] = localKeyPrefix + strconv.Itoa(i)
	}
	vals, err := t.store.MultiGet(ctx, keys)
	if err != nil {
		return nil, fmt.Errorf("collective: look up hosts: %w", err)
	}
	ids := make([]string, t.size)
	for i, v := range vals {
		ids[i], _, _ = splitLocal(v)
	}
	return ids, nil
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
