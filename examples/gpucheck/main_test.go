package main

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/gorun/gorun/cuda/cudatest"
)

// The check at world size 1 on package cuda's fake libraries, whose GPU
// memory is host memory and whose NCCL moves data for one rank: on NCCL,
// and on the TCP backend with a GPU of the command's own.
func TestGPUCheckOnFakes(t *testing.T) {
	fakes, err := cudatest.NewBuilder("../../cuda/testdata")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fakes.Close() })
	t.Setenv("GORUN_CUDA_LIBRARY", fakes.CUDA(t))
	t.Setenv("GORUN_NCCL_LIBRARY", fakes.NCCL(t))
	for _, backend := range []string{"nccl", "tcp"} {
		t.Run(backend, func(t *testing.T) {
			for k, v := range map[string]string{
				"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
				"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": strconv.Itoa(freePort(t)),
			} {
				t.Setenv(k, v)
			}
			var stdout, stderr bytes.Buffer
			code := run(t.Context(), []string{"-backend", backend, "-want", backend, "-n", "64"}, &stdout, &stderr)
			const checks = 26 // messages need two ranks
			want := fmt.Sprintf("gpucheck: %d of %d checks passed on backend %s\n", checks, checks, backend)
			if code != 0 || !strings.HasSuffix(stdout.String(), want) || strings.Count(stdout.String(), "PASS ") != checks {
				t.Errorf("exit %d; want 0 and %q; stdout:\n%s\nstderr:\n%s", code, want, stdout.String(), stderr.String())
			}
		})
	}
	if code := run(t.Context(), []string{"-n", "3"}, os.Stdout, &bytes.Buffer{}); code != 2 {
		t.Errorf("-n 3: exit %d, want 2", code)
	}
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
