package cuda

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gorun/gorun/internal/testenv"
)

// wheel lays out a site-packages folder holding lib as NVIDIA's NCCL
// wheel does, and returns the folder.
func wheel(t *testing.T, lib string) string {
	t.Helper()
	sitePackages := t.TempDir()
	dir := filepath.Join(sitePackages, "nvidia", "nccl", "lib")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(lib)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "libnccl.so.2"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	return sitePackages
}

// stagedSearch is a Search over three places at once: the environment
// variable names envPath (when not empty), the dynamic loader finds
// loaderPath for the bare soname (when not empty), and python3 lists
// sitePackages. It records what was given to the loader.
func stagedSearch(envPath, loaderPath string, sitePackages []string, opened *[]string) Search {
	return Search{
		LookupEnv: func(key string) (string, bool) {
			return envPath, key == "GORUN_NCCL_LIBRARY" && envPath != ""
		},
		SitePackages: func(context.Context) ([]string, error) { return sitePackages, nil },
		dlopen: func(name string) (uintptr, error) {
			*opened = append(*opened, name)
			if name == "libnccl.so.2" {
				if loaderPath == "" {
					return 0, errors.New("libnccl.so.2: cannot open shared object file: No such file or directory")
				}
				return dlopen(loaderPath)
			}
			return dlopen(name)
		},
	}
}

func TestSearchOrderEnvThenLoaderThenSitePackages(t *testing.T) {
	envLib, loaderLib := fakeNCCL(t), fakeNCCL(t)
	sitePackages := wheel(t, fakeNCCL(t))
	wheelLib := filepath.Join(sitePackages, "nvidia", "nccl", "lib", "libnccl.so.2")
	cases := []struct {
		name        string
		env, loader string
		wantPath    string
		wantOpened  []string
	}{
		{"the environment variable wins", envLib, loaderLib, envLib, []string{envLib}},
		{"then the dynamic loader", "", loaderLib, "libnccl.so.2", []string{"libnccl.so.2"}},
		{"then the wheels", "", "", wheelLib, []string{"libnccl.so.2", wheelLib}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var opened []string
			n, err := LoadNCCL(context.Background(), stagedSearch(tc.env, tc.loader, []string{sitePackages}, &opened))
			if err != nil {
				t.Fatal(err)
			}
			if n.Path() != tc.wantPath || !slices.Equal(opened, tc.wantOpened) {
				t.Errorf("loaded %s after trying %q; want %s after %q", n.Path(), opened, tc.wantPath, tc.wantOpened)
			}
		})
	}
}

func TestSearchHonoursABrokenEnvironmentVariable(t *testing.T) {
	// An explicit choice that does not load is an error, not a reason to
	// load some other NCCL behind the user's back.
	var opened []string
	missing := filepath.Join(t.TempDir(), "libnccl.so.2")
	_, err := LoadNCCL(context.Background(), stagedSearch(missing, fakeNCCL(t), nil, &opened))
	var loadErr *LoadError
	if !errors.As(err, &loadErr) || len(loadErr.Tried) != 1 || loadErr.Tried[0].Path != missing || loadErr.Tried[0].From != "GORUN_NCCL_LIBRARY" {
		t.Fatalf("got %v; want a LoadError naming only %s", err, missing)
	}
	if !slices.Equal(opened, []string{missing}) {
		t.Errorf("tried %q after the variable's file failed", opened)
	}
}

func TestNoLibraryListsWhatWasTried(t *testing.T) {
	var opened []string
	a, b := t.TempDir(), t.TempDir()
	_, err := LoadNCCL(context.Background(), stagedSearch("", "", []string{a, b}, &opened))
	var loadErr *LoadError
	if !errors.As(err, &loadErr) {
		t.Fatalf("got %v; want a *LoadError", err)
	}
	msg := err.Error()
	for _, want := range []string{
		"cuda: no usable libnccl.so.2 (set GORUN_NCCL_LIBRARY to its path)",
		"not found (dynamic loader): libnccl.so.2",
		"not found (python3 site-packages): " + filepath.Join(a, "nvidia", "nccl", "lib", "libnccl.so.2") + ", " +
			filepath.Join(b, "nvidia", "nccl", "lib", "libnccl.so.2"),
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("the error does not say %q:\n%s", want, msg)
		}
	}

	// When Python cannot be asked, the error says so.
	search := stagedSearch("", "", nil, &opened)
	search.SitePackages = noPython
	_, err = LoadNCCL(context.Background(), search)
	if err == nil || !strings.Contains(err.Error(), "python3 site-packages: no python3 in this test") {
		t.Errorf("got %v; want the failure to list site-packages", err)
	}
}

func TestCUDAWheelFolders(t *testing.T) {
	// libcuda.so.1 normally comes with the driver; the CUDA wheels'
	// folders are still searched, and named when nothing is found.
	var opened []string
	search := Search{
		LookupEnv:    func(string) (string, bool) { return "", false },
		SitePackages: func(context.Context) ([]string, error) { return []string{"/sp"}, nil },
		dlopen: func(name string) (uintptr, error) {
			opened = append(opened, name)
			return 0, errors.New("not here")
		},
	}
	_, err := LoadDriver(context.Background(), search)
	want := []string{"libcuda.so.1", "/sp/nvidia/cu13/lib/libcuda.so.1", "/sp/nvidia/cuda_runtime/lib/libcuda.so.1"}
	if !slices.Equal(opened, want) {
		t.Errorf("tried %q; want %q", opened, want)
	}
	if err == nil || !strings.Contains(err.Error(), "set GORUN_CUDA_LIBRARY to its path") {
		t.Errorf("got %v; want a LoadError naming GORUN_CUDA_LIBRARY", err)
	}
}

func TestOldNCCLIsRefused(t *testing.T) {
	t.Setenv("FAKE_NCCL_VERSION", "2604") // NCCL 2.6.4, numbered the pre-2.9 way
	_, err := LoadNCCL(context.Background(), only("GORUN_NCCL_LIBRARY", fakeNCCL(t)))
	var versionErr *VersionError
	if !errors.As(err, &versionErr) || versionErr.Found != (Version{2, 6, 4}) {
		t.Fatalf("got %v; want a VersionError for 2.6.4", err)
	}
	if want := "NCCL 2.6.4 is too old: gorun needs 2.7.0 or newer (ncclSend/ncclRecv)"; !strings.Contains(err.Error(), want) {
		t.Errorf("the error does not say %q:\n%v", want, err)
	}
}

func TestAnOldNCCLIsPassedOverForAGoodOne(t *testing.T) {
	var opened []string
	old := fakeNCCL(t, "-DFAKE_DEFAULT_VERSION=20604")
	sitePackages := wheel(t, fakeNCCL(t))
	n, err := LoadNCCL(context.Background(), stagedSearch("", old, []string{sitePackages}, &opened))
	if err != nil {
		t.Fatal(err)
	}
	if n.Version() != (Version{2, 27, 3}) || !strings.HasPrefix(n.Path(), sitePackages) {
		t.Errorf("loaded NCCL %v from %s; want 2.27.3 from the wheel", n.Version(), n.Path())
	}
}

func TestMissingSymbolsAreNamed(t *testing.T) {
	_, err := LoadNCCL(context.Background(), only("GORUN_NCCL_LIBRARY", fakeNCCL(t, "-DNO_SEND")))
	var symErr *SymbolsError
	if !errors.As(err, &symErr) || !slices.Equal(symErr.Missing, []string{"ncclSend", "ncclRecv"}) {
		t.Fatalf("got %v; want ncclSend and ncclRecv missing", err)
	}
	if want := "missing ncclSend, ncclRecv (need NCCL 2.7.0 or newer)"; !strings.Contains(err.Error(), want) {
		t.Errorf("the error does not say %q:\n%v", want, err)
	}
}

func TestOptionalSymbolsAreProbed(t *testing.T) {
	cases := []struct {
		defines               []string
		canSplit, nonblocking bool
		version               Version
	}{
		{nil, true, true, Version{2, 27, 3}},
		{[]string{"-DNO_SPLIT"}, false, true, Version{2, 27, 3}},
		{[]string{"-DLEGACY"}, false, false, Version{2, 12, 12}},
	}
	for _, tc := range cases {
		n, err := LoadNCCL(context.Background(), only("GORUN_NCCL_LIBRARY", fakeNCCL(t, tc.defines...)))
		if err != nil {
			t.Fatal(err)
		}
		if n.CanSplit() != tc.canSplit || n.Nonblocking() != tc.nonblocking || n.Version() != tc.version {
			t.Errorf("%v: CanSplit %v, Nonblocking %v, version %v; want %v, %v, %v", tc.defines,
				n.CanSplit(), n.Nonblocking(), n.Version(), tc.canSplit, tc.nonblocking, tc.version)
		}
	}
}

func TestNCCLVersionCodes(t *testing.T) {
	for code, want := range map[int]Version{
		2708:  {2, 7, 8}, // before 2.9: X*1000+Y*100+Z
		2804:  {2, 8, 4},
		20903: {2, 9, 3}, // from 2.9: X*10000+Y*100+Z
		21803: {2, 18, 3},
		23007: {2, 30, 7},
	} {
		if got := ncclVersionOf(code); got != want {
			t.Errorf("ncclVersionOf(%d) = %v; want %v", code, got, want)
		}
	}
}

// script writes an executable shell script and returns its path.
func script(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "python3")
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestSitePackagesParsesPythonsAnswer(t *testing.T) {
	python := script(t, `printf '/usr/lib/python3/dist-packages\nrelative/site-packages\n\n/home/u/.local/lib/python3.13/site-packages\n/usr/lib/python3/dist-packages\n'`)
	dirs, err := sitePackagesOf(context.Background(), python)
	want := []string{"/usr/lib/python3/dist-packages", "/home/u/.local/lib/python3.13/site-packages"}
	if err != nil || !slices.Equal(dirs, want) {
		t.Errorf("got %q, %v; want %q", dirs, err, want)
	}

	broken := script(t, `echo 'Traceback (most recent call last):' >&2; echo 'ModuleNotFoundError: No module named site' >&2; exit 1`)
	if _, err := sitePackagesOf(context.Background(), broken); err == nil || !strings.HasSuffix(err.Error(), "exit status 1: ModuleNotFoundError: No module named site") {
		t.Errorf("got %v; want the exception", err)
	}
}

func TestSitePackagesOfTheRealPython(t *testing.T) {
	testenv.MustHaveCommand(t, "python3", "python3")
	dirs, err := Search{}.sitePackages(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if !filepath.IsAbs(d) || !(strings.HasSuffix(d, "site-packages") || strings.HasSuffix(d, "dist-packages")) {
			t.Errorf("python3 listed %q as a site-packages folder", d)
		}
	}
}
