package launcher

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
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
	// Threads beyond the runtime's own: goroutines blocked in system calls,
	// each holding its thread, which the poll below waits to see.
	for range 3 {
		go func() { time.Sleep(time.Minute) }()
		go unix.Nanosleep(&unix.Timespec{Sec: 60}, nil)
	}
	for deadline := time.Now().Add(10 * time.Second); threadsIn(unix.SYS_NANOSLEEP) < 3; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			fmt.Fprintln(os.Stderr, "the three threads never blocked in nanosleep")
			return 1
		}
	}
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

// threadsIn counts this process's threads blocked in system call nr.
func threadsIn(nr int) int {
	paths, _ := filepath.Glob("/proc/self/task/*/syscall")
	n := 0
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err == nil && strings.HasPrefix(string(b), strconv.Itoa(nr)+" ") {
			n++
		}
	}
	return n
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
	return cpusOf(&set)
}

func TestParseBinding(t *testing.T) {
	for in, want := range map[string]Binding{"none": BindNone, "core": BindCore, " Core ": BindCore, "numa": BindNUMA} {
		if got, err := ParseBinding(in); err != nil || got != want {
			t.Errorf("ParseBinding(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "socket", "cores", "1"} {
		if _, err := ParseBinding(in); err == nil || !strings.Contains(err.Error(), "want none, core or numa") {
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

func TestParseCPUList(t *testing.T) {
	for in, want := range map[string][]int{"": nil, "0": {0}, "0-3": {0, 1, 2, 3}, "0-1,8,10-11": {0, 1, 8, 10, 11}} {
		if got, err := parseCPUList(in); err != nil || !slices.Equal(got, want) {
			t.Errorf("parseCPUList(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"a", "3-1", "1-", ",", "-2"} {
		if _, err := parseCPUList(in); err == nil {
			t.Errorf("parseCPUList(%q): want an error", in)
		}
	}
}

// The nodes come in node order (node10 after node2), a node of memory
// only is listed empty, and a garbled list is an error naming its file.
func TestNUMANodes(t *testing.T) {
	root := t.TempDir()
	for node, list := range map[string]string{"node0": "0-1,4\n", "node2": "2-3\n", "node10": "5\n", "node3": "\n"} {
		os.Mkdir(filepath.Join(root, node), 0o755)
		os.WriteFile(filepath.Join(root, node, "cpulist"), []byte(list), 0o644)
	}
	got, err := numaNodes(root)
	want := [][]int{{0, 1, 4}, {2, 3}, nil, {5}}
	if err != nil || !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("numaNodes = %v, %v; want %v", got, err, want)
	}
	os.WriteFile(filepath.Join(root, "node3", "cpulist"), []byte("x\n"), 0o644)
	if _, err := numaNodes(root); err == nil || !strings.Contains(err.Error(), "node3") {
		t.Errorf("garbled node3: want an error naming it, got %v", err)
	}
	if _, err := numaNodes(t.TempDir()); err == nil {
		t.Error("no nodes: want an error")
	}
}

// Bound by NUMA node, a worker gets every CPU of its node it may use: on
// a machine of one node, all of them.
func TestCPUsForNUMA(t *testing.T) {
	nodes, err := numaNodes(nodeRoot)
	if err != nil {
		t.Fatal(err)
	}
	got, err := BindNUMA.CPUsFor(3)
	if err != nil {
		t.Fatal(err)
	}
	own := ownCPUs(t)
	for i, cpus := range got {
		if len(cpus) == 0 {
			t.Fatalf("worker %d: no CPUs", i)
		}
		for _, c := range cpus {
			if !slices.Contains(own, c) {
				t.Errorf("worker %d: CPU %d is not ours (%v)", i, c, own)
			}
		}
	}
	if len(nodes) == 1 && !slices.Equal(got[0], own) {
		t.Errorf("one node: worker 0 got %v, want all of ours %v", got[0], own)
	}
}
