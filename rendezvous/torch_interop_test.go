package rendezvous

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testenv"
)

// torchScript is the Python side of the interop tests.
var torchScript = filepath.Join("testdata", "torch_client.py")

// requireTorch returns the Python interpreter with torch.distributed
// ($GORUN_TEST_PYTHON, else Debian's /usr/bin/python3: the python3 on PATH
// may lack torch): interop is tested against real torch. Without it the
// test is skipped naming python3-torch, or fails under CI=true.
func requireTorch(tb testing.TB) string {
	tb.Helper()
	return testenv.MustHavePythonModule(tb, "torch.distributed", "import torch, torch.distributed", testenv.TorchPackage)
}

// torchProcess runs the Python script and reads its JSON lines.
type torchProcess struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines *bufio.Scanner
}

type torchLine struct {
	Step   string          `json:"step"`
	Result json.RawMessage `json:"result"`
}

func startTorch(tb testing.TB, args ...string) *torchProcess {
	tb.Helper()
	return startScript(tb, append([]string{requireTorch(tb), torchScript}, args...))
}

// startScript runs argv, a torch client script, and reads its JSON lines;
// it closes the script's stdin when the test ends ("serve" exits on EOF)
// and kills it if it has not exited within testTimeout.
func startScript(tb testing.TB, argv []string) *torchProcess {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stderr = &testLogWriter{tb: tb}
	cmd.WaitDelay = 5 * time.Second
	stdin, err := cmd.StdinPipe()
	mustDo(tb, err)
	stdout, err := cmd.StdoutPipe()
	mustDo(tb, err)
	mustDo(tb, cmd.Start())
	tb.Cleanup(func() {
		stdin.Close()
		done := make(chan struct{})
		go func() {
			_ = cmd.Wait()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(testTimeout):
			cancel()
			<-done
		}
		cancel()
	})
	return &torchProcess{cmd: cmd, stdin: stdin, lines: bufio.NewScanner(stdout)}
}

// next returns the script's next step, which must be named step.
func (p *torchProcess) next(tb testing.TB, step string) json.RawMessage {
	tb.Helper()
	if !p.lines.Scan() {
		tb.Fatalf("torch script ended before step %q: %v", step, p.lines.Err())
	}
	var l torchLine
	if err := json.Unmarshal(p.lines.Bytes(), &l); err != nil {
		tb.Fatalf("torch script printed %q: %v", p.lines.Text(), err)
	}
	if l.Step != step {
		tb.Fatalf("torch script step %q (%s), want %q", l.Step, l.Result, step)
	}
	return l.Result
}

// expect checks that the script's next step is step and its result,
// decoded as want's type, equals want.
func (p *torchProcess) expect(tb testing.TB, step string, want any) {
	tb.Helper()
	raw := p.next(tb, step)
	got := reflect.New(reflect.TypeOf(want))
	if err := json.Unmarshal(raw, got.Interface()); err != nil {
		tb.Fatalf("step %s: result %s: %v", step, raw, err)
	}
	if !reflect.DeepEqual(got.Elem().Interface(), want) {
		tb.Errorf("step %s: got %s, want %v", step, raw, want)
	}
}

// expectError checks that the script's next step is step and that it
// failed with an error containing contains.
func (p *torchProcess) expectError(tb testing.TB, step, contains string) {
	tb.Helper()
	raw := p.next(tb, step)
	var got struct{ Error string }
	if err := json.Unmarshal(raw, &got); err != nil || got.Error == "" || !strings.Contains(got.Error, contains) {
		tb.Errorf("step %s: got %s, want an error containing %q", step, raw, contains)
	}
}

// serverAddr reads the port a "serve" script's server listens on and returns
// its address.
func (p *torchProcess) serverAddr(tb testing.TB) string {
	tb.Helper()
	var port int
	if err := json.Unmarshal(p.next(tb, "port"), &port); err != nil {
		tb.Fatal(err)
	}
	return "127.0.0.1:" + strconv.Itoa(port)
}

// testLogWriter forwards the script's stderr to the test log.
type testLogWriter struct {
	mu sync.Mutex
	tb testing.TB
}

func (w *testLogWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.tb.Logf("python: %s", strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestTorchClientAgainstOurServer runs torch 1.13's TCPStore client, every
// operation of its Python binding, against our server.
func TestTorchClientAgainstOurServer(t *testing.T) {
	requireTorch(t)
	srv, addr, logs := startServer(t, ServerOptions{})
	host, port, _ := strings.Cut(addr, ":")
	py := startTorch(t, "client", host, port)

	py.expect(t, "set_get", "v1")
	py.expect(t, "set_get_bytes", "\x00\u00ff") // latin-1 decoded
	py.expect(t, "add", []any{5.0, 3.0, "3"})
	py.expect(t, "add_quirks", []int64{13, 8, 5, 1})
	py.expect(t, "add_overflow", int64(-9223372036854775808))
	py.expectError(t, "add_non_integer", "")
	py.expect(t, "after_add_non_integer", "P")
	py.expect(t, "compare_set", []string{"abc", "first", "second", "second", "second", ""})
	py.expect(t, "wait_present", true)
	py.expectError(t, "wait_timeout", "Socket Timeout")
	py.expectError(t, "wait_multi_timeout", "Socket Timeout")
	py.expect(t, "delete_key", []bool{true, false})
	py.expect(t, "num_keys_delta", 2)
	n, err := srv.Store().NumKeys(context.Background())
	mustDo(t, err)
	py.expect(t, "num_keys", int(n))
	py.expectError(t, "set_timeout_get", "Socket Timeout")

	py.expect(t, "waiting", true)
	waitUntil(t, func() bool {
		return srv.table.waitingOn("/woken") > 0
	})
	mustDo(t, NewPrefixStore("", srv.Store()).Set(context.Background(), "woken", []byte("by go")))
	py.expect(t, "woken", "by go")
	py.expect(t, "done", true)

	// torch's keys as they landed in our table: "/" prefixed, but init/.
	if got := mustGet(t, srv.Store(), "init/"); got != "1" {
		t.Errorf(`"init/" = %q, want 1 (one client gave a world size)`, got)
	}
	if got := mustGet(t, srv.Store(), "/cs"); got != "second" {
		t.Errorf(`"/cs" = %q`, got)
	}
	if !strings.Contains(logs.String(), "not an integer") {
		t.Error("the non-integer add was not logged")
	}
}

// TestOurClientAgainstTorchServer runs the conformance suite with our
// Client against torch 1.13's own server.
func TestOurClientAgainstTorchServer(t *testing.T) {
	addr := startTorchServer(t)
	for _, d := range []Dialect{Dialect113, DialectAuto} {
		t.Run(d.String(), func(t *testing.T) {
			c := dialClient(t, addr, ClientOptions{Dialect: d, WorldSize: 1})
			if c.Dialect() != Dialect113 {
				t.Fatalf("dialect %v against torch 1.13", c.Dialect())
			}
			if err := c.Ping(context.Background()); !errors.Is(err, errors.ErrUnsupported) {
				t.Fatalf("ping: %v, want ErrUnsupported", err)
			}
			testStoreSemantics(t, func(t *testing.T) storeFixture {
				open := func(t *testing.T) Store { return dialClient(t, addr, ClientOptions{Dialect: d}) }
				return storeFixture{
					store:           open(t),
					open:            open,
					appendSupported: false,
					compareSetWakes: false, // torch 1.13's server does not wake on compare_set
				}
			})
		})
	}
	c := dialClient(t, addr, ClientOptions{Dialect: Dialect113})
	if n, err := c.add(context.Background(), initKey, 0); err != nil || n != 2 {
		t.Errorf(`"init/" = %d, %v; want 2 (two clients gave a world size)`, n, err)
	}
}

// startTorchServer starts torch 1.13's TCPStore server and returns its
// address.
func startTorchServer(tb testing.TB) string {
	tb.Helper()
	return startTorch(tb, "serve").serverAddr(tb)
}
