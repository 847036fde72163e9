package elastic

// The event field of the agent's log lines that have a metric: the
// metric's name without its unit suffix, so that a log search and a
// dashboard use one name for one thing.
const (
	eventRound   = "gorun_rendezvous_rounds" // gorun_rendezvous_rounds_total
	eventStarted = "gorun_workers"           // gorun_workers{state="running"}
	// Worker exits: gorun_worker_exits, logged by the launcher.
	eventRestart = "gorun_restarts" // gorun_restarts_total
	eventHang    = "gorun_hangs"    // no metric yet
)
