package collective

import (
	"context"
	"fmt"
	"strconv"
	"strings"
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
				timeAllReduce(b, s.bytes, n, run)
			})
		}
	}
}

// BenchmarkProcesses runs each rank in its own process, as training jobs
// do, and reports rank 0's median, fastest and mean call, and the bus
// bandwidth of the median (nccl-tests' formulas).
func BenchmarkProcesses(b *testing.B) {
	busFactor := map[string]func(n float64) float64{
		"allreduce":      func(n float64) float64 { return 2 * (n - 1) / n },
		"broadcast":      func(float64) float64 { return 1 },
		"allgather":      func(n float64) float64 { return (n - 1) / n },
		"reduce_scatter": func(n float64) float64 { return (n - 1) / n },
		"alltoall":       func(n float64) float64 { return (n - 1) / n },
	}
	for _, op := range []string{"allreduce", "broadcast", "allgather", "reduce_scatter", "alltoall"} {
		for _, n := range []int{2, 4} {
			for _, s := range benchSizes {
				b.Run(fmt.Sprintf("%s/world=%d/%s", op, n, s.name), func(b *testing.B) {
					iters := max(b.N, 5)
					procs := startRanks(b, n, "bench", envOp+"="+op, envBytes+"="+strconv.Itoa(s.bytes), envIters+"="+strconv.Itoa(iters))
					var per, best, mean time.Duration
					for r, p := range procs {
						for line := range p.lines {
							if f := strings.Fields(line); len(f) == 3 && r == 0 {
								per, _ = time.ParseDuration(f[0])
								best, _ = time.ParseDuration(f[1])
								mean, _ = time.ParseDuration(f[2])
							}
						}
						waitExit(b, p, 5*time.Minute)
						if p.err != nil {
							b.Fatalf("rank %d: %v\n%s", r, p.err, p.stderr.String())
						}
					}
					b.ReportMetric(float64(per.Nanoseconds())/1e3, "us/call")
					b.ReportMetric(float64(best.Nanoseconds())/1e3, "us-min/call")
					b.ReportMetric(float64(mean.Nanoseconds())/1e3, "us-mean/call")
					b.ReportMetric(float64(s.bytes)/per.Seconds()/1e9*busFactor[op](float64(n)), "busbw-GB/s")
				})
			}
		}
	}
}

// BenchmarkCombine measures the reduction kernels on buffers that stay in
// the caches, as the blocks of the shared-memory algorithms do.
func BenchmarkCombine(b *testing.B) {
	for _, p := range []struct {
		dt DType
		op Op
	}{{Float32, Sum}, {Float64, Sum}, {BFloat16, Sum}, {Float16, Sum}, {Float32, Max}, {Int32, Sum}} {
		for _, size := range []int{64 << 10, 512 << 10} {
			b.Run(fmt.Sprintf("%v/%v/%dKiB", p.dt, p.op, size>>10), func(b *testing.B) {
				x, y := make([]byte, size), make([]byte, size)
				b.SetBytes(int64(size))
				b.ReportAllocs()
				for b.Loop() {
					combine(x, x, y, p.dt, p.op)
				}
			})
		}
	}
}

// timeAllReduce runs run once, which connects the ranks, then times it as
// b's loop and reports the bus bandwidth of an all_reduce of size bytes on
// n ranks.
func timeAllReduce(b *testing.B, size, n int, run func()) {
	run()
	b.SetBytes(int64(size))
	b.ResetTimer()
	start := time.Now()
	for b.Loop() {
		run()
	}
	per := time.Since(start) / time.Duration(b.N)
	b.ReportMetric(busBandwidth(size, n, per), "busbw-GB/s")
}
