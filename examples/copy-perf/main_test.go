package main

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/gorun/gorun/cuda/cudatest"
)

// On package cuda's fake driver, whose GPU memory is host memory: every
// size gets a line, the bytes come back, and a GPU the driver lacks
// fails with why.
func TestCopyPerfOnFakes(t *testing.T) {
	fakes, err := cudatest.NewBuilder("../../cuda/testdata")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fakes.Close() })
	t.Setenv("GORUN_CUDA_LIBRARY", fakes.CUDA(t))

	var stdout, stderr bytes.Buffer
	if code := run(t.Context(), []string{"-max-mib", "1", "-time", "1ms"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d, want 0; stderr:\n%s", code, stderr.String())
	}
	var sizes []string
	for _, line := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		if !strings.HasPrefix(line, "#") {
			sizes = append(sizes, strings.Fields(line)[0])
		}
	}
	if want := []string{"4096", "65536", "1048576"}; !slices.Equal(sizes, want) {
		t.Errorf("sizes %v, want %v; stdout:\n%s", sizes, want, stdout.String())
	}
	if !strings.Contains(stdout.String(), "Fake GPU 0, 0000:10:00.0") {
		t.Errorf("the header does not name the GPU:\n%s", stdout.String())
	}

	stderr.Reset()
	if code := run(t.Context(), []string{"-gpu", "3", "-time", "1ms"}, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), "no GPU 3") {
		t.Errorf("-gpu 3: exit %d, want 1 and why; stderr:\n%s", code, stderr.String())
	}
	if code := run(t.Context(), []string{"-max-mib", "0"}, &stdout, &stderr); code != 2 {
		t.Errorf("-max-mib 0: exit %d, want 2", code)
	}
}

func TestLadder(t *testing.T) {
	for _, tc := range []struct {
		largest int
		want    []int
	}{
		{1 << 20, []int{4 << 10, 64 << 10, 1 << 20}},
		{1 << 30, []int{4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20, 1 << 30}},
		{3 << 20, []int{4 << 10, 64 << 10, 1 << 20, 3 << 20}},
	} {
		if got := ladder(tc.largest); !slices.Equal(got, tc.want) {
			t.Errorf("ladder(%d) = %v, want %v", tc.largest, got, tc.want)
		}
	}
}
