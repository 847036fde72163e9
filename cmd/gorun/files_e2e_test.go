package main

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/shmname"
)

// A job id or role that is not one plain name is refused before anything
// is made: "../../x" would otherwise escape --log-dir and the temporary
// folder.
func TestTraversalNamesAreRefused(t *testing.T) {
	for _, args := range [][]string{
		{"--rdzv-id", "../../x"},
		{"--rdzv-id", "a/b"},
		{"--rdzv-id", "x\x01"},
		{"--role", "../x"},
		{"--role", ""},
	} {
		top := t.TempDir()
		logs := filepath.Join(top, "a", "b", "logs")
		j := gorun(t, nil, append(args, "--log-dir", logs, "true")...)
		if j.code != 2 || !strings.Contains(j.stderr, args[0]) {
			t.Errorf("gorun %q: want exit 2 naming %s:\n%s", args, args[0], j)
		}
		if entries, _ := os.ReadDir(top); len(entries) != 0 {
			t.Errorf("gorun %q made %v", args, entries)
		}
	}
}

// snapshot lists a tree: each path with its mode and contents.
func snapshot(t *testing.T, root string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s %v", strings.TrimPrefix(path, root), info.Mode())
		if info.Mode().IsRegular() {
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			fmt.Fprintf(&b, " %q", data)
		}
		b.WriteByte('\n')
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// The planted-symlink attack: while gorun runs (as root in CI) and
// restarts its workers, a link to a folder outside is planted, and
// flipped back and forth, at each component gorun makes or resets under
// --log-dir. gorun may refuse to go on, but nothing outside is written or
// deleted, and what it makes is 0700 and 0600.
func TestPlantedSymlinksAreNeverFollowed(t *testing.T) {
	outside := t.TempDir()
	for _, f := range []string{"0/precious", "attempt_0/0/precious", "precious"} {
		path := filepath.Join(outside, f)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte("root's own file\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	before := snapshot(t, outside)
	dir := t.TempDir()
	w := script(t, dir, "w.sh", "echo attacker text; echo more >&2; exit 3\n")
	for _, component := range []string{"job", "job/attempt_0", "job/attempt_1", "job/attempt_1/0", "job/attempt_2/1"} {
		logs := filepath.Join(t.TempDir(), "logs")
		if err := os.MkdirAll(filepath.Join(logs, filepath.Dir(component)), 0o700); err != nil {
			t.Fatal(err)
		}
		at := filepath.Join(logs, component)
		// The flipper moves what gorun made at the component aside (its
		// parent is a real folder: only this component is attacked) and
		// puts a link there, and back, until the run ends.
		var stop atomic.Bool
		flipped := make(chan int)
		go func() {
			n := 0
			for ; !stop.Load(); n++ {
				os.Rename(at, fmt.Sprintf("%s.moved%d", at, n))
				os.Symlink(outside, at)
				os.Remove(at)
			}
			flipped <- n
		}()
		for range 3 {
			gorun(t, nil, "--nproc-per-node", "2", "--max-restarts", "2", "--rdzv-id", "job", "--log-dir", logs, w)
		}
		// And once with the link in place from the start.
		stop.Store(true)
		if n := <-flipped; n == 0 {
			t.Fatalf("%s: the link was never planted", component)
		}
		os.Rename(at, at+".last")
		if err := os.Symlink(outside, at); err != nil {
			t.Fatal(err)
		}
		j := gorun(t, nil, "--nproc-per-node", "2", "--max-restarts", "2", "--rdzv-id", "job", "--log-dir", logs, w)
		if j.code == 0 {
			t.Errorf("%s: a link in place: gorun exited 0", component)
		}
		if after := snapshot(t, outside); after != before {
			t.Fatalf("link at %s: the folder outside changed:\nbefore:\n%safter:\n%s", component, before, after)
		}
		// What gorun made is this user's alone.
		filepath.WalkDir(logs, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.Type()&fs.ModeSymlink != 0 || path == logs || filepath.Base(path) == "logs" {
				return nil
			}
			info, err := d.Info()
			if err != nil {
				return nil
			}
			if perm := info.Mode().Perm(); d.IsDir() && perm != 0o700 || !d.IsDir() && perm != 0o600 {
				t.Errorf("%s is %v", path, info.Mode())
			}
			return nil
		})
	}
}

// gorunSegments lists the shared-memory segments whose creator is a
// child of pid.
func gorunSegments(pid int) map[string]int {
	found := make(map[string]int)
	entries, _ := os.ReadDir("/dev/shm")
	for _, e := range entries {
		n, ok := shmname.Parse(e.Name())
		if ok && parentOf(n.Pid) == pid {
			found[e.Name()] = n.Pid
		}
	}
	return found
}

// parentOf is pid's parent, 0 when pid is gone.
func parentOf(pid int) int {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	i := bytes.LastIndexByte(stat, ')')
	if err != nil || i < 0 {
		return 0
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// kill -9 of gorun and of a worker while the workers set up shared
// memory, between a segment's creation and its unlinking, the window in
// which a segment outlives its creator: the keeper removes the segment
// and the job's temporary folder.
func TestKillNineDuringSharedMemorySetupLeavesNothing(t *testing.T) {
	for try := 1; ; try++ {
		tmp := t.TempDir()
		cmd := exec.Command(bin("gorun"), "--nproc-per-node", "4", bin("allreduce-perf"), "-b", "4", "-e", "4", "-w", "0", "-n", "1")
		cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { cmd.Wait(); close(exited) }()
		var caught map[string]int
	watch:
		for {
			select {
			case <-exited:
				break watch
			default:
			}
			if caught = gorunSegments(cmd.Process.Pid); len(caught) > 0 {
				for _, pid := range caught {
					syscall.Kill(pid, syscall.SIGKILL)
				}
				cmd.Process.Kill()
				break
			}
		}
		<-exited
		if len(caught) == 0 {
			if try == 30 {
				t.Fatalf("no try of 30 saw a segment in its setup window; the last run:\n%s", out.String())
			}
			continue
		}
		left := func() []string {
			var names []string
			for name := range caught {
				if _, err := os.Lstat("/dev/shm/" + name); err == nil {
					names = append(names, name)
				}
			}
			entries, _ := os.ReadDir(tmp)
			for _, e := range entries {
				// The user's status folder, like tmux's, outlives jobs;
				// the killed agent's socket in it must not.
				if strings.HasPrefix(e.Name(), "gorun-status-") {
					if agents, _ := os.ReadDir(filepath.Join(tmp, e.Name())); len(agents) == 0 {
						continue
					}
				}
				names = append(names, filepath.Join(tmp, e.Name()))
			}
			return names
		}
		if !waitFor(15*time.Second, func() bool { return len(left()) == 0 }) {
			for name := range caught {
				os.Remove("/dev/shm/" + name)
			}
			t.Fatalf("after kill -9 in the setup window (try %d), left behind: %v\n%s", try, left(), out.String())
		}
		t.Logf("try %d: %d segments caught in their setup window, all swept", try, len(caught))
		return
	}
}
