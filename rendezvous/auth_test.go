package rendezvous

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

func mustAuth(t testing.TB, secret string) *Auth {
	t.Helper()
	a, err := NewAuth([]byte(secret))
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// startAuthServer serves a new Server that requires auth's secret on
// 127.0.0.1:0 until the test ends.
func startAuthServer(t testing.TB, auth *Auth) (*Server, string, *logBuffer) {
	t.Helper()
	logs := &logBuffer{}
	log := zerolog.New(logs).Level(zerolog.DebugLevel)
	srv := NewServer(ServerOptions{Logger: log})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(auth.Listener(l, AuthListenerOptions{Logger: log}))
	t.Cleanup(func() { srv.Close() })
	return srv, l.Addr().String(), logs
}

func numKeys(t testing.TB, srv *Server) int64 {
	t.Helper()
	n, err := srv.Store().NumKeys(ctxTimeout(t, testTimeout))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

const (
	testSecret  = "0123456789abcdef-the-job"
	otherSecret = "0123456789abcdef-another"
)

func TestNewAuthWantsALongSecret(t *testing.T) {
	if _, err := NewAuth([]byte("short")); err == nil || !strings.Contains(err.Error(), "too short") {
		t.Fatalf("NewAuth(short) = %v, want a too-short error", err)
	}
	if s := NewSecret(); len(s) != 64 || s == NewSecret() {
		t.Fatalf("NewSecret() = %q: want 64 fresh hex digits", s)
	}
}

func TestAuthAgentWithTheSecretUsesTheStore(t *testing.T) {
	srv, addr, _ := startAuthServer(t, mustAuth(t, testSecret))
	c := dialClient(t, addr, ClientOptions{Auth: mustAuth(t, testSecret)})
	ctx := ctxTimeout(t, testTimeout)
	if err := c.Set(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if v, err := c.Get(ctx, "k"); err != nil || string(v) != "v" {
		t.Fatalf("Get = %q, %v", v, err)
	}
	if c.Dialect() != DialectV2 {
		t.Fatalf("dialect %v, want torch-2", c.Dialect())
	}
	if n := numKeys(t, srv); n != 1 {
		t.Fatalf("%d keys, want 1", n)
	}
}

// A client that cannot prove the secret is refused at once (no retry
// until its timeout), writes nothing, and the store says whom it refused.
func TestAuthStoreRefusesClientsWithoutTheSecret(t *testing.T) {
	srv, addr, logs := startAuthServer(t, mustAuth(t, testSecret))
	for _, tc := range []struct {
		name string
		auth *Auth
		want error
		log  string
	}{
		{"wrong secret", mustAuth(t, otherSecret), ErrStoreUnproven, "hung up on the store's proof"},
		{"no secret", nil, ErrSecretRequired, "refused a connection that did not authenticate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c, err := Dial(ctx, addr, ClientOptions{Auth: tc.auth, Timeout: 30 * time.Second})
			if err == nil {
				c.Set(ctx, "stolen", []byte("x"))
				c.Close()
				t.Fatal("Dial succeeded")
			}
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), addr) {
				t.Fatalf("Dial: %v, want %v naming %s", err, tc.want, addr)
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Fatalf("refused after %v: the client retried a refusal", d)
			}
			deadline := time.Now().Add(testTimeout)
			for !strings.Contains(logs.String(), tc.log) && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			if !strings.Contains(logs.String(), tc.log) {
				t.Fatalf("server log lacks %q:\n%s", tc.log, logs)
			}
		})
	}
	// A torch client, or any, that just sends requests: answered the
	// banner, closed, and its SET never reaches the table.
	raw := dialRaw(t, addr)
	raw.send(cat(u8(0), u32(validateMagic)), setV2("/stolen", "x"))
	got, _ := io.ReadAll(raw.nc)
	if !bytes.Equal(got, append([]byte("GORUNAU1"), authRequired)) {
		t.Fatalf("raw client got %q, want the banner and authRequired", got)
	}
	if n := numKeys(t, srv); n != 0 {
		t.Fatalf("%d keys after refused clients, want 0", n)
	}
}

// recorder is a rogue "store" that accepts connections and keeps every
// byte it is sent; answer, if set, replies to each connection.
type recorder struct {
	addr   string
	mu     sync.Mutex
	got    [][]byte
	answer func(nc net.Conn)
}

func startRecorder(t testing.TB, answer func(nc net.Conn)) *recorder {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{addr: l.Addr().String(), answer: answer}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			nc, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer nc.Close()
				var buf bytes.Buffer
				rc := &recConn{Conn: nc, buf: &buf}
				if r.answer != nil {
					r.answer(rc)
				}
				_ = nc.SetReadDeadline(time.Now().Add(testTimeout))
				io.Copy(io.Discard, rc)
				r.mu.Lock()
				r.got = append(r.got, buf.Bytes())
				r.mu.Unlock()
			}()
		}
	}()
	return r
}

// recConn keeps what is read from it.
type recConn struct {
	net.Conn
	buf *bytes.Buffer
}

func (c *recConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.buf.Write(p[:n])
	return n, err
}

// received returns what every closed connection sent.
func (r *recorder) received() [][]byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]byte(nil), r.got...)
}

// A store that cannot prove the secret gets nothing but hellos: no
// request, no proof of the agent's.
func TestAuthAgentRefusesRogueStores(t *testing.T) {
	agent := mustAuth(t, testSecret)
	for _, tc := range []struct {
		name      string
		answer    func(nc net.Conn)
		permanent bool
	}{
		{"silent listener", nil, false},
		{"closes at once", func(nc net.Conn) { nc.Close() }, false},
		{"echoes", func(nc net.Conn) {
			b := make([]byte, len(authBanner)+authNonceLen)
			io.ReadFull(nc, b)
			nc.Write(append(b, make([]byte, authMACLen)...))
		}, true},
		{"speaks http", func(nc net.Conn) { nc.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n")) }, true},
		{"proves another secret", func(nc net.Conn) {
			other := mustAuth(t, otherSecret)
			hello := make([]byte, len(authBanner)+authNonceLen)
			io.ReadFull(nc, hello)
			sn := bytes.Repeat([]byte{7}, authNonceLen)
			nc.Write(cat(authBanner, sn, other.mac(storeLabel, hello[len(authBanner):], sn)))
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rogue := startRecorder(t, tc.answer)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			c, err := Dial(ctx, rogue.addr, ClientOptions{Auth: agent, Timeout: 2 * time.Second})
			if err == nil {
				c.Close()
				t.Fatal("joined a rogue store")
			}
			if permanentAuthError(err) != tc.permanent || tc.permanent && !errors.Is(err, ErrStoreUnproven) {
				t.Fatalf("Dial: %v (permanent %v, want %v)", err, permanentAuthError(err), tc.permanent)
			}
			if !strings.Contains(err.Error(), rogue.addr) {
				t.Fatalf("Dial: %v does not name the endpoint %s", err, rogue.addr)
			}
			awaitHellosOnly(t, rogue)
		})
	}
}

// awaitHellosOnly checks that the rogue got at least one connection and,
// on each, the agent's hello (or, if it hung up first, part of one) and
// nothing more.
func awaitHellosOnly(t *testing.T, rogue *recorder) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for len(rogue.received()) == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	got := rogue.received()
	if len(got) == 0 {
		t.Fatal("the rogue saw no connection")
	}
	for _, b := range got {
		if len(b) > len(authBanner)+authNonceLen || !bytes.HasPrefix(b, authBanner[:min(len(b), len(authBanner))]) {
			t.Fatalf("the rogue got %d bytes %q, want only a hello", len(b), b)
		}
	}
}

// Our own server without the secret: a store another user started. The
// agent never writes a key to it.
func TestAuthAgentRefusesOurServerWithoutTheSecret(t *testing.T) {
	srv, addr, _ := startServer(t, ServerOptions{})
	ctx := ctxTimeout(t, 2*time.Second)
	_, err := Dial(ctx, addr, ClientOptions{Auth: mustAuth(t, testSecret)})
	if !errors.Is(err, ErrStoreUnproven) || !strings.Contains(err.Error(), addr) {
		t.Fatalf("Dial: %v, want ErrStoreUnproven naming %s", err, addr)
	}
	if n := numKeys(t, srv); n != 0 {
		t.Fatalf("the rogue store holds %d keys", n)
	}
}

// relay is a TCP proxy from a local port to target that records what the
// client sent and what the server answered, connection by connection.
type relay struct {
	addr     string
	mu       sync.Mutex
	sent     [][]byte
	answered [][]byte
}

func startRelay(t *testing.T, target string) *relay {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	r := &relay{addr: l.Addr().String()}
	go func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			var sent, answered bytes.Buffer
			var wg sync.WaitGroup
			wg.Go(func() { io.Copy(io.MultiWriter(out, &sent), in); out.(*net.TCPConn).CloseWrite() })
			wg.Go(func() { io.Copy(io.MultiWriter(in, &answered), out); in.(*net.TCPConn).CloseWrite() })
			go func() {
				wg.Wait()
				in.Close()
				out.Close()
				r.mu.Lock()
				r.sent = append(r.sent, sent.Bytes())
				r.answered = append(r.answered, answered.Bytes())
				r.mu.Unlock()
			}()
		}
	}()
	return r
}

// A recorded exchange does not pass again: the agent's proof covers the
// store's fresh nonce, the store's the agent's.
func TestAuthProofsDoNotReplay(t *testing.T) {
	auth := mustAuth(t, testSecret)
	srv, addr, _ := startAuthServer(t, auth)
	rl := startRelay(t, addr)
	c := dialClient(t, rl.addr, ClientOptions{Auth: auth})
	c.Close()
	var sent, answered []byte
	deadline := time.Now().Add(testTimeout)
	for sent == nil && time.Now().Before(deadline) {
		rl.mu.Lock()
		if len(rl.sent) > 0 {
			sent, answered = rl.sent[0], rl.answered[0]
		}
		rl.mu.Unlock()
		time.Sleep(10 * time.Millisecond)
	}
	helloLen := len(authBanner) + authNonceLen
	if len(sent) < helloLen+authMACLen || len(answered) < helloLen+authMACLen+1 {
		t.Fatalf("recorded %d bytes sent, %d answered: no handshake", len(sent), len(answered))
	}

	// The agent's hello and proof, replayed to the store.
	raw := dialRaw(t, addr)
	raw.send(sent[:helloLen+authMACLen], setV2("/replayed", "x"))
	got, _ := io.ReadAll(raw.nc)
	if len(got) != helloLen+authMACLen+1 || got[len(got)-1] != authRefused {
		t.Fatalf("replayed agent proof got %q, want a refusal", got)
	}
	if n := numKeys(t, srv); n != 0 {
		t.Fatalf("%d keys after a replay", n)
	}

	// The store's answer, replayed to an agent.
	replayer := startRecorder(t, func(nc net.Conn) {
		io.ReadFull(nc, make([]byte, helloLen))
		nc.Write(answered[:helloLen+authMACLen])
	})
	_, err := Dial(ctxTimeout(t, testTimeout), replayer.addr, ClientOptions{Auth: auth})
	if !errors.Is(err, ErrStoreUnproven) {
		t.Fatalf("Dial to a replaying store: %v, want ErrStoreUnproven", err)
	}
	awaitHellosOnly(t, replayer)
}

// Shutdown is not held up by a connection stuck in its handshake.
func TestAuthHandshakeDoesNotBlockShutdown(t *testing.T) {
	logs := &logBuffer{}
	srv := NewServer(ServerOptions{Logger: zerolog.New(logs)})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(mustAuth(t, testSecret).Listener(l, AuthListenerOptions{}))
	raw := dialRaw(t, l.Addr().String())
	raw.send(authBanner[:3]) // a third of a hello
	deadline := time.Now().Add(testTimeout)
	for srv.Clients() == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}

func TestPeerAllowed(t *testing.T) {
	ip := net.ParseIP
	members := []net.IP{ip("10.0.0.2"), ip("fd00::3")}
	for _, tc := range []struct {
		remote, local string
		want          bool
	}{
		{"127.0.0.1", "127.0.0.1", true},
		{"127.0.0.5", "10.0.0.1", true},
		{"::1", "::1", true},
		{"10.0.0.1", "10.0.0.1", true}, // this machine, by its own address
		{"10.0.0.2", "10.0.0.1", true},
		{"::ffff:10.0.0.2", "10.0.0.1", true},
		{"fd00::3", "fd00::1", true},
		{"10.0.0.9", "10.0.0.1", false},
		{"192.168.1.2", "10.0.0.1", false},
		{"fd00::4", "fd00::1", false},
		{"", "10.0.0.1", false},
	} {
		if got := peerAllowed(ip(tc.remote), ip(tc.local), members); got != tc.want {
			t.Errorf("peerAllowed(%s on %s) = %v, want %v", tc.remote, tc.local, got, tc.want)
		}
	}
}

// fakeListener hands out in-memory connections that claim the addresses
// of their test case.
type fakeListener struct {
	conns chan net.Conn
	addr  net.Addr
}

func (l *fakeListener) Accept() (net.Conn, error) {
	c, ok := <-l.conns
	if !ok {
		return nil, net.ErrClosed
	}
	return c, nil
}
func (l *fakeListener) Close() error   { return nil }
func (l *fakeListener) Addr() net.Addr { return l.addr }

type addrConn struct {
	net.Conn
	remote, local net.Addr
	closed        chan struct{}
}

func (c *addrConn) RemoteAddr() net.Addr { return c.remote }
func (c *addrConn) LocalAddr() net.Addr  { return c.local }
func (c *addrConn) Close() error {
	select {
	case <-c.closed:
	default:
		close(c.closed)
	}
	return c.Conn.Close()
}

func TestPeerListenerClosesStrangers(t *testing.T) {
	local := &net.TCPAddr{IP: net.ParseIP("10.0.0.1"), Port: 5000}
	conn := func(remote string) *addrConn {
		a, _ := net.Pipe()
		return &addrConn{Conn: a, remote: &net.TCPAddr{IP: net.ParseIP(remote), Port: 40000}, local: local, closed: make(chan struct{})}
	}
	logs := &logBuffer{}
	fl := &fakeListener{conns: make(chan net.Conn, 4), addr: local}
	l := PeerListener(fl, PeerListenerOptions{Allowed: []net.IP{net.ParseIP("10.0.0.2")}, Logger: zerolog.New(logs)})
	stranger, stranger2, member := conn("10.0.0.66"), conn("10.0.0.66"), conn("10.0.0.2")
	fl.conns <- stranger
	fl.conns <- stranger2
	fl.conns <- member
	close(fl.conns)
	got, err := l.Accept()
	if err != nil || got != member {
		t.Fatalf("Accept = %v, %v; want the member's connection", got, err)
	}
	for _, c := range []*addrConn{stranger, stranger2} {
		select {
		case <-c.closed:
		default:
			t.Fatal("a stranger's connection was left open")
		}
	}
	if n := strings.Count(logs.String(), "from outside the round's nodes"); n != 1 {
		t.Fatalf("%d warnings for two refusals from one address, want 1:\n%s", n, logs)
	}
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after close: %v", err)
	}
}

// torch 1.13's own TCPStore on the endpoint: the agent refuses it, and
// its keys stay as they were.
func TestTorchStoreCannotPassForTheJobsStore(t *testing.T) {
	addr := startTorchServer(t)
	plain := dialClient(t, addr, ClientOptions{Dialect: Dialect113})
	before, err := plain.NumKeys(ctxTimeout(t, testTimeout))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxTimeout(t, 2*time.Second)
	if c, err := Dial(ctx, addr, ClientOptions{Auth: mustAuth(t, testSecret)}); !errors.Is(err, ErrStoreUnproven) || !strings.Contains(err.Error(), addr) {
		if c != nil {
			c.Close()
		}
		t.Fatalf("Dial to torch's store: %v, want ErrStoreUnproven naming %s", err, addr)
	}
	after, err := plain.NumKeys(ctxTimeout(t, testTimeout))
	if err != nil || after != before {
		t.Fatalf("torch's store holds %d keys (%v), had %d", after, err, before)
	}
}
