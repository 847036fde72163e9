package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	goruntime "runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/gorun/gorun/internal/testenv"
)

func TestDoctorReportsThisHost(t *testing.T) {
	j := gorun(t, nil, "doctor")
	if j.code != 0 {
		t.Fatalf("gorun doctor failed:\n%s", j)
	}
	for _, section := range []string{"== Host", "== GPUs (NVML)", "== NCCL and CUDA libraries", "== Network interfaces", "== Store port", "== Slurm"} {
		if !strings.Contains(j.stdout, section+"\n") {
			t.Errorf("no %q section:\n%s", section, j.stdout)
		}
	}
	host, _ := os.Hostname()
	if !strings.Contains(j.stdout, "hostname: "+host+"\n") {
		t.Errorf("hostname %q not reported:\n%s", host, j.stdout)
	}
	if want := fmt.Sprintf("CPUs: %d usable", goruntime.NumCPU()); !strings.Contains(j.stdout, want) {
		t.Errorf("want %q:\n%s", want, j.stdout)
	}
	// Without a driver, one line says why; with one, GPU0 is listed.
	if !strings.Contains(j.stdout, "no GPU listed: nvml: ") && !regexp.MustCompile(`(?m)^GPU0 .* MiB .*bus `).MatchString(j.stdout) {
		t.Errorf("the GPU section neither lists GPU0 nor says why NVML is unavailable:\n%s", j.stdout)
	}
	lo := regexp.MustCompile(`(?m)^lo +up +loopback +mtu \d+ +.*127\.0\.0\.1/8`)
	if !lo.MatchString(j.stdout) {
		t.Errorf("the loopback interface with 127.0.0.1 is not listed:\n%s", j.stdout)
	}
	if j.stderr != "" {
		t.Errorf("doctor wrote to stderr: %s", j.stderr)
	}
}

func TestDoctorChecksTheStorePort(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	busy := strconv.Itoa(held.Addr().(*net.TCPAddr).Port)

	j := gorun(t, nil, "doctor", "--master-port", busy)
	if want := busy + "/tcp (--master-port): busy on this host: "; j.code != 0 || !strings.Contains(j.stdout, want) {
		t.Errorf("want %q:\n%s", want, j)
	}
	// gorun's own --master-port counts too.
	j = gorun(t, nil, "--master-port", busy, "doctor")
	if want := busy + "/tcp (--master-port): busy"; j.code != 0 || !strings.Contains(j.stdout, want) {
		t.Errorf("gorun --master-port %s doctor: want %q:\n%s", busy, want, j)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	free := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	j = gorun(t, nil, "doctor", "--rdzv-endpoint", "127.0.0.1:"+free)
	if want := free + "/tcp (--rdzv-endpoint, store on 127.0.0.1): free on this host"; j.code != 0 || !strings.Contains(j.stdout, want) {
		t.Errorf("want %q:\n%s", want, j)
	}

	// Outside Slurm (even when the tests run in a Slurm job), torchrun's port.
	j = gorun(t, []string{"SLURM_JOB_ID="}, "doctor")
	if want := "29500/tcp (torchrun's default"; j.code != 0 || !strings.Contains(j.stdout, want) {
		t.Errorf("want %q:\n%s", want, j)
	}

	j = gorun(t, nil, "doctor", "--master-port", "http")
	if j.code != exitUsage || !strings.Contains(j.stderr, `--master-port "http": want a number from 1 to 65535`) {
		t.Errorf("a bad port is a usage error:\n%s", j)
	}
}

func TestDoctorNamesTheLibrariesItTried(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing", "libnccl.so.2")
	notALibrary := filepath.Join(dir, "libcuda-text.so.1")
	if err := os.WriteFile(notALibrary, []byte("not an ELF file\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A CUDA driver found on LD_LIBRARY_PATH, which says 12.4.
	ldDir := filepath.Join(dir, "ld")
	compileLibrary(t, filepath.Join(ldDir, "libcuda.so.1"), "int cuDriverGetVersion(int *v) { *v = 12040; return 0; }")

	j := gorun(t, []string{"GORUN_NCCL_LIBRARY=" + missing, "GORUN_CUDA_LIBRARY=" + notALibrary, "LD_LIBRARY_PATH=" + ldDir}, "doctor")
	if j.code != 0 {
		t.Fatalf("gorun doctor failed:\n%s", j)
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^  GORUN_NCCL_LIBRARY +` + regexp.QuoteMeta(missing) + ` +not found$`),
		regexp.MustCompile(`(?m)^  GORUN_CUDA_LIBRARY +` + regexp.QuoteMeta(notALibrary) + ` +cannot load: `),
		regexp.MustCompile(`(?m)^  LD_LIBRARY_PATH +` + regexp.QuoteMeta(filepath.Join(ldDir, "libcuda.so.1")) + ` +CUDA driver 12\.4$`),
		regexp.MustCompile(`(?m)^NCCL environment: .*GORUN_NCCL_LIBRARY=` + regexp.QuoteMeta(missing)),
	} {
		if !want.MatchString(j.stdout) {
			t.Errorf("want a line matching %s:\n%s", want, j.stdout)
		}
	}

	// NCCL named by GORUN_NCCL_LIBRARY: its version, in both encodings.
	for code, want := range map[int]string{22105: "NCCL 2.21.5", 2804: "NCCL 2.8.4"} {
		nccl := filepath.Join(dir, strconv.Itoa(code), "libnccl.so.2")
		compileLibrary(t, nccl, fmt.Sprintf("int ncclGetVersion(int *v) { *v = %d; return 0; }", code))
		j = gorun(t, []string{"GORUN_NCCL_LIBRARY=" + nccl}, "doctor")
		line := regexp.MustCompile(`(?m)^  GORUN_NCCL_LIBRARY +` + regexp.QuoteMeta(nccl) + ` +` + regexp.QuoteMeta(want) + `$`)
		if j.code != 0 || !line.MatchString(j.stdout) {
			t.Errorf("want %q for %s:\n%s", want, nccl, j)
		}
	}

	// NCCL from pip's wheel, in the site-packages of the --python given.
	site := filepath.Join(dir, "site-packages")
	wheel := filepath.Join(site, "nvidia", "nccl", "lib", "libnccl.so.2")
	compileLibrary(t, wheel, "int ncclGetVersion(int *v) { *v = 23004; return 0; }")
	python := script(t, dir, "python", "echo "+site+"\n")
	j = gorun(t, nil, "doctor", "--python", python)
	line := regexp.MustCompile(`(?m)^  python3 site-packages +` + regexp.QuoteMeta(wheel) + ` +NCCL 2\.30\.4$`)
	if j.code != 0 || !line.MatchString(j.stdout) {
		t.Errorf("want the wheel's NCCL 2.30.4 at %s:\n%s", wheel, j)
	}

	// A library without ncclGetVersion is not NCCL.
	other := filepath.Join(dir, "other", "libnccl.so.2")
	compileLibrary(t, other, "int unrelated(void) { return 1; }")
	j = gorun(t, []string{"GORUN_NCCL_LIBRARY=" + other}, "doctor")
	if want := "not NCCL: no ncclGetVersion"; !strings.Contains(j.stdout, want) {
		t.Errorf("want %q:\n%s", want, j)
	}
}

func TestDoctorReadsTheSlurmStep(t *testing.T) {
	env := []string{
		"SLURM_JOB_ID=77", "SLURM_STEP_ID=0", "SLURM_NNODES=2", "SLURM_NODEID=1",
		"SLURM_STEP_NODELIST=gpu[07-08]", "SLURM_GPUS_ON_NODE=4",
	}
	j := gorun(t, env, "doctor")
	for _, want := range []string{
		"srun step of job 77: node 1 of 2, store on gpu07:29477, GPUs on node 4",
		"29477/tcp (Slurm job 77, store on gpu07): ",
		"  SLURM_STEP_NODELIST=gpu[07-08]\n",
	} {
		if j.code != 0 || !strings.Contains(j.stdout, want) {
			t.Errorf("want %q:\n%s", want, j)
		}
	}
}

// TestNProcPerNodeGPUAndAuto checks the launcher counts GPUs through NVML:
// here, without a driver, gpu fails saying why and auto falls back to the
// CPUs; on a GPU host both give the visible GPUs.
func TestNProcPerNodeGPUAndAuto(t *testing.T) {
	gpus, err := visibleGPUs()
	wantAuto := gpus
	if err != nil || gpus == 0 {
		wantAuto = goruntime.NumCPU()
	}
	j := gorun(t, nil, "--nproc-per-node", "auto", "--local-ranks-filter", "0", "sh", "-c", "echo workers=$LOCAL_WORLD_SIZE")
	if want := fmt.Sprintf("workers=%d", wantAuto); j.code != 0 || !strings.Contains(j.stdout, want) {
		t.Errorf("auto: want %q:\n%s", want, j)
	}

	j = gorun(t, nil, "--nproc-per-node", "gpu", "--local-ranks-filter", "0", "sh", "-c", "echo workers=$LOCAL_WORLD_SIZE")
	if err != nil || gpus == 0 {
		if j.code != exitUsage || !strings.Contains(j.stderr, "--nproc-per-node gpu: ") {
			t.Errorf("gpu without a visible GPU must fail as bad usage:\n%s", j)
		}
		if err != nil && !strings.Contains(j.stderr, err.Error()) {
			t.Errorf("gpu: the error does not say why NVML failed (%v):\n%s", err, j)
		}
		return
	}
	if want := fmt.Sprintf("workers=%d", gpus); j.code != 0 || !strings.Contains(j.stdout, want) {
		t.Errorf("gpu: want %q:\n%s", want, j)
	}
}

// compileLibrary builds a shared library from one line of C, standing in
// for NCCL or the CUDA driver.
func compileLibrary(t *testing.T, path, source string) {
	t.Helper()
	cc := testenv.MustHaveCommand(t, "cc", "gcc")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	src := path + ".c"
	if err := os.WriteFile(src, []byte(source+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-o", path, src).CombinedOutput(); err != nil {
		t.Fatalf("cc %s: %v\n%s", src, err, out)
	}
}
