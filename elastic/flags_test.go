package elastic

import (
	"errors"
	goruntime "runtime"
	"strings"
	"syscall"
	"testing"
)

func TestParseNNodes(t *testing.T) {
	for _, tc := range []struct {
		in       string
		min, max int
		bad      bool
	}{
		{"1", 1, 1, false}, {"2:4", 2, 4, false}, {" 3 ", 3, 3, false},
		{"0", 0, 0, true}, {"3:2", 0, 0, true}, {"a", 0, 0, true}, {"1:", 0, 0, true}, {"", 0, 0, true}, {"-1:2", 0, 0, true},
	} {
		min, max, err := ParseNNodes(tc.in)
		if (err != nil) != tc.bad || min != tc.min || max != tc.max {
			t.Errorf("ParseNNodes(%q) = %d, %d, %v", tc.in, min, max, err)
		}
		if err != nil && !strings.Contains(err.Error(), "--nnodes") {
			t.Errorf("error %q does not name the flag", err)
		}
	}
}

func TestResolveNProc(t *testing.T) {
	gpus := func(n int, err error) func() (int, error) {
		return func() (int, error) { return n, err }
	}
	noNVML := errors.New("nvml: libnvidia-ml.so.1 not found")
	unasked := func() (int, error) {
		t.Error("GPUs counted for a value that does not need them")
		return 0, nil
	}
	for _, tc := range []struct {
		in      string
		gpus    func() (int, error)
		want    int
		wantErr string
	}{
		{"4", unasked, 4, ""},
		{"cpu", unasked, goruntime.NumCPU(), ""},
		{"gpu", gpus(2, nil), 2, ""},
		{"gpu", gpus(0, nil), 0, "--nproc-per-node gpu: no GPU on this node"},
		{"gpu", gpus(0, noNVML), 0, "--nproc-per-node gpu: cannot count GPUs: nvml: libnvidia-ml.so.1 not found"},
		{"auto", gpus(8, nil), 8, ""},
		{"auto", gpus(0, nil), goruntime.NumCPU(), ""},
		{"auto", gpus(0, noNVML), goruntime.NumCPU(), ""},
		{"0", unasked, 0, `--nproc-per-node "0"`}, {"-2", unasked, 0, `--nproc-per-node "-2"`}, {"many", unasked, 0, `--nproc-per-node "many"`},
	} {
		got, err := ResolveNProc(tc.in, tc.gpus)
		if got != tc.want || (err == nil) != (tc.wantErr == "") || (err != nil && !strings.HasPrefix(err.Error(), tc.wantErr)) {
			t.Errorf("ResolveNProc(%q) = %d, %v; want %d, %q", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
	if _, err := ResolveNProc("gpu", gpus(0, noNVML)); !errors.Is(err, noNVML) {
		t.Errorf("gpu: %v does not wrap why GPUs could not be counted", err)
	}
}

func TestParseRdzvConf(t *testing.T) {
	got, err := ParseRdzvConf("timeout=10, is_host=true,,")
	if err != nil || got["timeout"] != "10" || got["is_host"] != "true" || len(got) != 2 {
		t.Errorf("ParseRdzvConf = %v, %v", got, err)
	}
	for _, bad := range []string{"timeout", "=3", "a=1,b"} {
		if _, err := ParseRdzvConf(bad); err == nil {
			t.Errorf("ParseRdzvConf(%q) accepted", bad)
		}
	}
}

func TestParseSignals(t *testing.T) {
	got, err := ParseSignals("SIGTERM, int,10")
	want := []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGUSR1}
	if err != nil || len(got) != len(want) {
		t.Fatalf("ParseSignals = %v, %v", got, err)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("signal %d = %v, want %v", i, got[i], want[i])
		}
	}
	for _, bad := range []string{"SIGFOO", "SIGKILL", "STOP", "99"} {
		if _, err := ParseSignals(bad); err == nil {
			t.Errorf("ParseSignals(%q) accepted", bad)
		}
	}
}
