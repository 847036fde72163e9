package rendezvous

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"
)

// BenchmarkStore measures set, get and add throughput of our Client with
// 1, 16 and 64 concurrent clients against our server and, in the same
// run, against torch 1.13's own server (skipped without torch):
//
//	go test -run x -bench Store -benchtime 2000x ./rendezvous/
func BenchmarkStore(b *testing.B) {
	servers := []struct {
		name  string
		start func(testing.TB) string
	}{
		{"gorun", func(tb testing.TB) string {
			_, addr, _ := startServer(tb, ServerOptions{})
			return addr
		}},
		{"torch113", startTorchServer},
	}
	for _, srv := range servers {
		b.Run("server="+srv.name, func(b *testing.B) {
			addr := srv.start(b)
			for _, op := range []string{"set", "get", "add"} {
				for _, clients := range []int{1, 16, 64} {
					b.Run(fmt.Sprintf("op=%s/clients=%d", op, clients), func(b *testing.B) {
						benchmarkOp(b, addr, op, clients)
					})
				}
			}
		})
	}
}

// benchmarkOp spreads b.N operations over clients connections, each
// driven by its own goroutine, and reports the aggregate ops/s.
func benchmarkOp(b *testing.B, addr, op string, clients int) {
	ctx := context.Background()
	conns := make([]*Client, clients)
	for i := range conns {
		conns[i] = dialClient(b, addr, ClientOptions{})
	}
	value := []byte("0123456789abcdef0123456789abcdef") // 32 B, about a rank's address
	mustDo(b, conns[0].Set(ctx, "bench/get", value))
	do := map[string]func(c *Client, i int) error{
		"set": func(c *Client, i int) error { return c.Set(ctx, "bench/set/"+strconv.Itoa(i), value) },
		"get": func(c *Client, _ int) error { _, err := c.Get(ctx, "bench/get"); return err },
		"add": func(c *Client, _ int) error { _, err := c.Add(ctx, "bench/add", 1); return err },
	}[op]

	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for i, c := range conns {
		n := b.N / clients
		if i < b.N%clients {
			n++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range n {
				if err := do(c, i); err != nil {
					b.Error(err)
					return
				}
			}
			// A round trip, so that SETs, which have no reply, count only
			// once the server has applied them.
			if _, err := c.NumKeys(ctx); err != nil {
				b.Error(err)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "ops/s")
}
