package elastic

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// fakeWorker answers every connection to a socket in dir with text, as
// the runtime does with its stacks.
func fakeWorker(t *testing.T, dir, text string) string {
	t.Helper()
	path := filepath.Join(dir, "w.stacks")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, text)
			c.Close()
		}
	}()
	return path
}

// GET /stacks/{rank} on the status socket asks that worker of this node
// for its stacks; a rank not of this node, a worker without a socket and
// one whose socket nobody answers are told apart.
func TestServeStacks(t *testing.T) {
	dir := t.TempDir()
	sock := fakeWorker(t, dir, "goroutine 1 [sleep]:\nmain.main()\n")
	b := newStatusBoard(&Spec{}, zerolog.Nop(), time.Now, nil)
	b.slots = []slotState{
		{rank: 4, stacks: sock},
		{rank: 5}, // Python, or no status folder
		{rank: 6, stacks: filepath.Join(dir, "gone.stacks")}, // a worker without the runtime
	}
	for _, tc := range []struct {
		path string
		code int
		want string
	}{
		{"/stacks/4", http.StatusOK, "goroutine 1 [sleep]:\nmain.main()\n"},
		{"/stacks/5", http.StatusBadGateway, "cannot be asked for its stacks"},
		{"/stacks/6", http.StatusBadGateway, "does not use gorun's Go runtime"},
		{"/stacks/7", http.StatusNotFound, "rank 7 is not a worker of this node"},
		{"/stacks/x", http.StatusBadRequest, "is not a number"},
	} {
		mux := http.NewServeMux()
		mux.HandleFunc("GET /stacks/{rank}", b.serveStacks)
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest("GET", tc.path, nil))
		if rec.Code != tc.code || !strings.Contains(rec.Body.String(), tc.want) {
			t.Errorf("%s: %d %q, want %d and %q", tc.path, rec.Code, rec.Body.String(), tc.code, tc.want)
		}
	}
}
