// Package sshtest starts real OpenSSH servers on loopback addresses for
// tests: each with its own host keys, all accepting one client key, and a
// known_hosts file that lists them. It is used only by tests.
package sshtest

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/gorun/gorun/internal/testenv"
)

// SSHDPath must be absolute: sshd re-executes itself.
const SSHDPath = "/usr/sbin/sshd"

// Env is a throwaway client side: a key that every test server accepts
// and a known_hosts file that the servers are added to.
type Env struct {
	Dir        string
	Key        string // the client's private key; Key+".pub" is authorized
	KnownHosts string
}

// NewEnv skips the test when real OpenSSH servers cannot be started here
// (they need root, sshd and the client's tools), naming what to install,
// except in CI (CI=true), where they must be (testenv's rule).
func NewEnv(t testing.TB) *Env {
	t.Helper()
	// The programs first: without them, root alone would not do.
	testenv.MustHaveCommand(t, SSHDPath, "openssh-server")
	for _, tool := range []string{"ssh", "ssh-keygen", "ssh-agent", "ssh-add"} {
		testenv.MustHaveCommand(t, tool, "openssh-client")
	}
	testenv.MustHaveRoot(t, "sshd servers")
	// sshd's privilege separation needs this empty directory.
	if out, err := exec.Command("install", "-d", "-m", "0755", "-o", "root", "-g", "root", "/run/sshd").CombinedOutput(); err != nil {
		t.Fatalf("install -d /run/sshd: %v: %s", err, out)
	}
	e := &Env{Dir: t.TempDir()}
	e.Key = filepath.Join(e.Dir, "id_client")
	e.KnownHosts = filepath.Join(e.Dir, "known_hosts")
	Keygen(t, e.Key, "ed25519")
	return e
}

// Keygen writes a new key pair of typ at path, with a passphrase if one is
// given.
func Keygen(t testing.TB, path, typ string, passphrase ...string) {
	t.Helper()
	out, err := exec.Command("ssh-keygen", "-q", "-t", typ, "-N", strings.Join(passphrase, ""), "-C", "gorun-test", "-f", path).CombinedOutput()
	if err != nil {
		t.Fatalf("ssh-keygen: %v: %s", err, out)
	}
}

// SSHD is a real sshd on a loopback address, with its own host keys
// (ed25519 and ecdsa), run until the test ends.
type SSHD struct {
	Addr     string // ip:port
	Dir      string
	Pid      int
	Log      string
	HostKeys map[string]ssh.PublicKey // by type
	Exited   chan struct{}
}

// Port is the server's port.
func (s *SSHD) Port() string {
	_, port, _ := net.SplitHostPort(s.Addr)
	return port
}

// StartSSHD starts sshd on ip and a free port, with extra config lines, and
// records its ed25519 key in e.KnownHosts. The server, its sessions and
// their commands are killed when the test ends.
func (e *Env) StartSSHD(t testing.TB, ip string, extra ...string) *SSHD {
	t.Helper()
	l, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	_, port, _ := net.SplitHostPort(addr)
	s := &SSHD{Addr: addr, Dir: filepath.Join(e.Dir, "sshd-"+ip+"-"+port), HostKeys: map[string]ssh.PublicKey{}, Exited: make(chan struct{})}
	if err := os.Mkdir(s.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	s.Log = filepath.Join(s.Dir, "sshd.log")
	cfg := []string{
		"Port " + port,
		"ListenAddress " + ip,
		"PidFile none",
		"AuthorizedKeysFile " + e.Key + ".pub",
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
		key := filepath.Join(s.Dir, "ssh_host_"+typ+"_key")
		Keygen(t, key, typ)
		cfg = append(cfg, "HostKey "+key)
		s.HostKeys[typ] = ReadPublicKey(t, key+".pub")
	}
	cfgFile := filepath.Join(s.Dir, "sshd_config")
	WriteFile(t, cfgFile, strings.Join(append(cfg, extra...), "\n")+"\n")

	cmd := exec.Command(SSHDPath, "-D", "-f", cfgFile, "-E", s.Log)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s.Pid = cmd.Process.Pid
	go func() { cmd.Wait(); close(s.Exited) }()
	t.Cleanup(func() {
		// The listener, then its connections and their commands.
		pids := append(Descendants(s.Pid), s.Pid)
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		<-s.Exited
		if t.Failed() {
			t.Logf("sshd %s log:\n%s", s.Addr, ReadFile(t, s.Log))
		}
	})
	s.waitReady(t)
	e.AddKnownHost(t, s.Addr, s.HostKeys["ed25519"])
	return s
}

// waitReady waits until the server greets a connection with its banner.
func (s *SSHD) waitReady(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", s.Addr, time.Second)
		if err == nil {
			conn.SetDeadline(time.Now().Add(time.Second))
			banner, _ := bufio.NewReader(conn).ReadString('\n')
			conn.Close()
			if strings.HasPrefix(banner, "SSH-2.0-") {
				return
			}
		}
		select {
		case <-s.Exited:
			t.Fatalf("sshd exited; log:\n%s", ReadFile(t, s.Log))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("sshd on %s not ready: %v; log:\n%s", s.Addr, err, ReadFile(t, s.Log))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// SessionPids are the processes serving the server's connections.
func (s *SSHD) SessionPids() []int { return Descendants(s.Pid) }

// AddKnownHost records key for addr ("host:port") in e.KnownHosts.
func (e *Env) AddKnownHost(t testing.TB, addr string, key ssh.PublicKey) {
	t.Helper()
	f, err := os.OpenFile(e.KnownHosts, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(knownhosts.Line([]string{knownhosts.Normalize(addr)}, key) + "\n"); err != nil {
		t.Fatal(err)
	}
}

// WriteSSHConfig writes an ssh_config file in e.Dir that reaches each
// server by its IP address with e's key and known_hosts and no agent, and
// returns its path.
func (e *Env) WriteSSHConfig(t testing.TB, servers ...*SSHD) string {
	t.Helper()
	var b strings.Builder
	for _, s := range servers {
		host, port, _ := net.SplitHostPort(s.Addr)
		b.WriteString("Host " + host + "\n  Port " + port + "\n")
	}
	return e.WriteSSHConfigText(t, "ssh_config", b.String())
}

// WriteSSHConfigText writes the ssh_config file name in e.Dir: text (the
// test's own Host and Match blocks), then a Host * block that logs in with
// e's key and known_hosts and no agent. It returns the file's path.
func (e *Env) WriteSSHConfigText(t testing.TB, name, text string) string {
	t.Helper()
	path := filepath.Join(e.Dir, name)
	WriteFile(t, path, text+"\nHost *\n  IdentityFile "+e.Key+"\n  IdentitiesOnly yes\n  IdentityAgent none\n  UserKnownHostsFile "+e.KnownHosts+"\n")
	return path
}

// OutsideIPv4 is an IPv4 address of this machine that is neither loopback
// nor link-local, for a server that must not look local to its clients,
// and the same address written as one decimal number ("192.0.2.2" is
// "3221225986"): a host name that glibc's resolver (so OpenSSH) reads as
// the address and Go's does not.
func OutsideIPv4(t testing.TB) (ip, decimal string) {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip4 := n.IP.To4(); ip4 != nil && !ip4.IsLoopback() && !ip4.IsLinkLocalUnicast() {
				return ip4.String(), strconv.FormatUint(uint64(ip4[0])<<24|uint64(ip4[1])<<16|uint64(ip4[2])<<8|uint64(ip4[3]), 10)
			}
		}
	}
	testenv.MustHave(t, fmt.Errorf("sshtest: interfaces have %v", addrs), "an IPv4 address other than loopback", "")
	return "", ""
}

// ReadPublicKey reads an authorized_keys-format public key.
func ReadPublicKey(t testing.TB, path string) ssh.PublicKey {
	t.Helper()
	key, _, _, _, err := ssh.ParseAuthorizedKey([]byte(ReadFile(t, path)))
	if err != nil {
		t.Fatal(err)
	}
	return key
}

// ReadFile returns the file's content or fails the test.
func ReadFile(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// WriteFile writes text to path (mode 0600) or fails the test.
func WriteFile(t testing.TB, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
}

// Descendants lists the living descendants of pid.
func Descendants(pid int) []int {
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
