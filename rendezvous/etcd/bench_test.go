package etcd

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/etcdtest"
	"github.com/gorun/gorun/rendezvous"
)

// BenchmarkRound measures how long a round of 200, 1,000 and 4,096
// nodes takes to form on a 3-member cluster on loopback: every node its
// own client and lease, all calling Next at once, the round decided when
// the last of them arrives (MinNodes = MaxNodes). Each node's client knows
// one member (node i the (i mod 3)-th), so that each holds one connection,
// as an agent does, and 4,096 of them fit in this process's open files.
// One op is one round; besides its time, it reports the processor time
// of the benchmark (the nodes) and of the etcd members, which others' load
// on the machine disturbs less, and the requests etcd took per node (its
// lease, join, reads, retries and leave), which load moves only through
// retries:
//
//	go test -run '^$' -bench Round -benchtime 3x ./rendezvous/etcd/
//
// The members' heartbeat and election timeout are 5x etcd's defaults, as
// etcd's tuning guide advises where heartbeats can be held up: here three
// members share 2 cores with the 4,096 clients, and at the defaults the
// cluster changed leaders up to three times in one round, each change
// failing the requests in flight.
func BenchmarkRound(b *testing.B) {
	c := etcdtest.Start(b, etcdtest.Options{Heartbeat: 500 * time.Millisecond, Election: 5 * time.Second})
	eps := c.Endpoints()
	for _, nodes := range []int{200, 1000, 4096} {
		b.Run(fmt.Sprintf("nodes=%d", nodes), func(b *testing.B) {
			var total, cpu, etcdCPU time.Duration
			reqs0 := requests(b, c)
			for i := range b.N {
				b.StopTimer()
				run := fmt.Sprintf("bench-%d-%d", nodes, i)
				hs := make([]*Handler, nodes)
				for n := range hs {
					cli, err := Dial([]string{eps[n%len(eps)]}, nil)
					if err != nil {
						b.Fatal(err)
					}
					hs[n] = New(cli, Options{
						ElasticOptions: rendezvous.ElasticOptions{
							RunID: run, MinNodes: nodes, MaxNodes: nodes, NodeID: fmt.Sprintf("n%d", n), Host: "h", NodeRank: -1,
							JoinTimeout: 5 * time.Minute,
						},
						LeaseTTL: 30 * time.Second, RequestTimeout: 5 * time.Minute,
					})
				}
				start, cpu0, etcd0 := time.Now(), processCPU(), c.CPU()
				b.StartTimer()
				var wg sync.WaitGroup
				errs := make(chan error, nodes)
				for _, h := range hs {
					wg.Go(func() {
						if _, err := h.Next(context.Background()); err != nil {
							errs <- err
						}
					})
				}
				wg.Wait()
				total += time.Since(start)
				cpu += processCPU() - cpu0
				etcdCPU += c.CPU() - etcd0
				b.StopTimer()
				close(errs)
				for err := range errs {
					b.Fatal(err)
				}
				var cw sync.WaitGroup
				for _, h := range hs {
					cw.Go(func() { h.Close() })
				}
				cw.Wait()
				b.StartTimer()
			}
			b.ReportMetric(total.Seconds()*1e3/float64(b.N), "ms/round")
			b.ReportMetric(cpu.Seconds()/float64(b.N), "cpu-s/round")
			b.ReportMetric(etcdCPU.Seconds()/float64(b.N), "etcd-cpu-s/round")
			b.ReportMetric(float64(requests(b, c)-reqs0)/float64(b.N*nodes), "requests/node")
			b.ReportMetric(0, "ns/op") // ms/round says it
		})
	}
}

// requests is how many unary requests the cluster's members have taken.
func requests(b *testing.B, c *etcdtest.Cluster) int {
	counts, err := c.Requests()
	if err != nil {
		b.Fatal(err)
	}
	n := 0
	for _, v := range counts {
		n += v
	}
	return n
}

// processCPU is the processor time, user and system, this process used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
