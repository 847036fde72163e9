package collective

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"
)

// busBandwidth is nccl-tests' bus bandwidth of an all_reduce of size
// bytes on n ranks taking d: the algorithm bandwidth size/d scaled by
// 2(n-1)/n, the share of the data every link must carry.
func busBandwidth(size, n int, d time.Duration) float64 {
	algbw := float64(size) / d.Seconds()
	return algbw * 2 * float64(n-1) / float64(n) / 1e9
}

var benchSizes = []struct {
	name  string
	bytes int
}{{"8B", 8}, {"1MiB", 1 << 20}, {"16MiB", 16 << 20}}

// BenchmarkAllReduce runs float32 sums on ranks that are goroutines of
// this process, over real loopback TCP, and reports bus bandwidth.
func BenchmarkAllReduce(b *testing.B) {
	for _, n := range []int{2, 4} {
		for _, s := range benchSizes {
			b.Run(fmt.Sprintf("world=%d/%s", n, s.name), func(b *testing.B) {
				comms := testWorld(b, n, TCPOptions{})
				ctx := context.Background()
				bufs := make([][]byte, n)
				for r := range bufs {
					bufs[r] = make([]byte, s.bytes)
				}
				run := func() {
					mustAll(b, "all_reduce", onAll(comms, func(r int, c Comm) error {
						return c.AllReduce(ctx, bufs[r], Float32, Sum)
					}))
				}
				run() // connect
				b.SetBytes(int64(s.bytes))
				b.ResetTimer()
				start := time.Now()
				for b.Loop() {
					run()
				}
				per := time.Since(start) / time.Duration(b.N)
				b.ReportMetric(busBandwidth(s.bytes, n, per), "busbw-GB/s")
			})
		}
	}
}

// BenchmarkAllReduceProcesses runs each rank in its own process, as
// training jobs do, and reports the bus bandwidth rank 0 measured.
func BenchmarkAllReduceProcesses(b *testing.B) {
	for _, n := range []int{2, 4} {
		for _, s := range benchSizes[1:] {
			b.Run(fmt.Sprintf("world=%d/%s", n, s.name), func(b *testing.B) {
				iters := max(b.N, 5)
				procs := startRanks(b, n, "bench", envBytes+"="+strconv.Itoa(s.bytes), envIters+"="+strconv.Itoa(iters))
				var per time.Duration
				for r, p := range procs {
					for line := range p.lines {
						if r == 0 {
							per, _ = time.ParseDuration(line)
						}
					}
					waitExit(b, p, 5*time.Minute)
					if p.err != nil {
						b.Fatalf("rank %d: %v\n%s", r, p.err, p.stderr.String())
					}
				}
				b.ReportMetric(float64(per.Microseconds())/1e3, "ms/allreduce")
				b.ReportMetric(busBandwidth(s.bytes, n, per), "busbw-GB/s")
			})
		}
	}
}
