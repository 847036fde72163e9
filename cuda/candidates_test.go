package cuda

import (
	"context"
	"debug/elf"
	"encoding/binary"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gorun/gorun/internal/testenv"
)

// candidateSearch is a Search whose environment is env, whose loader
// cache is cache and whose Python lists sitePackages.
func candidateSearch(env map[string]string, cache map[string][]string, sitePackages ...string) Search {
	return Search{
		LookupEnv: func(key string) (string, bool) {
			v, ok := env[key]
			return v, ok
		},
		SitePackages: func(context.Context) ([]string, error) { return sitePackages, nil },
		loaderCache:  func(context.Context) (map[string][]string, error) { return cache, nil },
	}
}

// inDir copies the library at lib into a new folder, under its soname,
// and returns the folder.
func inDir(t *testing.T, lib string) string {
	t.Helper()
	dir := t.TempDir()
	data, err := os.ReadFile(lib)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, filepath.Base(lib)), data, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestCandidatesInSearchOrder(t *testing.T) {
	first, empty, second := inDir(t, fakeNCCL(t)), t.TempDir(), inDir(t, fakeNCCL(t))
	cached := fakeNCCL(t)
	// The cache names first's file again, through a symbolic link: listed once.
	link := filepath.Join(t.TempDir(), "libnccl.so.2")
	if err := os.Symlink(filepath.Join(first, "libnccl.so.2"), link); err != nil {
		t.Fatal(err)
	}
	cache := map[string][]string{
		"libnccl.so.2": {link, cached, filepath.Join(empty, "gone", "libnccl.so.2")},
		"libcuda.so.1": {fakeCUDA(t)},
	}
	sitePackages := wheel(t, fakeNCCL(t))
	env := map[string]string{"LD_LIBRARY_PATH": first + "::" + empty + ":" + second}
	fromFirst := filepath.Join(first, "libnccl.so.2")
	fromSecond := filepath.Join(second, "libnccl.so.2")
	fromWheel := filepath.Join(sitePackages, "nvidia", "nccl", "lib", "libnccl.so.2")

	got, err := candidateSearch(env, cache, sitePackages, t.TempDir()).Candidates(context.Background(), NCCLLibrary)
	want := []Candidate{
		{fromFirst, "LD_LIBRARY_PATH", true}, // what the dynamic loader finds
		{fromSecond, "LD_LIBRARY_PATH", false},
		{cached, "ldconfig cache", false},
		{fromWheel, "python3 site-packages", true},
	}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("got %+v, %v\nwant %+v", got, err, want)
	}

	// The variable's file is listed even when missing, and then the
	// search tries nothing else.
	missing := filepath.Join(t.TempDir(), "libnccl.so.2")
	env["GORUN_NCCL_LIBRARY"] = missing
	got, err = candidateSearch(env, cache, sitePackages).Candidates(context.Background(), NCCLLibrary)
	want = []Candidate{
		{missing, "GORUN_NCCL_LIBRARY", true},
		{fromFirst, "LD_LIBRARY_PATH", false},
		{fromSecond, "LD_LIBRARY_PATH", false},
		{cached, "ldconfig cache", false},
		{fromWheel, "python3 site-packages", false},
	}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("with GORUN_NCCL_LIBRARY set: got %+v, %v\nwant %+v", got, err, want)
	}
}

func TestCandidatesPassOverAnotherMachinesLibrary(t *testing.T) {
	// A 32-bit or other-architecture copy first on the path is skipped by
	// the dynamic loader, which goes on to the next.
	foreign := fakeCUDA(t)
	data, err := os.ReadFile(foreign)
	if err != nil {
		t.Fatal(err)
	}
	if elf.Data(data[elf.EI_DATA]) != elf.ELFDATA2LSB {
		t.Fatalf("%s is not a little-endian ELF file", foreign)
	}
	other := elf.EM_AARCH64
	if binary.LittleEndian.Uint16(data[18:]) == uint16(other) {
		other = elf.EM_X86_64
	}
	binary.LittleEndian.PutUint16(data[18:], uint16(other)) // e_machine
	if err := os.WriteFile(foreign, data, 0o755); err != nil {
		t.Fatal(err)
	}
	native := fakeCUDA(t)
	env := map[string]string{"LD_LIBRARY_PATH": filepath.Dir(foreign) + ":" + filepath.Dir(native)}

	got, err := candidateSearch(env, nil).Candidates(context.Background(), DriverLibrary)
	want := []Candidate{{foreign, "LD_LIBRARY_PATH", false}, {native, "LD_LIBRARY_PATH", true}}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("got %+v, %v\nwant %+v", got, err, want)
	}
	if _, err := (Search{}).Probe(DriverLibrary, foreign); err == nil {
		t.Errorf("the %v copy probed as loadable", other)
	}
}

func TestCandidatesSayWhatCouldNotBeListed(t *testing.T) {
	lib := fakeNCCL(t)
	search := Search{
		LookupEnv: func(key string) (string, bool) {
			return filepath.Dir(lib), key == "LD_LIBRARY_PATH"
		},
		SitePackages: noPython,
		loaderCache: func(context.Context) (map[string][]string, error) {
			return nil, errors.New("no ldconfig in this test")
		},
	}
	got, err := search.Candidates(context.Background(), NCCLLibrary)
	if want := []Candidate{{lib, "LD_LIBRARY_PATH", true}}; !slices.Equal(got, want) {
		t.Errorf("got %+v; want %+v", got, want)
	}
	if err == nil || !strings.Contains(err.Error(), "no ldconfig in this test") || !strings.Contains(err.Error(), "no python3 in this test") {
		t.Errorf("got %v; want both failures named", err)
	}
}

func TestCandidatesAskTheGivenPython(t *testing.T) {
	sitePackages := wheel(t, fakeNCCL(t))
	python := script(t, "echo "+sitePackages)
	search := Search{
		LookupEnv:   func(string) (string, bool) { return "", false },
		Python:      python,
		loaderCache: func(context.Context) (map[string][]string, error) { return nil, nil },
	}
	got, err := search.Candidates(context.Background(), NCCLLibrary)
	want := []Candidate{{filepath.Join(sitePackages, "nvidia", "nccl", "lib", "libnccl.so.2"), "python3 site-packages", true}}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("got %+v, %v; want %+v", got, err, want)
	}
}

func TestUnknownLibrary(t *testing.T) {
	if _, err := (Search{}).Candidates(context.Background(), Library("libcudart.so.12")); err == nil || !strings.Contains(err.Error(), "not a library this package loads") {
		t.Errorf("Candidates: got %v; want the library refused", err)
	}
	if _, err := (Search{}).Probe(Library("libcudart.so.12"), fakeCUDA(t)); err == nil {
		t.Error("Probe accepted a library the package does not load")
	}
}

func TestLibraryNames(t *testing.T) {
	if NCCLLibrary.EnvVar() != "GORUN_NCCL_LIBRARY" || DriverLibrary.EnvVar() != "GORUN_CUDA_LIBRARY" {
		t.Errorf("EnvVar: %q, %q", NCCLLibrary.EnvVar(), DriverLibrary.EnvVar())
	}
	dirs := NCCLLibrary.WheelDirs()
	if !slices.Equal(dirs, []string{"nvidia/nccl/lib"}) {
		t.Errorf("WheelDirs: %q", dirs)
	}
	dirs[0] = "elsewhere"
	if NCCLLibrary.WheelDirs()[0] != "nvidia/nccl/lib" {
		t.Error("WheelDirs gives away the search's own folders")
	}
}

func TestProbe(t *testing.T) {
	text := filepath.Join(t.TempDir(), "libnccl.so.2")
	if err := os.WriteFile(text, []byte("not an ELF file\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var symbols *SymbolsError
	var tooOld *VersionError
	cases := []struct {
		name    string
		lib     Library
		path    string
		version Version
		err     func(error) bool
	}{
		{"a good NCCL", NCCLLibrary, fakeNCCL(t), Version{2, 27, 3}, isNil},
		{"a good driver", DriverLibrary, fakeCUDA(t), Version{12, 8, 0}, isNil},
		{"an NCCL too old", NCCLLibrary, fakeNCCL(t, "-DFAKE_DEFAULT_VERSION=20604"), Version{2, 6, 4}, as(&tooOld)},
		{"an NCCL without ncclSend", NCCLLibrary, fakeNCCL(t, "-DNO_SEND"), Version{2, 27, 3}, as(&symbols)},
		{"the driver taken for NCCL", NCCLLibrary, fakeCUDA(t), Version{}, missingOnly(&symbols, "ncclGetVersion")},
		{"NCCL taken for the driver", DriverLibrary, fakeNCCL(t), Version{}, missingOnly(&symbols, "cuDriverGetVersion")},
		{"no file", NCCLLibrary, filepath.Join(t.TempDir(), "libnccl.so.2"), Version{}, is(fs.ErrNotExist)},
		{"not a library", NCCLLibrary, text, Version{}, func(err error) bool {
			return err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.As(err, &symbols)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			version, err := (Search{}).Probe(tc.lib, tc.path)
			if version != tc.version || !tc.err(err) {
				t.Errorf("got %v, %v; want %v and another error", version, err, tc.version)
			}
		})
	}
}

func isNil(err error) bool { return err == nil }

func is(target error) func(error) bool {
	return func(err error) bool { return errors.Is(err, target) }
}

func as[E error](target *E) func(error) bool {
	return func(err error) bool { return errors.As(err, target) }
}

func missingOnly(target **SymbolsError, symbol string) func(error) bool {
	return func(err error) bool {
		return errors.As(err, target) && slices.Equal((*target).Missing, []string{symbol})
	}
}

func TestDriverVersionCodes(t *testing.T) {
	for code, want := range map[int]Version{12080: {12, 8, 0}, 11020: {11, 2, 0}, 13000: {13, 0, 0}} {
		if got := driverVersionOf(code); got != want {
			t.Errorf("driverVersionOf(%d) = %v; want %v", code, got, want)
		}
	}
}

func TestParseLoaderCache(t *testing.T) {
	out := "1234 libs found in cache `/etc/ld.so.cache'\n" +
		"\tlibnccl.so.2 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libnccl.so.2\n" +
		"\tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1\n" +
		"\tlibcuda.so.1 (libc6) => /usr/lib/i386-linux-gnu/libcuda.so.1\n" +
		"Cache generated by: ldconfig (GNU libc) stable release version 2.41\n"
	got := parseLoaderCache([]byte(out))
	want := map[string][]string{
		"libnccl.so.2": {"/usr/lib/x86_64-linux-gnu/libnccl.so.2"},
		"libcuda.so.1": {"/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/usr/lib/i386-linux-gnu/libcuda.so.1"},
	}
	if len(got) != len(want) || !slices.Equal(got["libnccl.so.2"], want["libnccl.so.2"]) || !slices.Equal(got["libcuda.so.1"], want["libcuda.so.1"]) {
		t.Errorf("got %q; want %q", got, want)
	}
}

func TestLoaderCacheOfThisMachine(t *testing.T) {
	_, err := findLdconfig()
	testenv.MustHave(t, err, "ldconfig", "libc-bin")
	cache, err := ldconfigCache(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	libc := cache["libc.so.6"]
	if len(libc) == 0 {
		t.Fatalf("the loader cache lists no libc.so.6: %q", cache)
	}
	for _, path := range libc {
		if _, err := os.Stat(path); err != nil {
			t.Errorf("the cache's libc.so.6: %v", err)
		}
	}
}
