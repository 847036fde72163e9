package cuda

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// A Library is one of the shared libraries the package loads, named by
// its soname.
type Library string

const (
	DriverLibrary Library = "libcuda.so.1" // the CUDA driver API
	NCCLLibrary   Library = "libnccl.so.2"
)

// spec is what the search knows of l.
func (l Library) spec() (librarySpec, error) {
	switch l {
	case DriverLibrary:
		return cudaLibrary, nil
	case NCCLLibrary:
		return ncclLibrary, nil
	}
	return librarySpec{}, fmt.Errorf("cuda: %q is not a library this package loads (%s, %s)", string(l), DriverLibrary, NCCLLibrary)
}

// EnvVar is the environment variable that names the file to load instead
// of searching.
func (l Library) EnvVar() string {
	spec, _ := l.spec()
	return spec.envVar
}

// WheelDirs are the folders, under site-packages, where NVIDIA's wheels
// put the library.
func (l Library) WheelDirs() []string {
	spec, _ := l.spec()
	return slices.Clone(spec.wheelDirs)
}

// Where a candidate came from, besides the library's environment variable
// and fromSitePackages.
const (
	fromLDLibraryPath = "LD_LIBRARY_PATH"
	fromLoaderCache   = "ldconfig cache"
)

// A Candidate is a file that may provide a library.
type Candidate struct {
	Path string // the file, as found: symbolic links are not followed
	From string // the environment variable, "LD_LIBRARY_PATH", "ldconfig cache" or "python3 site-packages"
	// Tried says the search tries the file when those before it fail. It
	// does not when the environment variable names another file, nor when
	// the dynamic loader, asked for the soname, finds another file first
	// or passes this one over as built for another machine.
	Tried bool
}

// Candidates lists every file that may provide lib, each once, in the
// order the search meets them: the file its environment variable names
// (even when missing: the user chose it), the files the dynamic loader
// can find for its soname (LD_LIBRARY_PATH's, then those in the ldconfig
// cache), then those in NVIDIA's wheel folders under site-packages. Unlike
// the search it does not stop at the variable's file nor at the first
// file the dynamic loader finds; Candidate.Tried tells which files the
// search would try. Nothing is loaded. The error names the places that
// could not be listed (the ldconfig cache, Python's site-packages), whose
// files are then missing from the list.
func (s Search) Candidates(ctx context.Context, lib Library) ([]Candidate, error) {
	spec, err := lib.spec()
	if err != nil {
		return nil, err
	}
	lookupEnv := s.lookupEnv()
	found := candidateList{seen: map[string]bool{}}
	var errs []error

	explicit := false
	if path, ok := lookupEnv(spec.envVar); ok && path != "" {
		found.add(Candidate{Path: path, From: spec.envVar, Tried: true}, true)
		explicit = true
	}

	var loaderFiles []Candidate
	if dirs, ok := lookupEnv("LD_LIBRARY_PATH"); ok {
		for _, dir := range filepath.SplitList(dirs) {
			if dir != "" {
				loaderFiles = append(loaderFiles, Candidate{Path: filepath.Join(dir, spec.soname), From: fromLDLibraryPath})
			}
		}
	}
	cache, err := s.readLoaderCache(ctx)
	if err != nil {
		errs = append(errs, err)
	}
	for _, path := range cache[spec.soname] {
		loaderFiles = append(loaderFiles, Candidate{Path: path, From: fromLoaderCache})
	}
	// The dynamic loader takes the first file it finds that is built for
	// this machine, whether or not the search then accepts it.
	loaderFound := explicit
	for _, c := range loaderFiles {
		foreign := builtForAnotherMachine(c.Path)
		c.Tried = !loaderFound && !foreign
		if found.add(c, false) && !foreign {
			loaderFound = true
		}
	}

	dirs, err := s.sitePackages(ctx)
	if err != nil {
		errs = append(errs, err)
	}
	for _, dir := range dirs {
		for _, sub := range spec.wheelDirs {
			path := filepath.Join(dir, filepath.FromSlash(sub), spec.soname)
			found.add(Candidate{Path: path, From: fromSitePackages, Tried: !explicit}, false)
		}
	}
	return found.list, errors.Join(errs...)
}

// candidateList collects candidates, each file once.
type candidateList struct {
	list []Candidate
	seen map[string]bool // the files listed, symbolic links followed
}

// add lists c unless its file is listed already or, unless evenMissing,
// does not exist. It reports whether the file exists.
func (l *candidateList) add(c Candidate, evenMissing bool) bool {
	file, err := filepath.EvalSymlinks(c.Path)
	if err != nil {
		if evenMissing {
			l.list = append(l.list, c)
		}
		return false
	}
	if !l.seen[file] {
		l.seen[file] = true
		l.list = append(l.list, c)
	}
	return true
}

// Probe opens the file at path as the search would, reads the version of
// lib it holds, and closes it. The version is zero when it cannot be
// read. The error is nil when the search would take the file; otherwise
// it says why not: the file does not exist (fs.ErrNotExist) or does not
// load (the dynamic loader's error), it is not lib or lacks functions the
// package needs (a *SymbolsError), or it is too old (a *VersionError).
// Loading runs the library's initialisers in this process, which for NCCL
// and the CUDA driver only set up their own state.
func (s Search) Probe(lib Library, path string) (Version, error) {
	spec, err := lib.spec()
	if err != nil {
		return Version{}, err
	}
	// A bare name is the dynamic loader's to find; a path must exist.
	if strings.ContainsRune(path, '/') {
		if _, err := os.Stat(path); err != nil {
			return Version{}, err
		}
	}
	h, err := s.open()(path)
	if err != nil {
		return Version{}, err
	}
	defer dlclose(h)
	return spec.probe(h)
}

// probeNCCL reads the version of the NCCL loaded as h and checks it as
// LoadNCCL does: 2.7 or newer, with every function we bind.
func probeNCCL(h uintptr) (Version, error) {
	_, version, err := checkNCCL(h)
	return version, err
}

// checkNCCL binds the functions of the NCCL loaded as h, after checking
// that it is NCCL and not too old. The version is zero when the library
// has none to give.
func checkNCCL(h uintptr) (ncclAPI, Version, error) {
	var api ncclAPI
	if missing := bind(h, []symbol{{name: "ncclGetVersion", fn: &api.ncclGetVersion}}); len(missing) > 0 {
		return api, Version{}, &SymbolsError{Missing: missing, Need: "a library that is NCCL"}
	}
	var code int32
	if res := api.ncclGetVersion(&code); res != ncclSuccess {
		return api, Version{}, fmt.Errorf("ncclGetVersion failed: %s", res.name())
	}
	version := ncclVersionOf(int(code))
	if version.Less(minNCCL) {
		return api, version, &VersionError{Library: "NCCL", Found: version, Min: minNCCL, Why: "ncclSend/ncclRecv"}
	}
	if missing := bind(h, api.symbols()); len(missing) > 0 {
		return api, version, &SymbolsError{Missing: missing, Need: "NCCL " + minNCCL.String() + " or newer"}
	}
	return api, version, nil
}

// probeDriver reads the CUDA version of the driver loaded as h and checks
// it as LoadDriver does: every function we bind must be there. No GPU is
// touched.
func probeDriver(h uintptr) (Version, error) {
	_, code, err := checkDriver(h)
	return driverVersionOf(code), err
}

// checkDriver binds the driver functions of the library loaded as h, after
// checking that it is the CUDA driver, and returns cuDriverGetVersion's
// code, which needs no cuInit: zero when the library has none to give.
func checkDriver(h uintptr) (driverAPI, int, error) {
	var api driverAPI
	if missing := bind(h, []symbol{{name: "cuDriverGetVersion", fn: &api.cuDriverGetVersion}}); len(missing) > 0 {
		return api, 0, &SymbolsError{Missing: missing, Need: "a library that is the CUDA driver"}
	}
	var code int32
	if res := api.cuDriverGetVersion(&code); res != cudaSuccess {
		return api, 0, fmt.Errorf("cuDriverGetVersion failed with CUresult %d", res)
	}
	if missing := bind(h, api.symbols()); len(missing) > 0 {
		return api, int(code), &SymbolsError{Missing: missing, Need: minDriver}
	}
	return api, int(code), nil
}

// driverVersionOf decodes cuDriverGetVersion's code, 1000*major +
// 10*minor (12080 is CUDA 12.8).
func driverVersionOf(code int) Version {
	return Version{Major: code / 1000, Minor: code % 1000 / 10}
}

// builtForAnotherMachine reports whether path is an ELF file for another
// machine or word size than this process's, which the dynamic loader
// passes over when it searches for a soname: a 32-bit libcuda.so.1 next
// to the 64-bit one, say. A file that is not ELF is not: the loader stops
// at it, and fails.
func builtForAnotherMachine(path string) bool {
	f, err := elf.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	class := elf.ELFCLASS32
	if strconv.IntSize == 64 {
		class = elf.ELFCLASS64
	}
	machine, known := elfMachine(goruntime.GOARCH)
	return f.Class != class || (known && f.Machine != machine)
}

// elfMachine is the ELF machine of the GOARCH architectures CUDA and NCCL
// ship for, and of a few more.
func elfMachine(goarch string) (elf.Machine, bool) {
	switch goarch {
	case "amd64":
		return elf.EM_X86_64, true
	case "arm64":
		return elf.EM_AARCH64, true
	case "ppc64le", "ppc64":
		return elf.EM_PPC64, true
	case "386":
		return elf.EM_386, true
	case "arm":
		return elf.EM_ARM, true
	case "riscv64":
		return elf.EM_RISCV, true
	case "s390x":
		return elf.EM_S390, true
	}
	return 0, false
}

// ldconfigTimeout bounds ldconfig -p, which only reads the cache file.
const ldconfigTimeout = 5 * time.Second

func (s Search) readLoaderCache(ctx context.Context) (map[string][]string, error) {
	if s.loaderCache != nil {
		return s.loaderCache(ctx)
	}
	return ldconfigCache(ctx)
}

// ldconfigCache maps each soname in the dynamic loader's cache to the
// files it names, as ldconfig -p lists them.
func ldconfigCache(ctx context.Context) (map[string][]string, error) {
	ldconfig, err := findLdconfig()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, ldconfigTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, ldconfig, "-p").Output()
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w after %v", ctx.Err(), ldconfigTimeout)
		}
		return nil, fmt.Errorf("reading the dynamic loader's cache with %s -p: %w", ldconfig, err)
	}
	return parseLoaderCache(out), nil
}

// findLdconfig looks for ldconfig on PATH, then in the sbin folders a
// user's PATH often lacks.
func findLdconfig() (string, error) {
	for _, name := range []string{"ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"} {
		if path, err := exec.LookPath(name); err == nil {
			return path, nil
		}
	}
	return "", errors.New("reading the dynamic loader's cache: no ldconfig on PATH, in /sbin or in /usr/sbin")
}

// parseLoaderCache reads ldconfig -p's lines, such as
// "\tlibnccl.so.2 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libnccl.so.2".
func parseLoaderCache(out []byte) map[string][]string {
	cache := map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		entry, path, ok := strings.Cut(sc.Text(), " => ")
		if !ok {
			continue
		}
		soname, _, _ := strings.Cut(strings.TrimSpace(entry), " ")
		cache[soname] = append(cache[soname], strings.TrimSpace(path))
	}
	return cache
}
