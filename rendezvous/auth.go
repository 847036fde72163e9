package rendezvous

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// The agents of one job and their rendezvous store authenticate each other
// by a secret the job shares, before the first TCPStore request. A client
// opens with a hello that no TCPStore client sends (its first byte, 'G',
// is no query type of either dialect), so torch's servers and ours
// without a secret close the connection or answer nonsense, and a gorun
// server tells its agents from anything else by that byte:
//
//	agent: hello magic (8) | agent nonce (32)
//	store: hello magic (8) | store nonce (32) | HMAC(secret, storeLabel | agent nonce | store nonce)
//	agent: HMAC(secret, agentLabel | agent nonce | store nonce)
//	store: status (1): authOK, or authRefused before it hangs up
//
// The store proves itself first, so an agent writes nothing, its own proof
// included, to a store that does not know the secret. Each side's proof
// covers the other side's fresh nonce, so no recorded proof passes again,
// and the two labels keep one side's proof from serving as the other's.
// A connection that opens with anything else is answered authBanner and
// authRequired, which our client reads as "this store wants a secret".
// Nothing is encrypted: the secret keeps other users' stores and clients
// out, not an attacker on the path.

// Errors of the authentication.
var (
	// ErrStoreUnproven: the server at the endpoint did not prove that it
	// knows this client's secret: another job's or user's store, torch's
	// own, or a gorun store whose secret is not this client's.
	ErrStoreUnproven = errors.New("rendezvous: the store did not prove that it knows this agent's secret")
	// ErrSecretRefused: the store proved it knows the secret, and then
	// refused this client's proof.
	ErrSecretRefused = errors.New("rendezvous: the store refused this agent: its secret is not the job's")
	// ErrSecretRequired: the store requires a secret, and this client
	// has none.
	ErrSecretRequired = errors.New("rendezvous: the store requires the job's secret, and this agent has none")
)

// answerError is the other side's answer, not a failure to reach it:
// asking again gets the same answer, so a client does not retry it.
type answerError struct{ err error }

func (e *answerError) Error() string { return e.err.Error() }
func (e *answerError) Unwrap() error { return e.err }

func answer(err error) error { return &answerError{err} }

// MinSecretLen is the shortest secret NewAuth accepts, in bytes.
const MinSecretLen = 16

const (
	authNonceLen = 32
	authMACLen   = sha256.Size
	// authTimeout bounds a handshake on either side: a peer that says
	// nothing is neither an agent nor a store.
	authTimeout = 10 * time.Second

	authOK       byte = 0
	authRefused  byte = 1
	authRequired byte = 2

	storeLabel = "gorun rendezvous store v1\x00"
	agentLabel = "gorun rendezvous agent v1\x00"
)

// authBanner opens every handshake message of both sides.
var authBanner = []byte("GORUNAU1")

// Auth holds a job's rendezvous secret. The zero value is not usable; a
// nil *Auth means no authentication, torch's behaviour.
type Auth struct {
	key []byte
}

// NewAuth returns the authentication for secret, which must hold at least
// MinSecretLen bytes.
func NewAuth(secret []byte) (*Auth, error) {
	if len(secret) < MinSecretLen {
		return nil, fmt.Errorf("rendezvous: a secret of %d bytes is too short: want at least %d", len(secret), MinSecretLen)
	}
	return &Auth{key: bytes.Clone(secret)}, nil
}

// NewSecret returns a fresh random secret, as text: 64 hex digits.
func NewSecret() string {
	b := make([]byte, 32)
	rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}

func (a *Auth) mac(label string, agentNonce, storeNonce []byte) []byte {
	m := hmac.New(sha256.New, a.key)
	m.Write([]byte(label))
	m.Write(agentNonce)
	m.Write(storeNonce)
	return m.Sum(nil)
}

// permanentAuthError reports whether err is the other side's answer.
func permanentAuthError(err error) bool {
	var a *answerError
	return errors.As(err, &a)
}

// authenticate runs the agent's side of the handshake on nc, within
// deadline (and authTimeout). An error that is not permanent (the
// connection failed) may be retried on a new connection.
func (a *Auth) authenticate(nc net.Conn, deadline time.Time) error {
	if d := time.Now().Add(authTimeout); deadline.IsZero() || d.Before(deadline) {
		deadline = d
	}
	_ = nc.SetDeadline(deadline)
	defer nc.SetDeadline(time.Time{})

	agentNonce := make([]byte, authNonceLen)
	rand.Read(agentNonce)
	if _, err := nc.Write(append(bytes.Clone(authBanner), agentNonce...)); err != nil {
		return fmt.Errorf("rendezvous: authenticate: %w", err)
	}
	reply := make([]byte, len(authBanner)+authNonceLen+authMACLen)
	// The banner first: a server that speaks something else is known by
	// its first bytes, without waiting for the rest.
	n, err := io.ReadFull(nc, reply[:len(authBanner)])
	switch {
	case n > 0 && !bytes.HasPrefix(authBanner, reply[:n]):
		return answer(fmt.Errorf("%w: it does not authenticate (it answered %q): not a gorun store with a secret", ErrStoreUnproven, reply[:n]))
	case err != nil && n == 0:
		// torch's servers, and ours without a secret, hang up on the
		// hello; so may a store short of connections: retried.
		return fmt.Errorf("%w: it closed the connection without a word (a store without a secret, or torch's?): %w", ErrStoreUnproven, err)
	case err != nil:
		return fmt.Errorf("rendezvous: authenticate: %w", err)
	}
	n, err = io.ReadFull(nc, reply[len(authBanner):])
	switch {
	case n > 0 && reply[len(authBanner)] == authRequired && err != nil:
		return answer(fmt.Errorf("%w: it took the hello for another protocol", ErrStoreUnproven))
	case err != nil:
		return fmt.Errorf("rendezvous: authenticate: %w", err)
	}
	storeNonce := reply[len(authBanner) : len(authBanner)+authNonceLen]
	proof := reply[len(authBanner)+authNonceLen:]
	if !hmac.Equal(proof, a.mac(storeLabel, agentNonce, storeNonce)) {
		return answer(fmt.Errorf("%w: it is a gorun store with another secret: another job's, or this agent's secret is not the job's", ErrStoreUnproven))
	}
	if _, err := nc.Write(a.mac(agentLabel, agentNonce, storeNonce)); err != nil {
		return fmt.Errorf("rendezvous: authenticate: %w", err)
	}
	var status [1]byte
	if _, err := io.ReadFull(nc, status[:]); err != nil {
		return fmt.Errorf("rendezvous: authenticate: %w", err)
	}
	switch status[0] {
	case authOK:
		return nil
	case authRefused:
		return answer(ErrSecretRefused)
	}
	return answer(fmt.Errorf("%w: status %d", ErrStoreUnproven, status[0]))
}

// isAuthBanner reports whether the 4 bytes a client read as a PING's echo
// are the start of a store's banner: the store wants a secret.
func isAuthBanner(echo uint32) bool {
	return echo == uint32(authBanner[0])|uint32(authBanner[1])<<8|uint32(authBanner[2])<<16|uint32(authBanner[3])<<24
}

// AuthListenerOptions configure Auth.Listener.
type AuthListenerOptions struct {
	// Logger receives the refusals, at warn, once a minute per address.
	Logger zerolog.Logger
}

// Listener wraps l so that each connection it accepts authenticates, as
// the store's side of the handshake, before its first request reaches the
// server; one that cannot is answered so and closed, without touching
// the store. The handshake runs on the connection's first read, in the
// server's goroutine for it, so that a slow peer never holds up Accept.
func (a *Auth) Listener(l net.Listener, opts AuthListenerOptions) net.Listener {
	return &authListener{Listener: l, auth: a, log: newRefusalLog(opts.Logger)}
}

type authListener struct {
	net.Listener
	auth *Auth
	log  *refusalLog
}

func (l *authListener) Accept() (net.Conn, error) {
	nc, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &authConn{Conn: nc, auth: l.auth, log: l.log}, nil
}

// authConn is a server's connection that authenticates on its first read.
type authConn struct {
	net.Conn
	auth *Auth
	log  *refusalLog

	once sync.Once
	err  error // the handshake's, sticky

	mu           sync.Mutex
	readDeadline time.Time // what the server last asked for
}

func (c *authConn) Read(p []byte) (int, error) {
	c.once.Do(func() { c.err = c.accept() })
	if c.err != nil {
		return 0, c.err
	}
	return c.Conn.Read(p)
}

// readableWaiter is a connection that can wait for bytes to read without
// a buffer, as waitReadable does, and without giving raw access to its
// socket (which would let a read bypass it).
type readableWaiter interface {
	waitReadable() error
	hasInput() bool
}

// waitReadable lets an idle connection wait without a buffer; the
// handshake still runs on its first Read.
func (c *authConn) waitReadable() error { return waitReadable(c.Conn) }

func (c *authConn) hasInput() bool { return hasInput(c.Conn) }

// SetReadDeadline and SetDeadline are remembered, so that a deadline the
// server set during the handshake (Shutdown's) holds after it.
func (c *authConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.readDeadline = t
	return c.Conn.SetReadDeadline(t)
}

func (c *authConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.readDeadline = t
	return c.Conn.SetDeadline(t)
}

// accept runs the store's side of the handshake.
func (c *authConn) accept() error {
	nc := c.Conn
	// Within authTimeout, or sooner if the server already asked: a
	// Shutdown that nudged this connection before its first read must not
	// be undone here (under mu, so that a nudge during it is not either).
	c.mu.Lock()
	deadline := time.Now().Add(authTimeout)
	_ = nc.SetWriteDeadline(deadline)
	if !c.readDeadline.IsZero() && c.readDeadline.Before(deadline) {
		deadline = c.readDeadline
	}
	_ = nc.SetReadDeadline(deadline)
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		_ = nc.SetWriteDeadline(time.Time{})
		_ = nc.SetReadDeadline(c.readDeadline)
	}()
	remote := nc.RemoteAddr()

	hello := make([]byte, len(authBanner)+authNonceLen)
	if _, err := io.ReadFull(nc, hello[:1]); err != nil {
		return err // hung up before a word: nothing to report
	}
	if hello[0] != authBanner[0] {
		_, _ = nc.Write(append(bytes.Clone(authBanner), authRequired))
		c.log.refuse(remote, "refused a connection that did not authenticate (a client without the job's secret)")
		hangUp(nc)
		return fmt.Errorf("rendezvous: %s: %w: %w", remote, errUnauthenticatedPeer, net.ErrClosed)
	}
	if _, err := io.ReadFull(nc, hello[1:]); err != nil || !bytes.Equal(hello[:len(authBanner)], authBanner) {
		c.log.refuse(remote, "refused a connection with a malformed authentication")
		return fmt.Errorf("rendezvous: %s: malformed authentication: %w: %w", remote, errUnauthenticatedPeer, net.ErrClosed)
	}
	agentNonce := hello[len(authBanner):]
	storeNonce := make([]byte, authNonceLen)
	rand.Read(storeNonce)
	msg := append(bytes.Clone(authBanner), storeNonce...)
	if _, err := nc.Write(append(msg, c.auth.mac(storeLabel, agentNonce, storeNonce)...)); err != nil {
		return err
	}
	proof := make([]byte, authMACLen)
	if _, err := io.ReadFull(nc, proof); err != nil {
		// An agent hangs up here when the store's proof is not of its
		// secret.
		c.log.refuse(remote, "a client hung up on the store's proof: its secret is not the job's, or it is no agent")
		return fmt.Errorf("rendezvous: %s: authentication cut short: %w: %w", remote, err, net.ErrClosed)
	}
	if !hmac.Equal(proof, c.auth.mac(agentLabel, agentNonce, storeNonce)) {
		_, _ = nc.Write([]byte{authRefused})
		c.log.refuse(remote, "refused an agent whose secret is not the job's")
		hangUp(nc)
		return fmt.Errorf("rendezvous: %s: %w: %w", remote, errWrongSecret, net.ErrClosed)
	}
	_, err := nc.Write([]byte{authOK})
	return err
}

// hangUp ends a refused connection so that the refusal arrives: closing
// a socket with unread input resets it, and a reset may discard what was
// written before it. It sends EOF, then reads what the peer still sends,
// within a second and 64 KiB.
func hangUp(nc net.Conn) {
	if cw, ok := nc.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	_ = nc.SetReadDeadline(time.Now().Add(time.Second))
	_, _ = io.Copy(io.Discard, io.LimitReader(nc, 64<<10))
}

// The server's reasons to close a connection that did not authenticate;
// the errors also wrap net.ErrClosed, so that the server logs them at
// debug only: the refusal was logged, once a minute per address.
var (
	errUnauthenticatedPeer = errors.New("rendezvous: refused a client that did not authenticate")
	errWrongSecret         = errors.New("rendezvous: refused a client whose secret is not the job's")
)

// refusalLog logs refused connections at warn, once a minute per address
// and reason,
// so that a flood of them cannot flood the log.
type refusalLog struct {
	log zerolog.Logger
	mu  sync.Mutex
	at  map[string]time.Time
}

func newRefusalLog(log zerolog.Logger) *refusalLog {
	return &refusalLog{log: log, at: make(map[string]time.Time)}
}

// refusalLogEntries bounds the addresses refusalLog remembers.
const refusalLogEntries = 4096

func (r *refusalLog) refuse(remote net.Addr, msg string) {
	host := remote.String()
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host += "\x00" + msg // once per kind of refusal
	now := time.Now()
	r.mu.Lock()
	last, seen := r.at[host]
	if seen && now.Sub(last) < time.Minute {
		r.mu.Unlock()
		return
	}
	if len(r.at) >= refusalLogEntries {
		clear(r.at)
	}
	r.at[host] = now
	r.mu.Unlock()
	r.log.Warn().Stringer("remote", remote).Msg(msg)
}

// warnOpenStore says, for a store served without a secret beyond
// loopback, who can use it.
func warnOpenStore(log zerolog.Logger, addr net.Addr) {
	if !OpenBeyondLoopback(addr) {
		return
	}
	log.Warn().Stringer("listen", addr).
		Msg("the rendezvous store has no secret: anyone who can reach this port may read and write the job's rendezvous (give every agent the same secret to require it)")
}

// OpenBeyondLoopback reports whether a listener on addr can be reached
// from other machines.
func OpenBeyondLoopback(addr net.Addr) bool {
	tcp, ok := addr.(*net.TCPAddr)
	return !ok || !tcp.IP.IsLoopback()
}
