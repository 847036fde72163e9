// Package testenv is how a test says what it needs from the machine: root,
// a command, a Python module, a running service. Every test follows one
// rule, after Go's own internal/testenv: where a component is missing the
// test is skipped with a message naming the Debian package to install,
// except in CI (CI=true), where every component must be present and its
// absence fails the test. A contributor without torch, sshd or Slurm runs
// `go test ./...` green; CI cannot go green by skipping.
//
// Only tests import it.
package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// Verdict is what a test does about one component.
type Verdict int

const (
	// Run: the component is here.
	Run Verdict = iota
	// Skip: it is missing, and the run may do without it.
	Skip
	// Fail: it is missing, and the run must have it.
	Fail
)

func (v Verdict) String() string {
	switch v {
	case Run:
		return "run"
	case Skip:
		return "skip"
	case Fail:
		return "fail"
	}
	return fmt.Sprintf("Verdict(%d)", int(v))
}

// Decide is the rule. missing: the component is not here; ci: the run is
// CI's (CI=true); inCI: CI machines have the component (all but a GPU and
// its driver do), so that its absence there is a broken machine.
func Decide(missing, ci, inCI bool) Verdict {
	switch {
	case !missing:
		return Run
	case ci && inCI:
		return Fail
	default:
		return Skip
	}
}

// CI reports whether this is a CI run: CI=true, as GitHub Actions and
// GitLab set it.
func CI() bool {
	return os.Getenv("CI") == "true"
}

// MustHave lets the test go on when err is nil. Otherwise the test needs
// what (a phrase: "sshd", "root", "torch.distributed") and is skipped, or
// fails under CI=true; install names the Debian package that brings it
// ("" when no package does, as for root).
func MustHave(t testing.TB, err error, what, install string) {
	t.Helper()
	act(t, Decide(err != nil, CI(), true), Message(what, install, err))
}

// MayHave is MustHave for a GPU and its driver, which CI machines lack
// too: their absence skips the test, under CI=true as well. Nothing else
// may use it.
func MayHave(t testing.TB, err error, what, install string) {
	t.Helper()
	act(t, Decide(err != nil, CI(), false), Message(what, install, err)+" (optional, under CI=true too)")
}

// act carries out v; msg names what is missing and how to install it.
func act(t testing.TB, v Verdict, msg string) {
	t.Helper()
	switch v {
	case Fail:
		t.Fatalf("%s (CI=true: every component must be present)", msg)
	case Skip:
		// Decide says Skip only outside CI, or for a GPU (MayHave), which
		// CI machines lack too; under CI=true a missing component failed
		// above.
		t.Skip(msg)
	}
}

// Message is the line a test that lacks what says.
func Message(what, install string, err error) string {
	var b strings.Builder
	b.WriteString("testenv: needs " + what)
	if install != "" {
		b.WriteString(" (apt-get install " + install + ")")
	}
	if err != nil {
		b.WriteString(": " + err.Error())
	}
	return b.String()
}

// ErrNotRoot is what MustHaveRoot reports on a user's run.
var ErrNotRoot = errors.New("testenv: not running as root")

// MustHaveRoot needs root; why says what for ("network namespaces").
func MustHaveRoot(t testing.TB, why string) {
	t.Helper()
	var err error
	if os.Geteuid() != 0 {
		err = ErrNotRoot
	}
	MustHave(t, err, "root for "+why, "")
}

// sbin are the folders a root shell in a container may lack in PATH,
// where daemons live.
var sbin = []string{"/usr/sbin", "/sbin"}

// LookPath finds an executable: an absolute path as it is, a name in PATH
// and then in the sbin folders.
func LookPath(name string) (string, error) {
	path, err := exec.LookPath(name)
	if err == nil || filepath.IsAbs(name) {
		return path, err
	}
	for _, dir := range sbin {
		if p, sbinErr := exec.LookPath(filepath.Join(dir, name)); sbinErr == nil {
			return p, nil
		}
	}
	return "", err
}

// MustHaveCommand returns the path of the executable name (a name in PATH
// or the sbin folders, or an absolute path), which the Debian package
// install brings.
func MustHaveCommand(t testing.TB, name, install string) string {
	t.Helper()
	path, err := LookPath(name)
	MustHave(t, err, name, install)
	return path
}

// PythonEnv names the interpreter the tests use when it is not Debian's
// /usr/bin/python3 (a virtualenv with torch, say).
const PythonEnv = "GORUN_TEST_PYTHON"

// Python returns $GORUN_TEST_PYTHON, else Debian's /usr/bin/python3: the
// python3 first in PATH may be a pyenv or a virtualenv without torch.
func Python() string {
	if py := os.Getenv(PythonEnv); py != "" {
		return py
	}
	return "/usr/bin/python3"
}

// MustHavePython returns Python(), which must run.
func MustHavePython(t testing.TB) string {
	t.Helper()
	py := Python()
	_, err := exec.LookPath(py)
	MustHave(t, err, "python3", "python3")
	return py
}

// MustHavePythonModule returns Python() after checking that it runs check,
// a statement such as "import torch.distributed", which the Debian
// package install brings; module names it in the message.
func MustHavePythonModule(t testing.TB, module, check, install string) string {
	t.Helper()
	py := MustHavePython(t)
	MustHave(t, pythonRuns(py, check), module+" in "+py+" (or set "+PythonEnv+")", install)
	return py
}

// pythonChecks remembers each check's result for the test binary: an
// import of torch takes seconds, and many tests need it.
var pythonChecks sync.Map // [2]string{py, code} -> func() error

// pythonRuns runs py -c code once per test binary.
func pythonRuns(py, code string) error {
	f, _ := pythonChecks.LoadOrStore([2]string{py, code}, sync.OnceValue(func() error { return runPython(py, code) }))
	return f.(func() error)()
}

// runPython runs py -c code, bounded: a first import of torch reads a lot.
func runPython(py, code string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, py, "-c", code).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s -c %q: %w: %s", py, code, err, lastLine(out))
	}
	return nil
}

// TorchPackage is Debian's torch.
const TorchPackage = "python3-torch"

// MustHaveTorch returns the interpreter with torch.distributed and gloo.
func MustHaveTorch(t testing.TB) string {
	t.Helper()
	return MustHavePythonModule(t, "torch.distributed with gloo",
		"import sys, torch.distributed as d; sys.exit(0 if d.is_gloo_available() else 'gloo is not available')", TorchPackage)
}

func lastLine(b []byte) string {
	s := strings.TrimSpace(string(b))
	return s[strings.LastIndexByte(s, '\n')+1:]
}
