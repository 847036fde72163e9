package runtime

import (
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rs/zerolog"
)

// askStacks reads one answer from the stacks socket at path.
func askStacks(t *testing.T, path string) (string, error) {
	t.Helper()
	conn, err := net.Dial("unix", path)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	b, err := io.ReadAll(conn)
	return string(b), err
}

// The socket named by StacksSocketEnv answers every request with all the
// goroutines' stacks, and is gone once the group's resources are released.
func TestStacksSocketAnswersUntilReleased(t *testing.T) {
	path := filepath.Join(t.TempDir(), "w.stacks")
	cfg := config{lookupEnv: func(name string) (string, bool) {
		return path, name == StacksSocketEnv
	}}
	var release cleanups
	cfg.serveStacks(zerolog.Nop(), &release)
	for range 2 { // the worker answers more than once
		got, err := askStacks(t, path)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(got, "runtime.TestStacksSocketAnswersUntilReleased") || !strings.Contains(got, "goroutine ") {
			t.Fatalf("the answer lacks the asking test's goroutine:\n%s", got)
		}
	}
	if err := release.run(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("the socket outlives the release: %v", err)
	}
	if _, err := askStacks(t, path); err == nil {
		t.Error("a released socket still answers")
	}
}

// Without the variable nothing listens; a socket that cannot be made
// leaves Init's resources as they were.
func TestStacksSocketOff(t *testing.T) {
	var release cleanups
	(&config{lookupEnv: func(string) (string, bool) { return "", false }}).serveStacks(zerolog.Nop(), &release)
	bad := filepath.Join(t.TempDir(), "missing", "w.stacks")
	(&config{lookupEnv: func(string) (string, bool) { return bad, true }}).serveStacks(zerolog.Nop(), &release)
	if len(release) != 0 {
		t.Errorf("%d resources to release, want 0", len(release))
	}
}
