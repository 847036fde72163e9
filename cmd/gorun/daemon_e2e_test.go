package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testenv"
)

// daemonBound is how soon after gorun ends, or a worker group is stopped,
// every daemon a worker started must be dead.
const daemonBound = 5 * time.Second

// containments are the two ways gorun holds what workers start, forced by
// GORUN_CONTAINMENT: the cgroup where gorun may create one, and the
// subreaper with a mark that works anywhere.
var containments = []struct {
	mode string
	// bare: an env-cleared daemon dies after kill -9 of gorun too. Only a
	// cgroup holds it then: the keeper finds daemons by the mark they
	// inherit.
	bare bool
}{
	{mode: "cgroup", bare: true},
	{mode: "subreaper", bare: false},
}

// requireContainment skips (fails under CI=true, whose VM runs the tests
// as root with cgroup2 mounted) when gorun cannot contain workers that way.
func requireContainment(t *testing.T, mode string) {
	t.Helper()
	j := gorun(t, []string{"GORUN_CONTAINMENT=" + mode}, "--nproc-per-node", "1", "true")
	if j.code == 0 {
		return
	}
	testenv.MustHave(t, fmt.Errorf("gorun cannot contain workers by %s:\n%s", mode, j),
		"root or a delegated cgroup v2 subtree, and Linux 5.7", "")
}

// daemonWorker writes a worker that starts, in attempt $TORCHELASTIC_RESTART_COUNT,
// daemons that leave its process group, and records their pids, one per
// line, in dir/daemons.<restart>.<rank>: one by `setsid -f`, one by a
// double fork through setsid and, with bare, one by `setsid -f` with an
// emptied environment. Before, it records its cgroup and mark in
// dir/where.<rank>. Then it runs then.
func daemonWorker(t *testing.T, dir string, bare bool, then string) string {
	t.Helper()
	bareLine, want := "", 2
	if bare {
		bareLine, want = `env -i setsid -f sh -c 'echo $$ > "$1"; exec sleep 300' sh "$d.3"`, 3
	}
	return script(t, dir, "w.sh", `
d="`+dir+`/d.$TORCHELASTIC_RESTART_COUNT.$RANK"
setsid -f sh -c 'echo $$ > "$1"; exec sleep 300' sh "$d.1"
sh -c 'setsid sh -c "sleep 300 & echo \$! > \"$1\"" sh "$1" &' sh "$d.2"
`+bareLine+`
while :; do
	n=0
	for f in "$d".*; do [ -s "$f" ] && n=$((n+1)); done
	[ $n -ge `+strconv.Itoa(want)+` ] && break
	sleep 0.01
done
{ grep '^0::' /proc/self/cgroup; echo "mark=$GORUN_JOB_MARK"; } > "`+dir+`/where.$RANK"
cat "$d".* > "`+dir+`/tmp.$RANK"
mv "`+dir+`/tmp.$RANK" "`+dir+`/daemons.$TORCHELASTIC_RESTART_COUNT.$RANK"
`+then+"\n")
}

// daemonPids waits until nproc workers of attempt restart have recorded
// their daemons, and returns the daemons' pids, each killed when the test
// ends whatever happens.
func daemonPids(t *testing.T, dir string, restart, nproc int, out func() string) []int {
	t.Helper()
	var pids []int
	ready := waitFor(30*time.Second, func() bool {
		pids = pids[:0]
		for r := range nproc {
			b, err := os.ReadFile(filepath.Join(dir, "daemons."+strconv.Itoa(restart)+"."+strconv.Itoa(r)))
			if err != nil {
				return false
			}
			for _, f := range strings.Fields(string(b)) {
				pid, err := strconv.Atoi(f)
				if err != nil {
					t.Fatalf("daemon pid %q: %v", f, err)
				}
				pids = append(pids, pid)
			}
		}
		return true
	})
	if !ready {
		t.Fatalf("workers of attempt %d did not record their daemons:\n%s", restart, out())
	}
	for _, pid := range pids {
		t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	}
	return pids
}

// assertDead fails unless every pid is dead within daemonBound.
func assertDead(t *testing.T, what string, pids []int, out func() string) {
	t.Helper()
	gone := waitFor(daemonBound, func() bool {
		for _, pid := range pids {
			if alive(pid) {
				return false
			}
		}
		return true
	})
	if gone {
		return
	}
	for _, pid := range pids {
		if alive(pid) {
			t.Errorf("daemon %d survived %s", pid, what)
		}
	}
	t.Logf("gorun's output:\n%s", out())
}

// assertContained checks that the workers ran the way mode says: inside a
// cgroup of gorun's, or carrying a mark outside one.
func assertContained(t *testing.T, dir, mode string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "where.0"))
	if err != nil {
		t.Fatal(err)
	}
	where := string(b)
	inCgroup := strings.Contains(where, "/gorun-")
	marked := !strings.Contains(where, "mark=\n")
	if mode == "cgroup" && !inCgroup || mode == "subreaper" && (inCgroup || !marked) {
		t.Errorf("worker under %s containment reports %q", mode, where)
	}
}

// A worker's daemons die when the job succeeds.
func TestDaemonsDieWhenTheJobSucceeds(t *testing.T) {
	for _, c := range containments {
		t.Run(c.mode, func(t *testing.T) {
			requireContainment(t, c.mode)
			dir := t.TempDir()
			w := daemonWorker(t, dir, true, "exit 0")
			j := gorun(t, []string{"GORUN_CONTAINMENT=" + c.mode}, "--nproc-per-node", "2", w)
			if j.code != 0 {
				t.Fatalf("want exit 0:\n%s", j)
			}
			pids := daemonPids(t, dir, 0, 2, j.String)
			assertContained(t, dir, c.mode)
			assertDead(t, "the job's success", pids, j.String)
		})
	}
}

// A failed attempt's daemons are dead before the next attempt starts, and
// the next attempt's die with the job.
func TestDaemonsDieBeforeARestart(t *testing.T) {
	for _, c := range containments {
		t.Run(c.mode, func(t *testing.T) {
			requireContainment(t, c.mode)
			dir := t.TempDir()
			// Attempt 1 reports which of attempt 0's daemons it finds alive.
			w := daemonWorker(t, dir, true, `
if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then
	# Fail once both ranks have their daemons running.
	while [ ! -e "`+dir+`/daemons.0.0" ] || [ ! -e "`+dir+`/daemons.0.1" ]; do sleep 0.01; done
	exit 3
fi
for p in $(cat "`+dir+`"/daemons.0.*); do
	case "$(sed -n 's/^State:[[:space:]]*//p' /proc/$p/status 2>/dev/null)" in
	""|Z*|X*) ;;
	*) echo "alive $p" >> "`+dir+`/seen.$RANK" ;;
	esac
done
echo checked >> "`+dir+`/seen.$RANK"
`)
			j := gorun(t, []string{"GORUN_CONTAINMENT=" + c.mode}, "--nproc-per-node", "2", "--max-restarts", "1", w)
			if j.code != 0 {
				t.Fatalf("want exit 0 after one restart:\n%s", j)
			}
			first := daemonPids(t, dir, 0, 2, j.String)
			second := daemonPids(t, dir, 1, 2, j.String)
			for r := range 2 {
				seen, err := os.ReadFile(filepath.Join(dir, "seen."+strconv.Itoa(r)))
				if err != nil || string(seen) != "checked\n" {
					t.Errorf("rank %d of attempt 1 found attempt 0's daemons %v: %q (%v)\n%s", r, first, seen, err, j)
				}
			}
			assertDead(t, "the job's end", append(first, second...), j.String)
		})
	}
}

// A worker's daemons die when gorun is stopped by SIGTERM, and when it is
// killed with SIGKILL (by the keeper).
func TestDaemonsDieWhenGorunIsStopped(t *testing.T) {
	for _, c := range containments {
		for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
			t.Run(c.mode+"/"+sig.String(), func(t *testing.T) {
				requireContainment(t, c.mode)
				dir := t.TempDir()
				// The subreaper outlives no kill -9: only what keeps the
				// mark is found after it.
				bare := c.bare || sig != syscall.SIGKILL
				w := daemonWorker(t, dir, bare, "exec sleep 300")
				cmd := exec.Command(bin("gorun"), "--nproc-per-node", "2", w)
				cmd.Env = append(testEnv(t), "GORUN_CONTAINMENT="+c.mode)
				var out bytes.Buffer
				cmd.Stdout, cmd.Stderr = &out, &out
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				defer cmd.Process.Kill()
				// out is only read once gorun has exited.
				pids := daemonPids(t, dir, 0, 2, func() string { return "(gorun still running)" })
				assertContained(t, dir, c.mode)
				if err := cmd.Process.Signal(sig); err != nil {
					t.Fatal(err)
				}
				cmd.Wait()
				if code := cmd.ProcessState.ExitCode(); sig == syscall.SIGTERM && code != 128+int(sig) {
					t.Errorf("exit %d after SIGTERM, want %d:\n%s", code, 128+int(sig), out.String())
				}
				assertDead(t, "gorun's "+sig.String(), pids, out.String)
			})
		}
	}
}
