package launcher

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/gorun/gorun/internal/testenv"
)

// containedAgentEnv makes the test binary play an agent whose workers are
// contained in the mode it names, and that can be killed -9.
const containedAgentEnv = "GORUN_TEST_CONTAINED_AGENT"

func TestParseContainMode(t *testing.T) {
	for in, want := range map[string]ContainMode{"": ContainAuto, "auto": ContainAuto, "cgroup": ContainCgroup, "subreaper": ContainSubreaper} {
		if got, err := ParseContainMode(in); err != nil || got != want {
			t.Errorf("ParseContainMode(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"Cgroup", "none", "cgroups"} {
		if _, err := ParseContainMode(in); err == nil {
			t.Errorf("ParseContainMode(%q) succeeded", in)
		}
	}
}

func TestOwnCgroupDir(t *testing.T) {
	const (
		hybrid = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n" +
			"32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n" +
			"41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
		unified = "35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate\n"
		// A container's view: its own cgroup bind-mounted as the root.
		bound   = "600 590 0:30 /docker/abc /sys/fs/cgroup ro,nosuid master:9 - cgroup2 cgroup2 rw\n"
		escaped = "35 24 0:30 / /mnt/cg\\040x rw - cgroup2 none rw\n"
	)
	for _, tc := range []struct {
		name, mountinfo, membership, want string
	}{
		{"hybrid, root cgroup", hybrid, "1:cpu:/\n0::/\n", "/sys/fs/cgroup/unified"},
		{"unified, a session", unified, "0::/user.slice/user-1000.slice/session-2.scope\n", "/sys/fs/cgroup/user.slice/user-1000.slice/session-2.scope"},
		{"bound subtree", bound, "0::/docker/abc/job\n", "/sys/fs/cgroup/job"},
		{"bound subtree itself", bound, "0::/docker/abc\n", "/sys/fs/cgroup"},
		{"escaped mount point", escaped, "0::/a\n", "/mnt/cg x/a"},
		{"prefix is not a parent", bound, "0::/docker/abcd\n", ""},
		{"cgroup v1 only", hybrid, "1:cpu:/\n", ""},
		{"outside the namespace", unified, "0::/../sibling\n", ""},
		{"no cgroup2 mount", "31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n", "0::/\n", ""},
	} {
		got, err := ownCgroupDir(tc.mountinfo, tc.membership)
		if tc.want == "" {
			if err == nil {
				t.Errorf("%s: got %q, want an error", tc.name, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%s: got %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
}

func TestKernelAtLeast(t *testing.T) {
	for release, want := range map[string]bool{
		"6.18.44-fc-v595": true, "5.7.0": true, "5.7-rc1": true, "5.10": true,
		"5.6.19": false, "4.18.0-553.el8_10.x86_64": false, "junk": false, "5": false,
	} {
		if got := kernelAtLeast(release, 5, 7); got != want {
			t.Errorf("kernelAtLeast(%q, 5, 7) = %v, want %v", release, got, want)
		}
	}
}

func TestHasMark(t *testing.T) {
	env := func(entries ...string) []byte { return []byte(strings.Join(entries, "\x00") + "\x00") }
	for _, tc := range []struct {
		environ []byte
		want    bool
	}{
		{env("PATH=/bin", JobMarkEnv+"=abc", "HOME=/"), true},
		{env(JobMarkEnv + "=abc"), true},
		{[]byte(JobMarkEnv + "=abc"), true}, // no trailing NUL
		{env(JobMarkEnv + "=abcd"), false},
		{env(JobMarkEnv + "=ab"), false},
		{env("X" + JobMarkEnv + "=abc"), false},
		{env("OTHER=" + JobMarkEnv + "=abc"), false},
		{nil, false},
	} {
		if got := hasMark(tc.environ, "abc"); got != tc.want {
			t.Errorf("hasMark(%q) = %v, want %v", tc.environ, got, tc.want)
		}
	}
}

func TestLeftovers(t *testing.T) {
	const self, selfPgid = 100, 100
	procs := []proc{
		{pid: 1, ppid: 0, pgid: 1},
		{pid: 90, ppid: 1, pgid: 90},                   // our parent
		{pid: 100, ppid: 90, pgid: 100},                // ourselves
		{pid: 150, ppid: 100, pgid: 150},               // the keeper: started by us
		{pid: 200, ppid: 100, pgid: 200, zombie: true}, // a dead worker, not yet reaped
		{pid: 300, ppid: 100, pgid: 300},               // adopted, mark cleared
		{pid: 301, ppid: 300, pgid: 300},               // its child
		{pid: 302, ppid: 301, pgid: 302},               // and grandchild
		{pid: 400, ppid: 100, pgid: 100},               // our own helper, in our group
		{pid: 500, ppid: 1, pgid: 500, marked: true},   // escaped beyond us, marked
		{pid: 501, ppid: 500, pgid: 501},               // its child, mark cleared
		{pid: 600, ppid: 100, pgid: 600, zombie: true}, // adopted and dead
		{pid: 700, ppid: 1, pgid: 700},                 // a stranger
		{pid: 701, ppid: 700, pgid: 700, marked: true}, // a marked child of a stranger
	}
	started := func(pid int) bool { return pid == 150 || pid == 200 }
	if got, want := leftovers(procs, self, selfPgid, started), []int{300, 301, 302, 500, 501, 701}; !slices.Equal(got, want) {
		t.Errorf("leftovers = %v, want %v", got, want)
	}
	// The keeper, after the agent died: no children, only marks.
	if got, want := leftovers(procs, 150, 150, func(int) bool { return false }), []int{500, 501, 701}; !slices.Equal(got, want) {
		t.Errorf("leftovers for the keeper = %v, want %v", got, want)
	}
}

// A process that takes the mark only after the first scan, as one caught
// in the middle of its exec shows no environment until the exec is done,
// is found by the look a settle later: the keeper looks twice even where
// its first scan found nothing.
func TestKillLeftoversLooksAgainAfterAnExec(t *testing.T) {
	mark := "exec-" + strconv.Itoa(os.Getpid())
	late := exec.Command("sh", "-c", "sleep 0.05; exec env "+JobMarkEnv+"="+mark+" sleep 30")
	late.Env = []string{"PATH=" + os.Getenv("PATH")}
	if err := late.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- late.Wait() }()
	t.Cleanup(func() { late.Process.Kill() })
	none := func(int) bool { return false }
	killed, left := killLeftovers(mark, none, func() {}, 10*time.Second, time.Second, true)
	if !slices.Equal(killed, []int{late.Process.Pid}) || len(left) != 0 {
		t.Fatalf("killed %v, left %v; want %d killed", killed, left, late.Process.Pid)
	}
	select {
	case err := <-waited:
		if status, ok := late.ProcessState.Sys().(syscall.WaitStatus); !ok || status.Signal() != syscall.SIGKILL {
			t.Errorf("it ended with %v, want SIGKILL", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("it outlived its kill")
	}
}

// contain returns a Containment in mode, closed when the test ends; a
// cgroup that cannot be had skips the test (fails it under CI=true, whose
// VM runs as root with cgroup2).
func contain(t *testing.T, mode ContainMode) *Containment {
	t.Helper()
	c, err := Contain(ContainOptions{Mode: mode, Logger: testLogger(t)})
	if errors.Is(err, errNoCgroup) {
		testenv.MustHave(t, err, "a cgroup of our own (root, or a delegated cgroup v2 subtree)", "")
	}
	if err != nil {
		t.Fatal(err)
	}
	if c.Mode() != mode {
		t.Fatalf("Contain(%s) contains by %s", mode, c.Mode())
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// containedKeeper is a Containment in mode and the keeper it starts,
// both closed when the test ends.
func containedKeeper(t *testing.T, mode ContainMode) (*Containment, *Keeper) {
	t.Helper()
	c := contain(t, mode)
	keeper, err := c.StartKeeper(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { keeper.Close() })
	return c, keeper
}

// daemonsScript starts daemons that leave the worker's process group, by
// `setsid -f`, by a double fork through setsid and, with bare, by `setsid
// -f` with an emptied environment; waits for them; and prints
// "daemons <pid>..." and the worker's cgroup.
func daemonsScript(dir string, bare bool) string {
	s := `d="` + dir + `/d"
setsid -f sh -c 'echo $$ > "$1"; exec sleep 300' sh "$d.1"
sh -c 'setsid sh -c "sleep 300 & echo \$! > \"$1\"" sh "$1" &' sh "$d.2"
`
	want := 2
	if bare {
		s += `env -i setsid -f sh -c 'echo $$ > "$1"; exec sleep 300' sh "$d.3"` + "\n"
		want = 3
	}
	return s + `while :; do
	n=0
	for f in "$d".*; do [ -s "$f" ] && n=$((n+1)); done
	[ $n -ge ` + strconv.Itoa(want) + ` ] && break
	sleep 0.01
done
echo daemons $(cat "$d".*)
grep '^0::' /proc/self/cgroup
`
}

// daemonPids parses the "daemons" line of out; each is killed when the
// test ends.
func daemonPids(t *testing.T, out string) []int {
	t.Helper()
	for line := range strings.Lines(out) {
		fields, found := strings.CutPrefix(strings.TrimSpace(line), "daemons ")
		if !found {
			continue
		}
		var pids []int
		for _, f := range strings.Fields(fields) {
			pid, err := strconv.Atoi(f)
			if err != nil {
				t.Fatalf("daemon pid %q: %v", f, err)
			}
			killOnCleanup(t, pid)
			pids = append(pids, pid)
		}
		return pids
	}
	t.Fatalf("no daemons line in %q", out)
	return nil
}

// assertContainedBy checks that the worker's cgroup, in out, is the
// containment's, and that every pid is dead and, if it was adopted,
// reaped.
func assertContainedBy(t *testing.T, c *Containment, out string, pids []int) {
	t.Helper()
	if c.Mode() == ContainCgroup && !strings.Contains(out, "/"+filepath.Base(c.cgroup)+"/group-") {
		t.Errorf("worker outside the job's cgroup %s: %q", c.cgroup, out)
	}
	for _, pid := range pids {
		if alive(pid) {
			t.Errorf("daemon %d outlived its group", pid)
		} else if p, ok := readProc(pid); ok && p.ppid == os.Getpid() {
			t.Errorf("daemon %d, adopted, was never reaped", pid)
		}
	}
}

// A group's daemons are dead when its last Exit has been delivered, and
// when Stop returns: the cell is swept before, whatever the mode.
func TestContainedGroupLeavesNothing(t *testing.T) {
	for _, mode := range []ContainMode{ContainCgroup, ContainSubreaper} {
		t.Run(string(mode)+"/exit", func(t *testing.T) {
			c, keeper := containedKeeper(t, mode)
			out := newWaitingWriter()
			g, err := StartGroup([]WorkerSpec{
				{LocalRank: 0, Argv: sh(daemonsScript(t.TempDir(), true) + "exit 0"), Stdout: out},
				{LocalRank: 1, Argv: sh(daemonsScript(t.TempDir(), true) + "exit 7"), Stdout: out},
			}, GroupOptions{Logger: testLogger(t), Keeper: keeper})
			if err != nil {
				t.Fatal(err)
			}
			exits := collectExits(t, g)
			if len(exits) != 2 || exits[0].ExitCode != 0 || exits[1].ExitCode != 7 {
				t.Fatalf("exits %v", exits)
			}
			text := out.String()
			assertContainedBy(t, c, text, daemonPids(t, text))
			if err := keeper.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
			if c.cgroup != "" && fileExists(c.cgroup) {
				t.Errorf("the job's cgroup %s outlived Close", c.cgroup)
			}
		})
		t.Run(string(mode)+"/stop", func(t *testing.T) {
			c, keeper := containedKeeper(t, mode)
			out := newWaitingWriter()
			g, err := StartGroup([]WorkerSpec{
				{Argv: sh(daemonsScript(t.TempDir(), true) + "exec sleep 300"), Stdout: out},
			}, GroupOptions{Logger: testLogger(t), Keeper: keeper})
			if err != nil {
				t.Fatal(err)
			}
			text := out.waitFor(t, "daemons", "0::")
			pids := daemonPids(t, text)
			g.Stop(syscall.SIGTERM, time.Second)
			assertContainedBy(t, c, text, pids)
		})
	}
}

// In subreaper mode, an adopted process that dies while its worker runs
// is reaped at once: no zombie piles up.
func TestSubreaperReapsAdoptedAsTheyDie(t *testing.T) {
	_, keeper := containedKeeper(t, ContainSubreaper)
	out := newWaitingWriter()
	release := filepath.Join(t.TempDir(), "release")
	g, err := StartGroup([]WorkerSpec{{
		Argv:   sh(`setsid -f sh -c 'echo orphan $$; while [ ! -e "$1" ]; do sleep 0.01; done' sh ` + release + `; exec sleep 300`),
		Stdout: out,
	}}, GroupOptions{Logger: testLogger(t), Keeper: keeper})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Stop(syscall.SIGKILL, 0) })
	orphan := leadingPid(t, strings.TrimPrefix(out.waitFor(t, "orphan"), "orphan "))
	killOnCleanup(t, orphan)
	poll := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				p, _ := readProc(orphan)
				t.Fatalf("process %d never %s: %+v", orphan, what, p)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	poll("adopted", func() bool { p, ok := readProc(orphan); return ok && p.ppid == os.Getpid() })
	if err := os.WriteFile(release, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// Only its parent, this process, can make it vanish from /proc.
	poll("reaped", func() bool { _, ok := readProc(orphan); return !ok })
}

// kill -9 of the agent: the keeper kills the job's cgroup, or every process
// that kept the mark. An env-cleared daemon escapes the subreaper then, so
// it is only tried with a cgroup.
func TestKeeperKillsContainedDaemonsWhenAgentIsKilled(t *testing.T) {
	for _, mode := range []ContainMode{ContainCgroup, ContainSubreaper} {
		t.Run(string(mode), func(t *testing.T) {
			contain(t, mode).Close() // skips where the mode is not to be had
			agent := exec.Command(os.Args[0], "-test.run=^$")
			agent.Env = append(os.Environ(), containedAgentEnv+"="+string(mode), "GORUN_TEST_DIR="+t.TempDir())
			agent.Stderr = os.Stderr
			stdout, err := agent.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := agent.Start(); err != nil {
				t.Fatal(err)
			}
			killOnCleanup(t, agent.Process.Pid)
			lines := bufio.NewScanner(stdout)
			var daemons []int
			ready := make(chan error, 1)
			go func() {
				for lines.Scan() {
					if strings.HasPrefix(lines.Text(), "daemons ") {
						for _, f := range strings.Fields(lines.Text())[1:] {
							pid, err := strconv.Atoi(f)
							if err != nil {
								ready <- err
								return
							}
							daemons = append(daemons, pid)
						}
						ready <- nil
						return
					}
				}
				ready <- fmt.Errorf("agent output ended: %v", lines.Err())
			}()
			select {
			case err := <-ready:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("the contained agent did not report its daemons")
			}
			for _, pid := range daemons {
				killOnCleanup(t, pid)
				if !alive(pid) {
					t.Fatalf("daemon %d not running before the agent was killed", pid)
				}
			}
			if err := agent.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			agent.Wait()
			waitGone(t, 5*time.Second, daemons...)
		})
	}
}

// runContainedAgent contains its one worker in the mode of
// containedAgentEnv; the worker starts daemons, which this prints, then
// waits to be killed.
func runContainedAgent(mode string) int {
	c, err := Contain(ContainOptions{Mode: ContainMode(mode), Logger: zerolog.Nop()})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	keeper, err := c.StartKeeper(os.Args[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	_, err = StartGroup([]WorkerSpec{{
		Argv:   sh(daemonsScript(os.Getenv("GORUN_TEST_DIR"), mode == string(ContainCgroup)) + "exec sleep 300"),
		Stdout: os.Stdout,
	}}, GroupOptions{Logger: zerolog.Nop(), Keeper: keeper})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	time.Sleep(time.Minute) // the test kills us long before
	return 1
}

// The probe fails where a process cannot start inside the directory: here
// one that is no cgroup at all.
func TestProbeCgroupRefusesANonCgroup(t *testing.T) {
	if err := probeCgroup(t.TempDir()); err == nil {
		t.Error("a process started inside a plain directory")
	}
}

// Workers start side by side, so all that started may have exited before
// the last one starts. The cell must not be swept then: a cgroup killed
// through cgroup.kill kills whatever is cloned into it later (this failed
// 16 runs in 60 of `gorun --nproc-per-node 3` before the fix).
func TestFastWorkersAreNotSweptBeforeTheLastStarts(t *testing.T) {
	for _, mode := range []ContainMode{ContainCgroup, ContainSubreaper} {
		t.Run(string(mode), func(t *testing.T) {
			_, keeper := containedKeeper(t, mode)
			for round := range 30 {
				specs := make([]WorkerSpec, 6)
				for i := range specs {
					specs[i] = WorkerSpec{LocalRank: i, Argv: []string{"/bin/true"}}
				}
				g, err := StartGroup(specs, GroupOptions{Logger: testLogger(t), Keeper: keeper})
				if err != nil {
					t.Fatal(err)
				}
				for _, e := range collectExits(t, g) {
					if e.ExitCode != 0 {
						t.Fatalf("round %d: local rank %d exited %s", round, e.LocalRank, e)
					}
				}
			}
		})
	}
}
