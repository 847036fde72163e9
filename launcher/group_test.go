package launcher

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func sh(script string) []string { return []string{"/bin/sh", "-c", script} }

func TestExitString(t *testing.T) {
	tests := []struct {
		exit   Exit
		want   string
		failed bool
	}{
		{Exit{}, "exitcode 0", false},
		{Exit{ExitCode: 3}, "exitcode 3", true},
		{Exit{ExitCode: 137, Signal: 9}, "signal 9 (SIGKILL)", true},
		{Exit{ExitCode: 143, Signal: 15}, "signal 15 (SIGTERM)", true},
	}
	for _, tt := range tests {
		if got := tt.exit.String(); got != tt.want || tt.exit.Failed() != tt.failed {
			t.Errorf("%+v: String() = %q, Failed() = %v; want %q, %v", tt.exit, got, tt.exit.Failed(), tt.want, tt.failed)
		}
	}
}

func TestStartGroupReportsExits(t *testing.T) {
	t.Parallel()
	observed := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	specs := []WorkerSpec{
		{LocalRank: 0, Rank: 10, Argv: sh("exit 0")},
		{LocalRank: 1, Rank: 11, Argv: sh("exit 3")},
		{LocalRank: 2, Rank: 12, Argv: sh("kill -9 $$")},
	}
	g, err := StartGroup(specs, GroupOptions{Logger: testLogger(t), Now: func() time.Time { return observed }})
	if err != nil {
		t.Fatal(err)
	}
	pids := g.Pids()
	exits := collectExits(t, g)

	want := []struct {
		code   int
		signal syscall.Signal
		text   string
	}{{0, 0, "exitcode 0"}, {3, 0, "exitcode 3"}, {137, syscall.SIGKILL, "signal 9 (SIGKILL)"}}
	if len(exits) != len(want) {
		t.Fatalf("got %d exits, want %d", len(exits), len(want))
	}
	for i, exit := range exits {
		if exit.LocalRank != i || exit.Rank != 10+i || exit.Pid != pids[i] || !exit.Time.Equal(observed) {
			t.Errorf("exit %d = %+v; want local rank %d, rank %d, pid %d, time %v", i, exit, i, 10+i, pids[i], observed)
		}
		if exit.ExitCode != want[i].code || exit.Signal != want[i].signal || exit.String() != want[i].text {
			t.Errorf("local rank %d: got %q (code %d, signal %d), want %q", i, exit, exit.ExitCode, exit.Signal, want[i].text)
		}
		if exit.Failed() != (want[i].code != 0) {
			t.Errorf("local rank %d: Failed() = %v", i, exit.Failed())
		}
	}
}

func TestStartGroupCopiesOutputBeforeExit(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var stdout, stderr bytes.Buffer
	g, err := StartGroup([]WorkerSpec{{
		Argv:   []string{"sh", "-c", `printf 'one\ntwo\n'; pwd; echo "$GORUN_X"; printf 'oops' >&2`},
		Env:    []string{"PATH=/usr/bin:/bin", "GORUN_X=from-env"},
		Dir:    dir,
		Stdout: &stdout,
		Stderr: &stderr,
	}}, GroupOptions{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	collectExits(t, g)
	// Exits is closed only after the copies finished, so the buffers are complete.
	if want := "one\ntwo\n" + dir + "\nfrom-env\n"; stdout.String() != want {
		t.Errorf("stdout = %q, want %q", stdout.String(), want)
	}
	if stderr.String() != "oops" {
		t.Errorf("stderr = %q, want %q", stderr.String(), "oops")
	}
}

func TestStartGroupPTY(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	g, err := StartGroup([]WorkerSpec{{
		Argv:   sh(`[ -t 1 ] && echo "stdout is a tty"; [ -t 2 ] || echo "stderr is a pipe" >&2`),
		Stdout: &stdout,
		Stderr: &stderr,
		PTY:    true,
	}}, GroupOptions{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if exit := collectExits(t, g)[0]; exit.Failed() {
		t.Errorf("worker %s", exit)
	}
	// No "\r\n": the terminal does not translate newlines.
	if stdout.String() != "stdout is a tty\n" {
		t.Errorf("stdout = %q", stdout.String())
	}
	if stderr.String() != "stderr is a pipe\n" {
		t.Errorf("stderr = %q", stderr.String())
	}
}

func TestStartGroupFailureNamesRankAndKillsStarted(t *testing.T) {
	t.Parallel()
	marker := "gorun-test-marker-" + strconv.Itoa(os.Getpid()) + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	specs := []WorkerSpec{
		{LocalRank: 0, Argv: []string{"/bin/sh", "-c", "exec sleep 30", marker}},
		{LocalRank: 1, Argv: sh("exec sleep 30")},
		{LocalRank: 2, Argv: []string{"./nope"}},
	}
	g, err := StartGroup(specs, GroupOptions{Logger: testLogger(t)})
	if err == nil {
		g.Stop(syscall.SIGKILL, 0)
		t.Fatal("StartGroup succeeded with a missing program")
	}
	if want := `launcher: start local rank 2 ("./nope"): `; !strings.HasPrefix(err.Error(), want) {
		t.Errorf("error %q does not start with %q", err, want)
	}
	var startErr *StartError
	if !errors.As(err, &startErr) || startErr.LocalRank != 2 || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("error %#v is not a StartError for local rank 2 wrapping ErrNotExist", err)
	}
	// StartGroup returns only after the started workers have been reaped.
	if pids := processesWith(t, marker); len(pids) > 0 {
		t.Errorf("worker 0 (pids %v) survived the failed start", pids)
	}
}

// processesWith returns the live processes whose command line contains marker.
func processesWith(t *testing.T, marker string) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, entry := range entries {
		pid, err := strconv.Atoi(entry.Name())
		if err != nil {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", entry.Name(), "cmdline"))
		if bytes.Contains(cmdline, []byte(marker)) && alive(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func TestStartGroupLooksUpArgv0InWorkerPath(t *testing.T) {
	t.Parallel()
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "gorun-hello"), []byte("#!/bin/sh\necho hello\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	var stdout bytes.Buffer
	g, err := StartGroup([]WorkerSpec{{Argv: []string{"gorun-hello"}, Env: []string{"PATH=/nonexistent:" + bin}, Stdout: &stdout}},
		GroupOptions{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	collectExits(t, g)
	if stdout.String() != "hello\n" {
		t.Errorf("stdout = %q", stdout.String())
	}

	_, err = StartGroup([]WorkerSpec{{Argv: []string{"gorun-hello"}, Env: []string{"PATH=/nonexistent"}}}, GroupOptions{Logger: testLogger(t)})
	if !errors.Is(err, exec.ErrNotFound) {
		t.Errorf("with gorun-hello outside PATH: error %v, want exec.ErrNotFound", err)
	}
}

func TestLookPathRefusesCurrentDirectory(t *testing.T) {
	t.Chdir(t.TempDir())
	if err := os.WriteFile("tool", []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := lookPath("tool", []string{"PATH=."}); !errors.Is(err, exec.ErrDot) {
		t.Errorf("lookPath with PATH=. : %v, want exec.ErrDot", err)
	}
	if path, err := lookPath("./tool", nil); path != "./tool" || err != nil {
		t.Errorf("lookPath(./tool) = %q, %v", path, err)
	}
}

func TestStopGraceThenKill(t *testing.T) {
	t.Parallel()
	out := newWaitingWriter()
	const loop = "while :; do sleep 0.05; done"
	g, err := StartGroup([]WorkerSpec{
		{LocalRank: 0, Argv: sh(`trap "exit 0" TERM; echo ready0; ` + loop), Stdout: out},
		{LocalRank: 1, Argv: sh(`trap "" TERM; echo ready1; ` + loop), Stdout: out},
	}, GroupOptions{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	out.waitFor(t, "ready0", "ready1") // the traps are set

	const grace = 300 * time.Millisecond
	start := time.Now()
	g.Stop(syscall.SIGTERM, grace)
	took := time.Since(start)

	exits := collectExits(t, g)
	if exits[0].ExitCode != 0 {
		t.Errorf("worker trapping TERM: %s, want exitcode 0", exits[0])
	}
	if exits[1].Signal != syscall.SIGKILL || exits[1].ExitCode != 128+9 {
		t.Errorf("worker ignoring TERM: %s, want signal 9 (SIGKILL)", exits[1])
	}
	if took < grace || took > grace+5*time.Second {
		t.Errorf("Stop took %v with a grace of %v", took, grace)
	}
}

func TestSignalReachesGrandchildren(t *testing.T) {
	t.Parallel()
	out := newWaitingWriter()
	// The grandchild reports TERM; the worker ignores it (after starting the
	// grandchild, which must not inherit that) and exits 7 once the
	// grandchild is done.
	grandchild := `sh -c 'trap "echo grandchild got TERM; exit 0" TERM; echo grandchild ready; while :; do sleep 0.05; done' &`
	g, err := StartGroup([]WorkerSpec{{
		Argv:   sh(grandchild + ` trap "" TERM; echo worker ready; wait; exit 7`),
		Stdout: out,
	}}, GroupOptions{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	out.waitFor(t, "grandchild ready", "worker ready")
	if err := g.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	exit := collectExits(t, g)[0]
	if exit.ExitCode != 7 {
		t.Errorf("worker: %s, want exitcode 7", exit)
	}
	if !strings.Contains(out.String(), "grandchild got TERM") {
		t.Errorf("grandchild did not get TERM; output %q", out.String())
	}
	if err := g.Signal(syscall.SIGTERM); err != nil {
		t.Errorf("Signal after every worker exited: %v", err)
	}
}

// SignalWorker reaches one worker and no other, and once that worker is
// reaped it sends nothing: its pid may be another process's by then.
func TestSignalWorkerReachesOneWorker(t *testing.T) {
	t.Parallel()
	out := newWaitingWriter()
	const loop = "while :; do sleep 0.05; done"
	g, err := StartGroup([]WorkerSpec{
		{LocalRank: 0, Argv: sh(`trap "echo zero got USR1" USR1; trap "echo zero got USR2; exit 6" USR2; echo ready0; ` + loop), Stdout: out},
		{LocalRank: 1, Argv: sh(`trap "echo one got USR1; exit 5" USR1; echo ready1; ` + loop), Stdout: out},
	}, GroupOptions{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	out.waitFor(t, "ready0", "ready1") // the traps are set
	if err := g.SignalWorker(1, syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	if exit := <-g.Exits(); exit.LocalRank != 1 || exit.ExitCode != 5 {
		t.Fatalf("first exit %s of local rank %d, want exitcode 5 of local rank 1", exit, exit.LocalRank)
	}
	if err := g.SignalWorker(1, syscall.SIGKILL); err != nil {
		t.Errorf("SignalWorker after the worker exited: %v", err)
	}
	if err := g.SignalWorker(2, syscall.SIGKILL); err == nil {
		t.Error("SignalWorker of a slot that does not exist: no error")
	}
	// Had local rank 0 got USR1 too, its shell would run that trap
	// before USR2's, which ends it.
	if err := g.SignalWorker(0, syscall.SIGUSR2); err != nil {
		t.Fatal(err)
	}
	if exit := collectExits(t, g); len(exit) != 1 || exit[0].ExitCode != 6 {
		t.Fatalf("local rank 0: %v, want exitcode 6", exit)
	}
	if got := out.String(); strings.Contains(got, "zero got USR1") || !strings.Contains(got, "zero got USR2") {
		t.Errorf("local rank 0 must get USR2 only; output %q", got)
	}
}

func TestReapKillsLeftoverChildren(t *testing.T) {
	t.Parallel()
	out := newWaitingWriter()
	g, err := StartGroup([]WorkerSpec{{Argv: sh("sleep 300 & echo $!"), Stdout: out}}, GroupOptions{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	collectExits(t, g)
	pid := leadingPid(t, out.String())
	killOnCleanup(t, pid)
	waitGone(t, 2*time.Second, pid)
}

func TestOutputDrainIsBounded(t *testing.T) {
	t.Parallel()
	pidFile := filepath.Join(t.TempDir(), "escapee.pid")
	// The escapee leaves the worker's process group and keeps stdout open;
	// the worker exits once the escapee has written its pid.
	escape := `setsid sh -c 'echo $$ > "$0.tmp"; mv "$0.tmp" "$0"; exec sleep 30' "$0" &
		while [ ! -e "$0" ]; do sleep 0.01; done`
	g, err := StartGroup([]WorkerSpec{{Argv: []string{"/bin/sh", "-c", escape, pidFile}, Stdout: newWaitingWriter()}},
		GroupOptions{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	exit := collectExits(t, g)[0]
	took := time.Since(start)
	pid, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	killOnCleanup(t, leadingPid(t, string(pid)))
	if exit.Failed() {
		t.Errorf("worker %s", exit)
	}
	if took > outputDrain+3*time.Second {
		t.Errorf("Exit took %v with an escapee holding stdout", took)
	}
}

var leadingNumber = regexp.MustCompile(`^\d+`)

func leadingPid(t *testing.T, text string) int {
	t.Helper()
	pid, err := strconv.Atoi(leadingNumber.FindString(text))
	if err != nil {
		t.Fatalf("no pid in %q", text)
	}
	return pid
}

// A console slower than the drain bound loses nothing: the bound counts
// only while the stream is empty, or once what it held at the worker's
// death has been read.
func TestSlowOutputIsNotCutByTheDrain(t *testing.T) {
	t.Parallel()
	const drain = 20 * time.Millisecond
	out := &slowWriter{delay: 10 * drain, slowWrites: 3}
	// 60,000 bytes fit a pipe: the worker exits while most of them wait.
	g, err := StartGroup([]WorkerSpec{{Argv: sh(`head -c 60000 /dev/zero | tr '\0' x`), Stdout: out}},
		GroupOptions{Logger: testLogger(t), drain: drain})
	if err != nil {
		t.Fatal(err)
	}
	if exit := collectExits(t, g)[0]; exit.Failed() {
		t.Fatalf("worker %s", exit)
	}
	if n := out.Len(); n != 60000 {
		t.Errorf("copied %d bytes of 60000", n)
	}
}

// slowWriter takes delay over each of its first slowWrites writes.
type slowWriter struct {
	delay      time.Duration
	mu         sync.Mutex
	slowWrites int
	n          int
}

func (w *slowWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.slowWrites > 0 {
		w.slowWrites--
		time.Sleep(w.delay)
	}
	w.n += len(p)
	return len(p), nil
}

func (w *slowWriter) Len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}

func TestLingering(t *testing.T) {
	const bound = time.Second
	s := int64(time.Second)
	tests := []struct {
		name                                      string
		now, died, idleSince, read, backlog, held int64
		want                                      bool
	}{
		{"just died, data left", 10 * s, 10 * s, 0, 0, 500, 500, false},
		{"copying slowly past the bound", 20 * s, 10 * s, 0, 400, 500, 100, false},
		{"empty for less than the bound", 20 * s, 19*s + 1, 19*s + 1, 500, 500, 0, false},
		{"empty for the bound", 20 * s, 10 * s, 19 * s, 500, 500, 0, true},
		{"empty since before the death", 20 * s, 19*s + 1, 5 * s, 500, 500, 0, false},
		{"waiting, but woken late: data waits", 20 * s, 10 * s, 12 * s, 400, 500, 100, false},
		{"waiting, backlog overestimated, empty", 20 * s, 10 * s, 12 * s, 400, 450, 0, true},
		{"backlog read, bound passed, still writing", 20 * s, 10 * s, 0, 900, 500, 64, true},
		{"backlog read, bound not passed", 10*s + 1, 10 * s, 0, 500, 500, 0, false},
	}
	for _, tt := range tests {
		if got := lingering(tt.now, tt.died, tt.idleSince, tt.read, tt.backlog, tt.held, bound); got != tt.want {
			t.Errorf("%s: lingering = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// The reapers of a wide node wait in Go's poller, not each in an OS thread
// of its own (waitid held one per worker).
func TestWaitingWorkersHoldNoThreadEach(t *testing.T) {
	const workers = 128
	specs := make([]WorkerSpec, workers)
	for i := range specs {
		specs[i] = WorkerSpec{LocalRank: i, Rank: i, Argv: []string{"sleep", "300"}}
	}
	g, err := StartGroup(specs, GroupOptions{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Stop(syscall.SIGKILL, 0)
	if threads := osThreads(t); threads >= workers/2 {
		t.Errorf("%d OS threads with %d workers waiting", threads, workers)
	}
}

func osThreads(t *testing.T) int {
	t.Helper()
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^Threads:\s+(\d+)$`).FindSubmatch(status)
	if m == nil {
		t.Fatal("no Threads in /proc/self/status")
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}
