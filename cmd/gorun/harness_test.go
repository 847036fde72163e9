package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testenv"
)

// The end-to-end tests run the real gorun binary on real processes. TestMain
// builds it, and the example workers, once.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "gorun-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	build := exec.Command("go", "build", "-o", dir+"/", "github.com/gorun/gorun/cmd/gorun", "github.com/gorun/gorun/examples/...")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build gorun:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func bin(name string) string { return filepath.Join(binDir, name) }

// job is one finished gorun run.
type job struct {
	stdout, stderr string
	code           int
}

func (j job) String() string {
	return fmt.Sprintf("exit %d\n--- stdout\n%s--- stderr\n%s", j.code, j.stdout, j.stderr)
}

// gorun runs the gorun binary with args and env added to the test's own
// environment, bounded by a minute.
func gorun(t *testing.T, env []string, args ...string) job {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin("gorun"), args...)
	cmd.Env = append(testEnv(t), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	j := job{stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		j.code = ee.ExitCode()
	case err != nil:
		t.Fatalf("gorun %v: %v", args, err)
	}
	if ctx.Err() != nil {
		t.Fatalf("gorun %v did not finish in time:\n%s", args, j)
	}
	return j
}

// testEnv is the test's environment with a temporary folder of the
// test's own, so that what a killed gorun leaves there is cleaned up.
func testEnv(t *testing.T) []string {
	return append(os.Environ(), "TMPDIR="+t.TempDir())
}

// script writes an executable shell script into dir and returns its path.
func script(t *testing.T, dir, name, body string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// python returns the interpreter that has Debian's python3-torch with
// gloo ($GORUN_TEST_PYTHON, else /usr/bin/python3); without it the test is
// skipped naming the package, or fails under CI=true.
func python(t *testing.T) string {
	t.Helper()
	return testenv.MustHaveTorch(t)
}

// waitFor polls cond every 20 ms until it holds or d passes.
func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return cond()
}

// alive reports whether pid is a live process (zombies count as dead).
func alive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses.
	i := bytes.LastIndexByte(stat, ')')
	return i >= 0 && i+2 < len(stat) && stat[i+2] != 'Z'
}
