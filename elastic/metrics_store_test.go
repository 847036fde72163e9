package elastic

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gorun/gorun/rendezvous"
)

// The store collector reads a hosted server's figures at scrape time:
// its open connections, requests by operation, refusals by reason and the
// bytes it holds; a store forgotten, or not started yet, is not exposed.
func TestStoreMetrics(t *testing.T) {
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	var srv *rendezvous.Server
	forget := m.HostStore(StoreWorkers, func() *rendezvous.Server { return srv })
	if n, err := testutil.GatherAndCount(reg, "gorun_store_connections"); err != nil || n != 0 {
		t.Fatalf("a store not started yet: %d series, %v; want none", n, err)
	}

	srv = rendezvous.NewServer(rendezvous.ServerOptions{MaxConns: 1, IdleTimeout: -1})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(l)
	defer srv.Close()
	c, err := rendezvous.Dial(ctx, l.Addr().String(), rendezvous.ClientOptions{Timeout: 5 * time.Second, Dialect: rendezvous.DialectV2})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	value := strings.Repeat("x", 1000)
	if err := c.Set(ctx, "k", []byte(value)); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := c.Add(ctx, "n", 1); err != nil {
			t.Fatal(err)
		}
	}
	// Past MaxConns, with no connection to close in its place.
	if c2, err := rendezvous.Dial(ctx, l.Addr().String(), rendezvous.ClientOptions{Timeout: time.Second, Dialect: rendezvous.DialectV2}); err == nil {
		c2.Ping(ctx) // the refusal closes it at once, a request or not
		c2.Close()
	}

	want := `
# HELP gorun_store_connections Client connections open to a store this agent hosts.
# TYPE gorun_store_connections gauge
gorun_store_connections{store="workers"} 1
# HELP gorun_store_refused_total Requests and connections a store this agent hosts refused, by reason (budget, caps, fd_reserve).
# TYPE gorun_store_refused_total counter
gorun_store_refused_total{reason="budget",store="workers"} 0
gorun_store_refused_total{reason="caps",store="workers"} 1
gorun_store_refused_total{reason="fd_reserve",store="workers"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "gorun_store_connections", "gorun_store_refused_total"); err != nil {
		t.Error(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	requests := map[string]float64{}
	var bytes float64
	for _, mf := range mfs {
		for _, s := range mf.GetMetric() {
			switch mf.GetName() {
			case "gorun_store_requests_total":
				for _, lp := range s.GetLabel() {
					if lp.GetName() == "op" {
						requests[lp.GetValue()] = s.GetCounter().GetValue()
					}
				}
			case "gorun_store_bytes":
				bytes = s.GetGauge().GetValue()
			}
		}
	}
	if requests["set"] != 1 || requests["add"] != 3 || requests["get"] != 0 {
		t.Errorf("requests by op = %v; want set 1, add 3, no get", requests)
	}
	if bytes < float64(len(value)) {
		t.Errorf("gorun_store_bytes = %v; want at least the %d bytes of the value", bytes, len(value))
	}

	forget()
	if n, err := testutil.GatherAndCount(reg, "gorun_store_connections", "gorun_store_requests_total"); err != nil || n != 0 {
		t.Errorf("a forgotten store: %d series, %v; want none", n, err)
	}
}
