package main

import (
	"bufio"
	"encoding/json"
	"strings"
	"testing"
)

// Issue 23: with --log-format json, the agent's lines for a completed
// round, started workers, a worker's failure and a restart carry an event
// field named as the metric that counts them.
func TestLogEventsNameTheirMetrics(t *testing.T) {
	dir := t.TempDir()
	worker := script(t, dir, "worker.sh", `if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$LOCAL_RANK" = 1 ]; then exit 3; fi
`)
	j := gorun(t, nil, "--log-format", "json", "--nproc-per-node", "2", "--max-restarts", "1", worker)
	if j.code != 0 {
		t.Fatalf("gorun exited %d:\n%s", j.code, j)
	}
	events := map[string][]map[string]any{}
	sc := bufio.NewScanner(strings.NewReader(j.stderr))
	for sc.Scan() {
		var line map[string]any
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("a log line is not JSON: %v: %q\n%s", err, sc.Text(), j)
		}
		if ev, ok := line["event"].(string); ok {
			events[ev] = append(events[ev], line)
		}
	}
	for ev, want := range map[string]int{
		"gorun_rendezvous_rounds": 2, "gorun_workers": 2, "gorun_restarts": 1,
	} {
		if got := len(events[ev]); got != want {
			t.Errorf("%d lines with event %q, want %d:\n%s", got, ev, want, j.stderr)
		}
	}
	// Exits that are not failures are logged below info, but rank 0 may
	// still run when rank 1 fails, and its stop by SIGTERM is logged too.
	failed := 0
	for _, e := range events["gorun_worker_exits"] {
		switch {
		case e["exit"] == "exitcode 3" && e["local_rank"] == 1.0:
			failed++
		case e["exit"] != "signal 15 (SIGTERM)":
			t.Errorf("an exit line of neither the failure nor its stop: %v", e)
		}
	}
	if failed != 1 {
		t.Errorf("%d lines of the failed worker's exit, want 1:\n%s", failed, j.stderr)
	}
}
