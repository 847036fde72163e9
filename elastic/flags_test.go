package elastic

import (
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
	env := func(vars map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
	}
	none := env(nil)
	for _, tc := range []struct {
		in   string
		env  func(string) (string, bool)
		want int
		bad  bool
	}{
		{"4", none, 4, false},
		{"cpu", none, goruntime.NumCPU(), false},
		{"gpu", env(map[string]string{"CUDA_VISIBLE_DEVICES": "0,3"}), 2, false},
		{"auto", env(map[string]string{"CUDA_VISIBLE_DEVICES": "1"}), 1, false},
		{"auto", env(map[string]string{"CUDA_VISIBLE_DEVICES": ""}), goruntime.NumCPU(), false},
		{"gpu", env(map[string]string{"CUDA_VISIBLE_DEVICES": ""}), 0, true},
		{"0", none, 0, true}, {"-2", none, 0, true}, {"many", none, 0, true},
	} {
		got, err := ResolveNProc(tc.in, tc.env)
		if (err != nil) != tc.bad || got != tc.want {
			t.Errorf("ResolveNProc(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
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
