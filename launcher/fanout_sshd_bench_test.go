package launcher

import (
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun/gorun/internal/sshtest"
)

// BenchmarkFanoutSSHD launches a trivial command on real sshd "hosts",
// one per loopback address, through Fanout.Run: the per-host cost of a
// flat launch, handshake, session and exit included.
func BenchmarkFanoutSSHD(b *testing.B) {
	e := sshtest.NewEnv(b)
	var servers []*sshtest.SSHD
	for i := range 16 {
		servers = append(servers, e.StartSSHD(b, fmt.Sprintf("127.0.0.%d", i+1)))
	}
	cfg := SSHConfig{
		IdentityFiles: []string{e.Key}, ConfigFile: "none", KnownHosts: e.KnownHosts,
		AgentSocket: "none", ConnectTimeout: 10 * time.Second, StopGrace: time.Second, Logger: zerolog.Nop(),
	}
	for _, n := range []int{4, 16} {
		b.Run(fmt.Sprintf("hosts=%d", n), func(b *testing.B) {
			agents := make([]RemoteAgent, n)
			for i := range agents {
				agents[i] = RemoteAgent{Host: servers[i].Addr, Argv: []string{"/bin/sh", "-c", "exit 0"}}
			}
			for b.Loop() {
				f := Fanout{Agents: agents, SSH: cfg, Stdout: io.Discard, Stderr: io.Discard, Logger: zerolog.Nop()}
				if code, err := f.Run(context.Background()); code != 0 || err != nil {
					b.Fatalf("Run = %d, %v", code, err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n)/1e6, "ms/host")
		})
	}
}
