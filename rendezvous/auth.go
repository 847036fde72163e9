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

// Errors of the authentication. A client does not retry them.
var (
	// ErrStoreUnproven: the server at the endpoint does not know the
	// job's secret (another job's or user's store, or torch's own).
	ErrStoreUnproven = errors.New("rendezvous: the store did not prove that it knows the job's secret: it is not this job's store")
	// ErrSecretRefused: the store knows a secret, and this client's
	// proof does not match it.
	ErrSecretRefused = errors.New("rendezvous: the store refused this agent: its secret is not the job's")
	// ErrSecretRequired: the store requires a secret, and this client
	// has none.
	ErrSecretRequired = errors.New("rendezvous: the store requires the job's secret, and this agent has none")
)

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

// permanentAuthError reports whether err is the other side's answer, not
// a failure to reach it: retrying would get the same answer.
func permanentAuthError(err error) bool {
	return errors.Is(err, ErrStoreUnproven) || errors.Is(err, ErrSecretRefused) || errors.Is(err, ErrSecretRequired)
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
	n, err := io.ReadFull(nc, reply)
	switch {
	case n >= len(authBanner)+1 && bytes.Equal(reply[:len(authBanner)], authBanner) && reply[len(authBanner)] == authRequired:
		// A gorun store that took the hello for something else.
		return ErrStoreUnproven
	case err != nil && n > 0 && !bytes.HasPrefix(authBanner, reply[:min(n, len(authBanner))]):
		return fmt.Errorf("%w (it answered %q)", ErrStoreUnproven, reply[:min(n, 16)])
	case err != nil:
		return fmt.Errorf("rendezvous: authenticate: the store said nothing that proves it knows the job's secret: %w", err)
	}
	storeNonce := reply[len(authBanner) : len(authBanner)+authNonceLen]
	proof := reply[len(authBanner)+authNonceLen:]
	want := a.mac(storeLabel, agentNonce, storeNonce)
	if !bytes.Equal(reply[:len(authBanner)], authBanner) || !hmac.Equal(proof, want) {
		return ErrStoreUnproven
	}
	if _, err := nc.Write(a.mac(agentLabel, agentNonce, storeNonce)); err != nil {
		return fmt.Errorf("rendezvous: authenticate: %w", err)
	}
	var status [1]byte
	if _, err := io.ReadFull(nc, status[:]); err != nil {
		// A store that proved itself hangs up only on a wrong proof.
		return fmt.Errorf("%w (it closed the connection: %v)", ErrSecretRefused, err)
	}
	switch status[0] {
	case authOK:
		return nil
	case authRefused:
		return ErrSecretRefused
	}
	return fmt.Errorf("%w (status %d)", ErrStoreUnproven, status[0])
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

// SetReadDeadline and SetDeadline are remembered, so that a deadline the
// server set during the handshake (Shutdown's) holds after it.
func (c *authConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	c.readDeadline = t
	c.mu.Unlock()
	return c.Conn.SetReadDeadline(t)
}

func (c *authConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	c.readDeadline = t
	c.mu.Unlock()
	return c.Conn.SetDeadline(t)
}

// accept runs the store's side of the handshake.
func (c *authConn) accept() error {
	nc := c.Conn
	_ = nc.SetDeadline(time.Now().Add(authTimeout))
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
		return fmt.Errorf("rendezvous: %s: %w", remote, errUnauthenticatedPeer)
	}
	if _, err := io.ReadFull(nc, hello[1:]); err != nil || !bytes.Equal(hello[:len(authBanner)], authBanner) {
		c.log.refuse(remote, "refused a connection with a malformed authentication")
		return fmt.Errorf("rendezvous: %s: malformed authentication: %w", remote, errUnauthenticatedPeer)
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
		return fmt.Errorf("rendezvous: %s: authentication cut short: %w", remote, err)
	}
	if !hmac.Equal(proof, c.auth.mac(agentLabel, agentNonce, storeNonce)) {
		_, _ = nc.Write([]byte{authRefused})
		c.log.refuse(remote, "refused an agent whose secret is not the job's")
		return fmt.Errorf("rendezvous: %s: %w", remote, errWrongSecret)
	}
	_, err := nc.Write([]byte{authOK})
	return err
}

// The server's reasons to close a connection that did not authenticate.
var (
	errUnauthenticatedPeer = errors.New("rendezvous: refused a client that did not authenticate")
	errWrongSecret         = errors.New("rendezvous: refused a client whose secret is not the job's")
)

// refusalLog logs refused connections at warn, once a minute per address,
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
