package launcher

import (
	"bufio"
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
)

// sshdPath must be absolute: sshd re-executes itself.
const sshdPath = "/usr/sbin/sshd"

// nastyValues survive a trip through the remote shell unchanged.
var nastyValues = []string{"a b", "it's", `"dq"`, "$HOME", "`id`", "x\ny\n", `back\slash`, "", "*", "; exit 3"}

func TestRemoteCommandLine(t *testing.T) {
	got := RemoteCommandLine("/w d", []string{"A=it's", "B="}, []string{"prog", "a b"})
	want := `cd '/w d' && exec env 'A=it'\''s' 'B=' 'prog' 'a b'`
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

// sshEnv is a throwaway client side: a key that every test server accepts
// and a known_hosts file that the servers are added to.
type sshEnv struct {
	dir        string
	key        string // the client's private key; key+".pub" is authorized
	knownHosts string
}

// newSSHEnv skips the test when real OpenSSH servers cannot be started
// here, except in CI, where they must be.
func newSSHEnv(t *testing.T) *sshEnv {
	t.Helper()
	var missing []string
	if os.Getuid() != 0 {
		missing = append(missing, "root")
	}
	if _, err := os.Stat(sshdPath); err != nil {
		missing = append(missing, sshdPath)
	}
	for _, tool := range []string{"ssh-keygen", "ssh-agent", "ssh-add"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	if len(missing) > 0 {
		if os.Getenv("CI") == "true" {
			t.Fatalf("ssh tests need %v (apt-get install openssh-server openssh-client)", missing)
		}
		t.Skipf("ssh tests need %v", missing)
	}
	// sshd's privilege separation needs this empty directory.
	if out, err := exec.Command("install", "-d", "-m", "0755", "-o", "root", "-g", "root", "/run/sshd").CombinedOutput(); err != nil {
		t.Fatalf("install -d /run/sshd: %v: %s", err, out)
	}
	e := &sshEnv{dir: t.TempDir()}
	e.key = filepath.Join(e.dir, "id_client")
	e.knownHosts = filepath.Join(e.dir, "known_hosts")
	keygen(t, e.key, "ed25519")
	return e
}

// keygen writes a new key pair of typ at path, with a passphrase if one is
// given.
func keygen(t *testing.T, path, typ string, passphrase ...string) {
	t.Helper()
	out, err := exec.Command("ssh-keygen", "-q", "-t", typ, "-N", strings.Join(passphrase, ""), "-C", "gorun-test", "-f", path).CombinedOutput()
	if err != nil {
		t.Fatalf("ssh-keygen: %v: %s", err, out)
	}
}

// config is the SSHConfig of the tests: nothing from $HOME or the agent.
func (e *sshEnv) config(t *testing.T) SSHConfig {
	return SSHConfig{
		IdentityFiles:  []string{e.key},
		ConfigFile:     "none",
		KnownHosts:     e.knownHosts,
		AgentSocket:    "none",
		ConnectTimeout: 5 * time.Second,
		StopGrace:      time.Second,
		Logger:         testLogger(t),
	}
}

// testSSHD is a real sshd on a loopback address, with its own host keys
// (ed25519 and ecdsa), run until the test ends.
type testSSHD struct {
	addr     string // ip:port
	dir      string
	pid      int
	log      string
	hostKeys map[string]ssh.PublicKey // by type
	exited   chan struct{}
}

// startSSHD starts sshd on ip and a free port, with extra config lines, and
// records its ed25519 key in e.knownHosts.
func (e *sshEnv) startSSHD(t *testing.T, ip string, extra ...string) *testSSHD {
	t.Helper()
	l, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	_, port, _ := net.SplitHostPort(addr)
	s := &testSSHD{addr: addr, dir: filepath.Join(e.dir, "sshd-"+ip+"-"+port), hostKeys: map[string]ssh.PublicKey{}, exited: make(chan struct{})}
	if err := os.Mkdir(s.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	s.log = filepath.Join(s.dir, "sshd.log")
	cfg := []string{
		"Port " + port,
		"ListenAddress " + ip,
		"PidFile none",
		"AuthorizedKeysFile " + e.key + ".pub",
		"PubkeyAuthentication yes",
		"PasswordAuthentication no",
		"KbdInteractiveAuthentication no",
		"PermitRootLogin prohibit-password",
		"UsePAM no",      // no pam_loginuid trouble in containers
		"StrictModes no", // the keys live under the 1777 /tmp
		"UseDNS no",
		"PrintMotd no",
		"LogLevel DEBUG",
		"MaxStartups 100:30:200",
	}
	for _, typ := range []string{"ed25519", "ecdsa"} {
		key := filepath.Join(s.dir, "ssh_host_"+typ+"_key")
		keygen(t, key, typ)
		cfg = append(cfg, "HostKey "+key)
		s.hostKeys[typ] = readPublicKey(t, key+".pub")
	}
	cfgFile := filepath.Join(s.dir, "sshd_config")
	writeFile(t, cfgFile, strings.Join(append(cfg, extra...), "\n")+"\n")

	cmd := exec.Command(sshdPath, "-D", "-f", cfgFile, "-E", s.log)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s.pid = cmd.Process.Pid
	go func() { cmd.Wait(); close(s.exited) }()
	t.Cleanup(func() {
		// The listener, then its connections and their commands.
		pids := append(descendants(s.pid), s.pid)
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		<-s.exited
		if t.Failed() {
			t.Logf("sshd %s log:\n%s", s.addr, readFile(t, s.log))
		}
	})
	s.waitReady(t)
	e.addKnownHost(t, s.addr, s.hostKeys["ed25519"])
	return s
}

// waitReady waits until the server greets a connection with its banner.
func (s *testSSHD) waitReady(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", s.addr, time.Second)
		if err == nil {
			conn.SetDeadline(time.Now().Add(time.Second))
			banner, _ := bufio.NewReader(conn).ReadString('\n')
			conn.Close()
			if strings.HasPrefix(banner, "SSH-2.0-") {
				return
			}
		}
		select {
		case <-s.exited:
			t.Fatalf("sshd exited; log:\n%s", readFile(t, s.log))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("sshd on %s not ready: %v; log:\n%s", s.addr, err, readFile(t, s.log))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// sessionPids are the processes serving the server's connections.
func (s *testSSHD) sessionPids() []int { return descendants(s.pid) }

func (e *sshEnv) addKnownHost(t *testing.T, addr string, key ssh.PublicKey) {
	t.Helper()
	if err := appendKnownHost(e.knownHosts, addr, key); err != nil {
		t.Fatal(err)
	}
}

func readPublicKey(t *testing.T, path string) ssh.PublicKey {
	t.Helper()
	key, _, _, _, err := ssh.ParseAuthorizedKey([]byte(readFile(t, path)))
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func writeFile(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
}

// descendants lists the living descendants of pid.
func descendants(pid int) []int {
	parent := map[int]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(fields) > 1 {
			parent[p], _ = strconv.Atoi(fields[1])
		}
	}
	var out []int
	for p := range parent {
		for a := parent[p]; a > 1; a = parent[a] {
			if a == pid {
				out = append(out, p)
				break
			}
		}
	}
	return out
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
	s := e.startSSHD(t, "127.0.0.1")
	// The server offers ecdsa first, but only its ed25519 key is known:
	// this needs HostKeyAlgorithms from known_hosts.
	c := dial(t, s.addr, e.config(t))

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
	servers := []*testSSHD{e.startSSHD(t, "127.0.0.1"), e.startSSHD(t, "127.0.0.2")}
	var procs []*SSHProcess
	var outs []*waitingWriter
	for i, s := range servers {
		c := dial(t, s.addr, e.config(t))
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
		outs[i].waitFor(t, fmt.Sprintf("rank %d on %s\n", i, strings.Replace(s.addr, ":", " ", 1)))
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
	s := e.startSSHD(t, "127.0.0.2")
	cfg := e.config(t)
	cfg.KnownHosts = filepath.Join(e.dir, "new", "known_hosts") // not there yet
	ctx := context.Background()

	_, err := DialSSH(ctx, s.addr, cfg)
	var hk *HostKeyError
	if !errors.As(err, &hk) || hk.Changed() {
		t.Fatalf("unknown host: got %v", err)
	}
	for _, want := range []string{"launcher: ssh " + s.addr + ": unknown host key (", "SHA256:", "not in " + cfg.KnownHosts, "--ssh-accept-new"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}

	cfg.AcceptNew = true
	dial(t, s.addr, cfg).Close()
	text := readFile(t, cfg.KnownHosts)
	if !strings.HasPrefix(text, "["+strings.Replace(s.addr, ":", "]:", 1)+" ") || strings.Count(text, "\n") != 1 {
		t.Errorf("known_hosts after accept-new:\n%s", text)
	}
	cfg.AcceptNew = false
	dial(t, s.addr, cfg).Close()

	// A changed key: the recorded one is not the server's.
	other := filepath.Join(e.dir, "other_host_key")
	keygen(t, other, "ed25519")
	writeFile(t, cfg.KnownHosts, "# old key\n"+knownHostsLine(s.addr, readPublicKey(t, other+".pub")))
	before := readFile(t, cfg.KnownHosts)
	for _, accept := range []bool{false, true} {
		cfg.AcceptNew = accept
		_, err := DialSSH(ctx, s.addr, cfg)
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
	s := e.startSSHD(t, "127.0.0.1")
	encrypted := filepath.Join(e.dir, "id_encrypted")
	keygen(t, encrypted, "ed25519", "secret")
	cfg := e.config(t)
	cfg.IdentityFiles = []string{encrypted, filepath.Join(e.dir, "absent")}

	_, err := DialSSH(context.Background(), s.addr, cfg)
	var se *SSHError
	if !errors.As(err, &se) || !strings.HasPrefix(se.Op, "auth") {
		t.Fatalf("got %v, want an auth error", err)
	}
	for _, want := range []string{s.addr, "no ssh-agent", encrypted + " (has a passphrase)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}

	// The agent has the key.
	sock := filepath.Join(e.dir, "agent.sock")
	agent := exec.Command("ssh-agent", "-D", "-a", sock)
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { agent.Process.Kill(); agent.Wait() })
	for i := 0; ; i++ {
		add := exec.Command("ssh-add", e.key)
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
	c := dial(t, s.addr, cfg)
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
	jump := e.startSSHD(t, "127.0.0.1", "AllowTcpForwarding yes")
	target := e.startSSHD(t, "127.0.0.2", "AllowTcpForwarding yes")
	// Everything comes from the default places in $HOME.
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("SSH_AUTH_SOCK", "")
	if err := os.MkdirAll(filepath.Join(home, ".ssh", "keys"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(e.key, filepath.Join(home, ".ssh", "keys", "id")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(e.knownHosts, filepath.Join(home, ".ssh", "known_hosts")); err != nil {
		t.Fatal(err)
	}
	hostPort := func(s *testSSHD) (string, string) { h, p, _ := net.SplitHostPort(s.addr); return h, p }
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
	cfg := SSHConfig{Logger: testLogger(t), ConnectTimeout: 5 * time.Second}

	hostOf := func(c *SSHClient) string {
		stdout, _, _ := run(t, c, "", nil, "/bin/sh", "-c", `echo "${SSH_CONNECTION#* * }"`)
		return strings.Replace(strings.TrimSpace(stdout), " ", ":", 1)
	}
	c := dial(t, "node2", cfg)
	if got := hostOf(c); got != target.addr {
		t.Errorf("node2 reached %s, want %s", got, target.addr)
	}
	if c.Host() != "node2 ("+target.addr+")" {
		t.Errorf("Host() = %q", c.Host())
	}

	forwards := func(s *testSSHD) int { return strings.Count(readFile(t, s.log), "server_request_direct_tcpip") }
	c = dial(t, "via-node1", cfg)
	if got := hostOf(c); got != target.addr {
		t.Errorf("via-node1 reached %s, want %s", got, target.addr)
	}
	if forwards(jump) != 1 {
		t.Errorf("the jump host forwarded %d connections, want 1", forwards(jump))
	}
	c = dial(t, "via-both", cfg)
	if got := hostOf(c); got != target.addr {
		t.Errorf("via-both reached %s, want %s", got, target.addr)
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
	s := e.startSSHD(t, "127.0.0.1")
	c := dial(t, s.addr, e.config(t))

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
		c := dial(t, s.addr, e.config(t))
		p, _ := startSleeper(t, context.Background(), c, "")
		c.Close()
		code, err := waitExit(t, p, 5*time.Second)
		if code != -1 || err == nil || !strings.Contains(err.Error(), s.addr+": connection closed") {
			t.Errorf("exit %d, %v", code, err)
		}
	})
}

func TestSSHConnectionLost(t *testing.T) {
	e := newSSHEnv(t)
	t.Run("frozen server", func(t *testing.T) {
		s := e.startSSHD(t, "127.0.0.1")
		cfg := e.config(t)
		cfg.KeepAlive = 100 * time.Millisecond
		c := dial(t, s.addr, cfg)
		p, _ := startSleeper(t, context.Background(), c, "")
		// The connection stays open, but nothing answers any more.
		frozen := s.sessionPids()
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
		if code != -1 || !errors.Is(err, ErrSSHConnectionLost) || !strings.Contains(err.Error(), "launcher: ssh "+s.addr+": connection lost") {
			t.Errorf("exit %d, %v", code, err)
		}
		t.Logf("lost after %v: %v", time.Since(start), err)
	})
	t.Run("killed server", func(t *testing.T) {
		s := e.startSSHD(t, "127.0.0.2")
		c := dial(t, s.addr, e.config(t))
		p, _ := startSleeper(t, context.Background(), c, "")
		for _, pid := range append(s.sessionPids(), s.pid) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		code, err := waitExit(t, p, 5*time.Second)
		if code != -1 || !errors.Is(err, ErrSSHConnectionLost) || !strings.Contains(err.Error(), s.addr) {
			t.Errorf("exit %d, %v", code, err)
		}
	})
}
