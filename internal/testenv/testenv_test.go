package testenv

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestDecide(t *testing.T) {
	for _, c := range []struct {
		missing, ci, inCI bool
		want              Verdict
	}{
		{missing: false, ci: false, inCI: true, want: Run},
		{missing: false, ci: true, inCI: true, want: Run},
		{missing: false, ci: true, inCI: false, want: Run},
		{missing: true, ci: false, inCI: true, want: Skip},
		{missing: true, ci: false, inCI: false, want: Skip},
		{missing: true, ci: true, inCI: true, want: Fail},
		{missing: true, ci: true, inCI: false, want: Skip}, // a GPU: CI has none either
	} {
		if got := Decide(c.missing, c.ci, c.inCI); got != c.want {
			t.Errorf("Decide(missing=%v, ci=%v, inCI=%v) = %v, want %v", c.missing, c.ci, c.inCI, got, c.want)
		}
	}
}

func TestMessage(t *testing.T) {
	for _, c := range []struct {
		what, install string
		err           error
		want          string
	}{
		{"sshd", "openssh-server", nil, "testenv: needs sshd (apt-get install openssh-server)"},
		{"root for netns", "", ErrNotRoot, "testenv: needs root for netns: testenv: not running as root"},
		{"etcd", "etcd-server", errors.New("not found"), "testenv: needs etcd (apt-get install etcd-server): not found"},
	} {
		if got := Message(c.what, c.install, c.err); got != c.want {
			t.Errorf("Message(%q, %q, %v) = %q, want %q", c.what, c.install, c.err, got, c.want)
		}
	}
}

// recorder is a testing.TB that notes a skip or a failure instead of
// ending the goroutine.
type recorder struct {
	testing.TB
	skipped, failed string
}

func (r *recorder) Helper()                        {}
func (r *recorder) Skip(args ...any)               { r.skipped = fmt.Sprint(args...) }
func (r *recorder) Fatalf(format string, a ...any) { r.failed = fmt.Sprintf(format, a...) }

func TestMustHave(t *testing.T) {
	missing := errors.New("no such file")
	for _, c := range []struct {
		name     string
		ci       string
		err      error
		may      bool
		wantSkip bool
		wantFail bool
	}{
		{name: "present", ci: "true", err: nil},
		{name: "missing on a laptop", ci: "", err: missing, wantSkip: true},
		{name: "missing in CI", ci: "true", err: missing, wantFail: true},
		{name: "CI=1 is no CI", ci: "1", err: missing, wantSkip: true},
		{name: "a GPU missing in CI", ci: "true", err: missing, may: true, wantSkip: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("CI", c.ci)
			r := &recorder{}
			if c.may {
				MayHave(r, c.err, "thing", "thing-pkg")
			} else {
				MustHave(r, c.err, "thing", "thing-pkg")
			}
			if (r.skipped != "") != c.wantSkip || (r.failed != "") != c.wantFail {
				t.Fatalf("skipped %q, failed %q; want skip %v, fail %v", r.skipped, r.failed, c.wantSkip, c.wantFail)
			}
			for _, msg := range []string{r.skipped, r.failed} {
				if msg != "" && !strings.Contains(msg, "apt-get install thing-pkg") {
					t.Errorf("%q does not name the package", msg)
				}
			}
		})
	}
}

func TestLookPath(t *testing.T) {
	if _, err := LookPath("testenv-no-such-command"); err == nil {
		t.Error("LookPath found a command that does not exist")
	}
	sh, err := LookPath("sh")
	if err != nil || !strings.HasSuffix(sh, "/sh") {
		t.Errorf("LookPath(sh) = %q, %v", sh, err)
	}
}
