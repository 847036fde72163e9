package launcher

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/crypto/ssh"
	"golang.org/x/sys/unix"
)

// Defaults of SSHConfig.
const (
	defaultSSHConnectTimeout = 30 * time.Second
	defaultSSHKeepAlive      = 15 * time.Second
	defaultSSHKeepAliveMax   = 3
	defaultSSHStopGrace      = 5 * time.Second
)

// ErrSSHConnectionLost is wrapped by the error of an SSHProcess whose
// connection died before the remote command's exit status arrived:
// keepalives went unanswered or the transport broke.
var ErrSSHConnectionLost = errors.New("connection lost")

// SSHConfig says how to reach remote hosts. Fields left zero come from
// ssh_config(5) (ConfigFile) the way OpenSSH's own client would take them,
// then from OpenSSH's defaults. Only the user's config is read, not the
// system-wide /etc/ssh/ssh_config.
//
// Honoured ssh_config keywords: Host and Match blocks (not Match exec),
// HostName (%h and %%), Port, User, IdentityFile, IdentitiesOnly, IdentityAgent,
// ProxyJump, ConnectTimeout, UserKnownHostsFile, StrictHostKeyChecking
// (accept-new and no both mean AcceptNew; a changed key is never accepted),
// ServerAliveInterval and ServerAliveCountMax. ProxyCommand is refused.
type SSHConfig struct {
	// User logs in on the target host; it beats ssh_config's User and the
	// user@ of a host string beats it ("" = ssh_config, then the local user).
	// Jump hosts take theirs from ssh_config only, as with ssh -l.
	User string
	// Port of the target host (0 = ssh_config, then 22); host:port beats it.
	Port int
	// IdentityFiles are private keys tried after the agent's keys, before
	// ssh_config's IdentityFile, on every host including jump hosts. As in
	// OpenSSH, ~/.ssh/id_{ed25519,ecdsa,rsa} are tried only when neither
	// names a key. Keys with a passphrase are skipped (load them into
	// ssh-agent): nothing ever prompts.
	IdentityFiles []string
	// ConfigFile is the ssh_config file ("" = ~/.ssh/config if it exists,
	// "none" = read none).
	ConfigFile string
	// KnownHosts is the known_hosts file ("" = ssh_config's
	// UserKnownHostsFile, then ~/.ssh/known_hosts).
	KnownHosts string
	// AcceptNew adds the key of a host not yet in KnownHosts to it
	// (trust on first use, like StrictHostKeyChecking=accept-new). A host
	// whose recorded key differs is refused regardless.
	AcceptNew bool
	// AgentSocket is ssh-agent's socket ("" = ssh_config's IdentityAgent,
	// then $SSH_AUTH_SOCK; "none" = use no agent).
	AgentSocket string
	// LookupEnv is the environment the defaults come from: HOME (else
	// the user database's home directory) for ~ and the default files,
	// USER when the user database has no entry for this process,
	// SSH_AUTH_SOCK and the variable an IdentityAgent names. nil is an
	// empty environment; a program passes os.LookupEnv.
	LookupEnv func(string) (string, bool)
	// ConnectTimeout bounds TCP connect plus SSH handshake and
	// authentication, per hop (0 = ssh_config, then 30 s).
	ConnectTimeout time.Duration
	// KeepAlive is the interval of keepalive@openssh.com requests; after
	// KeepAliveMax (ssh_config's ServerAliveCountMax, then 3) unanswered
	// intervals in a row the connection is declared lost and closed
	// (0 = ssh_config's ServerAliveInterval, then 15 s; negative = off).
	KeepAlive    time.Duration
	KeepAliveMax int
	// StopGrace is how long a remote command gets between SIGTERM and
	// SIGKILL after SSHProcess.Close or the end of its context, and again
	// between SIGKILL and Wait giving up on it (0 = 5 s).
	StopGrace time.Duration
	Logger    zerolog.Logger
}

// SSHError reports what failed with which host.
type SSHError struct {
	Host string // "node1 (10.0.0.1:22)", or the address alone
	Op   string // "dial", "handshake", "auth", "session", ... ("" = none)
	Err  error
}

func (e *SSHError) Error() string {
	if e.Op == "" {
		return fmt.Sprintf("launcher: ssh %s: %v", e.Host, e.Err)
	}
	return fmt.Sprintf("launcher: ssh %s: %s: %v", e.Host, e.Op, e.Err)
}

func (e *SSHError) Unwrap() error { return e.Err }

// SSHClient is an authenticated connection to one host, possibly through
// jump hosts. Its methods are safe for concurrent use.
type SSHClient struct {
	name      string // for messages and logs
	hostname  string // what ssh_config's HostName made of the host: the last hop dialed it
	client    *ssh.Client
	jumps     []*ssh.Client // in dialing order; closed after client
	log       zerolog.Logger
	stopGrace time.Duration
	connDone  chan struct{} // closed once the connection has ended

	mu     sync.Mutex
	lost   error // why the connection was declared lost, if it was
	closed bool  // Close was called
}

// DialSSH connects and authenticates to host, written "[user@]name[:port]"
// where name is an ssh_config alias or a hostname. ctx bounds dialing only;
// the client lives until Close or until the connection is lost.
func DialSSH(ctx context.Context, host string, cfg SSHConfig) (*SSHClient, error) {
	d, err := newSSHDialer(cfg)
	if err != nil {
		return nil, err
	}
	return d.dial(ctx, host)
}

// NewSSHDialer returns a Dialer that connects as DialSSH does, with
// ssh_config read once for all hosts.
func NewSSHDialer(cfg SSHConfig) (Dialer, error) {
	d, err := newSSHDialer(cfg)
	if err != nil {
		return nil, err
	}
	return d, nil
}

// Dial makes d a Dialer.
func (d *sshDialer) Dial(ctx context.Context, host string) (Conn, error) {
	c, err := d.dial(ctx, host)
	if err != nil {
		return nil, err
	}
	return sshConn{c}, nil
}

func (d *sshDialer) dial(ctx context.Context, host string) (*SSHClient, error) {
	cfg := d.cfg
	t, client, jumps, err := d.connect(ctx, host, nil, "", 0)
	if err != nil {
		return nil, err
	}
	c := &SSHClient{
		name:      t.name,
		hostname:  t.hostname,
		client:    client,
		jumps:     jumps,
		log:       cfg.Logger.With().Str("host", t.name).Logger(),
		stopGrace: cmp.Or(cfg.StopGrace, defaultSSHStopGrace),
		connDone:  make(chan struct{}),
	}
	go func() {
		err := client.Wait()
		close(c.connDone)
		c.mu.Lock()
		expected := c.closed || c.lost != nil
		c.mu.Unlock()
		if !expected {
			c.log.Warn().Err(err).Msg("ssh connection ended")
		}
	}()
	if t.keepAlive > 0 {
		go c.keepAlive(t.keepAlive, t.keepAliveMax)
	}
	return c, nil
}

// Host names the host in messages: "alias (address)" or the address.
func (c *SSHClient) Host() string { return c.name }

// sshConn is an SSHClient as a Fanout's Conn.
type sshConn struct{ *SSHClient }

func (c sshConn) HostName() string { return c.hostname }

func (c sshConn) Start(ctx context.Context, dir string, env, argv []string, stdin []byte, stdout, stderr io.Writer) (Process, error) {
	p, err := c.SSHClient.Start(ctx, dir, env, argv, stdout, stderr)
	if err != nil {
		return nil, err
	}
	if len(stdin) > 0 {
		if _, err := p.stdin.Write(stdin); err != nil {
			p.Close()
			p.Wait()
			return nil, err
		}
	}
	return p, nil
}

// Close closes the connection and those to jump hosts. Remote commands still
// running see EOF on stdin; their SSHProcess.Wait returns an error.
func (c *SSHClient) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	err := c.client.Close()
	for i := len(c.jumps) - 1; i >= 0; i-- {
		c.jumps[i].Close()
	}
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// lose declares the connection lost for reason and closes it.
func (c *SSHClient) lose(reason error) {
	c.mu.Lock()
	if c.lost == nil && !c.closed {
		c.lost = reason
	}
	c.mu.Unlock()
	c.log.Error().Err(reason).Msg("closing ssh connection")
	c.client.Close()
	for i := len(c.jumps) - 1; i >= 0; i-- {
		c.jumps[i].Close()
	}
}

// keepAlive sends keepalive@openssh.com every interval, at most one
// outstanding, and declares the connection lost once maxMisses intervals in a row
// passed without a reply. Any reply, even a refusal, proves the peer alive.
// It returns when the connection ends.
func (c *SSHClient) keepAlive(interval time.Duration, maxMisses int) {
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	var reply chan error // nil while no request is outstanding
	misses := 0
	for {
		select {
		case <-c.connDone:
			return
		case err := <-reply:
			if err != nil {
				return // the connection ended; its reader says why
			}
			reply, misses = nil, 0
		case <-ticker.C:
			if reply != nil {
				misses++
				c.log.Debug().Int("misses", misses).Msg("ssh keepalive unanswered")
				if misses >= maxMisses {
					c.lose(fmt.Errorf("%w: no reply to keepalives for %v", ErrSSHConnectionLost, time.Duration(maxMisses)*interval))
					return
				}
				continue
			}
			reply = make(chan error, 1)
			go func(reply chan<- error) {
				_, _, err := c.client.SendRequest("keepalive@openssh.com", true, nil)
				reply <- err
			}(reply)
		}
	}
}

// SSHProcess is a command running on a remote host.
//
// The stdin contract: the command's stdin is a pipe that nothing is written
// to, and that reaches EOF when the head is gone: after CloseStdin or Close,
// when the connection is closed or lost, or when the head process dies (its
// kernel closes the socket, and sshd then closes the pipe). sshd does not
// kill a command whose connection ended, and without a terminal nothing
// sends it SIGHUP, so a remote `gorun agent` must treat EOF on stdin as "the
// head is gone" and stop its workers.
type SSHProcess struct {
	c       *SSHClient
	sess    *ssh.Session
	stdin   io.WriteCloser
	pid     *pidScanner
	done    chan struct{} // closed once code and err are set
	code    int
	err     error
	stopCtx func() bool // unregisters the context's Close

	finishOnce, closeOnce sync.Once
}

// remotePidMarker starts the line by which the remote shell announces its
// pid (the command's process group: sshd makes it a session leader) before
// it execs the command, followed by a nonce of the session's: a login
// script that prints such a line cannot know it, so cannot name the
// process group that Signal kills. The line is taken out of stdout.
const remotePidMarker = "gorun-remote-pid "

// Start runs argv on the remote host in dir ("" = the login directory) with
// env added to sshd's environment for the command, through the login shell
// of the remote user, which must be a POSIX shell (see RemoteCommandLine).
// stdout and stderr receive the streams as they arrive, from separate
// goroutines (nil discards); they are never closed. When ctx ends the
// process is stopped as by Close.
func (c *SSHClient) Start(ctx context.Context, dir string, env, argv []string, stdout, stderr io.Writer) (*SSHProcess, error) {
	if len(argv) == 0 || argv[0] == "" {
		return nil, &SSHError{Host: c.name, Op: "start", Err: errors.New("empty command")}
	}
	if strings.Contains(argv[0], "=") || strings.HasPrefix(argv[0], "-") {
		// env(1) or exec would take it for a variable or an option.
		return nil, &SSHError{Host: c.name, Op: "start", Err: fmt.Errorf("command %q starts with '-' or contains '='", argv[0])}
	}
	for _, kv := range env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return nil, &SSHError{Host: c.name, Op: "start", Err: fmt.Errorf("environment entry %q is not NAME=value", kv)}
		}
	}
	sess, err := c.client.NewSession()
	if err != nil {
		return nil, c.sessionError("session", err)
	}
	stdin, err := sess.StdinPipe()
	if err != nil {
		sess.Close()
		return nil, c.sessionError("session", err)
	}
	if stdout == nil {
		stdout = io.Discard
	}
	marker := remotePidMarker + rand.Text() + " "
	pid := &pidScanner{w: &stickyWriter{w: stdout}, marker: []byte(marker), known: make(chan struct{})}
	sess.Stdout = pid
	if stderr != nil {
		sess.Stderr = &stickyWriter{w: stderr}
	}
	line := RemoteCommandLine(dir, env, argv)
	c.log.Debug().Str("command", line).Msg("starting remote command")
	if err := sess.Start("echo " + marker + "$$; " + line); err != nil {
		sess.Close()
		return nil, c.sessionError("start", err)
	}
	p := &SSHProcess{c: c, sess: sess, stdin: stdin, pid: pid, done: make(chan struct{})}
	p.stopCtx = context.AfterFunc(ctx, p.Close)
	go p.wait()
	return p, nil
}

// Output runs a short shell script on the remote host, with env added to
// its environment and stdin fed from in (nil: none), and returns its
// stdout. A non-zero exit is an error that carries the script's stderr.
// ctx ends the session.
func (c *SSHClient) Output(ctx context.Context, env []string, script string, in io.Reader) ([]byte, error) {
	sess, err := c.client.NewSession()
	if err != nil {
		return nil, c.sessionError("session", err)
	}
	defer sess.Close()
	stop := context.AfterFunc(ctx, func() { sess.Close() })
	defer stop()
	var stdout, stderr bytes.Buffer
	sess.Stdin, sess.Stdout, sess.Stderr = in, &stdout, &stderr
	if err := sess.Run(RemoteCommandLine("", env, []string{"sh", "-c", script})); err != nil {
		if ctx.Err() != nil {
			return nil, &SSHError{Host: c.name, Op: "run", Err: ctx.Err()}
		}
		if msg := strings.TrimSpace(stderr.String()); msg != "" {
			err = fmt.Errorf("%w: %s", err, msg)
		}
		return nil, c.sessionError("run", err)
	}
	return stdout.Bytes(), nil
}

// sessionError wraps err of op, saying so when the connection is gone.
func (c *SSHClient) sessionError(op string, err error) error {
	if lost := c.connErr(); lost != nil {
		return lost
	}
	return &SSHError{Host: c.name, Op: op, Err: err}
}

// connErr returns why the connection ended, or nil if it is up.
func (c *SSHClient) connErr() error {
	select {
	case <-c.connDone:
	default:
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.lost != nil:
		return &SSHError{Host: c.name, Err: c.lost}
	case c.closed:
		return &SSHError{Host: c.name, Err: errSSHClosed}
	default:
		return &SSHError{Host: c.name, Err: fmt.Errorf("%w: the connection broke", ErrSSHConnectionLost)}
	}
}

// wait collects the exit status once the session ends.
func (p *SSHProcess) wait() {
	err := p.sess.Wait()
	p.pid.flush()
	code := -1
	var exit *ssh.ExitError
	switch {
	case err == nil:
		code = 0
	case errors.As(err, &exit) && exit.Signal() != "":
		code = 255 // what ssh(1) exits with for a signal it cannot map
		if sig := unix.SignalNum("SIG" + exit.Signal()); sig != 0 {
			code = 128 + int(sig)
		}
	case errors.As(err, &exit):
		code = exit.ExitStatus()
	default:
		// Usually ExitMissingError: the channel closed without a status,
		// because the connection did. Let its reader notice first.
		select {
		case <-p.c.connDone:
		case <-time.After(time.Second):
		}
		lost := p.c.connErr()
		if lost == nil {
			lost = &SSHError{Host: p.c.name, Op: "wait", Err: err}
		}
		p.finish(code, lost)
		p.sess.Close()
		return
	}
	p.finish(code, nil)
	p.sess.Close()
}

// finish records how the command ended, once.
func (p *SSHProcess) finish(code int, err error) {
	p.finishOnce.Do(func() {
		p.code, p.err = code, err
		close(p.done)
		if p.stopCtx != nil {
			p.stopCtx()
		}
	})
}

// Wait waits for the remote command to end and returns its exit status,
// 128+n when it was killed by signal n. err is non-nil, and the code -1,
// only when the status is unknown: the connection was closed or lost first,
// or the command survived Close.
func (p *SSHProcess) Wait() (exitCode int, err error) {
	<-p.done
	return p.code, p.err
}

// Done is closed when the remote command has ended; Wait then returns at once.
func (p *SSHProcess) Done() <-chan struct{} { return p.done }

// Signal sends sig to the remote command's process group, by running kill
// in a second session: sshd's own "signal" request is refused for root
// logins ("session signalling requires privilege separation", OpenSSH 9.2)
// and unknown before OpenSSH 7.9. It is used only if the remote shell's pid
// has not arrived within StopGrace, and then without any confirmation. Signal waits for kill
// to finish; a command that has already ended is not signalled.
func (p *SSHProcess) Signal(sig syscall.Signal) error {
	name := strings.TrimPrefix(unix.SignalName(sig), "SIG")
	if name == "" {
		return &SSHError{Host: p.c.name, Op: "signal", Err: fmt.Errorf("unknown signal %d", int(sig))}
	}
	op := "signal " + name
	pid := 0
	select {
	case <-p.pid.known:
		pid = p.pid.pid
	case <-p.done:
		return nil
	case <-time.After(p.c.stopGrace):
	}
	if pid <= 0 {
		if err := p.sess.Signal(ssh.Signal(name)); err != nil {
			return &SSHError{Host: p.c.name, Op: op, Err: err}
		}
		return nil
	}
	sess, err := p.c.client.NewSession()
	if err != nil {
		return p.c.sessionError(op, err)
	}
	defer sess.Close()
	select {
	case <-p.done:
		return nil // the pid may be gone, or reused
	default:
	}
	out, err := sess.CombinedOutput(fmt.Sprintf("kill -s %s -- -%d", name, pid))
	if err != nil {
		select {
		case <-p.done:
			return nil // it ended meanwhile
		default:
		}
		return &SSHError{Host: p.c.name, Op: op, Err: fmt.Errorf("kill: %w: %s", err, bytes.TrimSpace(out))}
	}
	return nil
}

// CloseStdin closes the command's stdin (see the stdin contract on
// SSHProcess), which asks a remote `gorun agent` to stop its workers and exit.
func (p *SSHProcess) CloseStdin() error { return p.stdin.Close() }

// Close stops the remote command: EOF on stdin and SIGTERM at once, SIGKILL
// if it has not ended StopGrace later. If it survives another StopGrace
// (sshd keeps a session open while its command lives), Wait gives up with
// an error. Close does not wait; Wait reports how the command ended.
// Calling it again, or after the command ended, does nothing.
func (p *SSHProcess) Close() {
	p.closeOnce.Do(func() {
		select {
		case <-p.done:
			return
		default:
		}
		p.c.log.Debug().Msg("stopping remote command")
		p.stdin.Close()
		go p.stop()
	})
}

// stop is Close's escalation.
func (p *SSHProcess) stop() {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		if err := p.Signal(sig); err != nil {
			p.c.log.Warn().Err(err).Msg("stopping remote command")
		}
		select {
		case <-p.done:
			return
		case <-time.After(p.c.stopGrace):
		}
	}
	p.finish(-1, &SSHError{Host: p.c.name, Op: "stop", Err: errors.New("the remote command survived SIGTERM and SIGKILL; abandoning it")})
}

// pidScanner passes a stream through to w, except the line announcing the
// remote pid. Lines before it (a chatty login script's) pass through too.
type pidScanner struct {
	w      io.Writer
	marker []byte // the session's marker, nonce included
	buf    []byte
	pid    int           // 0 = unknown; set before known is closed
	known  chan struct{} // closed once pid is known or never will be
}

func (s *pidScanner) Write(p []byte) (int, error) {
	if s.buf == nil && s.isKnown() {
		return s.w.Write(p)
	}
	s.buf = append(s.buf, p...)
	for {
		i := bytes.IndexByte(s.buf, '\n')
		if i < 0 {
			if len(s.buf) > 4096 {
				s.flush()
			}
			return len(p), nil
		}
		line := s.buf[:i+1]
		if pid, ok := bytes.CutPrefix(line, s.marker); ok {
			s.pid = parseRemotePid(bytes.TrimSpace(pid))
			rest := s.buf[i+1:]
			s.buf = nil
			close(s.known)
			s.w.Write(rest)
			return len(p), nil
		}
		s.w.Write(line)
		s.buf = s.buf[i+1:]
	}
}

// parseRemotePid reads the remote shell's pid, or 0 for anything that is
// not a pid Signal may kill the process group of: 1 would make it
// `kill -- -1`, every process the remote user may signal.
func parseRemotePid(b []byte) int {
	pid, err := strconv.Atoi(string(b))
	if err != nil || pid <= 1 {
		return 0
	}
	return pid
}

func (s *pidScanner) isKnown() bool {
	select {
	case <-s.known:
		return true
	default:
		return false
	}
}

// flush gives up on the pid: the stream ended or is not what was expected.
// It is called from the goroutine that writes, or after it finished.
func (s *pidScanner) flush() {
	if !s.isKnown() {
		close(s.known)
	}
	if len(s.buf) > 0 {
		s.w.Write(s.buf)
	}
	s.buf = nil
}

// RemoteCommandLine is the line sshd hands to the remote user's login shell
// (`$SHELL -c line`) to run argv in dir with env:
//
//	cd -- 'dir' && exec env 'K=v' ... 'argv0' 'arg1' ...
//
// Every word is single-quoted, a quote inside it written as
//
//	'\''
//
// so the shell expands nothing: the command receives exactly these bytes,
// newlines included. This needs a POSIX shell (sh, bash, dash, zsh, ksh), not csh or
// fish. env(1) is used rather than the SSH "env" request, which sshd drops
// unless the variable is in its AcceptEnv. Without dir there is no cd; the
// command then starts in the login directory. Relative argv0 is looked up in
// the remote PATH (with env's additions).
func RemoteCommandLine(dir string, env []string, argv []string) string {
	var b strings.Builder
	if dir != "" {
		// "--": a folder named "-P" is a folder, not an option.
		b.WriteString("cd -- " + shellQuote(dir) + " && ")
	}
	b.WriteString("exec")
	if len(env) > 0 {
		b.WriteString(" env")
		for _, kv := range env {
			b.WriteString(" " + shellQuote(kv))
		}
	}
	for _, a := range argv {
		b.WriteString(" " + shellQuote(a))
	}
	return b.String()
}

// shellQuote single-quotes s for a POSIX shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// errSSHClosed is the error of a process whose SSHClient was closed.
var errSSHClosed = errors.New("connection closed")
