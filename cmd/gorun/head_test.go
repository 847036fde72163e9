package main

import (
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"testing/synctest"

	"github.com/rs/zerolog"
)

func TestForwardedEnv(t *testing.T) {
	file := filepath.Join(t.TempDir(), ".gorun_env")
	if err := os.WriteFile(file, []byte("# comment\n\nA=1\nB=x=y z\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GORUN_FWD", "head value")
	got, err := forwardedEnv([]string{"GORUN_FWD", "C=a,b", "GORUN_UNSET_VAR"}, file, zerolog.Nop())
	want := []string{"A=1", "B=x=y z", "GORUN_FWD=head value", "C=a,b"}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("got %q, %v; want %q", got, err, want)
	}
	if got, err := forwardedEnv(nil, file+".absent", zerolog.Nop()); err != nil || len(got) != 0 {
		t.Errorf("no file: got %q, %v", got, err)
	}
	if err := os.WriteFile(file, []byte("A=1\nnot a var\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := forwardedEnv(nil, file, zerolog.Nop()); err == nil || !strings.Contains(err.Error(), ".gorun_env:2:") {
		t.Errorf("bad line: got %v", err)
	}
	for _, bad := range []string{"", "=1", "1A", "A-B=1"} {
		if _, err := forwardedEnv([]string{bad}, file+".absent", zerolog.Nop()); err == nil {
			t.Errorf("-x %q accepted", bad)
		}
	}
}

// EOF on stdin and the head's SIGTERM are one stop request, not two.
// In a synctest bubble, recv sees what stopOnStdinEOF has sent once its
// goroutines are blocked: a signal not there then never comes.
func TestStopOnStdinEOF(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		recv := func(ch <-chan os.Signal) os.Signal {
			synctest.Wait()
			select {
			case s := <-ch:
				return s
			default:
				return nil
			}
		}
		ctx := t.Context()

		// EOF first: SIGTERM once; the head's SIGTERM after it is dropped, a
		// further signal passes.
		r, w := io.Pipe()
		in := make(chan os.Signal, 4)
		out := stopOnStdinEOF(ctx, r, in, zerolog.Nop())
		if s := recv(out); s != nil {
			t.Fatalf("got %v before EOF", s)
		}
		w.Close()
		if s := recv(out); s != syscall.SIGTERM {
			t.Fatalf("got %v after EOF, want SIGTERM", s)
		}
		in <- syscall.SIGTERM
		if s := recv(out); s != nil {
			t.Fatalf("the head's SIGTERM passed: %v", s)
		}
		in <- syscall.SIGINT
		if s := recv(out); s != syscall.SIGINT {
			t.Fatalf("got %v, want SIGINT", s)
		}

		// A signal first: EOF adds nothing.
		r, w = io.Pipe()
		in = make(chan os.Signal, 4)
		out = stopOnStdinEOF(ctx, r, in, zerolog.Nop())
		in <- syscall.SIGTERM
		if s := recv(out); s != syscall.SIGTERM {
			t.Fatalf("got %v, want SIGTERM", s)
		}
		w.Close()
		if s := recv(out); s != nil {
			t.Fatalf("EOF after a signal passed %v", s)
		}
	})
}
