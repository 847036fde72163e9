package launcher

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun/gorun/internal/sshtest"
)

// BenchmarkFanoutSSHD launches a trivial command on real sshd "hosts",
// one per loopback address, through Fanout.Run: the per-host cost of a
// flat launch, handshake, session and exit included. Besides the time,
// which on one machine grows with its load, it reports the CPU time per
// host of the sshd servers (their reaped children: the per-connection
// sshd, its privilege-separated child, the session's shell) and of the
// launcher itself, which do not.
func BenchmarkFanoutSSHD(b *testing.B) {
	e := sshtest.NewEnv(b)
	var servers []*sshtest.SSHD
	for i := range 16 {
		servers = append(servers, e.StartSSHD(b, fmt.Sprintf("127.0.0.%d", i+1)))
	}
	cfg := SSHConfig{
		IdentityFiles: []string{e.Key}, ConfigFile: "none", KnownHosts: e.KnownHosts,
		AgentSocket: "none", ConnectTimeout: 30 * time.Second, StopGrace: time.Second, Logger: zerolog.Nop(),
	}
	for _, n := range []int{4, 16} {
		b.Run(fmt.Sprintf("hosts=%d", n), func(b *testing.B) {
			agents := make([]RemoteAgent, n)
			for i := range agents {
				agents[i] = RemoteAgent{Host: servers[i].Addr, Argv: []string{"/bin/sh", "-c", "exit 0"}}
			}
			sshdBefore, selfBefore := childrenCPU(b, servers[:n]), selfCPU()
			for b.Loop() {
				f := Fanout{Agents: agents, SSH: cfg, Stdout: io.Discard, Stderr: io.Discard, Logger: zerolog.Nop()}
				if code, err := f.Run(context.Background()); code != 0 || err != nil {
					b.Fatalf("Run = %d, %v", code, err)
				}
			}
			hosts := float64(b.N * n)
			b.ReportMetric(float64(b.Elapsed().Milliseconds())/hosts, "ms/host")
			b.ReportMetric(float64((childrenCPU(b, servers[:n])-sshdBefore).Milliseconds())/hosts, "sshd-cpu-ms/host")
			b.ReportMetric(float64((selfCPU()-selfBefore).Milliseconds())/hosts, "head-cpu-ms/host")
		})
	}
}

// childrenCPU is the CPU time of the servers' reaped children.
func childrenCPU(b *testing.B, servers []*sshtest.SSHD) time.Duration {
	var ticks int
	for _, s := range servers {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", s.Pid))
		if err != nil {
			b.Fatal(err)
		}
		// Fields after the command name: cutime and cstime are 16 and 17.
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+2:]))
		for _, k := range []int{16 - 3, 17 - 3} {
			n, _ := strconv.Atoi(f[k])
			ticks += n
		}
	}
	return time.Duration(ticks) * 10 * time.Millisecond // USER_HZ is 100 on Linux
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
