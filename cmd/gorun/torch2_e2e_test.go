package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/torch2test"
)

// The torch 2.x tests run Debian 13's python3-torch 2.6 in a root of its
// own (see internal/torch2test) beside the host's torch 1.13: gorun on the
// host starts `chroot ROOT python3 -u script.py` as its workers, which
// reach its store on loopback.

var torch2Root struct {
	once sync.Once
	root *torch2test.Root
}

// torch2Env is what a torch 2.6 test needs: the root, and a folder seen
// in it holding the test's scripts and the libuv default (PYTHONPATH).
type torch2Env struct {
	root *torch2test.Root
	dir  string
	env  []string
}

// newTorch2 returns the torch 2.6 root ($GORUN_TORCH2_ROOT, else
// torch2test.DefaultDir), building it on first use, and copies the
// testdata scripts into a folder of the test's that the root sees. Without
// root or debootstrap the test is skipped, or fails under CI=true.
func newTorch2(t *testing.T, scripts ...string) torch2Env {
	t.Helper()
	opts := torch2test.Options{Dir: os.Getenv("GORUN_TORCH2_ROOT"), Share: []string{os.TempDir()}}
	torch2Root.once.Do(func() { torch2Root.root = torch2test.Require(t, opts) })
	if torch2Root.root == nil {
		// Require skipped or failed the first caller; so it does this one.
		torch2test.Require(t, opts)
	}
	e := torch2Env{root: torch2Root.root, dir: t.TempDir()}
	if err := torch2test.WriteSupport(e.dir); err != nil {
		t.Fatal(err)
	}
	e.env = []string{torch2test.SupportEnv(e.dir)}
	for _, s := range scripts {
		b, err := os.ReadFile(filepath.Join("testdata", s))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(e.dir, s), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

// worker is gorun's command line for a torch 2.6 script as its workers.
func (e torch2Env) worker(script string) []string {
	return append([]string{"--no-python"}, e.root.Python("-u", filepath.Join(e.dir, script))...)
}

// DDP on torch 2.6 under gorun, with the agent's store shared (gorun's and
// torch >= 2.3's default) and with worker rank 0 hosting its own.
func TestTorch2DDPUnderGorun(t *testing.T) {
	e := newTorch2(t, "torch2_ddp.py")
	digest := regexp.MustCompile(`\[rank\d\]: rank=\d identical=True digest=(\S+)`)
	for _, mode := range []struct {
		name string
		env  []string
	}{
		{"agent-store", nil},
		{"worker-hosted-store", []string{"TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			j := gorun(t, append(e.env, mode.env...), append([]string{"--nproc-per-node", "4"}, e.worker("torch2_ddp.py")...)...)
			if j.code != 0 {
				t.Fatalf("torch 2.6 DDP job failed:\n%s", j)
			}
			for r := 0; r < 4; r++ {
				// The mean target is 2.5: w = 0.5, 0.9, 1.22.
				want := fmt.Sprintf("[rank%d]: torch=2.6 rank=%d world=4 w=0.5000,0.9000,1.2200", r, r)
				if !strings.Contains(j.stdout, want) {
					t.Errorf("missing %q:\n%s", want, j)
				}
			}
			ds := digest.FindAllStringSubmatch(j.stdout, -1)
			if len(ds) != 4 {
				t.Fatalf("want 4 ranks with identical parameters:\n%s", j)
			}
			for _, d := range ds[1:] {
				if d[1] != ds[0][1] {
					t.Errorf("parameter digests differ across ranks: %q", ds)
				}
			}
		})
	}
}

// A 2x2 DeviceMesh of 4 ranks, and DTensor ops on it, on torch 2.6.
func TestTorch2DeviceMeshAndDTensor(t *testing.T) {
	e := newTorch2(t, "torch2_mesh.py")
	j := gorun(t, e.env, append([]string{"--nproc-per-node", "4"}, e.worker("torch2_mesh.py")...)...)
	if j.code != 0 {
		t.Fatalf("torch 2.6 mesh job failed:\n%s", j)
	}
	// Shard(0), Shard(1) of arange(16).reshape(4, 4): rank r at mesh
	// coordinate (r/2, r%2) holds the 2x2 block there.
	local := []string{"0,1,4,5", "2,3,6,7", "8,9,12,13", "10,11,14,15"}
	for r := 0; r < 4; r++ {
		want := fmt.Sprintf("[rank%d]: torch=2.6 rank=%d coord=[%d, %d] local=%s replicated=True half=[2, 4] sum=240 row=%d col=%d",
			r, r, r/2, r%2, local[r], r/2*4+1, r%2*2+2)
		if !strings.Contains(j.stdout, want) {
			t.Errorf("missing %q:\n%s", want, j)
		}
	}
}

// A torch 2.6 worker's error file (torchelastic's @record) is in the report,
// traceback included, and gorun exits with the worker's code.
func TestTorch2ErrorFileInReport(t *testing.T) {
	e := newTorch2(t, "torch2_error.py")
	j := gorun(t, e.env, append([]string{"--nproc-per-node", "2"}, e.worker("torch2_error.py")...)...)
	if j.code != 1 {
		t.Fatalf("want exit 1 from the failing Python worker:\n%s", j)
	}
	_, report, ok := strings.Cut(j.stderr, "Root Cause (first observed failure):")
	if !ok {
		t.Fatalf("no failure report:\n%s", j.stderr)
	}
	// The traceback is the error file's, not the worker's stderr, which the
	// console shows above the report.
	for _, want := range []string{
		"rank      : 1 (local_rank: 1)",
		"error.json",
		"traceback : ValueError: rank one gives up on torch 2.6",
		`torch2_error.py", line 10, in give_up`,
	} {
		if !strings.Contains(report, want) {
			t.Errorf("missing %q in the report:\n%s", want, j.stderr)
		}
	}
	if strings.Contains(report, "rank      : 0") {
		t.Errorf("rank 0 succeeded but is in the report:\n%s", j.stderr)
	}
}

// A torch 2.6 gloo job across two gorun agents on the c10d rendezvous
// survives an injected worker failure: every node restarts once and the job
// completes.
func TestTorch2JobOnElasticRendezvous(t *testing.T) {
	e := newTorch2(t, "torch2_elastic.py")
	args := append(elasticJob(t, "2", "--max-restarts", "1"), e.worker("torch2_elastic.py")...)
	env := append(testEnv(t), e.env...)
	agents := []*agent{startCommandEnv(t, env, bin("gorun"), args...), startCommandEnv(t, env, bin("gorun"), args...)}
	var all string
	for i, a := range agents {
		if code := a.wait(t, 120*time.Second); code != 0 {
			t.Fatalf("agent %d exited %d:\n%s", i, code, a.out.String())
		}
		all += a.out.String()
	}
	if !strings.Contains(all, "rank=3 fails on purpose") {
		t.Errorf("the failure was not injected:\n%s", all)
	}
	for r := 0; r < 4; r++ {
		want := fmt.Sprintf("torch=2.6 rank=%d world=4 restart=1 group=%d sum=10", r, r/2)
		if !strings.Contains(all, want) {
			t.Errorf("missing %q:\n%s", want, all)
		}
	}
}

// Go workers run unchanged under torch 2.6's torchrun, whose standalone
// mode shares its agent's store (torch's own TCPStore server) with them.
func TestGoWorkersUnderTorch2Torchrun(t *testing.T) {
	e := newTorch2(t)
	argv := e.root.Torchrun(e.dir, "--standalone", "--nproc_per_node", "3", "--redirects=1", "--tee=1", "--no_python",
		"sh", "-c", `echo "agent_store=$TORCHELASTIC_USE_AGENT_STORE"; exec "$0" "$@"`, bin("ddp"), "-steps", "30")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(testEnv(t), e.env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("torch 2.6 torchrun ddp: %v\n%s", err, out)
	}
	if n := strings.Count(string(out), "agent_store=True"); n != 3 {
		t.Errorf("%d of 3 workers were given torchrun's store, want all:\n%s", n, out)
	}
	if !strings.Contains(string(out), "parameters identical on all 3 ranks") {
		t.Errorf("ddp under torch 2.6's torchrun did not finish:\n%s", out)
	}
}

// torch 2.6's FileTimerClient under gorun's watchdog: a worker that
// overstays expires(after=1) is killed with the signal it asked for and
// the report names its scope; one that keeps within its scope is spared.
func TestTorch2FileTimer(t *testing.T) {
	e := newTorch2(t, "torch_filetimer.py")
	env := append([]string{fileTimer}, e.env...)
	j := gorun(t, env, append([]string{"--nproc-per-node", "2"}, append(e.worker("torch_filetimer.py"), "overstay", "SIGTERM")...)...)
	if j.code != 128+15 || !strings.Contains(j.stderr, `traceback : watchdog: scope "train_step" expired after 1s`) {
		t.Errorf("overstay: want exit 143 and the scope in the report:\n%s", j)
	}
	j = gorun(t, env, append([]string{"--nproc-per-node", "2"}, append(e.worker("torch_filetimer.py"), "in-time")...)...)
	if j.code != 0 {
		t.Errorf("in time: want success:\n%s", j)
	}
}
