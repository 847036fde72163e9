package elastic

import (
	"math"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/launcher"
)

func TestParseProcStat(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     int64
		err      bool
	}{
		{"plain", "42 (python3) S 1 42 42 0 -1 4194560 100 0 0 0 250 30 0 0 20 0 1 0", 280, false},
		{"name with spaces and parens", "42 (a b) c)) R 1 42 42 0 -1 0 0 0 0 0 7 3 0 0", 10, false},
		{"no name", "42 S 1 2", 0, true},
		{"too short", "42 (x) S 1 2 3", 0, true},
		{"not a number", "42 (x) S 1 42 42 0 -1 0 0 0 0 0 u s", 0, true},
	} {
		got, err := parseProcStat([]byte(tc.in))
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("%s: parseProcStat = %d, %v; want %d, error %v", tc.name, got, err, tc.want, tc.err)
		}
	}
	if got, err := parseProcStatm([]byte("1000 250 30 1 0 80 0\n")); err != nil || got != 250 {
		t.Errorf("parseProcStatm = %d, %v; want 250", got, err)
	}
	if _, err := parseProcStatm([]byte("1000")); err == nil {
		t.Error("parseProcStatm of one field: no error")
	}
}

func TestWorkerRows(t *testing.T) {
	t0 := time.Unix(1000, 0)
	now := t0.Add(10 * time.Second)
	wrote := new(atomic.Int64)
	wrote.Store(t0.Add(7 * time.Second).UnixNano())
	exit := launcher.Exit{LocalRank: 1, ExitCode: 137, Signal: syscall.SIGKILL}
	slots := []slotState{
		{rank: 4, localRank: 0, pid: 100, started: t0, lastOutput: wrote},
		{rank: 5, localRank: 1, pid: 101, started: t0, lastOutput: new(atomic.Int64), exit: &exit},
		{rank: 6, localRank: 2, pid: 102, started: t0}, // not sampled yet
	}
	prev := map[int]procSample{100: {cpuTicks: 100, rssPages: 10, at: now.Add(-2 * time.Second)}}
	cur := map[int]procSample{100: {cpuTicks: 250, rssPages: 20, at: now}}
	for _, tc := range []struct {
		name       string
		restarting bool
		want       []WorkerStatus
	}{
		{"running", false, []WorkerStatus{
			{Rank: 4, LocalRank: 0, Pid: 100, State: StateRunning, Restarts: 2, CPU: 75, RSS: 20 * 4096, Idle: 3},
			{Rank: 5, LocalRank: 1, Pid: 101, State: StateExited, Exit: "signal 9 (SIGKILL)", Restarts: 2, Idle: 10},
			{Rank: 6, LocalRank: 2, Pid: 102, State: StateRunning, Restarts: 2, Idle: 10},
		}},
		{"restarting", true, []WorkerStatus{
			{Rank: 4, LocalRank: 0, Pid: 100, State: StateRunning, Restarts: 2, CPU: 75, RSS: 20 * 4096, Idle: 3},
			{Rank: 5, LocalRank: 1, Pid: 101, State: StateRestarting, Exit: "signal 9 (SIGKILL)", Restarts: 2, Idle: 10},
			{Rank: 6, LocalRank: 2, Pid: 102, State: StateRunning, Restarts: 2, Idle: 10},
		}},
	} {
		got := workerRows(slots, 2, tc.restarting, cur, prev, nil, 4096, now)
		if len(got) != len(tc.want) {
			t.Fatalf("%s: %d rows, want %d", tc.name, len(got), len(tc.want))
		}
		for i := range got {
			g, w := got[i], tc.want[i]
			if math.Abs(g.CPU-w.CPU) > 1e-9 || math.Abs(g.Idle-w.Idle) > 1e-9 {
				t.Errorf("%s row %d: CPU %v idle %v, want %v %v", tc.name, i, g.CPU, g.Idle, w.CPU, w.Idle)
			}
			g.CPU, g.Idle, w.CPU, w.Idle = 0, 0, 0, 0
			if g != w {
				t.Errorf("%s row %d: %+v, want %+v", tc.name, i, g, w)
			}
		}
		if c := workerCounts(got); c[StateRunning] != 2 || c[StateExited]+c[StateRestarting] != 1 {
			t.Errorf("%s: workerCounts = %v", tc.name, c)
		}
	}
}

func TestCollectiveOf(t *testing.T) {
	now := time.Unix(1000, 0)
	for _, tc := range []struct {
		ops  []flightOp
		want string
	}{
		{nil, ""},
		{[]flightOp{{seq: 6, op: "all_reduce", dtype: "float32", count: 1 << 20, peer: -1, state: flightRunning, start: now.Add(-2100 * time.Millisecond)}},
			"in all_reduce #6 (float32 x 1048576) for 2.1s"},
		{[]flightOp{{seq: 1, op: "barrier", peer: -1, state: flightDone}, {seq: 2, op: "recv", dtype: "int32", count: 2, peer: 5, state: flightDone}},
			"done recv #2 (src=5, int32 x 2)"},
	} {
		if got := collectiveOf(tc.ops, now); got != tc.want {
			t.Errorf("collectiveOf(%v) = %q, want %q", tc.ops, got, tc.want)
		}
	}
}
