package launcher

import (
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// fakeSetup is what a fake connection takes to set up: a loopback SSH
// handshake's order of magnitude, so that the bounded windows show.
const fakeSetup = time.Millisecond

// BenchmarkFanoutFake launches 1,000 and 10,000 in-process hosts (see
// fakeNet), flat and as a tree with the relays in this process, and
// reports the connections the head held at most (sessions), the time to
// all agents started (ms-to-started) and, per launch, the memory of all
// launchers together.
func BenchmarkFanoutFake(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		agents := fakeAgents(n)
		for _, mode := range []string{"flat", "tree"} {
			b.Run(fmt.Sprintf("hosts=%d/%s", n, mode), func(b *testing.B) {
				b.ReportAllocs()
				var held int64
				var toStarted time.Duration
				for b.Loop() {
					net := newFakeNet(n)
					net.setup = fakeSetup
					d := &fakeDialer{net: net}
					f := &Fanout{
						Agents: agents, FanOut: DefaultFanOut, NoTree: mode == "flat", Relay: []string{"gorun", "--ssh-relay"},
						Dialer: d, Stdout: io.Discard, Stderr: io.Discard, Logger: zerolog.Nop(),
					}
					start := time.Now()
					code, err := f.Run(context.Background())
					if code != 0 || err != nil {
						b.Fatalf("Run = %d, %v", code, err)
					}
					<-net.allUp
					toStarted += time.Since(start)
					held = max(held, d.max.Load())
				}
				b.ReportMetric(float64(held), "sessions")
				b.ReportMetric(float64(toStarted.Milliseconds())/float64(b.N), "ms-to-started")
			})
		}
	}
}
