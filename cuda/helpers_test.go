package cuda

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ebitengine/purego"
	"github.com/gorun/gorun/cuda/cudatest"
	"github.com/gorun/gorun/rendezvous"
)

// fakes compiles the fake libraries, once per variant, and gives every
// test its own copy.
var fakes *cudatest.Builder

func TestMain(m *testing.M) {
	b, err := cudatest.NewBuilder("testdata")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fakes = b
	code := m.Run()
	b.Close()
	os.Exit(code)
}

func fakeCUDA(t *testing.T) string { return fakes.CUDA(t) }

func fakeNCCL(t *testing.T, defines ...string) string { return fakes.NCCL(t, defines...) }

// only is a Search that finds nothing but path, through the library's
// environment variable, without asking any Python.
func only(envVar, path string) Search {
	return Search{
		LookupEnv: func(key string) (string, bool) {
			if key == envVar {
				return path, true
			}
			return "", false
		},
		SitePackages: noPython,
	}
}

func noPython(context.Context) ([]string, error) {
	return nil, errors.New("no python3 in this test")
}

// testFunc binds a test-only function of a fake library.
func testFunc[F any](t *testing.T, lib uintptr, name string) F {
	t.Helper()
	var f F
	addr, ok := dlsym(lib, name)
	if !ok {
		t.Fatalf("the fake library has no %s", name)
	}
	purego.RegisterFunc(&f, addr)
	return f
}

// gpu is one fake GPU with fake NCCL loaded: the fixture of most tests.
type gpu struct {
	t    *testing.T
	drv  *Driver
	dev  *Device
	nccl *NCCL
}

// newGPU loads fresh fakes (NCCL built with defines) and opens device 0,
// closing it, and checking that nothing was left allocated, when t ends.
func newGPU(t *testing.T, defines ...string) *gpu {
	t.Helper()
	ctx := context.Background()
	drv, err := LoadDriver(ctx, only("GORUN_CUDA_LIBRARY", fakeCUDA(t)))
	if err != nil {
		t.Fatal(err)
	}
	nccl, err := LoadNCCL(ctx, only("GORUN_NCCL_LIBRARY", fakeNCCL(t, defines...)))
	if err != nil {
		t.Fatal(err)
	}
	dev, err := drv.OpenDevice(0)
	if err != nil {
		t.Fatal(err)
	}
	g := &gpu{t: t, drv: drv, dev: dev, nccl: nccl}
	t.Cleanup(func() {
		if err := dev.Close(); err != nil {
			t.Errorf("closing the device: %v", err)
		}
		g.expectAllReleased()
		if n := testFunc[func() int64](t, nccl.lib, "fake_nccl_misuse")(); n != 0 {
			t.Errorf("%d NCCL calls on an aborted or destroyed communicator\n%s", n, g.ncclLog())
		}
	})
	return g
}

func (g *gpu) cudaLog() string { return testFunc[func() string](g.t, g.drv.lib, "fake_cuda_log")() }
func (g *gpu) ncclLog() string { return testFunc[func() string](g.t, g.nccl.lib, "fake_nccl_log")() }

// live counts what the fake driver holds: "device", "pinned", "streams",
// "events" or "contexts".
func (g *gpu) live(what string) int64 {
	return testFunc[func(string) int64](g.t, g.drv.lib, "fake_cuda_live")(what)
}

func (g *gpu) expectAllReleased() {
	g.t.Helper()
	for _, what := range []string{"device", "pinned", "streams", "events", "contexts"} {
		if n := g.live(what); n != 0 {
			g.t.Errorf("%d %s still allocated after Close", n, what)
		}
	}
}

// comm makes a communicator of one rank with a default-sized timeout,
// closed when the test ends.
func (g *gpu) comm(cfg CommConfig) *Comm {
	g.t.Helper()
	if cfg.Size == 0 {
		cfg.Size = 1
	}
	if cfg.Store == nil {
		cfg.Store = rendezvous.NewMemoryStore(time.Minute)
	}
	if cfg.Key == "" {
		cfg.Key = "nccl/0"
	}
	c, err := g.nccl.NewComm(context.Background(), g.dev, cfg)
	if err != nil {
		g.t.Fatal(err)
	}
	g.t.Cleanup(func() {
		if err := c.Close(); err != nil && !errors.Is(err, ErrAborted) {
			g.t.Errorf("closing the communicator: %v", err)
		}
	})
	return c
}

// buffer allocates a device buffer holding data, freed when the test ends.
func (g *gpu) buffer(data []byte) *DeviceBuffer {
	g.t.Helper()
	b, err := g.dev.Alloc(len(data))
	if err != nil {
		g.t.Fatal(err)
	}
	g.t.Cleanup(func() {
		if err := b.Free(); err != nil && !errors.Is(err, errFreed) {
			g.t.Errorf("freeing a buffer: %v", err)
		}
	})
	if _, err := b.WriteAt(data, 0); err != nil {
		g.t.Fatal(err)
	}
	return b
}

// read returns the buffer's content.
func (g *gpu) read(b *DeviceBuffer) []byte {
	g.t.Helper()
	out := make([]byte, b.Size())
	if _, err := b.ReadAt(out, 0); err != nil {
		g.t.Fatal(err)
	}
	return out
}

// wait waits for w, failing the test on error.
func wait(t *testing.T, w *Work, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// logLines returns the lines of log that start with one of prefixes.
func logLines(log string, prefixes ...string) []string {
	var lines []string
	for line := range strings.Lines(log) {
		line = strings.TrimSuffix(line, "\n")
		for _, p := range prefixes {
			if strings.HasPrefix(line, p) {
				lines = append(lines, line)
				break
			}
		}
	}
	return lines
}

// pattern is n recognisable bytes.
func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) + seed
	}
	return b
}
