package launcher

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

func TestTreeShares(t *testing.T) {
	for _, tc := range []struct {
		n, fanOut int
		want      [][]int
	}{
		{1, 32, [][]int{nil}},
		{3, 3, [][]int{nil, nil, nil}},
		{4, 3, [][]int{nil, {3}, nil}},
		{5, 2, [][]int{nil, {2, 3, 4}}},
		{10, 3, [][]int{nil, {3, 4, 5, 6}, {7, 8, 9}}},
		{4, 1, [][]int{{1, 2, 3}}},
		{3, 0, [][]int{{1, 2}}}, // a fan-out below 1 counts as 1
	} {
		if got := treeShares(tc.n, tc.fanOut); !slices.EqualFunc(got, tc.want, slices.Equal) {
			t.Errorf("treeShares(%d, %d) = %v, want %v", tc.n, tc.fanOut, got, tc.want)
		}
	}
}

// TestTreeReachesEveryHostOnce walks the whole tree as the relays build it:
// every host is launched once, and no launcher reaches more than fanOut.
func TestTreeReachesEveryHostOnce(t *testing.T) {
	for _, tc := range []struct{ n, fanOut, depth int }{{5, 2, 3}, {1000, 32, 2}, {10000, 32, 3}, {128, 8, 3}} {
		seen := make([]int, tc.n)
		var walk func(hosts []int, depth int) int
		walk = func(hosts []int, depth int) int {
			shares := treeShares(len(hosts), tc.fanOut)
			if len(shares) > tc.fanOut {
				t.Fatalf("n=%d: a launcher reaches %d hosts", tc.n, len(shares))
			}
			deepest := depth
			for i, share := range shares {
				seen[hosts[i]]++
				sub := make([]int, len(share))
				for j, k := range share {
					sub[j] = hosts[k]
				}
				if len(sub) > 0 {
					deepest = max(deepest, walk(sub, depth+1))
				}
			}
			return deepest
		}
		all := make([]int, tc.n)
		for i := range all {
			all[i] = i
		}
		if d := walk(all, 1); d != tc.depth {
			t.Errorf("n=%d fan-out %d: depth %d, want %d", tc.n, tc.fanOut, d, tc.depth)
		}
		for h, k := range seen {
			if k != 1 {
				t.Fatalf("n=%d: host %d launched %d times", tc.n, h, k)
			}
		}
	}
}

func TestRelayPlanRoundTrip(t *testing.T) {
	hostList := strings.Repeat("node-with-a-long-name,", 500)
	self := RemoteAgent{Host: "a", Argv: []string{"gorun", "--node-hosts", hostList, "--node-rank", "0"}, Env: []string{"A=1"}, Stdin: []byte("s\n")}
	hosts := []RemoteAgent{
		{Host: "b", Argv: []string{"gorun", "--node-hosts", hostList, "--node-rank", "1"}, Env: []string{"A=1"}, Stdin: []byte("s\n")},
		{Host: "c", Argv: []string{"gorun", "x"}, Env: []string{"A=1", "CUDA_VISIBLE_DEVICES=0"}, Stdin: []byte("t\n")},
		{Host: "d", Argv: []string{"other", "--node-hosts", hostList, "--node-rank", "3"}},
	}
	plan := &RelayPlan{Self: self, Hosts: hosts, Relay: []string{"gorun", "--ssh-relay"}, FanOut: 2, Retries: 3, StopTimeout: time.Second,
		SSH: RelaySSH{IdentityFiles: []string{"k"}, ConfigFile: "cfg", AcceptNew: true}}
	b, err := plan.encode()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Count(string(b), "\n") != 1 || !strings.HasSuffix(string(b), "\n") {
		t.Fatalf("the plan is not one line")
	}
	// The host list travels once, with the relay's own agent.
	if n := strings.Count(string(b), hostList); n != 1 {
		t.Errorf("the shared argument is written %d times", n)
	}
	got, err := decodeRelayPlan(b)
	if err != nil {
		t.Fatal(err)
	}
	eq := func(a, b RemoteAgent) bool {
		return a.Host == b.Host && slices.Equal(a.Argv, b.Argv) && slices.Equal(a.Env, b.Env) && string(a.Stdin) == string(b.Stdin)
	}
	if !eq(got.Self, self) || !slices.EqualFunc(got.Hosts, hosts, eq) {
		t.Errorf("decoded %+v\nwant %+v", got.Hosts, hosts)
	}
	if !slices.Equal(got.Relay, plan.Relay) || got.FanOut != 2 || got.Retries != 3 || got.StopTimeout != time.Second ||
		got.SSH.ConfigFile != "cfg" || !got.SSH.AcceptNew || !slices.Equal(got.SSH.IdentityFiles, []string{"k"}) {
		t.Errorf("settings decoded as %+v", got)
	}
	for _, bad := range []string{"", "{", `{"self":{}}`, `{"self":{"Argv":["a"]},"hosts":[{"host":"x","args":{"5":"y"}}]}`} {
		if _, err := decodeRelayPlan([]byte(bad)); err == nil {
			t.Errorf("decodeRelayPlan(%q) succeeded", bad)
		}
	}
}

func TestRetryDial(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"eof in the handshake (MaxStartups)", &SSHError{Host: "h", Op: "handshake", Err: fmt.Errorf("ssh: handshake failed: %w", io.EOF)}, true},
		{"reset in the handshake", &SSHError{Host: "h", Op: "handshake", Err: fmt.Errorf("read: %w", syscall.ECONNRESET)}, true},
		{"refused", &SSHError{Host: "h", Op: "dial", Err: fmt.Errorf("connect: %w", syscall.ECONNREFUSED)}, true},
		{"unexpected eof", &SSHError{Host: "h", Op: "handshake", Err: io.ErrUnexpectedEOF}, true},
		{"auth failure", &SSHError{Host: "h", Op: "auth as root", Err: errors.New("ssh: unable to authenticate")}, false},
		{"auth cut short", &SSHError{Host: "h", Op: "auth as root", Err: io.EOF}, false},
		{"changed host key", &SSHError{Host: "h", Op: "host key", Err: errors.New("key mismatch")}, false},
		{"unknown host key", &SSHError{Host: "h", Op: "known hosts", Err: errors.New("not found")}, false},
		{"bad config", &SSHError{Host: "h", Op: "ssh config", Err: errors.New("ProxyCommand")}, false},
		{"timeout", &SSHError{Host: "h", Op: "handshake", Err: errors.New("timed out after 30s")}, false},
		{"no route", &SSHError{Host: "h", Op: "dial", Err: syscall.EHOSTUNREACH}, false},
		{"cancelled", &SSHError{Host: "h", Op: "dial", Err: context.Canceled}, false},
		{"plain eof", io.EOF, true},
		{"other", errors.New("x"), false},
	} {
		if got := retryDial(tc.err); got != tc.want {
			t.Errorf("%s: retryDial(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

func TestRetryDelay(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		attempt int
		base    time.Duration
		r       float64
		want    time.Duration
	}{
		{0, 0, 0.5, 250 * ms},
		{0, 100 * ms, 0, 50 * ms},
		{0, 100 * ms, 0.999, 149900 * time.Microsecond},
		{1, 100 * ms, 0.5, 200 * ms},
		{3, 100 * ms, 0.5, 800 * ms},
		{20, 100 * ms, 0.5, 10 * time.Second},
		{1000, 100 * ms, 0, 5 * time.Second},
	} {
		if got := retryDelay(tc.attempt, tc.base, tc.r); got != tc.want {
			t.Errorf("retryDelay(%d, %v, %v) = %v, want %v", tc.attempt, tc.base, tc.r, got, tc.want)
		}
	}
}

// fakeFanout is a head over net's hosts.
func fakeFanout(net *fakeNet, agents []RemoteAgent, fanOut int, out *lockedBuffer) (*Fanout, *fakeDialer) {
	d := &fakeDialer{net: net}
	return &Fanout{
		Agents: agents, FanOut: fanOut, Relay: []string{"gorun", "--ssh-relay"},
		Dialer: d, Stdout: out, Stderr: out, Logger: zerolog.Nop(),
		StopTimeout: 10 * time.Second, FailureGrace: 10 * time.Second, RetryBackoff: time.Millisecond,
	}, d
}

func TestFanoutTreeFake(t *testing.T) {
	const n, fanOut = 50, 3
	net := newFakeNet(n)
	net.codes["h47"] = 1 // deep in a subtree: 1 gives way to a later other status
	net.codes["h49"] = 3
	out := &lockedBuffer{}
	f, d := fakeFanout(net, fakeAgents(n), fanOut, out)
	code, err := f.Run(context.Background())
	if err != nil || code != 3 {
		t.Fatalf("Run = %d, %v; want 3\n%s", code, err, strings.Join(out.lines(), "\n"))
	}
	var want []string
	for i := range n {
		want = append(want, fmt.Sprintf("h%d: %d", i, i))
	}
	got := slices.DeleteFunc(out.lines(), func(l string) bool { return !strings.HasPrefix(l, "h") })
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("lines %q\nwant %q", got, want)
	}
	if m := d.max.Load(); m > fanOut {
		t.Errorf("the head held %d connections, want at most %d", m, fanOut)
	}
	if k := d.dials.Load(); k != fanOut {
		t.Errorf("the head dialed %d hosts, want %d", k, fanOut)
	}
}

func TestFanoutTreeStopFake(t *testing.T) {
	const n = 40
	net := newFakeNet(n)
	net.hold = true
	f, _ := fakeFanout(net, fakeAgents(n), 4, &lockedBuffer{})
	signals := make(chan os.Signal, 1)
	f.Signals = signals
	done := make(chan struct{})
	var code int
	var err error
	go func() { code, err = f.Run(context.Background()); close(done) }()
	<-net.allUp
	signals <- syscall.SIGINT
	<-done
	if err != nil || code != 128+int(syscall.SIGINT) {
		t.Fatalf("Run = %d, %v; want %d", code, err, 128+int(syscall.SIGINT))
	}
	if s := net.stopped.Load(); s != n {
		t.Errorf("%d of %d agents stopped", s, n)
	}
}

func TestFanoutFlatWindowFake(t *testing.T) {
	const n, fanOut = 24, 4
	net := newFakeNet(n)
	net.setup = 2 * time.Millisecond
	f, d := fakeFanout(net, fakeAgents(n), fanOut, &lockedBuffer{})
	f.NoTree = true
	if code, err := f.Run(context.Background()); code != 0 || err != nil {
		t.Fatalf("Run = %d, %v", code, err)
	}
	if m := d.maxDialing.Load(); m > fanOut {
		t.Errorf("%d connections set up at once, want at most %d", m, fanOut)
	}
	if m := d.max.Load(); m != n {
		t.Errorf("the head held %d connections, want all %d", m, n)
	}
}

func TestFanoutRetriesFake(t *testing.T) {
	net := newFakeNet(3)
	net.drops["h1"] = 2
	f, d := fakeFanout(net, fakeAgents(3), 32, &lockedBuffer{})
	f.Retries = 2
	if code, err := f.Run(context.Background()); code != 0 || err != nil {
		t.Fatalf("Run = %d, %v", code, err)
	}
	if k := d.dials.Load(); k != 5 {
		t.Errorf("%d dials, want 5", k)
	}

	net = newFakeNet(3)
	net.drops["h2"] = 3
	f, _ = fakeFanout(net, fakeAgents(3), 32, &lockedBuffer{})
	f.Retries = 2
	_, err := f.Run(context.Background())
	var le *LaunchError
	if !errors.As(err, &le) || !strings.Contains(err.Error(), "host h2") || !strings.Contains(err.Error(), "3 attempts") || !errors.Is(err, io.EOF) {
		t.Errorf("Run = %v; want a launch error naming h2, the attempts and the last cause", err)
	}
}

// TestFanoutTreeFailureGraceFake: a failure deep in a relay's subtree
// starts the head's FailureGrace at once, as in a flat launch, though the
// relays would wait for an hour.
func TestFanoutTreeFailureGraceFake(t *testing.T) {
	const n = 12
	net := newFakeNet(n)
	net.hold = true
	net.relayGrace = time.Hour
	net.codes["h11"] = 3
	f, _ := fakeFanout(net, fakeAgents(n), 2, &lockedBuffer{})
	f.FailureGrace = 50 * time.Millisecond
	done := make(chan struct{})
	var code int
	var err error
	go func() { code, err = f.Run(context.Background()); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the head did not stop the job after its FailureGrace")
	}
	if err != nil || code != 3 {
		t.Fatalf("Run = %d, %v; want 3", code, err)
	}
	if s := net.stopped.Load(); s != n-1 {
		t.Errorf("%d of %d agents stopped", s, n-1)
	}
}

func TestParseRelayEvent(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want relayEvent
		ok   bool
	}{
		{" failed 3\n", relayEvent{code: 3}, true},
		{" lost\n", relayEvent{lost: true}, true},
		{" failed 0\n", relayEvent{}, false},
		{" failed x\n", relayEvent{}, false},
		{" failed\n", relayEvent{}, false},
		{" hello world\n", relayEvent{}, false},
	} {
		got, ok := parseRelayEvent([]byte(tc.in))
		if ok != tc.ok || ok && got != tc.want {
			t.Errorf("parseRelayEvent(%q) = %+v, %v; want %+v, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}
