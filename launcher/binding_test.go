package launcher

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// threadCPUsEnv makes the test binary print the CPUs each of its threads
// may use, one line each, as a Go worker bound by its agent.
const threadCPUsEnv = "GORUN_TEST_THREAD_CPUS"

func printThreadCPUs() int {
	// Threads beyond the runtime's own: goroutines blocked in system calls.
	for range 3 {
		go func() { time.Sleep(time.Minute) }()
		go unix.Nanosleep(&unix.Timespec{Sec: 60}, nil)
	}
	time.Sleep(50 * time.Millisecond)
	lists, err := threadCPULists(os.Getpid())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	for _, l := range lists {
		fmt.Println("threadcpus", l)
	}
	return 0
}

var cpusAllowed = regexp.MustCompile(`(?m)^Cpus_allowed_list:\s*(\S+)$`)

// threadCPULists reads Cpus_allowed_list of every thread of pid.
func threadCPULists(pid int) ([]string, error) {
	paths, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	if err != nil || len(paths) == 0 {
		return nil, fmt.Errorf("threads of %d: %v", pid, err)
	}
	var lists []string
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // the thread ended
		}
		if m := cpusAllowed.FindSubmatch(b); m != nil {
			lists = append(lists, string(m[1]))
		}
	}
	return lists, nil
}

func ownCPUs(t *testing.T) []int {
	t.Helper()
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		t.Fatal(err)
	}
	var cpus []int
	for c := 0; len(cpus) < set.Count(); c++ {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	return cpus
}

func TestParseBinding(t *testing.T) {
	for in, want := range map[string]Binding{"none": BindNone, "core": BindCore, " Core ": BindCore} {
		if got, err := ParseBinding(in); err != nil || got != want {
			t.Errorf("ParseBinding(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "socket", "cores", "1"} {
		if _, err := ParseBinding(in); err == nil || !strings.Contains(err.Error(), "want none or core") {
			t.Errorf("ParseBinding(%q): want an error naming the choices, got %v", in, err)
		}
	}
}

// CPUsFor takes the CPUs of the calling thread's mask in order, one per
// worker, wrapping around.
func TestCPUsForWrapsAroundTheAgentsCPUs(t *testing.T) {
	if got, err := BindNone.CPUsFor(3); got != nil || err != nil {
		t.Errorf("none: got %v, %v; want nil", got, err)
	}
	cpus := ownCPUs(t)
	got, err := BindCore.CPUsFor(2*len(cpus) + 1)
	if err != nil {
		t.Fatal(err)
	}
	for i, g := range got {
		if want := cpus[i%len(cpus)]; len(g) != 1 || g[0] != want {
			t.Errorf("worker %d: got CPUs %v, want [%d]", i, g, want)
		}
	}
	// A narrower mask (taskset, Slurm) narrows the choice.
	last := cpus[len(cpus)-1]
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var one, all unix.CPUSet
	one.Set(last)
	unix.SchedGetaffinity(0, &all)
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		t.Fatal(err)
	}
	defer unix.SchedSetaffinity(0, &all)
	got, err = BindCore.CPUsFor(2)
	if err != nil || len(got) != 2 || got[0][0] != last || got[1][0] != last {
		t.Errorf("under a one-CPU mask {%d}: got %v, %v", last, got, err)
	}
}

// A bound worker's every thread, the Go runtime's included, runs on its
// CPU only; the agent's threads keep theirs.
func TestBoundWorkerAndItsThreads(t *testing.T) {
	cpus := ownCPUs(t)
	cpu := cpus[len(cpus)-1]
	before, err := threadCPULists(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	env := append(os.Environ(), threadCPUsEnv+"=1")
	g, err := StartGroup([]WorkerSpec{{Argv: []string{os.Args[0]}, Env: env, Stdout: &out, CPUs: []int{cpu}}},
		GroupOptions{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if exits := collectExits(t, g); exits[0].Failed() {
		t.Fatalf("worker: %v\n%s", exits[0], out.String())
	}
	lines := strings.Fields(strings.ReplaceAll(out.String(), "threadcpus", ""))
	if len(lines) < 3 {
		t.Fatalf("want the worker's threads, got:\n%s", out.String())
	}
	for _, l := range lines {
		if l != strconv.Itoa(cpu) {
			t.Errorf("a worker thread may run on %s, want %d only (%d threads)", l, cpu, len(lines))
		}
	}
	after, err := threadCPULists(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range after {
		if l != before[0] {
			t.Errorf("an agent thread may run on %s after the start, %s before", l, before[0])
		}
	}
}
