package doctor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"testing"

	"github.com/gorun/gorun/cuda"
)

// fakeLibraries lists set candidates and probes them from a table.
type fakeLibraries struct {
	found   map[cuda.Library][]cuda.Candidate
	listErr error
	probes  map[string]probe // by path
}

type probe struct {
	version cuda.Version
	err     error
}

func (f fakeLibraries) Candidates(_ context.Context, lib cuda.Library) ([]cuda.Candidate, error) {
	return f.found[lib], f.listErr
}

func (f fakeLibraries) Probe(_ cuda.Library, path string) (cuda.Version, error) {
	p, ok := f.probes[path]
	if !ok {
		return cuda.Version{}, fmt.Errorf("this test has no probe for %s", path)
	}
	return p.version, p.err
}

func librariesReport(libs Libraries, lookupEnv func(string) (string, bool), environ ...string) string {
	var b strings.Builder
	writeLibraries(context.Background(), &report{w: &b}, libs, "python3", lookupEnv, environ)
	return b.String()
}

func TestLibrariesSayWhichFileWouldBeLoaded(t *testing.T) {
	tooOld := &cuda.VersionError{Library: "NCCL", Found: cuda.Version{Major: 2, Minor: 6, Patch: 4}, Min: cuda.Version{Major: 2, Minor: 7}, Why: "ncclSend/ncclRecv"}
	libs := fakeLibraries{
		found: map[cuda.Library][]cuda.Candidate{
			cuda.NCCLLibrary: {
				{Path: "/ld/libnccl.so.2", From: "LD_LIBRARY_PATH", Tried: true},
				{Path: "/cache/libnccl.so.2", From: "ldconfig cache"},
				{Path: "/sp/nvidia/nccl/lib/libnccl.so.2", From: "python3 site-packages", Tried: true},
			},
			cuda.DriverLibrary: {
				{Path: "/ld/libcuda.so.1", From: "LD_LIBRARY_PATH", Tried: true},
				{Path: "/cache/libcuda.so.1", From: "ldconfig cache"},
			},
		},
		probes: map[string]probe{
			"/ld/libnccl.so.2":                 {cuda.Version{Major: 2, Minor: 6, Patch: 4}, tooOld},
			"/cache/libnccl.so.2":              {cuda.Version{Major: 2, Minor: 21, Patch: 5}, nil},
			"/sp/nvidia/nccl/lib/libnccl.so.2": {cuda.Version{Major: 2, Minor: 27, Patch: 3}, nil},
			"/ld/libcuda.so.1":                 {cuda.Version{}, &cuda.SymbolsError{Missing: []string{"cuDriverGetVersion"}, Need: "a library that is the CUDA driver"}},
			"/cache/libcuda.so.1":              {cuda.Version{}, errors.New("/cache/libcuda.so.1: wrong ELF class: ELFCLASS32")},
		},
	}
	got := librariesReport(libs, env(), "NCCL_DEBUG=INFO", "PATH=/bin", "GORUN_CUDA_LIBRARY=/x")
	wantLines(t, got,
		"NCCL (libnccl.so.2):\n",
		"  LD_LIBRARY_PATH        /ld/libnccl.so.2                  NCCL 2.6.4\n",
		"  ldconfig cache         /cache/libnccl.so.2               NCCL 2.21.5\n",
		"  python3 site-packages  /sp/nvidia/nccl/lib/libnccl.so.2  NCCL 2.27.3\n",
		// The loader's file is too old, the cache's is behind it: the wheel's.
		"  the NCCL backend would load /sp/nvidia/nccl/lib/libnccl.so.2 (python3 site-packages)\n",
		"    passing over /ld/libnccl.so.2: NCCL 2.6.4 is too old: gorun needs 2.7.0 or newer (ncclSend/ncclRecv)\n",
		"  searched $GORUN_NCCL_LIBRARY, LD_LIBRARY_PATH, the ldconfig cache, python3's site-packages/{nvidia/nccl/lib}\n",
		"CUDA driver (libcuda.so.1):\n",
		"  LD_LIBRARY_PATH  /ld/libcuda.so.1     not CUDA driver: no cuDriverGetVersion\n",
		"  ldconfig cache   /cache/libcuda.so.1  cannot load: /cache/libcuda.so.1: wrong ELF class: ELFCLASS32\n",
		"  the NCCL backend would load none of them\n",
		"NCCL environment: GORUN_CUDA_LIBRARY=/x NCCL_DEBUG=INFO\n",
	)
}

func TestLibrariesNamedByTheVariable(t *testing.T) {
	missing := &os.PathError{Op: "stat", Path: "/nowhere/libnccl.so.2", Err: fs.ErrNotExist}
	libs := fakeLibraries{
		found: map[cuda.Library][]cuda.Candidate{
			cuda.NCCLLibrary: {
				{Path: "/nowhere/libnccl.so.2", From: "GORUN_NCCL_LIBRARY", Tried: true},
				{Path: "/ld/libnccl.so.2", From: "LD_LIBRARY_PATH"},
			},
		},
		listErr: errors.Join(errors.New("no ldconfig here"), errors.New("python3 is broken")),
		probes: map[string]probe{
			"/nowhere/libnccl.so.2": {cuda.Version{}, missing},
			"/ld/libnccl.so.2":      {cuda.Version{Major: 2, Minor: 21, Patch: 5}, nil},
		},
	}
	got := librariesReport(libs, env("GORUN_NCCL_LIBRARY", "/nowhere/libnccl.so.2"))
	wantLines(t, got,
		"  GORUN_NCCL_LIBRARY  /nowhere/libnccl.so.2  not found\n",
		"  LD_LIBRARY_PATH     /ld/libnccl.so.2       NCCL 2.21.5\n",
		"  the NCCL backend would load none of them (GORUN_NCCL_LIBRARY is set: no other file is tried)\n",
		"  not searched: no ldconfig here\n  not searched: python3 is broken\n",
		// No driver at all.
		"  none found: it comes with the NVIDIA driver, or name the file in GORUN_CUDA_LIBRARY\n",
		"NCCL environment: none set\n",
	)
}
