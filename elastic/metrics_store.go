package elastic

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gorun/gorun/rendezvous"
)

// storeCollector exposes the figures of the stores this agent hosts,
// read from each server at scrape time: the store's hot path pays only
// its own atomic counters. Stores are labelled by what they serve.
type storeCollector struct {
	conns, requests, refused, bytes *prometheus.Desc

	mu     sync.Mutex
	stores map[string]func() *rendezvous.Server
}

func newStoreCollector() *storeCollector {
	return &storeCollector{
		conns: prometheus.NewDesc("gorun_store_connections",
			"Client connections open to a store this agent hosts.", []string{"store"}, nil),
		requests: prometheus.NewDesc("gorun_store_requests_total",
			"Requests a store this agent hosts served, by operation.", []string{"store", "op"}, nil),
		refused: prometheus.NewDesc("gorun_store_refused_total",
			"Requests and connections a store this agent hosts refused, by reason (budget, caps, fd_reserve).", []string{"store", "reason"}, nil),
		bytes: prometheus.NewDesc("gorun_store_bytes",
			"Bytes a store this agent hosts holds against its memory budget.", []string{"store"}, nil),
		stores: map[string]func() *rendezvous.Server{},
	}
}

func (c *storeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.conns
	ch <- c.requests
	ch <- c.refused
	ch <- c.bytes
}

func (c *storeCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for name, server := range c.stores {
		srv := server()
		if srv == nil {
			continue
		}
		st := srv.Stats()
		ch <- prometheus.MustNewConstMetric(c.conns, prometheus.GaugeValue, float64(st.Conns), name)
		ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.GaugeValue, float64(st.Memory), name)
		for op, n := range st.Requests {
			ch <- prometheus.MustNewConstMetric(c.requests, prometheus.CounterValue, float64(n), name, op)
		}
		for reason, n := range st.Refused {
			ch <- prometheus.MustNewConstMetric(c.refused, prometheus.CounterValue, float64(n), name, reason)
		}
	}
}

// Store names of HostStore.
const (
	StoreRendezvous = "rendezvous" // the c10d rendezvous store, or the static one of node 0
	StoreWorkers    = "workers"    // the workers' store of a round this agent hosts
)

// HostStore exposes the figures of a store this agent hosts under name,
// until forget; server is asked at each scrape and may return nil while
// there is none. A nil *Metrics records nothing.
func (m *Metrics) HostStore(name string, server func() *rendezvous.Server) (forget func()) {
	if m == nil {
		return func() {}
	}
	c := m.stores
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stores[name] = server
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		delete(c.stores, name)
	}
}
