package elastic

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gorun/gorun/launcher"
)

// Metrics are an agent's Prometheus metrics, named gorun_*, registered in
// a registry of the caller's (never the global default). A nil *Metrics
// records nothing.
type Metrics struct {
	workers       *prometheus.GaugeVec
	restarts      prometheus.Counter
	exits         *prometheus.CounterVec
	rounds        prometheus.Counter
	roundDuration prometheus.Histogram
	nodes         prometheus.Gauge
	stores        *storeCollector
}

// NewMetrics registers the agent's metrics in reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		workers: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gorun_workers", Help: "This node's workers by state.",
		}, []string{"state"}),
		restarts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gorun_restarts_total", Help: "Restarts of the job's worker groups (TORCHELASTIC_RESTART_COUNT).",
		}),
		exits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gorun_worker_exits_total", Help: "Worker exits by status (exitcode N or signal N).",
		}, []string{"status"}),
		rounds: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gorun_rendezvous_rounds_total", Help: "Rendezvous rounds this node completed.",
		}),
		roundDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "gorun_rendezvous_duration_seconds", Help: "Time to complete a rendezvous round.",
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 12),
		}),
		nodes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gorun_nodes", Help: "Nodes in the current round.",
		}),
		stores: newStoreCollector(),
	}
	reg.MustRegister(m.workers, m.restarts, m.exits, m.rounds, m.roundDuration, m.nodes, m.stores)
	for _, s := range []string{StateRunning, StateExited, StateRestarting} {
		m.workers.WithLabelValues(s)
	}
	return m
}

// round records a completed rendezvous round that took d.
func (m *Metrics) round(d time.Duration, nodes int) {
	if m == nil {
		return
	}
	m.rounds.Inc()
	m.roundDuration.Observe(d.Seconds())
	m.nodes.Set(float64(nodes))
}

func (m *Metrics) exited(e launcher.Exit) {
	if m == nil {
		return
	}
	status := "exitcode " + strconv.Itoa(e.ExitCode)
	if e.Signal != 0 {
		status = "signal " + strconv.Itoa(int(e.Signal))
	}
	m.exits.WithLabelValues(status).Inc()
}

// restarted counts n more restarts of the job.
func (m *Metrics) restarted(n int) {
	if m == nil {
		return
	}
	m.restarts.Add(float64(n))
}

// observe sets the workers gauge from a published document.
func (m *Metrics) observe(doc NodeStatus) {
	if m == nil {
		return
	}
	counts := workerCounts(doc.Workers)
	for _, s := range []string{StateRunning, StateExited, StateRestarting} {
		m.workers.WithLabelValues(s).Set(float64(counts[s]))
	}
}

// workerCounts counts rows by state.
func workerCounts(rows []WorkerStatus) map[string]int {
	c := map[string]int{}
	for _, w := range rows {
		c[w.State]++
	}
	return c
}
