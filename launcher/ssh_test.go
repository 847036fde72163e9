package launcher

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/gorun/gorun/internal/sshtest"
)

// nastyValues survive a trip through the remote shell unchanged.
var nastyValues = []string{"a b", "it's", `"dq"`, "$HOME", "`id`", "x\ny\n", `back\slash`, "", "*", "; exit 3"}

func TestRemoteCommandLine(t *testing.T) {
	got := RemoteCommandLine("/w d", []string{"A=it's", "B="}, []string{"prog", "a b"})
	want := `cd -- '/w d' && exec env 'A=it'\''s' 'B=' 'prog' 'a b'`
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	if got := RemoteCommandLine("", nil, []string{"true"}); got != `exec 'true'` {
		t.Errorf("got %s", got)
	}

	// What sshd does with the line: $SHELL -c line.
	dir := t.TempDir()
	env := []string{"GORUN_A=" + strings.Join(nastyValues, "|")}
	argv := append([]string{"/bin/sh", "-c", `printf '%s\0' "$PWD" "$GORUN_A" "$@"`, "sh"}, nastyValues...)
	out, err := exec.Command("/bin/sh", "-c", RemoteCommandLine(dir, env, argv)).Output()
	if err != nil {
		t.Fatal(err)
	}
	wantOut := append([]string{dir, strings.Join(nastyValues, "|")}, nastyValues...)
	if got := strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00"); !slices.Equal(got, wantOut) {
		t.Errorf("got %q\nwant %q", got, wantOut)
	}
}

func TestSplitSSHHost(t *testing.T) {
	for _, tc := range []struct {
		in, user, host string
		port           int
	}{
		{"node1", "", "node1", 0},
		{"bob@node1:2222", "bob", "node1", 2222},
		{"10.0.0.1:22", "", "10.0.0.1", 22},
		{"fe80::1", "", "fe80::1", 0},
		{"u@[fe80::1]:23", "u", "fe80::1", 23},
	} {
		user, host, port, err := splitSSHHost(tc.in)
		if err != nil || user != tc.user || host != tc.host || port != tc.port {
			t.Errorf("splitSSHHost(%q) = %q %q %d %v", tc.in, user, host, port, err)
		}
	}
	for _, bad := range []string{"", "u@", "h:0", "h:x", "h:99999"} {
		if _, _, _, err := splitSSHHost(bad); err == nil {
			t.Errorf("splitSSHHost(%q) succeeded", bad)
		}
	}
}

func TestSSHHandshakeTimeout(t *testing.T) {
	// A peer that accepts but never speaks.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			defer conn.Close()
		}
	}()
	cfg := SSHConfig{ConfigFile: "none", KnownHosts: filepath.Join(t.TempDir(), "known_hosts"), AgentSocket: "none",
		IdentityFiles: []string{"absent"}, ConnectTimeout: 200 * time.Millisecond, Logger: testLogger(t)}
	start := time.Now()
	_, err = DialSSH(context.Background(), l.Addr().String(), cfg)
	want := "launcher: ssh " + l.Addr().String() + ": handshake: timed out after 200ms"
	if err == nil || err.Error() != want {
		t.Errorf("got %v, want %s", err, want)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	cfg.ConnectTimeout = 0
	if _, err = DialSSH(ctx, l.Addr().String(), cfg); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("got %v, want the context's error", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("took %v", d)
	}
}

// sshEnv is the client side of the tests' real OpenSSH servers.
type sshEnv = sshtest.Env

// testSSHD is a real sshd on a loopback address.
type testSSHD = sshtest.SSHD

// newSSHEnv skips the test when real OpenSSH servers cannot be started
// here, except in CI, where they must be.
func newSSHEnv(t *testing.T) *sshEnv { return sshtest.NewEnv(t) }

func keygen(t *testing.T, path, typ string, passphrase ...string) {
	t.Helper()
	sshtest.Keygen(t, path, typ, passphrase...)
}

// testConfig is the SSHConfig of the tests: nothing from $HOME or the agent.
func testConfig(t *testing.T, e *sshEnv) SSHConfig {
	return SSHConfig{
		IdentityFiles:  []string{e.Key},
		ConfigFile:     "none",
		KnownHosts:     e.KnownHosts,
		AgentSocket:    "none",
		ConnectTimeout: 5 * time.Second,
		StopGrace:      time.Second,
		Logger:         testLogger(t),
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	return sshtest.ReadFile(t, path)
}

func writeFile(t *testing.T, path, text string) {
	t.Helper()
	sshtest.WriteFile(t, path, text)
}

func dial(t *testing.T, host string, cfg SSHConfig) *SSHClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := DialSSH(ctx, host, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// run runs argv on c and returns its output and exit status.
func run(t *testing.T, c *SSHClient, dir string, env []string, argv ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errOut bytes.Buffer
	p, err := c.Start(context.Background(), dir, env, argv, &out, &errOut)
	if err != nil {
		t.Fatal(err)
	}
	code, err = p.Wait()
	if err != nil {
		t.Fatal(err)
	}
	return out.String(), errOut.String(), code
}

// startSleeper starts a remote sleep 300 that records its pid, and returns
// the process and that pid.
func startSleeper(t *testing.T, ctx context.Context, c *SSHClient, script string) (*SSHProcess, int) {
	t.Helper()
	pidFile := filepath.Join(t.TempDir(), "pid")
	out := newWaitingWriter()
	p, err := c.Start(ctx, "", nil, []string{"/bin/sh", "-c", script + `echo $$ > "$1.tmp" && mv "$1.tmp" "$1" && echo started && exec sleep 300`, "sh", pidFile}, out, out)
	if err != nil {
		t.Fatal(err)
	}
	out.waitFor(t, "started")
	pid, err := strconv.Atoi(strings.TrimSpace(readFile(t, pidFile)))
	if err != nil {
		t.Fatal(err)
	}
	killOnCleanup(t, pid)
	if got := remotePid(t, p); got != pid {
		t.Errorf("the remote shell announced pid %d, not %d", got, pid)
	}
	return p, pid
}

// remotePid returns the pid that the remote shell of p announced, and kills
// it when the test ends (the remote host is this one).
func remotePid(t *testing.T, p *SSHProcess) int {
	t.Helper()
	select {
	case <-p.pid.known:
	case <-time.After(5 * time.Second):
		t.Fatal("no pid from the remote shell")
	}
	if p.pid.pid <= 0 {
		t.Fatal("no pid from the remote shell")
	}
	killOnCleanup(t, p.pid.pid)
	return p.pid.pid
}

// waitExit waits for p with a deadline.
func waitExit(t *testing.T, p *SSHProcess, timeout time.Duration) (int, error) {
	t.Helper()
	select {
	case <-p.Done():
	case <-time.After(timeout):
		t.Fatalf("remote command still running after %v", timeout)
	}
	return p.Wait()
}

func TestSSHRun(t *testing.T) {
	e := newSSHEnv(t)
	s := e.StartSSHD(t, "127.0.0.1")
	// The server offers ecdsa first, but only its ed25519 key is known:
	// this needs HostKeyAlgorithms from known_hosts.
	c := dial(t, s.Addr, testConfig(t, e))

	t.Run("env and args", func(t *testing.T) {
		var env []string
		for i, v := range nastyValues {
			env = append(env, fmt.Sprintf("GORUN_V%d=%s", i, v))
		}
		script := `for i in $(seq 0 $(($# - 1))); do eval "printf '%s\0' \"\$GORUN_V$i\""; done; printf '%s\0' "$@"`
		stdout, stderr, code := run(t, c, "", env, append([]string{"/bin/sh", "-c", script, "sh"}, nastyValues...)...)
		want := append(slices.Clone(nastyValues), nastyValues...)
		got := strings.Split(strings.TrimSuffix(stdout, "\x00"), "\x00")
		if code != 0 || !slices.Equal(got, want) {
			t.Errorf("exit %d, stderr %q\ngot  %q\nwant %q", code, stderr, got, want)
		}
	})
	t.Run("dir", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "it's a dir")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if stdout, _, _ := run(t, c, dir, nil, "pwd"); stdout != dir+"\n" {
			t.Errorf("pwd = %q, want %q", stdout, dir)
		}
		_, stderr, code := run(t, c, filepath.Join(dir, "missing"), nil, "pwd")
		if code == 0 || !strings.Contains(stderr, "missing") {
			t.Errorf("cd to a missing dir: exit %d, stderr %q", code, stderr)
		}
	})
	t.Run("exit status", func(t *testing.T) {
		stdout, stderr, code := run(t, c, "", nil, "/bin/sh", "-c", "echo out; echo err >&2; exit 7")
		if code != 7 || stdout != "out\n" || stderr != "err\n" {
			t.Errorf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
		}
		if _, _, code := run(t, c, "", nil, "gorun-no-such-command"); code != 127 {
			t.Errorf("missing command: exit %d, want 127", code)
		}
	})
	t.Run("signal", func(t *testing.T) {
		if _, _, code := run(t, c, "", nil, "/bin/sh", "-c", "kill -KILL $$"); code != 128+9 {
			t.Errorf("exit %d, want %d", code, 128+9)
		}
	})
	t.Run("bad argv", func(t *testing.T) {
		for _, argv := range [][]string{nil, {""}, {"A=1"}, {"-x"}} {
			if _, err := c.Start(context.Background(), "", nil, argv, nil, nil); err == nil {
				t.Errorf("Start(%q) succeeded", argv)
			}
		}
		if _, err := c.Start(context.Background(), "", []string{"NOVALUE"}, []string{"true"}, nil, nil); err == nil {
			t.Error("Start with env entry NOVALUE succeeded")
		}
	})
}

func TestSSHTwoHosts(t *testing.T) {
	e := newSSHEnv(t)
	servers := []*testSSHD{e.StartSSHD(t, "127.0.0.1"), e.StartSSHD(t, "127.0.0.2")}
	var procs []*SSHProcess
	var outs []*waitingWriter
	for i, s := range servers {
		c := dial(t, s.Addr, testConfig(t, e))
		out := newWaitingWriter()
		// Output must arrive while the command is still running.
		p, err := c.Start(context.Background(), "", []string{"GORUN_RANK=" + strconv.Itoa(i)},
			[]string{"/bin/sh", "-c", `echo "rank $GORUN_RANK on ${SSH_CONNECTION#* * }"; exec sleep 300`}, out, out)
		if err != nil {
			t.Fatal(err)
		}
		remotePid(t, p)
		procs, outs = append(procs, p), append(outs, out)
	}
	for i, s := range servers {
		outs[i].waitFor(t, fmt.Sprintf("rank %d on %s\n", i, strings.Replace(s.Addr, ":", " ", 1)))
	}
	for _, p := range procs {
		p.Close()
	}
	for _, p := range procs {
		if code, err := waitExit(t, p, 5*time.Second); code != 128+15 || err != nil {
			t.Errorf("after Close: exit %d, %v; want %d", code, err, 128+15)
		}
	}
}

func TestSSHHostKeys(t *testing.T) {
	e := newSSHEnv(t)
	s := e.StartSSHD(t, "127.0.0.2")
	cfg := testConfig(t, e)
	cfg.KnownHosts = filepath.Join(e.Dir, "new", "known_hosts") // not there yet
	ctx := context.Background()

	_, err := DialSSH(ctx, s.Addr, cfg)
	var hk *HostKeyError
	if !errors.As(err, &hk) || hk.Changed() {
		t.Fatalf("unknown host: got %v", err)
	}
	for _, want := range []string{"launcher: ssh " + s.Addr + ": unknown host key (", "SHA256:", "not in " + cfg.KnownHosts, "--ssh-accept-new"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}

	cfg.AcceptNew = true
	dial(t, s.Addr, cfg).Close()
	text := readFile(t, cfg.KnownHosts)
	if !strings.HasPrefix(text, "["+strings.Replace(s.Addr, ":", "]:", 1)+" ") || strings.Count(text, "\n") != 1 {
		t.Errorf("known_hosts after accept-new:\n%s", text)
	}
	cfg.AcceptNew = false
	dial(t, s.Addr, cfg).Close()

	// A changed key: the recorded one is not the server's.
	other := filepath.Join(e.Dir, "other_host_key")
	keygen(t, other, "ed25519")
	writeFile(t, cfg.KnownHosts, "# old key\n"+knownHostsLine(s.Addr, sshtest.ReadPublicKey(t, other+".pub")))
	before := readFile(t, cfg.KnownHosts)
	for _, accept := range []bool{false, true} {
		cfg.AcceptNew = accept
		_, err := DialSSH(ctx, s.Addr, cfg)
		if !errors.As(err, &hk) || !hk.Changed() {
			t.Fatalf("changed key (accept-new %v): got %v", accept, err)
		}
		for _, want := range []string{"REMOTE HOST KEY CHANGED", cfg.KnownHosts + ":2", "ssh-keygen -R"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q lacks %q", err, want)
			}
		}
	}
	if after := readFile(t, cfg.KnownHosts); after != before {
		t.Errorf("known_hosts changed:\n%s", after)
	}
}

func knownHostsLine(addr string, key ssh.PublicKey) string {
	return "[" + strings.Replace(addr, ":", "]:", 1) + " " + string(ssh.MarshalAuthorizedKey(key))
}

func TestSSHAuth(t *testing.T) {
	e := newSSHEnv(t)
	s := e.StartSSHD(t, "127.0.0.1")
	encrypted := filepath.Join(e.Dir, "id_encrypted")
	keygen(t, encrypted, "ed25519", "secret")
	cfg := testConfig(t, e)
	cfg.IdentityFiles = []string{encrypted, filepath.Join(e.Dir, "absent")}

	_, err := DialSSH(context.Background(), s.Addr, cfg)
	var se *SSHError
	if !errors.As(err, &se) || !strings.HasPrefix(se.Op, "auth") {
		t.Fatalf("got %v, want an auth error", err)
	}
	for _, want := range []string{s.Addr, "no ssh-agent", encrypted + " (has a passphrase)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}

	// The agent has the key.
	sock := filepath.Join(e.Dir, "agent.sock")
	agent := exec.Command("ssh-agent", "-D", "-a", sock)
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { agent.Process.Kill(); agent.Wait() })
	for i := 0; ; i++ {
		add := exec.Command("ssh-add", e.Key)
		add.Env = append(os.Environ(), "SSH_AUTH_SOCK="+sock)
		out, err := add.CombinedOutput()
		if err == nil {
			break
		}
		if i == 100 {
			t.Fatalf("ssh-add: %v: %s", err, out)
		}
		time.Sleep(10 * time.Millisecond) // the agent is starting
	}
	cfg.AgentSocket = sock
	c := dial(t, s.Addr, cfg)
	if _, _, code := run(t, c, "", nil, "true"); code != 0 {
		t.Errorf("exit %d", code)
	}

	// Nobody listens.
	_, err = DialSSH(context.Background(), "127.0.0.1:1", cfg)
	if !errors.As(err, &se) || se.Op != "dial" || !strings.Contains(err.Error(), "launcher: ssh 127.0.0.1:1: dial: ") {
		t.Errorf("got %v, want a dial error", err)
	}
}

func TestSSHConfigFile(t *testing.T) {
	e := newSSHEnv(t)
	jump := e.StartSSHD(t, "127.0.0.1", "AllowTcpForwarding yes")
	target := e.StartSSHD(t, "127.0.0.2", "AllowTcpForwarding yes")
	// Everything comes from the default places in $HOME.
	home := t.TempDir()
	if err := os.MkdirAll(filepath.Join(home, ".ssh", "keys"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(e.Key, filepath.Join(home, ".ssh", "keys", "id")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(e.KnownHosts, filepath.Join(home, ".ssh", "known_hosts")); err != nil {
		t.Fatal(err)
	}
	hostPort := func(s *testSSHD) (string, string) { h, p, _ := net.SplitHostPort(s.Addr); return h, p }
	jh, jp := hostPort(jump)
	th, tp := hostPort(target)
	writeFile(t, filepath.Join(home, ".ssh", "config"), fmt.Sprintf(`
Host node1
  HostName %s
  Port %s
Host node2 via-node1 via-both
  HostName %s
  Port %s
Host via-node1
  ProxyJump node1
Host via-both
  ProxyJump node1,node2
Host *
  User root
  IdentityFile ~/.ssh/keys/id
  ConnectTimeout 5
`, jh, jp, th, tp))
	env := map[string]string{"HOME": home}
	cfg := SSHConfig{Logger: testLogger(t), ConnectTimeout: 5 * time.Second,
		LookupEnv: func(name string) (string, bool) { v, ok := env[name]; return v, ok }}

	hostOf := func(c *SSHClient) string {
		stdout, _, _ := run(t, c, "", nil, "/bin/sh", "-c", `echo "${SSH_CONNECTION#* * }"`)
		return strings.Replace(strings.TrimSpace(stdout), " ", ":", 1)
	}
	c := dial(t, "node2", cfg)
	if got := hostOf(c); got != target.Addr {
		t.Errorf("node2 reached %s, want %s", got, target.Addr)
	}
	if c.Host() != "node2 ("+target.Addr+")" {
		t.Errorf("Host() = %q", c.Host())
	}

	forwards := func(s *testSSHD) int { return strings.Count(readFile(t, s.Log), "server_request_direct_tcpip") }
	c = dial(t, "via-node1", cfg)
	if got := hostOf(c); got != target.Addr {
		t.Errorf("via-node1 reached %s, want %s", got, target.Addr)
	}
	if forwards(jump) != 1 {
		t.Errorf("the jump host forwarded %d connections, want 1", forwards(jump))
	}
	c = dial(t, "via-both", cfg)
	if got := hostOf(c); got != target.Addr {
		t.Errorf("via-both reached %s, want %s", got, target.Addr)
	}
	if forwards(jump) != 2 || forwards(target) != 1 {
		t.Errorf("jump hosts forwarded %d and %d connections, want 2 and 1", forwards(jump), forwards(target))
	}

	// A user@ and a port in the host string beat ssh_config.
	_, err := DialSSH(context.Background(), "nobody@node1:1", cfg)
	if err == nil || !strings.Contains(err.Error(), "node1 ("+jh+":1): dial") {
		t.Errorf("got %v", err)
	}
}

func TestSSHStop(t *testing.T) {
	e := newSSHEnv(t)
	s := e.StartSSHD(t, "127.0.0.1")
	c := dial(t, s.Addr, testConfig(t, e))

	t.Run("context", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		p, pid := startSleeper(t, ctx, c, "")
		cancel()
		if code, err := waitExit(t, p, 5*time.Second); code != 128+15 || err != nil {
			t.Errorf("exit %d, %v; want %d", code, err, 128+15)
		}
		waitGone(t, 5*time.Second, pid)
	})
	t.Run("close ignoring SIGTERM", func(t *testing.T) {
		p, pid := startSleeper(t, context.Background(), c, "trap '' TERM; ")
		start := time.Now()
		p.Close()
		if code, err := waitExit(t, p, 5*time.Second); code != 128+9 || err != nil {
			t.Errorf("exit %d, %v; want %d", code, err, 128+9)
		}
		if d := time.Since(start); d < time.Second {
			t.Errorf("SIGKILL after %v, before the grace of 1s", d)
		}
		waitGone(t, 5*time.Second, pid)
	})
	t.Run("stdin EOF", func(t *testing.T) {
		out := newWaitingWriter()
		p, err := c.Start(context.Background(), "", nil, []string{"/bin/sh", "-c", "echo reading; cat; echo eof"}, out, out)
		if err != nil {
			t.Fatal(err)
		}
		out.waitFor(t, "reading")
		p.CloseStdin()
		if code, err := waitExit(t, p, 5*time.Second); code != 0 || err != nil || out.String() != "reading\neof\n" {
			t.Errorf("exit %d, %v, output %q", code, err, out.String())
		}
	})
	t.Run("client close", func(t *testing.T) {
		c := dial(t, s.Addr, testConfig(t, e))
		p, _ := startSleeper(t, context.Background(), c, "")
		c.Close()
		code, err := waitExit(t, p, 5*time.Second)
		if code != -1 || err == nil || !strings.Contains(err.Error(), s.Addr+": connection closed") {
			t.Errorf("exit %d, %v", code, err)
		}
	})
}

func TestSSHConnectionLost(t *testing.T) {
	e := newSSHEnv(t)
	t.Run("frozen server", func(t *testing.T) {
		s := e.StartSSHD(t, "127.0.0.1")
		cfg := testConfig(t, e)
		cfg.KeepAlive = 100 * time.Millisecond
		c := dial(t, s.Addr, cfg)
		p, _ := startSleeper(t, context.Background(), c, "")
		// The connection stays open, but nothing answers any more.
		frozen := s.SessionPids()
		for _, pid := range frozen {
			syscall.Kill(pid, syscall.SIGSTOP)
		}
		t.Cleanup(func() {
			for _, pid := range frozen {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		})
		start := time.Now()
		code, err := waitExit(t, p, 5*time.Second)
		if code != -1 || !errors.Is(err, ErrSSHConnectionLost) || !strings.Contains(err.Error(), "launcher: ssh "+s.Addr+": connection lost") {
			t.Errorf("exit %d, %v", code, err)
		}
		t.Logf("lost after %v: %v", time.Since(start), err)
	})
	t.Run("killed server", func(t *testing.T) {
		s := e.StartSSHD(t, "127.0.0.2")
		c := dial(t, s.Addr, testConfig(t, e))
		p, _ := startSleeper(t, context.Background(), c, "")
		for _, pid := range append(s.SessionPids(), s.Pid) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		code, err := waitExit(t, p, 5*time.Second)
		if code != -1 || !errors.Is(err, ErrSSHConnectionLost) || !strings.Contains(err.Error(), s.Addr) {
			t.Errorf("exit %d, %v", code, err)
		}
	})
}

// Only the session's own marker names the remote pid: a login script's
// look-alike line passes through as output, and a pid that would make
// Signal kill more than the command's process group is refused.
func TestPidScannerTrustsOnlyItsMarker(t *testing.T) {
	for _, tc := range []struct {
		out     string
		wantPid int
		wantOut string
	}{
		{"gorun-remote-pid N1 4242\nhello\n", 4242, "hello\n"},
		{"gorun-remote-pid 1\ngorun-remote-pid N1 77\nx\n", 77, "gorun-remote-pid 1\nx\n"},
		{"gorun-remote-pid N1 1\n", 0, ""},
		{"gorun-remote-pid N1 -1\n", 0, ""},
		{"gorun-remote-pid N1 0\n", 0, ""},
		{"gorun-remote-pid N2 99\n", 0, "gorun-remote-pid N2 99\n"},
	} {
		var out bytes.Buffer
		s := &pidScanner{w: &out, marker: []byte(remotePidMarker + "N1 "), known: make(chan struct{})}
		s.Write([]byte(tc.out))
		s.flush()
		if s.pid != tc.wantPid || out.String() != tc.wantOut {
			t.Errorf("%q: pid %d, output %q; want %d, %q", tc.out, s.pid, out.String(), tc.wantPid, tc.wantOut)
		}
	}
}
