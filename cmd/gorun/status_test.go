package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/elastic"
	"github.com/gorun/gorun/internal/testenv"
)

func TestLatestPerNode(t *testing.T) {
	t0 := time.Unix(1000, 0)
	docs := []elastic.NodeStatus{
		{RunID: "b", NodeRank: 0, Time: t0},
		{RunID: "a", NodeRank: 1, Time: t0, Host: "old"},
		{RunID: "a", NodeRank: 0, Time: t0},
		{RunID: "a", NodeRank: 1, Time: t0.Add(time.Second), Host: "new"},
	}
	got := latestPerNode(docs)
	var keys []string
	for _, d := range got {
		keys = append(keys, d.RunID+"/"+string(rune('0'+d.NodeRank))+d.Host)
	}
	if want := "a/0,a/1new,b/0"; strings.Join(keys, ",") != want {
		t.Errorf("latestPerNode = %v, want %s", keys, want)
	}
}

func TestWriteStatusTable(t *testing.T) {
	now := time.Unix(1000, 0)
	docs := []elastic.NodeStatus{{RunID: "job", Host: "n1", NodeRank: 1, Time: now.Add(-2 * time.Second), Workers: []elastic.WorkerStatus{
		{Rank: 3, LocalRank: 1, Pid: 31, State: elastic.StateExited, Exit: "exitcode 3", Restarts: 1},
		{Rank: 2, LocalRank: 0, Pid: 30, State: elastic.StateRunning, Restarts: 1, CPU: 99.6, RSS: 3 << 20, Idle: 4},
	}}}
	var b bytes.Buffer
	if err := writeStatusTable(&b, docs, now); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	want := [][]string{
		{"RUN", "HOST", "NODE", "RANK", "LOCAL", "PID", "STATE", "RESTARTS", "CPU%", "RSS", "IDLE", "AGE"},
		{"job", "n1", "1", "2", "0", "30", "running", "1", "100", "3.0MiB", "4s", "2s"},
		{"job", "n1", "1", "3", "1", "31", "exited", "(exitcode", "3)", "1", "0", "0B", "0s", "2s"},
	}
	if len(lines) != len(want) {
		t.Fatalf("table:\n%s", b.String())
	}
	for i, l := range lines {
		if got := strings.Fields(l); strings.Join(got, " ") != strings.Join(want[i], " ") {
			t.Errorf("line %d = %q, want %q", i, got, want[i])
		}
	}
}

func TestFormatBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0B", 1023: "1023B", 1024: "1.0KiB", 1536: "1.5KiB", 5 << 30: "5.0GiB"} {
		if got := formatBytes(n); got != want {
			t.Errorf("formatBytes(%d) = %s, want %s", n, got, want)
		}
	}
}

func TestPrintStacksWithoutPySpy(t *testing.T) {
	py := exec.Command(testenv.MustHaveCommand(t, "python3", "python3"), "-c", "import sys; sys.stdin.read()")
	stdin, err := py.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := py.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); py.Wait() }()
	// python3 may be a shim that execs the interpreter later.
	if !waitFor(10*time.Second, func() bool {
		exe, _ := os.Readlink("/proc/" + strconv.Itoa(py.Process.Pid) + "/exe")
		return strings.Contains(filepath.Base(exe), "python")
	}) {
		t.Fatal("python3 never became a python process")
	}
	// A Python worker, one that is not Python (this test), one gone, one exited.
	local := []elastic.NodeStatus{{Workers: []elastic.WorkerStatus{
		{Rank: 0, Pid: py.Process.Pid, State: elastic.StateRunning},
		{Rank: 1, Pid: os.Getpid(), State: elastic.StateRunning},
		{Rank: 2, Pid: 1 << 30, State: elastic.StateRunning},
		{Rank: 3, Pid: 2, State: elastic.StateExited},
	}}}
	var b bytes.Buffer
	noPySpy := func(string) (string, error) { return "", errors.New("not found") }
	if err := printStacks(t.Context(), &b, local, nil, noPySpy); err != nil {
		t.Fatal(err)
	}
	want := []string{"=== rank 0", "pip install py-spy", "=== rank 1", "no agent to ask for its stacks", "=== rank 2", "not running on this node"}
	for _, w := range want {
		if !strings.Contains(b.String(), w) {
			t.Errorf("stacks lack %q:\n%s", w, b.String())
		}
	}
	if strings.Contains(b.String(), "rank 3") {
		t.Errorf("stacks of an exited worker:\n%s", b.String())
	}
}
