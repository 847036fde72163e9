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
		"gorun_rendezvous_rounds": 2, "gorun_workers": 2, "gorun_worker_exits": 1, "gorun_restarts": 1,
	} {
		if got := len(events[ev]); got != want {
			t.Errorf("%d lines with event %q, want %d:\n%s", got, ev, want, j.stderr)
		}
	}
	if e := events["gorun_worker_exits"]; len(e) == 1 && (e[0]["exit"] != "exitcode 3" || e[0]["local_rank"] != 1.0) {
		t.Errorf("the failed worker's line: %v; want local rank 1, exitcode 3", e[0])
	}
}
