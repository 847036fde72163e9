package main

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/etcdtest"
)

// BenchmarkNodeLoss measures, through the real CLI, the time from kill -9
// of one of three agents (--nnodes 2:3, two workers each) to the
// survivors' workers starting again with world 4, with c10d and with
// etcd on a 3-member cluster, both told of a lost node within 3 s
// (heartbeats of 1 s, 3 misses; a lease TTL of 3 s) and with the same
// last call (1 s). With c10d the victim is a node that does not host the
// store (losing that one ends the job); with etcd it is group rank 0.
// The metric is s/loss:
//
//	go test -run x -bench NodeLoss -benchtime 3x ./cmd/gorun/
func BenchmarkNodeLoss(b *testing.B) {
	cases := []struct {
		name  string
		args  func(b *testing.B) []string
		isVic func(out string) bool
	}{
		{"backend=c10d", func(b *testing.B) []string {
			return []string{"--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:" + benchPort(b),
				"--rdzv-conf", "last_call_timeout=1,heartbeat_interval=1,heartbeat_misses=3"}
		}, func(out string) bool { return !strings.Contains(out, "hosting the rendezvous store") }},
		{"backend=etcd", func(b *testing.B) []string {
			c := etcdtest.Start(b, etcdtest.Options{})
			return []string{"--rdzv-backend", "etcd", "--rdzv-endpoint", strings.Join(c.Endpoints(), ","),
				"--rdzv-conf", "last_call_timeout=1,lease_ttl=3"}
		}, func(out string) bool { return regexp.MustCompile(`rendezvous complete.*node_rank=0`).MatchString(out) }},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			var total time.Duration
			for i := range b.N {
				b.StopTimer()
				args := append(tc.args(b), "--nnodes", "2:3", "--nproc-per-node", "2", "--rdzv-id", strings.NewReplacer("/", "-", "=", "-").Replace(b.Name())+strconv.Itoa(i),
					bin("elastic"), "-steps", "100000", "-step-delay", "20ms", "-every", "10",
					"-checkpoint", filepath.Join(b.TempDir(), "ckpt"), "-log-every", "10")
				agents := []*agent{startBenchAgent(b, args), startBenchAgent(b, args), startBenchAgent(b, args)}
				if !waitFor(60*time.Second, func() bool { return strings.Contains(allOutput(agents), "world 6 restart 0") }) {
					b.Fatalf("no round of 3:\n%s", allOutput(agents))
				}
				var victim *agent
				for _, a := range agents {
					if tc.isVic(a.out.String()) {
						victim = a
					}
				}
				victim.cmd.Process.Signal(syscall.SIGKILL)
				killed := time.Now()
				if !waitFor(60*time.Second, func() bool { return strings.Contains(allOutput(agents), "with world 4") }) {
					b.Fatalf("no round of 2:\n%s", allOutput(agents))
				}
				total += time.Since(killed)
				for _, a := range agents {
					a.cmd.Process.Kill()
					<-a.done
				}
			}
			b.ReportMetric(total.Seconds()/float64(b.N), "s/loss")
		})
	}
}

// startBenchAgent is startAgent for a benchmark: the agent is killed
// when the benchmark ends.
func startBenchAgent(b *testing.B, args []string) *agent {
	b.Helper()
	a := &agent{cmd: exec.Command(bin("gorun"), args...), done: make(chan struct{})}
	a.cmd.Env = append(os.Environ(), "TMPDIR="+b.TempDir())
	a.cmd.Stdout, a.cmd.Stderr = &a.out, &a.out
	if err := a.cmd.Start(); err != nil {
		b.Fatal(err)
	}
	go func() {
		a.cmd.Wait()
		close(a.done)
	}()
	b.Cleanup(func() {
		a.cmd.Process.Kill()
		<-a.done
	})
	return a
}

// benchPort is a port free on loopback now.
func benchPort(b *testing.B) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}
