package launcher

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// fakeAgentEnv makes the test binary play an agent that can be killed -9.
const fakeAgentEnv = "GORUN_TEST_FAKE_AGENT"

func TestMain(m *testing.M) {
	if MaybeRunKeeper(os.LookupEnv) {
		os.Exit(0)
	}
	if os.Getenv(fakeAgentEnv) == "1" {
		os.Exit(runFakeAgent())
	}
	if mode := os.Getenv(containedAgentEnv); mode != "" {
		os.Exit(runContainedAgent(mode))
	}
	if os.Getenv(threadCPUsEnv) == "1" {
		os.Exit(printThreadCPUs())
	}
	os.Exit(m.Run())
}

// fakeAgentDirsEnv lists, separated by colons, the folders the fake agent
// has its keeper remove.
const fakeAgentDirsEnv = "GORUN_TEST_FAKE_AGENT_DIRS"

// runFakeAgent starts a keeper and one worker that leaves a background
// grandchild, records the folders of fakeAgentDirsEnv, prints the pids,
// then waits to be killed.
func runFakeAgent() int {
	keeper, err := StartKeeper(os.Args[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	for dir := range strings.SplitSeq(os.Getenv(fakeAgentDirsEnv), ":") {
		if err := keeper.RemoveOnExit(dir); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	g, err := StartGroup([]WorkerSpec{{
		Argv:   []string{"/bin/sh", "-c", "sleep 300 & echo grandchild $!; exec sleep 300"},
		Stdout: os.Stdout,
	}}, GroupOptions{Logger: zerolog.Nop(), Keeper: keeper})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("worker %d\nkeeper %d\n", g.Pids()[0], keeper.cmd.Process.Pid)
	time.Sleep(time.Minute) // the test kills us long before
	return 1
}

func testLogger(t *testing.T) zerolog.Logger {
	return zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.DebugLevel)
}

// collectExits gathers every Exit of g, ordered by local rank.
func collectExits(t *testing.T, g *Group) []Exit {
	t.Helper()
	timeout := time.After(20 * time.Second)
	var exits []Exit
	for {
		select {
		case exit, ok := <-g.Exits():
			if !ok {
				slices.SortFunc(exits, func(a, b Exit) int { return a.LocalRank - b.LocalRank })
				return exits
			}
			exits = append(exits, exit)
		case <-timeout:
			t.Fatalf("workers did not all exit; got %v", exits)
		}
	}
}

// alive reports whether pid is a process that has not yet died (a zombie
// counts as dead: only reaping is missing).
func alive(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses.
	fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z" && fields[0] != "X"
}

// waitGone polls until none of pids is alive, failing after timeout.
func waitGone(t *testing.T, timeout time.Duration, pids ...int) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		live := slices.DeleteFunc(slices.Clone(pids), func(pid int) bool { return !alive(pid) })
		if len(live) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes %v still alive after %v", live, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// killOnCleanup makes sure a test never leaves pid behind, even when it fails.
func killOnCleanup(t *testing.T, pid int) {
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
}

// waitingWriter records a stream and lets a test wait for text in it.
type waitingWriter struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	changed chan struct{} // closed and replaced on every write
}

func newWaitingWriter() *waitingWriter { return &waitingWriter{changed: make(chan struct{})} }

func (w *waitingWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	close(w.changed)
	w.changed = make(chan struct{})
	return len(p), nil
}

func (w *waitingWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// waitFor blocks until every one of words has been written.
func (w *waitingWriter) waitFor(t *testing.T, words ...string) string {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		w.mu.Lock()
		text, changed := w.buf.String(), w.changed
		w.mu.Unlock()
		if !slices.ContainsFunc(words, func(word string) bool { return !strings.Contains(text, word) }) {
			return text
		}
		select {
		case <-changed:
		case <-timeout:
			t.Fatalf("waiting for %q; output so far: %q", words, text)
		}
	}
}
