package main

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// fileTimer is the environment that turns torch's file-timer watchdog on.
const fileTimer = "TORCHELASTIC_ENABLE_FILE_TIMER=1"

// timerFileOf is the pipe a worker reported, which must have been a
// named pipe while it ran.
func timerFileOf(t *testing.T, j job) string {
	t.Helper()
	m := regexp.MustCompile(`timer file (\S+) fifo=(\w+)`).FindStringSubmatch(j.stdout)
	if m == nil || m[2] != "True" {
		t.Fatalf("no worker saw a named pipe in TORCHELASTIC_TIMER_FILE:\n%s", j)
	}
	return m[1]
}

// A worker that overstays its scope is killed with the signal it asked
// for, soon after the scope expires; the job fails with that signal's
// status, the report names the scope, and the pipe is gone.
func TestFileTimerKillsAWorkerThatOverstays(t *testing.T) {
	py := python(t)
	j := gorun(t, []string{fileTimer}, "--nproc-per-node", "2", "--python", py,
		"testdata/torch_filetimer.py", "overstay", "SIGTERM")
	ended := time.Now()
	if j.code != 128+15 {
		t.Fatalf("want exit 143 (SIGTERM), got:\n%s", j)
	}
	for _, want := range []string{
		`watchdog: scope expired; signalling the worker`,            // the agent's log
		`traceback : watchdog: scope "train_step" expired after 1s`, // the report
		"rank      : 1 (local_rank: 1)",
		"exitcode  : 143 (SIGTERM)",
	} {
		if !strings.Contains(j.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, j)
		}
	}
	if !strings.Contains(j.stdout, "rank 0 done") {
		t.Errorf("rank 0, within its scope, did not finish:\n%s", j)
	}
	// The worker would sleep a minute: it was killed within seconds.
	m := regexp.MustCompile(`overstaying at ([0-9.]+)`).FindStringSubmatch(j.stdout)
	if m == nil {
		t.Fatalf("rank 1 did not overstay:\n%s", j)
	}
	entered, _ := strconv.ParseFloat(m[1], 64)
	if took := ended.Sub(time.Unix(0, int64(entered*1e9))); took > 15*time.Second {
		t.Errorf("the job ended %s after rank 1 entered its 1 s scope", took)
	}
	if path := timerFileOf(t, j); !errors.Is(lstat(path), os.ErrNotExist) {
		t.Errorf("the pipe %s outlived gorun", path)
	}
}

// An expired scope is a failure like any other: the group restarts, and
// an attempt that keeps within its scope succeeds.
func TestFileTimerFailureRestartsTheGroup(t *testing.T) {
	py := python(t)
	j := gorun(t, []string{fileTimer}, "--nproc-per-node", "2", "--max-restarts", "1", "--python", py,
		"testdata/torch_filetimer.py", "overstay-first")
	if j.code != 0 || !strings.Contains(j.stderr, "scope=train_step signal=SIGABRT stacks=true") ||
		!strings.Contains(j.stderr, "restarting (1/1)") || !strings.Contains(j.stdout, "rank 1 done restart=1") {
		t.Fatalf("want a SIGKILL by the watchdog, one restart and success, got:\n%s", j)
	}
}

// A worker that the watchdog would SIGKILL (torch's default) is first
// asked for its stacks: faulthandler prints the stuck line's traceback on
// SIGABRT, and the report says so.
func TestFileTimerPrintsPythonStacksBeforeTheKill(t *testing.T) {
	py := python(t)
	j := gorun(t, []string{fileTimer}, "--nproc-per-node", "2", "--python", py, "testdata/torch_filetimer.py", "overstay")
	if j.code != 128+6 {
		t.Fatalf("want exit 134 (SIGABRT, on which faulthandler dumps and dies), got:\n%s", j)
	}
	// The traceback names the line rank 1 is stuck on: its time.sleep.
	stuck := regexp.MustCompile(`\[rank1\]: +File ".*torch_filetimer\.py", line (\d+) in <module>`).FindStringSubmatch(j.stderr)
	src, err := os.ReadFile("testdata/torch_filetimer.py")
	if err != nil {
		t.Fatal(err)
	}
	if stuck == nil {
		t.Fatalf("no Python traceback of rank 1:\n%s", j)
	}
	n, _ := strconv.Atoi(stuck[1])
	if lines := strings.Split(string(src), "\n"); n < 1 || n > len(lines) || !strings.Contains(lines[n-1], "time.sleep(60)") {
		t.Errorf("the traceback points at line %d, not the sleep rank 1 is stuck in:\n%s", n, j)
	}
	if !strings.Contains(j.stderr, "asked for its Python stacks (SIGABRT, printed above), then SIGKILL") {
		t.Errorf("the report does not say the stacks were asked for:\n%s", j)
	}
}

// A scope released in time reaps nothing, even once its expiry has
// passed; and the pipe is where TORCHELASTIC_TIMER_FILE says, and is
// removed afterwards.
func TestFileTimerSparesWorkersWithinTheirScope(t *testing.T) {
	py := python(t)
	path := filepath.Join(t.TempDir(), "my_watchdog")
	j := gorun(t, []string{fileTimer, "TORCHELASTIC_TIMER_FILE=" + path}, "--nproc-per-node", "2", "--python", py,
		"testdata/torch_filetimer.py", "in-time")
	if j.code != 0 || strings.Count(j.stdout, " done restart=0") != 2 || strings.Contains(j.stderr, "watchdog:") {
		t.Fatalf("want both ranks done and no watchdog, got:\n%s", j)
	}
	if got := timerFileOf(t, j); got != path {
		t.Errorf("workers got TORCHELASTIC_TIMER_FILE=%s, want %s", got, path)
	}
	if !errors.Is(lstat(path), os.ErrNotExist) {
		t.Errorf("the pipe %s outlived gorun", path)
	}
}

// --hang-timeout cannot see Python workers, and says so once.
func TestHangTimeoutWarnsItIsBlindToPython(t *testing.T) {
	py := python(t)
	prog := filepath.Join(t.TempDir(), "hello.py")
	if err := os.WriteFile(prog, []byte("print('hello')\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	j := gorun(t, nil, "--nproc-per-node", "2", "--max-restarts", "1", "--hang-timeout", "5", "--python", py, prog)
	if j.code != 0 || strings.Count(j.stderr, "TORCHELASTIC_ENABLE_FILE_TIMER=1") != 1 {
		t.Fatalf("want success and one warning pointing to the file timer, got:\n%s", j)
	}
}

func lstat(path string) error {
	_, err := os.Lstat(path)
	return err
}
