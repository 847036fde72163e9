// Package etcdtest starts real etcd clusters for tests: Debian's
// etcd-server, members on loopback with their own data directories and
// ports, killed and removed when the test ends.
package etcdtest

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/gorun/gorun/internal/testenv"
)

// Need returns the etcd binary; without it the test is skipped naming the
// packages to install, or fails under CI=true (testenv's rule).
func Need(t testing.TB) string {
	t.Helper()
	return testenv.MustHaveCommand(t, "etcd", "etcd-server etcd-client")
}

// Options shape a cluster.
type Options struct {
	// Members is the number of members (default 3).
	Members int
	// Host is the address members listen on (default 127.0.0.1).
	Host string
	// TLS, when set, makes the members speak HTTPS to clients and ask them
	// for a certificate that TLS.CA signed.
	TLS *Certs
	// Heartbeat and Election, when set, are the members' raft heartbeat
	// interval and election timeout (etcd's defaults: 100 ms and 1 s).
	Heartbeat, Election time.Duration
}

// Cluster is a running etcd cluster.
type Cluster struct {
	t       testing.TB
	bin     string
	opts    Options
	Members []*Member
}

// Member is one etcd server.
type Member struct {
	Name      string
	Dir       string
	ClientURL string
	PeerURL   string
	initial   string
	cmd       *exec.Cmd
	exited    chan struct{}
}

// Endpoint is the member's host:port for clients.
func (m *Member) Endpoint() string {
	return strings.TrimPrefix(strings.TrimPrefix(m.ClientURL, "http://"), "https://")
}

// Start starts a cluster and waits until every member answers; the test's
// cleanup kills it.
func Start(t testing.TB, o Options) *Cluster {
	t.Helper()
	bin := Need(t)
	if o.Members == 0 {
		o.Members = 3
	}
	if o.Host == "" {
		o.Host = "127.0.0.1"
	}
	scheme := "http"
	if o.TLS != nil {
		scheme = "https"
	}
	c := &Cluster{t: t, bin: bin, opts: o}
	dir := t.TempDir()
	var initial []string
	// Every port is held until all are chosen: one closed at once could be
	// handed out again, and two members on one port would kill one.
	ports := freePorts(t, o.Host, 2*o.Members)
	for i := range o.Members {
		m := &Member{
			Name:      "m" + strconv.Itoa(i),
			Dir:       filepath.Join(dir, "m"+strconv.Itoa(i)),
			ClientURL: scheme + "://" + net.JoinHostPort(o.Host, strconv.Itoa(ports[2*i])),
			PeerURL:   "http://" + net.JoinHostPort(o.Host, strconv.Itoa(ports[2*i+1])),
		}
		c.Members = append(c.Members, m)
		initial = append(initial, m.Name+"="+m.PeerURL)
	}
	for _, m := range c.Members {
		m.initial = strings.Join(initial, ",")
		c.start(m, "new")
	}
	t.Cleanup(func() {
		for _, m := range c.Members {
			c.Kill(m)
		}
	})
	c.AwaitHealthy(60 * time.Second)
	return c
}

// start runs m's server; state is etcd's --initial-cluster-state.
func (c *Cluster) start(m *Member, state string) {
	c.t.Helper()
	args := []string{
		"--name", m.Name, "--data-dir", m.Dir,
		"--listen-client-urls", m.ClientURL, "--advertise-client-urls", m.ClientURL,
		"--listen-peer-urls", m.PeerURL, "--initial-advertise-peer-urls", m.PeerURL,
		"--initial-cluster", m.initial, "--initial-cluster-state", state,
		"--initial-cluster-token", "gorun-test",
		"--logger", "zap", "--log-outputs", filepath.Join(filepath.Dir(m.Dir), m.Name+".log"),
	}
	if c.opts.Heartbeat > 0 {
		args = append(args, "--heartbeat-interval", strconv.FormatInt(c.opts.Heartbeat.Milliseconds(), 10))
	}
	if c.opts.Election > 0 {
		args = append(args, "--election-timeout", strconv.FormatInt(c.opts.Election.Milliseconds(), 10))
	}
	if tl := c.opts.TLS; tl != nil {
		args = append(args, "--cert-file", tl.ServerCert, "--key-file", tl.ServerKey,
			"--trusted-ca-file", tl.CA, "--client-cert-auth")
	}
	cmd := exec.Command(c.bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("etcdtest: start %s: %v", m.Name, err)
	}
	m.cmd, m.exited = cmd, make(chan struct{})
	go func() {
		cmd.Wait()
		close(m.exited)
	}()
}

// Kill kills m with SIGKILL, if it runs, and reaps it.
func (c *Cluster) Kill(m *Member) {
	if m.cmd == nil {
		return
	}
	select {
	case <-m.exited:
	default:
		m.cmd.Process.Signal(syscall.SIGKILL)
		<-m.exited
	}
	m.cmd = nil
}

// Restart starts a killed member again on its data.
func (c *Cluster) Restart(m *Member) { c.start(m, "existing") }

// Endpoints are the members' host:port for clients.
func (c *Cluster) Endpoints() []string {
	var eps []string
	for _, m := range c.Members {
		eps = append(eps, m.Endpoint())
	}
	return eps
}

// Client returns a client of the running members, closed at cleanup.
func (c *Cluster) Client() *clientv3.Client {
	c.t.Helper()
	cfg := clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()}
	if c.opts.TLS != nil {
		cfg.TLS = c.opts.TLS.ClientConfig(c.t)
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		c.t.Fatalf("etcdtest: client: %v", err)
	}
	c.t.Cleanup(func() { cli.Close() })
	return cli
}

// AwaitHealthy waits until every running member answers a linearizable
// read, failing the test after within.
func (c *Cluster) AwaitHealthy(within time.Duration) {
	c.t.Helper()
	cli := c.Client()
	deadline := time.Now().Add(within)
	for _, m := range c.Members {
		if m.cmd == nil {
			continue
		}
		for {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, err := cli.Status(ctx, m.Endpoint())
			if err == nil {
				_, err = cli.Get(ctx, "health")
			}
			cancel()
			if err == nil {
				break
			}
			select {
			case <-m.exited:
				c.t.Fatalf("etcdtest: %s exited; the end of its log:\n%s", m.Name, logTail(filepath.Join(filepath.Dir(m.Dir), m.Name+".log")))
			default:
			}
			if time.Now().After(deadline) {
				c.t.Fatalf("etcdtest: %s not healthy within %v: %v", m.Name, within, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// Leader returns the member that leads the cluster now.
func (c *Cluster) Leader() *Member {
	c.t.Helper()
	cli := c.Client()
	for _, m := range c.Members {
		if m.cmd == nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		s, err := cli.Status(ctx, m.Endpoint())
		cancel()
		if err == nil && s.Leader == s.Header.MemberId {
			return m
		}
	}
	c.t.Fatal("etcdtest: no member leads the cluster")
	return nil
}

// freePorts returns n distinct ports free on host now.
func freePorts(t testing.TB, host string, n int) []int {
	ports := make([]int, n)
	for i := range ports {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			t.Fatalf("etcdtest: %v", err)
		}
		defer l.Close()
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	return ports
}

func (m *Member) String() string { return fmt.Sprintf("%s (%s)", m.Name, m.ClientURL) }

// logTail is the last lines of a member's log, for a failure message (the
// test's folder is gone once it ends).
func logTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-8):], "\n")
}

// CPU is the processor time, user and system, that m's server has used
// since it started, read from /proc; 0 where that cannot be read (not
// Linux, or the member is not running).
func (m *Member) CPU() time.Duration {
	if m.cmd == nil || m.cmd.Process == nil {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", m.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	// The fields after the command's name, which is in parentheses and
	// may hold spaces: utime and stime are the 12th and 13th of them.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0
	}
	// Linux counts them in USER_HZ ticks, 100 a second on every
	// architecture Go runs on.
	return time.Duration(utime+stime) * (time.Second / 100)
}

// CPU is the processor time that the cluster's members have used.
func (c *Cluster) CPU() time.Duration {
	var total time.Duration
	for _, m := range c.Members {
		total += m.CPU()
	}
	return total
}

// Requests counts the unary requests the members have taken since they
// started, by method (Range, Txn, LeaseGrant, ...), from their Prometheus
// metrics (grpc_server_started_total). Counts, unlike times, do not move
// with the machine's load: they show what a change costs etcd.
func (c *Cluster) Requests() (map[string]int, error) {
	if c.opts.TLS != nil {
		return nil, fmt.Errorf("etcdtest: requests of a TLS cluster are not counted")
	}
	counts := map[string]int{}
	for _, m := range c.Members {
		if err := m.addRequests(counts); err != nil {
			return nil, err
		}
	}
	return counts, nil
}

func (m *Member) addRequests(counts map[string]int) error {
	resp, err := http.Get(m.ClientURL + "/metrics")
	if err != nil {
		return fmt.Errorf("etcdtest: metrics of %s: %w", m, err)
	}
	defer resp.Body.Close()
	// Lines such as
	// grpc_server_started_total{grpc_method="Range",grpc_service="etcdserverpb.KV",grpc_type="unary"} 5072
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "grpc_server_started_total{") || !strings.Contains(line, `grpc_type="unary"`) {
			continue
		}
		_, rest, _ := strings.Cut(line, `grpc_method="`)
		method, _, _ := strings.Cut(rest, `"`)
		value := line[strings.LastIndexByte(line, ' ')+1:]
		n, err := strconv.ParseFloat(value, 64)
		if err != nil {
			return fmt.Errorf("etcdtest: metrics of %s: %q: %w", m, line, err)
		}
		counts[method] += int(n)
	}
	return sc.Err()
}
