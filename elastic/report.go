package elastic

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/gorun/gorun/launcher"
)

// Failure is one worker that ended badly, with what its error file said.
type Failure struct {
	launcher.Exit
	// Round is the rendezvous round the worker ran in.
	Round     int
	Host      string
	ErrorFile string
	// Error is the worker's error file, nil when it wrote none.
	Error *launcher.ErrorInfo
}

// When is the moment the failure happened: the error file's timestamp when
// the worker wrote one (it is closer to the cause), else when it exited.
func (f Failure) When() time.Time {
	if f.Error != nil && !f.Error.Timestamp.IsZero() {
		return f.Error.Timestamp
	}
	return f.Time
}

// sortRootCauseFirst orders failures by time, so the first one is the root
// cause, as torchrun defines it (first observed failure); failures that
// their workers blamed on another rank come after all the others, since
// near-simultaneous exits on different nodes are seen in any order.
func sortRootCauseFirst(fs []Failure) {
	sort.SliceStable(fs, func(i, j int) bool {
		if ci, cj := fs[i].collateral(), fs[j].collateral(); ci != cj {
			return cj
		}
		return fs[i].When().Before(fs[j].When())
	})
}

func (f Failure) collateral() bool { return f.Error != nil && f.Error.Collateral }

// Result is how a job ended on this node.
type Result struct {
	// Failures of the last attempt, root cause first; empty on success.
	Failures []Failure
	// ExitCode is what gorun exits with: 0, the root cause's exit code
	// (128+signal for a signal), or 128+signal when gorun itself was signalled.
	ExitCode int
	// Restarts is how many times the worker group was restarted.
	Restarts int
	// Interrupted is the signal that stopped the job, if any.
	Interrupted string
}

// WriteReport prints torchrun's failure table for r, root cause first.
func WriteReport(w io.Writer, name string, r *Result) {
	if len(r.Failures) == 0 {
		return
	}
	var b strings.Builder
	thick, thin := strings.Repeat("=", launcher.ReportWidth), strings.Repeat("-", launcher.ReportWidth)
	fmt.Fprintf(&b, "%s\n%s FAILED\n%s\n", thick, name, thin)
	b.WriteString("Root Cause (first observed failure):\n")
	writeFailure(&b, 0, r.Failures[0])
	b.WriteString(thin + "\nOther Failures:\n")
	if len(r.Failures) == 1 {
		b.WriteString("  <NO_OTHER_FAILURES>\n")
	}
	for i, f := range r.Failures[1:] {
		writeFailure(&b, i+1, f)
	}
	b.WriteString(thick + "\n")
	io.WriteString(w, b.String())
}

func writeFailure(b *strings.Builder, i int, f Failure) {
	errorFile, traceback := "<N/A>", ""
	if f.ErrorFile != "" {
		errorFile = f.ErrorFile
	}
	if f.Error != nil {
		traceback = f.Error.Message
		if f.Error.Traceback != "" {
			traceback += "\n" + f.Error.Traceback
		}
	}
	if traceback == "" && f.Signal != 0 {
		traceback = fmt.Sprintf("Signal %d (%s) received by PID %d", int(f.Signal), signalName(f.Signal), f.Pid)
	}
	if traceback == "" {
		traceback = "<N/A> (the worker wrote no error file)"
	}
	fmt.Fprintf(b, "[%d]:\n", i)
	fmt.Fprintf(b, "  time      : %s\n", f.When().Format("2006-01-02_15:04:05"))
	fmt.Fprintf(b, "  host      : %s\n", f.Host)
	fmt.Fprintf(b, "  rank      : %d (local_rank: %d)\n", f.Rank, f.LocalRank)
	fmt.Fprintf(b, "  exitcode  : %s (pid: %d)\n", exitStatus(f.Exit), f.Pid)
	fmt.Fprintf(b, "  error_file: %s\n", errorFile)
	fmt.Fprintf(b, "  traceback : %s\n", indentContinuation(traceback, "              "))
}

// exitStatus shows the status gorun would exit with, and the signal behind it.
func exitStatus(e launcher.Exit) string {
	if e.Signal != 0 {
		return fmt.Sprintf("%d (%s)", e.ExitCode, signalName(e.Signal))
	}
	return fmt.Sprint(e.ExitCode)
}

func indentContinuation(s, indent string) string {
	return strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n"+indent)
}

// failureRecord is a Failure as agents exchange it through the store, so
// that every node can report the failures of all.
type failureRecord struct {
	Round      int       `json:"round"`
	Host       string    `json:"host"`
	Rank       int       `json:"rank"`
	LocalRank  int       `json:"local_rank"`
	Pid        int       `json:"pid"`
	ExitCode   int       `json:"exit_code"`
	Signal     int       `json:"signal,omitempty"`
	Time       time.Time `json:"time"`
	ErrorFile  string    `json:"error_file,omitempty"`
	Message    string    `json:"message,omitempty"`
	Traceback  string    `json:"traceback,omitempty"`
	ErrorTime  time.Time `json:"error_time,omitzero"`
	Collateral bool      `json:"collateral,omitempty"`
}

// encodeFailures renders fs as one line of JSON.
func encodeFailures(fs []Failure) []byte {
	records := make([]failureRecord, len(fs))
	for i, f := range fs {
		r := failureRecord{
			Round: f.Round, Host: f.Host, Rank: f.Rank, LocalRank: f.LocalRank, Pid: f.Pid,
			ExitCode: f.ExitCode, Signal: int(f.Signal), Time: f.Time, ErrorFile: f.ErrorFile,
		}
		if f.Error != nil {
			r.Message, r.Traceback, r.ErrorTime = f.Error.Message, f.Error.Traceback, f.Error.Timestamp
			r.Collateral = f.Error.Collateral
		}
		records[i] = r
	}
	b, _ := json.Marshal(records) // plain data: cannot fail
	return b
}

func decodeFailures(b []byte) ([]Failure, error) {
	var records []failureRecord
	if err := json.Unmarshal(b, &records); err != nil {
		return nil, fmt.Errorf("elastic: failure report %q: %w", b, err)
	}
	fs := make([]Failure, len(records))
	for i, r := range records {
		fs[i] = Failure{
			Exit: launcher.Exit{
				LocalRank: r.LocalRank, Rank: r.Rank, Pid: r.Pid,
				ExitCode: r.ExitCode, Signal: syscall.Signal(r.Signal), Time: r.Time,
			},
			Round: r.Round, Host: r.Host, ErrorFile: r.ErrorFile,
		}
		if r.Message != "" || r.Traceback != "" || !r.ErrorTime.IsZero() || r.Collateral {
			fs[i].Error = &launcher.ErrorInfo{Message: r.Message, Traceback: r.Traceback, Timestamp: r.ErrorTime, Collateral: r.Collateral}
		}
	}
	return fs, nil
}

// WriteEvents prints torchelastic's status events for r as JSON lines, one
// per failed worker (source WORKER) and one for the agent, in the shape
// torch's console event handler prints: name, source, timestamp in
// milliseconds, metadata (--event-log-handler console).
func WriteEvents(w io.Writer, s Spec, r *Result, now time.Time) {
	state := "SUCCEEDED"
	switch {
	case r.Interrupted != "":
		state = "STOPPED"
	case len(r.Failures) > 0:
		state = "FAILED"
	}
	type event struct {
		Name      string         `json:"name"`
		Source    string         `json:"source"`
		Timestamp int64          `json:"timestamp"`
		Metadata  map[string]any `json:"metadata"`
	}
	meta := func(extra map[string]any) map[string]any {
		m := map[string]any{
			"run_id": s.RunID, "role": s.Role, "hostname": s.Host, "rdzv_backend": s.Backend,
			"agent_restarts": r.Restarts, "state": state,
		}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	enc := json.NewEncoder(w)
	for _, f := range r.Failures {
		raw := ""
		if f.Error != nil {
			raw = f.Error.Message
		}
		enc.Encode(event{"torchelastic.worker.status.FAILED", "WORKER", f.When().UnixMilli(), meta(map[string]any{
			"state": "FAILED", "global_rank": f.Rank, "local_rank": f.LocalRank, "hostname": f.Host,
			"exit_code": f.ExitCode, "raw_error": raw,
		})})
	}
	enc.Encode(event{"torchelastic.worker.status." + state, "AGENT", now.UnixMilli(), meta(map[string]any{
		"exit_code": r.ExitCode, "signal": r.Interrupted,
	})})
}
