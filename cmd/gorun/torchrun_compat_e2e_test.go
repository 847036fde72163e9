package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testenv"
)

// Issue 20: a command copied from PyTorch's docs runs. Each torchrun flag
// gorun had refused is accepted, through the real CLI.
func TestTorchrunFlagsAreAccepted(t *testing.T) {
	dir := t.TempDir()
	w := script(t, dir, "w.sh", `echo "rank=$RANK local=$LOCAL_RANK"`+"\n")
	for _, args := range [][]string{
		{"--start-method", "spawn"},
		{"--start_method=forkserver"},
		{"--logs-specs", "default"},
		{"--use-env"},
		{"--use_env"},
		{"--numa-binding", "node"},
		{"--numa_binding=exclusive"},
		{"--event-log-handler", "null"},
		{"--duplicate-stdout-filters", "rank", "--duplicate_stderr_filters=x"},
	} {
		j := gorun(t, nil, append(append([]string{"--nproc-per-node", "2"}, args...), w)...)
		if j.code != 0 || !strings.Contains(j.stdout, "rank=1 local=1") {
			t.Errorf("gorun %v: want the job to run:\n%s", args, j)
		}
	}
	if j := gorun(t, nil, "--start-method", "fork", w); !strings.Contains(j.stderr, "gorun always starts every worker as a fresh process") {
		t.Errorf("--start-method: want an info line:\n%s", j)
	}
}

// An unknown flag: one line naming it as typed, a pointer to --help, exit
// 2, nothing on stdout.
func TestUnknownFlagIsNamedAsTyped(t *testing.T) {
	for _, tc := range []struct{ args, want []string }{
		{[]string{"--start-methodd", "spawn", "true"}, []string{"--start-methodd"}},
		{[]string{"--bogus=3", "true"}, []string{"--bogus"}},
		{[]string{"--logs-specs", "plugin", "true"}, []string{`--logs-specs "plugin"`}},
		{[]string{"--numa-binding", "rack", "true"}, []string{`--numa-binding "rack"`}},
	} {
		j := gorun(t, nil, tc.args...)
		lines := strings.Split(strings.TrimSpace(j.stderr), "\n")
		if j.code != 2 || j.stdout != "" || len(lines) != 2 || !strings.Contains(lines[1], "gorun --help") {
			t.Errorf("gorun %v: want exit 2, one error line and a pointer to --help, nothing on stdout:\n%s", tc.args, j)
			continue
		}
		for _, want := range tc.want {
			if !strings.Contains(lines[0], want) || strings.Contains(lines[0], " -"+strings.TrimLeft(want, "-")) {
				t.Errorf("gorun %v: want the line to name %s as typed:\n%s", tc.args, want, j)
			}
		}
	}
}

// pytorch/examples' ddp/run_example.sh: a static job whose store is named
// by --rdzv-endpoint, which workers see as MASTER_ADDR and MASTER_PORT.
func TestStaticRendezvousTakesTheEndpoint(t *testing.T) {
	dir := t.TempDir()
	w := script(t, dir, "w.sh", `echo "master=$MASTER_ADDR:$MASTER_PORT run=$TORCHELASTIC_RUN_ID"`+"\n")
	port := strconv.Itoa(freePort(t))
	j := gorun(t, nil, "--nnodes", "1", "--nproc-per-node", "2", "--rdzv-id", "101", "--rdzv-endpoint", "127.0.0.1:"+port, w)
	if want := "master=127.0.0.1:" + port + " run=101"; j.code != 0 || strings.Count(j.stdout, want) != 2 {
		t.Errorf("want both workers to see %q:\n%s", want, j)
	}
	if strings.Contains(j.stderr, "c10d") {
		t.Errorf("a static job turned c10d:\n%s", j)
	}
}

// ${hostname}, an empty template, and lines that carry the prefix already.
func TestPrefixTemplates(t *testing.T) {
	dir := t.TempDir()
	w := script(t, dir, "w.sh", `echo "plain"; echo "[rank$RANK]: Traceback"`+"\n")
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	j := gorun(t, nil, "--nproc-per-node", "2", w)
	if j.code != 0 || !strings.Contains(j.stdout, "[rank1]: plain\n") || !strings.Contains(j.stdout, "[rank1]: Traceback\n") ||
		strings.Contains(j.stdout, "[rank1]: [rank1]:") {
		t.Errorf("default prefix, said once:\n%s", j)
	}
	j = gorun(t, nil, "--nproc-per-node", "2", "--log-line-prefix-template", "${hostname}/${rank}| ", w)
	if j.code != 0 || !strings.Contains(j.stdout, host+"/1| plain\n") {
		t.Errorf("${hostname}: want %q:\n%s", host+"/1| plain", j)
	}
	for _, tc := range []struct {
		env  []string
		args []string
	}{
		{nil, []string{"--log-line-prefix-template", ""}},
		{[]string{"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE="}, nil},
	} {
		j = gorun(t, tc.env, append(append([]string{"--nproc-per-node", "2"}, tc.args...), w)...)
		if j.code != 0 || strings.Count(j.stdout, "plain\n") != 2 || strings.Contains(j.stdout, "]: plain") {
			t.Errorf("env %v args %v: want no prefix:\n%s", tc.env, tc.args, j)
		}
	}
}

// --duplicate-stdout-filters copies the tee'd lines that match into the
// attempt's filtered_stdout.log, prefixed, from every rank.
func TestDuplicateFilters(t *testing.T) {
	dir := t.TempDir()
	logs := filepath.Join(dir, "logs")
	w := script(t, dir, "w.sh", `echo "loss,acc=$RANK"; echo "noise $RANK"; echo "warn: NCCL $RANK" >&2`+"\n")
	j := gorun(t, nil, "--nproc-per-node", "2", "--rdzv-id", "dup", "--log-dir", logs, "--tee", "3",
		"--duplicate-stdout-filters", "loss,,acc,nothing", "--duplicate-stderr-filters", "NCCL", w)
	if j.code != 0 {
		t.Fatalf("job failed:\n%s", j)
	}
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(logs, "dup", "attempt_0", name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	out, errs := read("filtered_stdout.log"), read("filtered_stderr.log")
	for _, want := range []string{"[rank0]: loss,acc=0\n", "[rank1]: loss,acc=1\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("filtered_stdout.log lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "noise") || strings.Count(errs, "NCCL") != 2 {
		t.Errorf("filtered files copy what does not match, or miss what does:\n%s---\n%s", out, errs)
	}
	if !strings.Contains(j.stdout, "noise 1") {
		t.Errorf("the console lost lines:\n%s", j)
	}
}

// The failure header names the script, not the interpreter; with -m, the
// module. --event-log-handler console adds torchelastic's events.
func TestReportNamesTheProgram(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "fail.py"), []byte("import sys\nsys.exit(3)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	py := testenv.MustHavePython(t)
	j := gorun(t, nil, "--python", py, "--event-log-handler", "console", filepath.Join(dir, "fail.py"))
	if j.code != 3 || !strings.Contains(j.stderr, filepath.Join(dir, "fail.py")+" FAILED") || strings.Contains(j.stderr, "python3 FAILED") {
		t.Errorf("want the script in the header and exit 3:\n%s", j)
	}
	var events []map[string]any
	for _, line := range strings.Split(j.stderr, "\n") {
		var e map[string]any
		if json.Unmarshal([]byte(line), &e) == nil && e["name"] != nil {
			events = append(events, e)
		}
	}
	if len(events) != 2 || events[0]["name"] != "torchelastic.worker.status.FAILED" || events[0]["source"] != "WORKER" ||
		events[1]["source"] != "AGENT" {
		t.Errorf("want a WORKER and an AGENT event:\n%v\n%s", events, j)
	}
	j = gorun(t, []string{"PYTHONPATH=" + dir}, "--python", py, "-m", "fail")
	if j.code != 3 || !strings.Contains(j.stderr, "\nfail FAILED") {
		t.Errorf("want the module in the header:\n%s", j)
	}
}

// Kubernetes operators start the launcher with PET_* variables only:
// Kubeflow Trainer v2's torch runtime (static, PET_MASTER_*) and a
// PyTorchJob's elastic policy (c10d, PET_RDZV_*), each with an empty
// PET_STANDALONE. Two agents form the job.
func TestKubeflowEnvironments(t *testing.T) {
	dir := t.TempDir()
	w := script(t, dir, "w.sh", `echo "rank=$RANK world=$WORLD_SIZE"`+"\n")
	port := strconv.Itoa(freePort(t))
	for _, tc := range []struct {
		name  string
		nodes [][]string
	}{
		{"trainer v2", [][]string{
			{"PET_NNODES=2", "PET_NPROC_PER_NODE=2", "PET_NODE_RANK=0", "PET_MASTER_ADDR=127.0.0.1", "PET_MASTER_PORT=" + port, "PET_STANDALONE="},
			{"PET_NNODES=2", "PET_NPROC_PER_NODE=2", "PET_NODE_RANK=1", "PET_MASTER_ADDR=127.0.0.1", "PET_MASTER_PORT=" + port, "PET_STANDALONE="},
		}},
		{"pytorchjob elastic", [][]string{
			{"PET_NNODES=1:2", "PET_NPROC_PER_NODE=2", "PET_RDZV_BACKEND=c10d", "PET_RDZV_ENDPOINT=127.0.0.1:" + port,
				"PET_RDZV_ID=kf-job", "PET_MAX_RESTARTS=3", "PET_STANDALONE="},
			{"PET_NNODES=1:2", "PET_NPROC_PER_NODE=2", "PET_RDZV_BACKEND=c10d", "PET_RDZV_ENDPOINT=127.0.0.1:" + port,
				"PET_RDZV_ID=kf-job", "PET_MAX_RESTARTS=3", "PET_STANDALONE="},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var agents []*agent
			for _, env := range tc.nodes {
				agents = append(agents, startCommandEnv(t, append(testEnv(t), env...), bin("gorun"), w))
			}
			var all string
			for i, a := range agents {
				if code := a.wait(t, 60*time.Second); code != 0 {
					t.Fatalf("agent %d exited %d:\n%s", i, code, a.out.String())
				}
				all += a.out.String()
			}
			for r := range 4 {
				if want := "rank=" + strconv.Itoa(r) + " world=4"; !strings.Contains(all, want) {
					t.Errorf("missing %q:\n%s", want, all)
				}
			}
		})
	}
}
