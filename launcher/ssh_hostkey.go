package launcher

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/rs/zerolog"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// HostKeyError is a host key that is not trusted: unknown (Known is empty)
// or different from the one recorded (the connection may be intercepted).
type HostKeyError struct {
	Host       string // as in SSHError
	Addr       string // host:port looked up
	Key        ssh.PublicKey
	KnownHosts []string // the files searched
	Known      []knownhosts.KnownKey
	Revoked    bool // Key is marked @revoked
}

// Changed reports whether the host is known with another key.
func (e *HostKeyError) Changed() bool { return len(e.Known) > 0 }

func (e *HostKeyError) Error() string {
	offered := e.Key.Type() + " " + ssh.FingerprintSHA256(e.Key)
	files := strings.Join(e.KnownHosts, ", ")
	switch {
	case e.Revoked:
		return fmt.Sprintf("launcher: ssh %s: host key %s is marked @revoked in %s", e.Host, offered, files)
	case !e.Changed():
		host, port, _ := net.SplitHostPort(e.Addr)
		return fmt.Sprintf("launcher: ssh %s: unknown host key (%s): not in %s; add it with "+
			"`ssh-keyscan -p %s %s >> %s` (after checking the fingerprint) or pass --ssh-accept-new",
			e.Host, offered, files, port, host, e.KnownHosts[0])
	}
	var known []string
	for _, k := range e.Known {
		known = append(known, fmt.Sprintf("%s:%d has %s %s", k.Filename, k.Line, k.Key.Type(), ssh.FingerprintSHA256(k.Key)))
	}
	return fmt.Sprintf("launcher: ssh %s: REMOTE HOST KEY CHANGED: the host offers %s, but %s; "+
		"someone may be intercepting the connection. If the host was reinstalled, remove the old key "+
		"with `ssh-keygen -R %q -f %s` and connect again",
		e.Host, offered, strings.Join(known, "; "), knownhosts.Normalize(e.Addr), e.Known[0].Filename)
}

// hostKeyCheck verifies one host's key against its known_hosts files.
type hostKeyCheck struct {
	t          *sshTarget
	log        zerolog.Logger
	db         ssh.HostKeyCallback
	algorithms []string // to ask the host for: the types recorded for it
	ok         bool     // the key was accepted
	err        error    // why it was not
}

// probeKey is a key that no host has, to learn which keys a host is known
// with: knownhosts reports them in KeyError.Want.
var probeKey = sync.OnceValue(func() ssh.PublicKey {
	pub, _, _ := ed25519.GenerateKey(nil)
	k, _ := ssh.NewPublicKey(pub)
	return k
})

// knownHostsMu serializes appending to known_hosts files.
var knownHostsMu sync.Mutex

func newHostKeyCheck(t *sshTarget, log zerolog.Logger) (*hostKeyCheck, error) {
	h := &hostKeyCheck{t: t, log: log}
	var err error
	if h.db, err = loadKnownHosts(t.knownHosts); err != nil {
		return nil, &SSHError{Host: t.name, Op: "known hosts", Err: err}
	}
	// Without HostKeyAlgorithms the host may offer a key of a type other
	// than the recorded one, which knownhosts reports as a mismatch.
	var ke *knownhosts.KeyError
	if err := h.db(t.addr(), probeAddr, probeKey()); errors.As(err, &ke) {
		for _, k := range ke.Want {
			h.algorithms = append(h.algorithms, algorithmsForKeyType(k.Key.Type())...)
		}
		h.algorithms = slices.Compact(h.algorithms)
	}
	return h, nil
}

// probeAddr stands for the remote address, which knownhosts only parses
// when given a hostname.
var probeAddr = &net.TCPAddr{IP: net.IPv4zero}

// loadKnownHosts reads the files that exist.
func loadKnownHosts(files []string) (ssh.HostKeyCallback, error) {
	var existing []string
	for _, f := range files {
		if _, err := os.Stat(f); err == nil {
			existing = append(existing, f)
		} else if !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
	}
	return knownhosts.New(existing...)
}

// algorithmsForKeyType lists the host key algorithms that yield a key of
// type typ: an RSA key signs with SHA-2 too.
func algorithmsForKeyType(typ string) []string {
	switch typ {
	case ssh.KeyAlgoRSA:
		return []string{ssh.KeyAlgoRSASHA512, ssh.KeyAlgoRSASHA256, ssh.KeyAlgoRSA}
	case ssh.CertAlgoRSAv01:
		return []string{ssh.CertAlgoRSASHA512v01, ssh.CertAlgoRSASHA256v01, ssh.CertAlgoRSAv01}
	}
	return []string{typ}
}

// callback is the ssh.HostKeyCallback: it accepts a recorded key, adds a
// new one when t.acceptNew, and refuses everything else.
func (h *hostKeyCheck) callback(hostname string, remote net.Addr, key ssh.PublicKey) error {
	err := h.db(hostname, remote, key)
	var ke *knownhosts.KeyError
	var re *knownhosts.RevokedError
	switch {
	case err == nil:
	case errors.As(err, &ke) && len(ke.Want) == 0 && h.t.acceptNew:
		err = h.addKey(key)
	case errors.As(err, &ke):
		err = &HostKeyError{Host: h.t.name, Addr: h.t.addr(), Key: key, KnownHosts: h.t.knownHosts, Known: ke.Want}
	case errors.As(err, &re):
		err = &HostKeyError{Host: h.t.name, Addr: h.t.addr(), Key: key, KnownHosts: h.t.knownHosts, Revoked: true}
	default:
		err = &SSHError{Host: h.t.name, Op: "host key", Err: err}
	}
	h.ok, h.err = err == nil, err
	return err
}

// addKey appends key for the host to the first known_hosts file, unless a
// concurrent dial has just done so; a different key recorded meanwhile is
// refused.
func (h *hostKeyCheck) addKey(key ssh.PublicKey) error {
	knownHostsMu.Lock()
	defer knownHostsMu.Unlock()
	file := h.t.knownHosts[0]
	db, err := loadKnownHosts(h.t.knownHosts)
	if err == nil {
		err = db(h.t.addr(), probeAddr, key)
	}
	var ke *knownhosts.KeyError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ke) && len(ke.Want) > 0:
		return &HostKeyError{Host: h.t.name, Addr: h.t.addr(), Key: key, KnownHosts: h.t.knownHosts, Known: ke.Want}
	case !errors.As(err, &ke):
		return &SSHError{Host: h.t.name, Op: "known hosts", Err: err}
	}
	if err := appendKnownHost(file, h.t.addr(), key); err != nil {
		return &SSHError{Host: h.t.name, Op: "add host key", Err: err}
	}
	h.log.Warn().Str("key", key.Type()+" "+ssh.FingerprintSHA256(key)).Str("file", file).
		Msg("added the host key of a new host (accept-new)")
	return nil
}

// appendKnownHost writes the line for addr ("[host]:port" unless the port
// is 22) and key at the end of file, creating it and its directory.
func appendKnownHost(file, addr string, key ssh.PublicKey) error {
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(file, os.O_RDWR|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	line := knownhosts.Line([]string{knownhosts.Normalize(addr)}, key) + "\n"
	// Start on a line of our own.
	if st, err := f.Stat(); err == nil && st.Size() > 0 {
		last := make([]byte, 1)
		if _, err := f.ReadAt(last, st.Size()-1); err == nil && !bytes.Equal(last, []byte("\n")) {
			line = "\n" + line
		}
	}
	if _, err := f.WriteString(line); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
