package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/gorun/gorun/cuda"
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
			stderr.Reset()
			if code := run(t.Context(), []string{"-backend", backend, "-watchdog", "1s"}, &stdout, &stderr); code != 1 ||
				!strings.Contains(stderr.String(), "gpucheck: -watchdog needs two ranks or more") {
				t.Errorf("-watchdog on one rank: exit %d, want 1 and why; stderr:\n%s", code, stderr.String())
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

// TestAbortedAsWanted: -watchdog accepts only an abort at the timeout
// that names the operation and the rank.
func TestAbortedAsWanted(t *testing.T) {
	timedOut := func(op string, rank int, aborted bool) error {
		return fmt.Errorf("runtime: %s: %w", op, &cuda.OpError{Op: op, Rank: rank, Aborted: aborted,
			Err: fmt.Errorf("not complete after 5s: %w", context.DeadlineExceeded)})
	}
	for _, tc := range []struct {
		name string
		err  error
		ok   bool
	}{
		{"aborted at the timeout", timedOut("all_reduce", 1, true), true},
		{"finished", nil, false},
		{"failed otherwise", errors.New("connection reset"), false},
		{"another operation", timedOut("broadcast", 1, true), false},
		{"another rank", timedOut("all_reduce", 0, true), false},
		{"not aborted", timedOut("all_reduce", 1, false), false},
		{"aborted for an NCCL error", &cuda.OpError{Op: "all_reduce", Rank: 1, Aborted: true, Err: errors.New("ncclRemoteError")}, false},
	} {
		if got := abortedAsWanted(tc.err, "all_reduce", 1); (got == nil) != tc.ok {
			t.Errorf("%s: got %v, want ok=%v", tc.name, got, tc.ok)
		}
	}
}
