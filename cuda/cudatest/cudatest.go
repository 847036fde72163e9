// Package cudatest builds the fake CUDA driver and NCCL libraries of
// package cuda's testdata with cc, for the tests of cuda and of the
// packages above it, and reads back what the fakes recorded. The fakes
// stand in for libcuda.so.1 and libnccl.so.2 on machines without a GPU:
// device memory is host memory, and NCCL moves data for a world of one
// rank (see the comments atop fake_cuda.c and fake_nccl.c for their knobs
// and build variants).
//
// It does not import package cuda, whose own tests use it.
package cudatest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/gorun/gorun/internal/testenv"
)

// The fake libraries' sources, in the testdata folder of package cuda.
const (
	CUDASource = "fake_cuda.c"
	NCCLSource = "fake_nccl.c"
)

// Builder compiles each variant of a fake library once, into a folder of
// its own, and hands every test a fresh copy: the dynamic loader treats a
// copy at a new path as a new library, with state of its own.
type Builder struct {
	src    string // the folder holding the C sources
	dir    string // where the variants are compiled
	builds sync.Map
}

type build struct {
	once sync.Once
	path string
	err  error
}

// NewBuilder returns a Builder of the sources in srcDir (package cuda's
// testdata, relative to the calling test's package). Close removes what
// it compiled; call it from TestMain.
func NewBuilder(srcDir string) (*Builder, error) {
	if _, err := os.Stat(filepath.Join(srcDir, CUDASource)); err != nil {
		return nil, fmt.Errorf("cudatest: the fake libraries' sources: %w", err)
	}
	dir, err := os.MkdirTemp("", "gorun-cuda-fakes-")
	if err != nil {
		return nil, err
	}
	return &Builder{src: srcDir, dir: dir}, nil
}

// Close removes the compiled libraries.
func (b *Builder) Close() error { return os.RemoveAll(b.dir) }

// Library returns a fresh copy of src compiled with the cc flags defines
// (-DNAME or -DNAME=VALUE), named soname, in a folder of t's own. Without
// a C compiler t is skipped naming gcc, or fails under CI=true.
func (b *Builder) Library(t testing.TB, src, soname string, defines ...string) string {
	t.Helper()
	testenv.MustHaveCommand(t, "cc", "gcc")
	v, _ := b.builds.LoadOrStore(src+" "+strings.Join(defines, " "), &build{})
	bd := v.(*build)
	bd.once.Do(func() { bd.path, bd.err = b.compile(src, defines) })
	if bd.err != nil {
		t.Fatal(bd.err)
	}
	data, err := os.ReadFile(bd.path)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), soname)
	if err := os.WriteFile(path, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

func (b *Builder) compile(src string, defines []string) (string, error) {
	cc, err := exec.LookPath("cc")
	if err != nil {
		return "", fmt.Errorf("no C compiler to build the fake CUDA and NCCL libraries (install the Debian package gcc): %w", err)
	}
	variant := strings.NewReplacer("-D", "-", "=", "_").Replace(strings.Join(defines, ""))
	path := filepath.Join(b.dir, strings.TrimSuffix(src, ".c")+variant+".so")
	args := append([]string{"-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-Wl,-Bsymbolic"}, defines...)
	args = append(args, "-o", path, filepath.Join(b.src, src), "-lpthread")
	if out, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
		return "", fmt.Errorf("cc %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return path, nil
}

// CUDA returns a fresh fake libcuda.so.1.
func (b *Builder) CUDA(t testing.TB) string {
	return b.Library(t, CUDASource, "libcuda.so.1")
}

// NCCL returns a fresh fake libnccl.so.2 compiled with defines: -DNO_SPLIT
// (NCCL < 2.18), -DNO_SEND (< 2.7), -DLEGACY (2.12),
// -DFAKE_DEFAULT_VERSION=N (what ncclGetVersion reports).
func (b *Builder) NCCL(t testing.TB, defines ...string) string {
	return b.Library(t, NCCLSource, "libnccl.so.2", defines...)
}

// NCCLLog returns every call the fake NCCL at path has logged, one per line.
func NCCLLog(t testing.TB, path string) string {
	t.Helper()
	return Func[func() string](t, path, "fake_nccl_log")()
}

// CUDALive counts what the fake driver at path holds: "device" (buffers),
// "pinned", "streams", "events" or "contexts".
func CUDALive(t testing.TB, path, what string) int64 {
	t.Helper()
	return Func[func(string) int64](t, path, "fake_cuda_live")(what)
}
