package elastic

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/launcher"
)

func TestReportPutsTheEarliestFailureFirst(t *testing.T) {
	t0 := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	fs := []Failure{
		{Exit: launcher.Exit{Rank: 0, LocalRank: 0, Pid: 10, ExitCode: 143, Signal: syscall.SIGTERM, Time: t0.Add(2 * time.Second)}, Host: "h"},
		// Exited later than rank 0 but its error file says it failed first.
		{Exit: launcher.Exit{Rank: 3, LocalRank: 1, Pid: 11, ExitCode: 1, Time: t0.Add(3 * time.Second)}, Host: "h",
			ErrorFile: "/x/error.json", Error: &launcher.ErrorInfo{Message: "ValueError: boom", Traceback: "line 1\nline 2", Timestamp: t0}},
	}
	sortRootCauseFirst(fs)
	if fs[0].Rank != 3 {
		t.Fatalf("root cause is rank %d, want 3", fs[0].Rank)
	}
	var b strings.Builder
	WriteReport(&b, "train.py", &Result{Failures: fs, ExitCode: fs[0].ExitCode})
	out := b.String()
	root, others, ok := strings.Cut(out, "Other Failures:")
	if !ok {
		t.Fatalf("no Other Failures section:\n%s", out)
	}
	for _, want := range []string{"train.py FAILED", "rank      : 3 (local_rank: 1)", "time      : 2026-11-21_12:00:00", "error_file: /x/error.json", "traceback : ValueError: boom\n              line 1\n              line 2"} {
		if !strings.Contains(root, want) {
			t.Errorf("root cause section lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(others, "rank      : 0 (local_rank: 0)") || !strings.Contains(others, "Signal 15 (SIGTERM) received by PID 10") {
		t.Errorf("other failures section wrong:\n%s", out)
	}
}

func TestNoReportOnSuccess(t *testing.T) {
	var b strings.Builder
	WriteReport(&b, "x", &Result{})
	if b.Len() != 0 {
		t.Errorf("report on success: %q", b.String())
	}
}
