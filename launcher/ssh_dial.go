package launcher

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	sshconfig "github.com/kevinburke/ssh_config"
	"github.com/rs/zerolog"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
)

// maxSSHJumps bounds ProxyJump chains, which ssh_config could make loop.
const maxSSHJumps = 8

// sshDialer connects to hosts with one SSHConfig and one parsed ssh_config.
type sshDialer struct {
	cfg  SSHConfig
	conf *sshconfig.Config // nil when none is read
	home string            // "" when unknown
	user string            // the local user
	env  func(string) string
	log  zerolog.Logger
}

func newSSHDialer(cfg SSHConfig) (*sshDialer, error) {
	d := &sshDialer{cfg: cfg, log: cfg.Logger, env: func(string) string { return "" }}
	if cfg.LookupEnv != nil {
		d.env = func(name string) string { v, _ := cfg.LookupEnv(name); return v }
	}
	u, userErr := user.Current()
	d.home = d.env("HOME")
	if d.home == "" && userErr == nil {
		d.home = u.HomeDir
	}
	if userErr == nil {
		d.user = u.Username
	} else {
		d.user = d.env("USER")
	}
	path, must := cfg.ConfigFile, true
	switch path {
	case "none":
		return d, nil
	case "":
		if d.home == "" {
			return d, nil
		}
		path, must = filepath.Join(d.home, ".ssh", "config"), false
	}
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) && !must {
		return d, nil
	}
	if err != nil {
		return nil, fmt.Errorf("launcher: ssh config: %w", err)
	}
	defer f.Close()
	if d.conf, err = sshconfig.Decode(f); err != nil {
		return nil, fmt.Errorf("launcher: ssh config %s: %w", path, err)
	}
	return d, nil
}

// sshTarget is one host with everything needed to connect to it.
type sshTarget struct {
	name           string // for messages
	alias          string // the host as given, without user and port
	hostname, user string
	port           int
	identities     []string
	identitiesOnly bool
	agentSocket    string // "" = no agent
	knownHosts     []string
	acceptNew      bool
	jumps          []string
	timeout        time.Duration
	keepAlive      time.Duration
	keepAliveMax   int
}

func (t *sshTarget) addr() string { return net.JoinHostPort(t.hostname, strconv.Itoa(t.port)) }

// get returns the ssh_config value of key for alias ("" when unset).
func (d *sshDialer) get(alias, key string) string {
	if d.conf == nil {
		return ""
	}
	v, err := d.conf.Get(alias, key)
	if err != nil {
		d.log.Warn().Err(err).Str("key", key).Msg("ssh config")
	}
	return v
}

func (d *sshDialer) getAll(alias, key string) []string {
	if d.conf == nil {
		return nil
	}
	v, err := d.conf.GetAll(alias, key)
	if err != nil {
		d.log.Warn().Err(err).Str("key", key).Msg("ssh config")
	}
	return v
}

// splitSSHHost splits "[user@]host[:port]" (an IPv6 host in brackets when it
// has a port).
func splitSSHHost(s string) (user, host string, port int, err error) {
	if i := strings.LastIndexByte(s, '@'); i >= 0 {
		user, s = s[:i], s[i+1:]
	}
	host = s
	if strings.HasPrefix(s, "[") || strings.Count(s, ":") == 1 {
		var p string
		if host, p, err = net.SplitHostPort(s); err != nil {
			return "", "", 0, err
		}
		if port, err = strconv.Atoi(p); err != nil || port <= 0 || port > 65535 {
			return "", "", 0, fmt.Errorf("bad port %q", p)
		}
	}
	if host == "" {
		return "", "", 0, errors.New("empty host name")
	}
	return user, host, port, nil
}

// resolve applies SSHConfig, ssh_config and the defaults to host. jumpFor
// is the host that a jump host leads to ("" for the target itself).
func (d *sshDialer) resolve(host, jumpFor string) (*sshTarget, error) {
	user, alias, port, err := splitSSHHost(host)
	if err != nil {
		return nil, &SSHError{Host: host, Op: "parse host", Err: err}
	}
	t := &sshTarget{alias: alias, user: user, port: port}
	t.hostname = expandHostName(d.get(alias, "HostName"), alias)
	if t.user == "" && jumpFor == "" {
		t.user = d.cfg.User
	}
	if t.user == "" {
		t.user = cmp.Or(d.get(alias, "User"), d.user)
	}
	if t.port == 0 && jumpFor == "" {
		t.port = d.cfg.Port
	}
	if p := d.get(alias, "Port"); t.port == 0 && p != "" {
		if t.port, err = strconv.Atoi(p); err != nil {
			return nil, &SSHError{Host: host, Op: "ssh config", Err: fmt.Errorf("bad Port %q", p)}
		}
	}
	t.port = cmp.Or(t.port, 22)
	t.name = t.addr()
	if alias != t.hostname {
		t.name = alias + " (" + t.addr() + ")"
	}
	if jumpFor != "" {
		t.name += ", jump host for " + jumpFor
	}
	expand := func(path string) string { return d.expand(path, t) }

	for _, f := range d.cfg.IdentityFiles {
		t.identities = append(t.identities, expand(f))
	}
	for _, f := range d.getAll(alias, "IdentityFile") {
		t.identities = append(t.identities, expand(f))
	}
	if len(t.identities) == 0 && d.home != "" {
		for _, k := range []string{"id_ed25519", "id_ecdsa", "id_rsa"} {
			t.identities = append(t.identities, filepath.Join(d.home, ".ssh", k))
		}
	}
	t.identitiesOnly = strings.EqualFold(d.get(alias, "IdentitiesOnly"), "yes")

	switch a := d.cfg.AgentSocket; {
	case a == "none":
	case a != "":
		t.agentSocket = expand(a)
	default:
		switch ia := d.get(alias, "IdentityAgent"); ia {
		case "none":
		case "", "SSH_AUTH_SOCK":
			t.agentSocket = d.env("SSH_AUTH_SOCK")
		default:
			if strings.HasPrefix(ia, "$") {
				t.agentSocket = d.env(strings.Trim(ia[1:], "{}"))
			} else {
				t.agentSocket = expand(ia)
			}
		}
	}

	if d.cfg.KnownHosts != "" {
		t.knownHosts = []string{expand(d.cfg.KnownHosts)}
	} else if files := strings.Fields(d.get(alias, "UserKnownHostsFile")); len(files) > 0 {
		for _, f := range files {
			t.knownHosts = append(t.knownHosts, expand(f))
		}
	} else if d.home != "" {
		t.knownHosts = []string{filepath.Join(d.home, ".ssh", "known_hosts")}
	} else {
		return nil, &SSHError{Host: t.name, Op: "known hosts", Err: errors.New("no home directory: set a known_hosts file")}
	}
	switch strings.ToLower(d.get(alias, "StrictHostKeyChecking")) {
	case "accept-new", "no", "off":
		t.acceptNew = true
	default:
		t.acceptNew = d.cfg.AcceptNew
	}

	if pc := d.get(alias, "ProxyCommand"); pc != "" && pc != "none" {
		return nil, &SSHError{Host: t.name, Op: "ssh config", Err: errors.New("ProxyCommand is not supported; use ProxyJump")}
	}
	if pj := d.get(alias, "ProxyJump"); pj != "" && pj != "none" {
		for _, j := range strings.Split(pj, ",") {
			if j = strings.TrimPrefix(strings.TrimSpace(j), "ssh://"); j != "" {
				t.jumps = append(t.jumps, j)
			}
		}
	}

	t.timeout = d.cfg.ConnectTimeout
	if s := d.get(alias, "ConnectTimeout"); t.timeout == 0 && s != "" {
		if n, err := strconv.Atoi(s); err == nil && n > 0 {
			t.timeout = time.Duration(n) * time.Second
		}
	}
	t.timeout = cmp.Or(t.timeout, defaultSSHConnectTimeout)
	t.keepAlive = d.cfg.KeepAlive
	if s := d.get(alias, "ServerAliveInterval"); t.keepAlive == 0 && s != "" {
		if n, err := strconv.Atoi(s); err == nil {
			t.keepAlive = time.Duration(n) * time.Second
			if n == 0 {
				t.keepAlive = -1
			}
		}
	}
	t.keepAlive = cmp.Or(t.keepAlive, defaultSSHKeepAlive)
	t.keepAliveMax = d.cfg.KeepAliveMax
	if s := d.get(alias, "ServerAliveCountMax"); t.keepAliveMax == 0 && s != "" {
		t.keepAliveMax, _ = strconv.Atoi(s)
	}
	if t.keepAliveMax <= 0 {
		t.keepAliveMax = defaultSSHKeepAliveMax
	}
	return t, nil
}

// expandHostName is the host that alias reaches by ssh_config's HostName
// hn ("" = alias itself). As in OpenSSH, HostName takes the tokens %h (the
// alias) and %%, read left to right: "%%h" is a literal "%h".
func expandHostName(hn, alias string) string {
	if hn == "" {
		return alias
	}
	return strings.NewReplacer("%%", "%", "%h", alias).Replace(hn)
}

// expand resolves ~ and the ssh_config tokens %d %h %i %l %n %p %r %u %% in
// a path of t.
func (d *sshDialer) expand(path string, t *sshTarget) string {
	if path == "~" || strings.HasPrefix(path, "~/") {
		path = d.home + path[1:]
	}
	if !strings.Contains(path, "%") {
		return path
	}
	local, _ := os.Hostname()
	return strings.NewReplacer(
		"%%", "%", "%d", d.home, "%h", t.hostname, "%i", strconv.Itoa(os.Getuid()),
		"%l", local, "%n", t.alias, "%p", strconv.Itoa(t.port), "%r", t.user, "%u", d.user,
	).Replace(path)
}

// connect dials host, through via when non-nil, otherwise through host's
// own ProxyJump chain if it has one (so, as in OpenSSH, only the first hop
// of a chain follows its own ProxyJump). It returns the jump clients it
// opened on the way, in order.
func (d *sshDialer) connect(ctx context.Context, host string, via *ssh.Client, jumpFor string, depth int) (*sshTarget, *ssh.Client, []*ssh.Client, error) {
	t, err := d.resolve(host, jumpFor)
	if err != nil {
		return nil, nil, nil, err
	}
	if depth > maxSSHJumps {
		return nil, nil, nil, &SSHError{Host: t.name, Op: "proxy jump", Err: fmt.Errorf("more than %d jump hosts (a ProxyJump loop?)", maxSSHJumps)}
	}
	var chain []*ssh.Client
	closeChain := func() {
		for i := len(chain) - 1; i >= 0; i-- {
			chain[i].Close()
		}
	}
	if via == nil {
		for _, j := range t.jumps {
			_, jc, sub, err := d.connect(ctx, j, via, t.alias, depth+1)
			if err != nil {
				closeChain()
				return nil, nil, nil, err
			}
			chain = append(append(chain, sub...), jc)
			via = jc
		}
	}
	c, err := d.handshake(ctx, t, via)
	if err != nil {
		closeChain()
		return nil, nil, nil, err
	}
	return t, c, chain, nil
}

// handshake opens the TCP connection to t (directly or through via) and
// runs the SSH handshake and authentication, all within t.timeout.
func (d *sshDialer) handshake(ctx context.Context, t *sshTarget, via *ssh.Client) (*ssh.Client, error) {
	log := d.log.With().Str("host", t.name).Logger()
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, t.timeout)
	defer cancel()
	timeoutErr := func(err error) error {
		switch {
		case parent.Err() != nil:
			return parent.Err()
		case ctx.Err() != nil:
			return fmt.Errorf("timed out after %v", t.timeout)
		}
		return err
	}

	var conn net.Conn
	var err error
	if via == nil {
		conn, err = new(net.Dialer).DialContext(ctx, "tcp", t.addr())
	} else {
		conn, err = via.DialContext(ctx, "tcp", t.addr())
	}
	if err != nil {
		return nil, &SSHError{Host: t.name, Op: "dial", Err: timeoutErr(err)}
	}
	// SSH's own Timeout covers only the TCP connect; a peer that accepts
	// but never speaks would hang the handshake.
	stop := context.AfterFunc(ctx, func() { conn.Close() })

	hk, err := newHostKeyCheck(t, log)
	if err != nil {
		stop()
		conn.Close()
		return nil, err
	}
	auth, done := d.auth(t, log)
	defer done()
	sc, chans, reqs, err := ssh.NewClientConn(conn, t.addr(), &ssh.ClientConfig{
		User:              t.user,
		Auth:              []ssh.AuthMethod{auth.method},
		HostKeyCallback:   hk.callback,
		HostKeyAlgorithms: hk.algorithms,
	})
	if !stop() {
		if err == nil {
			sc.Close()
			err = errors.New("closed")
		}
		return nil, &SSHError{Host: t.name, Op: "handshake", Err: timeoutErr(err)}
	}
	switch {
	case hk.err != nil:
		conn.Close()
		return nil, hk.err
	case err != nil && hk.ok:
		conn.Close()
		return nil, &SSHError{Host: t.name, Op: "auth as " + t.user, Err: fmt.Errorf("%w (offered %s)", err, auth.describe())}
	case err != nil:
		conn.Close()
		return nil, &SSHError{Host: t.name, Op: "handshake", Err: err}
	}
	log.Debug().Str("user", t.user).Msg("ssh connected")
	return ssh.NewClient(sc, chans, reqs), nil
}

// sshAuth is the public keys offered to one host.
type sshAuth struct {
	method   ssh.AuthMethod
	agentN   int      // keys from the agent
	agentErr error    // why the agent gave none
	agent    string   // its socket
	files    []string // key files loaded
	skipped  []string // "path (why)" of key files not usable
}

func (a *sshAuth) describe() string {
	var parts []string
	switch {
	case a.agent == "":
		parts = append(parts, "no ssh-agent")
	case a.agentErr != nil:
		parts = append(parts, fmt.Sprintf("no keys from ssh-agent %s: %v", a.agent, a.agentErr))
	default:
		parts = append(parts, fmt.Sprintf("%d keys from ssh-agent %s", a.agentN, a.agent))
	}
	if len(a.files) > 0 {
		parts = append(parts, "key files "+strings.Join(a.files, ", "))
	}
	if len(a.skipped) > 0 {
		parts = append(parts, "skipped "+strings.Join(a.skipped, ", "))
	}
	return "publickey: " + strings.Join(parts, "; ")
}

// auth gathers the agent's keys and t's key files into one publickey
// method: x/crypto tries only the first method of each kind. done closes
// the agent connection once the handshake is over.
func (d *sshDialer) auth(t *sshTarget, log zerolog.Logger) (auth *sshAuth, done func()) {
	auth, done = &sshAuth{agent: t.agentSocket}, func() {}
	var signers []ssh.Signer
	seen := map[string]bool{}
	add := func(s ssh.Signer) {
		if k := string(s.PublicKey().Marshal()); !seen[k] {
			seen[k] = true
			signers = append(signers, s)
		}
	}

	var fileSigners []ssh.Signer
	var filePubs []ssh.PublicKey // of all key files, for IdentitiesOnly
	for _, path := range t.identities {
		pem, err := os.ReadFile(path)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			auth.skipped = append(auth.skipped, fmt.Sprintf("%s (%v)", path, err))
			continue
		}
		s, err := ssh.ParsePrivateKey(pem)
		var missing *ssh.PassphraseMissingError
		switch {
		case errors.As(err, &missing):
			log.Debug().Str("key", path).Msg("skipping a key with a passphrase; load it into ssh-agent")
			auth.skipped = append(auth.skipped, path+" (has a passphrase)")
			if missing.PublicKey != nil {
				filePubs = append(filePubs, missing.PublicKey)
			}
		case err != nil:
			log.Warn().Err(err).Str("key", path).Msg("skipping an unreadable ssh key")
			auth.skipped = append(auth.skipped, fmt.Sprintf("%s (%v)", path, err))
		default:
			fileSigners = append(fileSigners, s)
			filePubs = append(filePubs, s.PublicKey())
			auth.files = append(auth.files, path)
		}
	}

	if t.agentSocket != "" {
		conn, err := net.Dial("unix", t.agentSocket)
		var agentSigners []ssh.Signer
		if err == nil {
			done = func() { conn.Close() }
			agentSigners, err = agent.NewClient(conn).Signers()
		}
		if err != nil {
			log.Debug().Err(err).Str("agent", t.agentSocket).Msg("ssh-agent unusable")
			auth.agentErr = err
		}
		for _, s := range agentSigners {
			if t.identitiesOnly && !containsKey(filePubs, s.PublicKey()) {
				continue
			}
			add(s)
			auth.agentN++
		}
	}
	for _, s := range fileSigners {
		add(s)
	}
	auth.method = ssh.PublicKeysCallback(func() ([]ssh.Signer, error) { return signers, nil })
	return auth, done
}

func containsKey(keys []ssh.PublicKey, k ssh.PublicKey) bool {
	for _, key := range keys {
		if string(key.Marshal()) == string(k.Marshal()) {
			return true
		}
	}
	return false
}
