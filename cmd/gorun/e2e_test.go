package main

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The demo of `make run`: four workers meet through gorun's store.
func TestDemoWorkersMeetThroughTheStore(t *testing.T) {
	j := gorun(t, nil, "--nproc-per-node", "4", bin("demo"))
	if j.code != 0 {
		t.Fatalf("demo failed:\n%s", j)
	}
	for r := 0; r < 4; r++ {
		for from := 0; from < 4; from++ {
			if from == r {
				continue
			}
			want := fmt.Sprintf("[rank%d]: rank %d of 4 received from rank %d: \"hello from rank %d ", r, r, from, from)
			if !strings.Contains(j.stdout, want) {
				t.Errorf("missing %q in:\n%s", want, j.stdout)
			}
		}
	}
	if n := strings.Count(j.stdout, "was the last of 4 ranks to arrive"); n != 1 {
		t.Errorf("%d ranks claim to be last, want 1:\n%s", n, j.stdout)
	}
	if !regexp.MustCompile(`store listening.*endpoint=127\.0\.0\.1:\d+`).MatchString(j.stderr) {
		t.Errorf("gorun did not print the store endpoint:\n%s", j.stderr)
	}
}

// A failing worker stops the group; gorun exits with ITS status and names it.
func TestExitCodeIsTheRootCause(t *testing.T) {
	dir := t.TempDir()
	w := script(t, dir, "w.sh", `
if [ "$RANK" = 2 ]; then echo "rank 2 fails" >&2; exit 3; fi
trap 'exit 0' TERM
sleep 30 & wait
`)
	start := time.Now()
	j := gorun(t, nil, "--nproc-per-node", "3", w)
	if j.code != 3 {
		t.Fatalf("want exit 3 (the failing rank's), got:\n%s", j)
	}
	if time.Since(start) > 20*time.Second {
		t.Errorf("the other workers were not stopped promptly")
	}
	for _, want := range []string{"Root Cause (first observed failure)", "rank      : 2 (local_rank: 2)", "exitcode  : 3", "[rank2]: rank 2 fails"} {
		if !strings.Contains(j.stderr, want) {
			t.Errorf("missing %q in stderr:\n%s", want, j.stderr)
		}
	}
}

// Acceptance 4: kill -9 of a worker, with and without a restart budget.
func TestKilledWorkerRestartsWithinBudget(t *testing.T) {
	dir := t.TempDir()
	w := script(t, dir, "w.sh", `
echo "restart=$TORCHELASTIC_RESTART_COUNT max=$TORCHELASTIC_MAX_RESTARTS"
if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$RANK" = 1 ]; then kill -9 $$; fi
if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then trap 'exit 0' TERM; sleep 30 & wait; fi
echo done
`)
	j := gorun(t, nil, "--nproc-per-node", "2", "--max-restarts", "1", w)
	if j.code != 0 {
		t.Fatalf("want success after one restart:\n%s", j)
	}
	for r := 0; r < 2; r++ {
		for _, want := range []string{fmt.Sprintf("[rank%d]: restart=1 max=1", r), fmt.Sprintf("[rank%d]: done", r)} {
			if !strings.Contains(j.stdout, want) {
				t.Errorf("missing %q:\n%s", want, j)
			}
		}
	}
	if !strings.Contains(j.stderr, "restarting (1/1)") {
		t.Errorf("gorun did not log the restart:\n%s", j.stderr)
	}

	j = gorun(t, nil, "--nproc-per-node", "2", "--max-restarts", "0", w)
	if j.code != 128+9 {
		t.Fatalf("want exit 137 (SIGKILL of rank 1), got:\n%s", j)
	}
	for _, want := range []string{"Root Cause", "rank      : 1 (local_rank: 1)", "SIGKILL"} {
		if !strings.Contains(j.stderr, want) {
			t.Errorf("missing %q in the report:\n%s", want, j.stderr)
		}
	}
}

// Acceptance 5: kill -9 of gorun leaves neither workers nor their children.
func TestKillingGorunKillsEverythingItStarted(t *testing.T) {
	dir := t.TempDir()
	w := script(t, dir, "w.sh", `
sleep 300 &
echo "$$ $!" > "`+dir+`/pids.$RANK"
sleep 300
`)
	cmd := exec.Command(bin("gorun"), "--nproc-per-node", "3", w)
	cmd.Env = testEnv(t)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	var pids []int
	ready := waitFor(30*time.Second, func() bool {
		pids = pids[:0]
		for r := 0; r < 3; r++ {
			b, err := os.ReadFile(filepath.Join(dir, "pids."+strconv.Itoa(r)))
			if err != nil || !bytes.HasSuffix(b, []byte("\n")) {
				return false
			}
			for _, f := range strings.Fields(string(b)) {
				pid, _ := strconv.Atoi(f)
				pids = append(pids, pid)
			}
		}
		return true
	})
	if !ready {
		t.Fatalf("workers did not start:\n%s", out.String())
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	gone := waitFor(2*time.Second, func() bool {
		for _, pid := range pids {
			if alive(pid) {
				return false
			}
		}
		return true
	})
	if !gone {
		for _, pid := range pids {
			if alive(pid) {
				syscall.Kill(pid, syscall.SIGKILL)
				t.Errorf("pid %d survived kill -9 of gorun", pid)
			}
		}
	}
}

// Acceptance 5: SIGTERM reaches every worker first; SIGKILL follows after
// the grace period for workers that do not exit.
func TestSIGTERMThenSIGKILLAfterGrace(t *testing.T) {
	dir := t.TempDir()
	w := script(t, dir, "w.sh", `
trap 'echo "got TERM"' TERM
echo ready > "`+dir+`/ready.$RANK"
while :; do sleep 0.05; done
`)
	cmd := exec.Command(bin("gorun"), "--nproc-per-node", "2", "--shutdown-timeout", "1.5", w)
	cmd.Env = testEnv(t)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	if !waitFor(30*time.Second, func() bool {
		_, e0 := os.Stat(filepath.Join(dir, "ready.0"))
		_, e1 := os.Stat(filepath.Join(dir, "ready.1"))
		return e0 == nil && e1 == nil
	}) {
		t.Fatal("workers did not start")
	}
	sent := time.Now()
	cmd.Process.Signal(syscall.SIGTERM)
	err := cmd.Wait()
	took := time.Since(sent)
	if code := cmd.ProcessState.ExitCode(); code != 128+15 {
		t.Errorf("want exit 143 after SIGTERM, got %d (%v)\n%s", code, err, stderr.String())
	}
	for r := 0; r < 2; r++ {
		if !strings.Contains(stdout.String(), fmt.Sprintf("[rank%d]: got TERM", r)) {
			t.Errorf("rank %d did not get SIGTERM first:\n%s", r, stdout.String())
		}
	}
	if took < 1400*time.Millisecond || took > 10*time.Second {
		t.Errorf("SIGKILL came %s after SIGTERM, want about the 1.5 s grace", took)
	}
}

// Malformed flags fail before anything starts, with the flag named.
func TestMalformedFlagsAreRejected(t *testing.T) {
	dir := t.TempDir()
	marker := filepath.Join(dir, "started")
	w := script(t, dir, "w.sh", "touch "+marker+"\n")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--nproc-per-node", "abc"}, `--nproc-per-node "abc"`},
		{[]string{"--nproc-per-node", "0"}, `--nproc-per-node "0"`},
		{[]string{"--nnodes", "3:2"}, `--nnodes "3:2"`},
		{[]string{"--max-restarts", "x"}, `--max-restarts "x"`},
		{[]string{"--redirects", "0:9"}, "--redirects"},
		{[]string{"--local-ranks-filter", "7"}, "--local-ranks-filter"},
		{[]string{"--signals-to-handle", "SIGFOO"}, "SIGFOO"},
		{[]string{"--shutdown-timeout", "-1"}, "--shutdown-timeout"},
		{[]string{"--rdzv-backend", "zookeeper"}, "--rdzv-backend"},
		{[]string{"--log-format", "xml"}, "--log-format"},
		{[]string{"--backend", "gloo"}, `--backend "gloo"`},
		{[]string{"--bind-to", "socket"}, `--bind-to "socket"`},
		{[]string{"--no-such-flag"}, "no-such-flag"},
		{[]string{"--module", "--no-python"}, "--module and --no-python"},
		{[]string{"--nproc-per-node", "2", "--nproc_per_node", "3"}, "two forms of the same flag"},
		{[]string{"--shutdown-timeout", "NaN"}, `--shutdown-timeout "NaN"`},
		{[]string{"--shutdown-timeout", "1e300"}, `--shutdown-timeout "1e300"`},
		{[]string{"--monitor-interval", "0"}, `--monitor-interval "0"`},
		{[]string{"--nproc-per-node", "100000"}, "ulimit -n"},
		{[]string{"--rdzv-backend", "c10d", "--rdzv-endpoint", ":::"}, `--rdzv-endpoint ":::"`},
	} {
		j := gorun(t, nil, append(tc.args, w)...)
		if j.code != 2 || !strings.Contains(j.stderr, tc.want) {
			t.Errorf("gorun %v: want exit 2 naming %q, got:\n%s", tc.args, tc.want, j)
		}
	}
	if j := gorun(t, nil); j.code != 2 || !strings.Contains(j.stderr, "no program") {
		t.Errorf("gorun without a program: want exit 2, got:\n%s", j)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("a worker started despite malformed flags")
	}
}

// A program that is not there is named, with a shell's 127, before any
// rendezvous.
func TestMissingProgramExits127(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{
		{filepath.Join(dir, "absent")},
		{"--python", filepath.Join(dir, "nopython"), "train.py"},
		{"gorun-no-such-command-anywhere"},
	} {
		j := gorun(t, nil, args...)
		if j.code != 127 || !strings.Contains(j.stderr, "cannot run it") || strings.Contains(j.stderr, "rendezvous") {
			t.Errorf("gorun %v: want exit 127 naming the program, nothing started:\n%s", args, j)
		}
	}
}

// --version names the build and starts nothing; after PROGRAM it is the
// program's argument, as every flag there is.
func TestVersion(t *testing.T) {
	dir := t.TempDir()
	w := script(t, dir, "w.sh", `echo "args: $*"`+"\n")
	j := gorun(t, nil, "--version", w)
	if j.code != 0 || !strings.HasPrefix(j.stdout, "gorun version ") || !strings.Contains(j.stdout, runtime.Version()) {
		t.Errorf("gorun --version: want exit 0 and the build's version (%s):\n%s", runtime.Version(), j)
	}
	if strings.Contains(j.stdout, "args:") {
		t.Errorf("gorun --version started the program:\n%s", j)
	}
	if j := gorun(t, nil, w, "--version", "-v"); j.code != 0 || !strings.Contains(j.stdout, "args: --version -v") {
		t.Errorf("gorun PROGRAM --version -v: want the program to get both:\n%s", j)
	}
}

// Both spellings and PET_* fallbacks reach the same setting.
func TestFlagSpellingsAndPETFallbacks(t *testing.T) {
	dir := t.TempDir()
	w := script(t, dir, "w.sh", `echo "ws=$WORLD_SIZE role=$ROLE_NAME"`+"\n")
	for _, tc := range []struct {
		env  []string
		args []string
	}{
		{nil, []string{"--nproc-per-node", "3", "--role", "trainer"}},
		{nil, []string{"--nproc_per_node=3", "--role=trainer"}},
		{[]string{"PET_NPROC_PER_NODE=3", "PET_ROLE=trainer"}, nil},
	} {
		j := gorun(t, tc.env, append(tc.args, w)...)
		if j.code != 0 || strings.Count(j.stdout, "ws=3 role=trainer") != 3 {
			t.Errorf("env %v args %v: want 3 workers of role trainer:\n%s", tc.env, tc.args, j)
		}
	}
}

// --bind-to core pins worker i, and whatever it starts, to the i-th CPU
// gorun may use, wrapping around; without it workers keep every CPU.
func TestBindToCore(t *testing.T) {
	var own unix.CPUSet
	if err := unix.SchedGetaffinity(0, &own); err != nil {
		t.Fatal(err)
	}
	var cpus []string
	for c := 0; len(cpus) < own.Count(); c++ {
		if own.IsSet(c) {
			cpus = append(cpus, strconv.Itoa(c))
		}
	}
	dir := t.TempDir()
	// The worker's child reports, so the binding is inherited, not set on
	// the worker alone.
	w := script(t, dir, "w.sh", `sh -c 'echo "cpus=$(grep Cpus_allowed_list /proc/self/status | cut -f2)"'`+"\n")
	n := len(cpus) + 1 // one more than the CPUs: the last wraps to the first
	j := gorun(t, nil, "--nproc-per-node", strconv.Itoa(n), "--bind-to", "core", w)
	if j.code != 0 {
		t.Fatalf("gorun --bind-to core:\n%s", j)
	}
	for r := range n {
		if want := fmt.Sprintf("[rank%d]: cpus=%s\n", r, cpus[r%len(cpus)]); !strings.Contains(j.stdout, want) {
			t.Errorf("want %q:\n%s", want, j)
		}
	}
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	all := regexp.MustCompile(`Cpus_allowed_list:\s*(\S+)`).FindSubmatch(status)[1]
	j = gorun(t, nil, "--nproc-per-node", "2", w)
	if j.code != 0 || strings.Count(j.stdout, "cpus="+string(all)+"\n") != 2 {
		t.Errorf("unbound workers: want both on every CPU gorun may use (%s):\n%s", all, j)
	}
}

// Console prefixes, --local-ranks-filter and per-rank log files.
func TestOutputPrefixesFiltersAndLogFiles(t *testing.T) {
	dir := t.TempDir()
	logs := filepath.Join(dir, "logs")
	w := script(t, dir, "w.sh", `
i=0; while [ $i -lt 200 ]; do echo "line $i of rank $RANK"; i=$((i+1)); done
echo "err of rank $RANK" >&2
`)
	j := gorun(t, nil, "--nproc-per-node", "3", "--local-ranks-filter", "0,2", "--log-dir", logs, "--rdzv-id", "job7", w)
	if j.code != 0 {
		t.Fatalf("job failed:\n%s", j)
	}
	line := regexp.MustCompile(`^\[rank(\d)\]: line \d+ of rank (\d)$`)
	counts := map[string]int{}
	for _, l := range strings.Split(strings.TrimSpace(j.stdout), "\n") {
		m := line.FindStringSubmatch(l)
		if m == nil || m[1] != m[2] {
			t.Fatalf("garbled or misattributed line %q", l)
		}
		counts[m[1]]++
	}
	if counts["0"] != 200 || counts["2"] != 200 || counts["1"] != 0 {
		t.Errorf("console lines per rank = %v, want 200 for ranks 0 and 2 only", counts)
	}
	for r := 0; r < 3; r++ {
		base := filepath.Join(logs, "job7", "attempt_0", strconv.Itoa(r))
		out, err := os.ReadFile(filepath.Join(base, "stdout.log"))
		if err != nil || strings.Count(string(out), "\n") != 200 {
			t.Errorf("stdout.log of rank %d: %v, %d lines", r, err, strings.Count(string(out), "\n"))
		}
		errLog, err := os.ReadFile(filepath.Join(base, "stderr.log"))
		if err != nil || string(errLog) != fmt.Sprintf("err of rank %d\n", r) {
			t.Errorf("stderr.log of rank %d = %q, %v", r, errLog, err)
		}
	}
}

// Redirected streams go to files only; tee'd ones to files and the console.
func TestRedirectsAndTee(t *testing.T) {
	dir := t.TempDir()
	logs := filepath.Join(dir, "logs")
	w := script(t, dir, "w.sh", "echo out-$RANK; echo err-$RANK >&2\n")
	j := gorun(t, nil, "--nproc-per-node", "2", "--redirects", "1", "--tee", "0:2", "--log-dir", logs, "--rdzv-id", "r", w)
	if j.code != 0 {
		t.Fatalf("job failed:\n%s", j)
	}
	if strings.Contains(j.stdout, "out-") {
		t.Errorf("redirected stdout reached the console:\n%s", j.stdout)
	}
	if !strings.Contains(j.stderr, "[rank0]: err-0") || !strings.Contains(j.stderr, "[rank1]: err-1") {
		t.Errorf("stderr missing from the console:\n%s", j.stderr)
	}
	if b, _ := os.ReadFile(filepath.Join(logs, "r", "attempt_0", "1", "stdout.log")); string(b) != "out-1\n" {
		t.Errorf("stdout.log of rank 1 = %q", b)
	}
}

// Acceptance 1: real PyTorch, gloo, env://, in agent-store mode and with
// worker rank 0 hosting the store on a port gorun chose.
func TestTorchGlooUnderGorun(t *testing.T) {
	py := python(t)
	for _, mode := range []struct {
		name string
		env  []string
	}{
		{"agent-store", nil},
		{"worker-hosted-store", []string{"TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			j := gorun(t, mode.env, "--nproc-per-node", "4", "--python", py, "testdata/torch_collectives.py")
			if j.code != 0 {
				t.Fatalf("torch job failed:\n%s", j)
			}
			for r := 0; r < 4; r++ {
				want := []string{
					fmt.Sprintf("[rank%d]: all_reduce rank=%d value=10", r, r),
					fmt.Sprintf("[rank%d]: broadcast rank=%d value=37", r, r),
				}
				if r != 1 {
					want = append(want, fmt.Sprintf("[rank%d]: subgroup rank=%d value=5", r, r))
				}
				for _, w := range want {
					if !strings.Contains(j.stdout, w) {
						t.Errorf("missing %q:\n%s", w, j)
					}
				}
			}
		})
	}
}

// A Python worker's error file (torchelastic's @record) is in the report.
func TestTorchErrorFileInReport(t *testing.T) {
	py := python(t)
	j := gorun(t, nil, "--nproc-per-node", "2", "--python", py, "testdata/torch_error.py")
	if j.code != 1 {
		t.Fatalf("want exit 1 from the failing Python worker:\n%s", j)
	}
	for _, want := range []string{"rank      : 1 (local_rank: 1)", "ValueError: rank one gives up", "error.json"} {
		if !strings.Contains(j.stderr, want) {
			t.Errorf("missing %q in:\n%s", want, j.stderr)
		}
	}
}

// Acceptance 3: the environment matches torchrun's, variable by variable.
func TestEnvironmentMatchesTorchrun(t *testing.T) {
	py := python(t)
	torchrun := filepath.Join(filepath.Dir(py), "torchrun")
	if _, err := os.Stat(torchrun); err != nil {
		t.Fatalf("torchrun not found beside %s: %v", py, err)
	}
	dir := t.TempDir()
	dump := func(tool string) string { return filepath.Join(dir, tool) }
	w := script(t, dir, "w.sh", `env > "$DUMP.$RANK"`+"\n")
	base := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}

	run := func(tool string, argv ...string) {
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = append(base, "DUMP="+dump(tool))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", tool, err, out)
		}
	}
	run("torchrun", torchrun, "--standalone", "--nproc_per_node", "2", "--redirects=1", "--tee=1", "--no_python", w)
	run("gorun", bin("gorun"), "--nproc-per-node", "2", w)

	// Values that name this particular job, not the contract.
	perJob := map[string]bool{"MASTER_PORT": true, "TORCHELASTIC_RUN_ID": true, "TORCHELASTIC_ERROR_FILE": true, "MASTER_ADDR": true}
	for r := 0; r < 2; r++ {
		theirs := readEnv(t, fmt.Sprintf("%s.%d", dump("torchrun"), r))
		ours := readEnv(t, fmt.Sprintf("%s.%d", dump("gorun"), r))
		for _, k := range sortedKeys(theirs) {
			v, ok := ours[k]
			switch {
			case k == "LC_CTYPE" || k == "DUMP":
				// Python's locale coercion in torchrun's own process, and ours.
			case !ok:
				t.Errorf("rank %d: gorun does not set %s (torchrun: %q)", r, k, theirs[k])
			case k == "TORCHELASTIC_USE_AGENT_STORE":
				// torchrun 1.13's c10d standalone says False; torch >= 2.3
				// and gorun share the agent's store.
				if v != "True" {
					t.Errorf("rank %d: TORCHELASTIC_USE_AGENT_STORE=%q, want True", r, v)
				}
			case perJob[k]:
				if v == "" {
					t.Errorf("rank %d: %s is empty", r, k)
				}
			case v != theirs[k]:
				t.Errorf("rank %d: %s=%q, torchrun says %q", r, k, v, theirs[k])
			}
		}
		for _, k := range sortedKeys(ours) {
			if _, ok := theirs[k]; !ok && !strings.HasPrefix(k, "GORUN_") && k != "TORCH_NCCL_ASYNC_ERROR_HANDLING" {
				t.Errorf("rank %d: gorun adds %s=%q, which torchrun does not set", r, k, ours[k])
			}
		}
	}
}

func readEnv(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			env[k] = v
		}
	}
	return env
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Two agents of a static two-node job on one machine: node 0 hosts the store,
// ranks are contiguous per node, and the nodes may differ in size.
func TestStaticTwoNodeJob(t *testing.T) {
	dir := t.TempDir()
	w := script(t, dir, "w.sh", `echo "rank=$RANK world=$WORLD_SIZE group=$GROUP_RANK/$GROUP_WORLD_SIZE local=$LOCAL_RANK/$LOCAL_WORLD_SIZE"`+"\n")
	port := strconv.Itoa(freePort(t))
	results := make(chan job, 2)
	for node, nproc := range []string{"2", "1"} {
		go func() {
			results <- gorun(t, nil, "--nnodes", "2", "--node-rank", strconv.Itoa(node), "--nproc-per-node", nproc,
				"--master-addr", "127.0.0.1", "--master-port", port, "--rdzv-id", "two", w)
		}()
	}
	var out string
	for range 2 {
		j := <-results
		if j.code != 0 {
			t.Fatalf("an agent failed:\n%s", j)
		}
		out += j.stdout
	}
	for _, want := range []string{
		"[rank0]: rank=0 world=3 group=0/2 local=0/2",
		"[rank1]: rank=1 world=3 group=0/2 local=1/2",
		"[rank2]: rank=2 world=3 group=1/2 local=0/1",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
}

// listenLoopback listens on 127.0.0.1:port.
func listenLoopback(port int) (net.Listener, error) {
	return net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
}

func freePort(t *testing.T) int {
	t.Helper()
	// On every address, as the store binds it: a port free on 127.0.0.1
	// may be held on 127.0.0.2 by another test's host.
	l, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
