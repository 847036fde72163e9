package launcher

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/sshtest"
)

// The endpoint the agents get, from the first host's ssh_config entry and
// its SSH_CONNECTION, through the resolution that connects to it.
func TestSSHRendezvousEndpoint(t *testing.T) {
	dir := t.TempDir()
	config := filepath.Join(dir, "ssh_config")
	writeFile(t, config, `
Host node-a
  HostName 127.0.0.1
  Port 2201
Host node-b
  HostName 127.0.0.2
Host gpu-*
  HostName %h.cluster.example
Host literal
  HostName %%h-%h
Match host matched-*
  HostName 10.1.2.3
Host behind
  HostName compute-7
  ProxyJump node-a
Host *
  User root
`)
	d, err := newSSHDialer(SSHConfig{ConfigFile: config, KnownHosts: filepath.Join(dir, "known_hosts"), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	const seen = "10.9.9.9 51234 10.0.0.2 22" // SSH_CONNECTION: the server took it on 10.0.0.2
	for _, tc := range []struct {
		name, host, conn, explicit string
		port                       int
		want                       string
	}{
		{"alias, no SSH_CONNECTION: HostName", "node-a", "", "", 0, "127.0.0.1:29400"},
		{"neither user nor SSH port leaks in", "bob@node-a:2222", "", "", 0, "127.0.0.1:29400"},
		{"SSH_CONNECTION beats HostName", "node-b", seen, "", 0, "10.0.0.2:29400"},
		{"the port asked for", "node-b", seen, "", 29500, "10.0.0.2:29500"},
		{"pattern with %h", "gpu-3", "", "", 0, "gpu-3.cluster.example:29400"},
		{"%% is a literal %", "literal", "", "", 0, "%h-literal:29400"},
		{"Match host", "matched-1", "", "", 0, "10.1.2.3:29400"},
		{"ProxyJump: where the jump host reached it", "behind", "10.0.0.1 40000 192.168.1.7 22", "", 0, "192.168.1.7:29400"},
		{"ProxyJump, no SSH_CONNECTION", "behind", "", "", 0, "compute-7:29400"},
		{"no ssh_config entry", "plain.example", "", "", 0, "plain.example:29400"},
		{"IPv6", "node-b", "fd00::9 5 fd00::2 22", "", 0, "[fd00::2]:29400"},
		{"IPv4-mapped", "node-b", "::ffff:10.0.0.9 5 ::ffff:10.0.0.2 22", "", 0, "10.0.0.2:29400"},
		{"link-local: the zone means nothing elsewhere", "node-b", "fe80::9%eth0 5 fe80::2%eth0 22", "", 0, "127.0.0.2:29400"},
		{"not a socket", "node-b", "UNKNOWN 65535 UNKNOWN 65535", "", 0, "127.0.0.2:29400"},
		{"unspecified", "node-b", "0.0.0.0 5 0.0.0.0 22", "", 0, "127.0.0.2:29400"},
		{"garbage", "node-b", "10.0.0.2", "", 0, "127.0.0.2:29400"},
		{"loopback: the head is on that machine; the others resolve its name", "node1", "127.0.1.1 5 127.0.1.1 22", "", 0, "node1:29400"},
		{"IPv6 loopback", "node-b", "::1 5 ::1 22", "", 0, "127.0.0.2:29400"},
		{"after a login script's lines", "node-b", "welcome to node-b\n\n" + seen + "\n", "", 0, "10.0.0.2:29400"},
		{"explicit wins", "node-b", seen, "store.example:1234", 0, "store.example:1234"},
		{"explicit is passed on as it is", "node-a", seen, "node-a:29500", 0, "node-a:29500"},
	} {
		target, err := d.resolve(tc.host, "")
		if err != nil {
			t.Errorf("%s: resolve %s: %v", tc.name, tc.host, err)
			continue
		}
		if got := rendezvousEndpoint(tc.explicit, tc.port, tc.conn, target.hostname); got != tc.want {
			t.Errorf("%s: host %s, SSH_CONNECTION %q, explicit %q, port %d: got %s, want %s",
				tc.name, tc.host, tc.conn, tc.explicit, tc.port, got, tc.want)
		}
	}
}

// A Fanout whose hosts are ssh_config aliases gives its agents the first
// host's own address, also when the head can reach that host only through
// a jump host and by a name that only the jump host resolves.
func TestSSHFanoutEndpoint(t *testing.T) {
	e := newSSHEnv(t)
	a := e.StartSSHD(t, "127.0.0.1")
	b := e.StartSSHD(t, "127.0.0.2")
	outside, decimal := sshtest.OutsideIPv4(t)
	c := e.StartSSHD(t, outside)
	// As in OpenSSH, known_hosts is searched by HostName, not by alias.
	e.AddKnownHost(t, "localhost:"+a.Port(), a.HostKeys["ed25519"])
	e.AddKnownHost(t, decimal+":"+c.Port(), c.HostKeys["ed25519"])
	config := e.WriteSSHConfigText(t, "ssh_config", fmt.Sprintf(`
Host node-a
  HostName 127.0.0.1
  Port %s
Host node-b
  HostName 127.0.0.2
  Port %s
Host hidden-a
  HostName localhost
  Port %s
  ProxyJump node-b
Host hidden-c
  HostName %s
  Port %s
  ProxyJump node-b
`, a.Port(), b.Port(), a.Port(), decimal, c.Port()))
	// Each agent prints the endpoint it was given.
	echoAgent := func(host string) RemoteAgent {
		return RemoteAgent{Host: host, Argv: []string{"/bin/sh", "-c", `echo "$1 got $2"`, "sh", host, ":unset"}, EndpointArg: 5}
	}
	launch := func(f Fanout) string {
		t.Helper()
		// Login scripts may write to stderr.
		var out, errOut bytes.Buffer
		f.SSH = SSHConfig{ConfigFile: config, ConnectTimeout: 5 * time.Second, StopGrace: time.Second, Logger: testLogger(t)}
		f.Stdout, f.Stderr, f.Logger = &out, &errOut, testLogger(t)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if code, err := f.Run(ctx); code != 0 || err != nil {
			t.Fatalf("exit %d, %v:\n%s%s", code, err, out.String(), errOut.String())
		}
		return out.String()
	}
	lines := func(s string) []string {
		l := strings.Split(strings.TrimSpace(s), "\n")
		slices.Sort(l)
		return l
	}
	forwards := func() int { return strings.Count(readFile(t, b.Log), "server_request_direct_tcpip") }

	for _, tc := range []struct {
		hosts    []string
		explicit string
		want     []string
	}{
		{[]string{"node-a", "node-b"}, "", []string{"node-a got 127.0.0.1:29400", "node-b got 127.0.0.1:29400"}},
		{[]string{"node-b", "node-a"}, "", []string{"node-a got 127.0.0.2:29400", "node-b got 127.0.0.2:29400"}},
		// Only node-b resolves hidden-c's HostName (Go, so gorun, cannot);
		// the others are told the address its sshd took the connection on.
		{[]string{"hidden-c", "node-b"}, "", []string{"hidden-c got " + outside + ":29400", "node-b got " + outside + ":29400"}},
		// hidden-a's sshd took the connection on loopback, which says only
		// that it is the head's machine: the others get its HostName.
		{[]string{"hidden-a", "node-b"}, "", []string{"hidden-a got localhost:29400", "node-b got localhost:29400"}},
		{[]string{"node-a", "node-b"}, "store.example:1234", []string{"node-a got store.example:1234", "node-b got store.example:1234"}},
	} {
		f := Fanout{Endpoint: tc.explicit}
		for _, h := range tc.hosts {
			f.Agents = append(f.Agents, echoAgent(h))
		}
		before := forwards()
		if got := lines(launch(f)); !slices.Equal(got, tc.want) {
			t.Errorf("hosts %v, explicit %q: got %q, want %q", tc.hosts, tc.explicit, got, tc.want)
		}
		if strings.HasPrefix(tc.hosts[0], "hidden-") && forwards() == before {
			t.Errorf("%s was not reached through node-b", tc.hosts[0])
		}
	}

	// An agent whose endpoint argument is past its command line starts
	// nothing.
	f := Fanout{Agents: []RemoteAgent{echoAgent("node-a"), echoAgent("node-b")}, Stdout: &bytes.Buffer{}, Stderr: &bytes.Buffer{}, Logger: testLogger(t)}
	f.Agents[1].EndpointArg = 6
	f.SSH = SSHConfig{ConfigFile: config, Logger: testLogger(t)}
	if _, err := f.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "node-b has no argument 6") {
		t.Errorf("got %v, want an error naming node-b", err)
	}
	if out := f.Stdout.(*bytes.Buffer).String(); out != "" {
		t.Errorf("an agent ran: %s", out)
	}
}
