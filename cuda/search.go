package cuda

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Search says where LoadDriver and LoadNCCL look for their library, in
// this order:
//
//  1. the file named by the library's environment variable
//     (GORUN_CUDA_LIBRARY, GORUN_NCCL_LIBRARY), read through LookupEnv,
//     and, when it is set, nowhere else: an explicit choice is never
//     silently replaced;
//  2. the library's soname (libcuda.so.1, libnccl.so.2) on the dynamic
//     loader's search path: LD_LIBRARY_PATH, the ldconfig cache, ...;
//  3. the folders NVIDIA's Python wheels install it into, under every
//     site-packages folder of Python (the python3 on PATH unless Python
//     names another; nvidia/nccl/lib for nvidia-nccl-cu12/cu13).
//
// The first file that loads and passes the library's checks (symbols,
// version) wins; when none does, the error lists every attempt.
// Candidates lists every file the search may meet and Probe says whether
// it would take one, for reports such as gorun doctor's.
type Search struct {
	// LookupEnv reads the environment: the variables above and
	// LD_LIBRARY_PATH (for Candidates). The package reads none itself; nil
	// reads none at all. Programs pass the os package's LookupEnv, as
	// gorun doctor does; runtime.Init passes its own lookup.
	LookupEnv func(key string) (string, bool)
	// SitePackages lists Python's site-packages folders; nil asks Python,
	// allowing it pythonTimeout.
	SitePackages func(ctx context.Context) ([]string, error)
	// Python is the interpreter asked for its site-packages when
	// SitePackages is nil: a command on PATH or a file; empty means python3.
	Python string

	// dlopen loads a library (tests stand in for the dynamic loader).
	dlopen func(name string) (uintptr, error)
	// loaderCache maps each soname in the dynamic loader's cache to its
	// files; nil runs ldconfig -p (tests stand in for the cache).
	loaderCache func(ctx context.Context) (map[string][]string, error)
}

// librarySpec describes one of the libraries we load.
type librarySpec struct {
	soname    string   // what the dynamic loader is asked for
	envVar    string   // names a file that overrides the search
	wheelDirs []string // where NVIDIA's wheels put it, under site-packages
	// probe reads the version of the library loaded as h and says whether
	// the search would take it.
	probe func(h uintptr) (Version, error)
}

var (
	cudaLibrary = librarySpec{
		soname: string(DriverLibrary),
		envVar: "GORUN_CUDA_LIBRARY",
		// The driver library normally comes with the kernel driver, not a
		// wheel; these are where the CUDA wheels put their libraries.
		wheelDirs: []string{"nvidia/cu13/lib", "nvidia/cuda_runtime/lib"},
		probe:     probeDriver,
	}
	ncclLibrary = librarySpec{
		soname:    string(NCCLLibrary),
		envVar:    "GORUN_NCCL_LIBRARY",
		wheelDirs: []string{"nvidia/nccl/lib"},
		probe:     probeNCCL,
	}
)

// Where an attempt's candidate came from, besides an environment variable.
const (
	fromLoader       = "dynamic loader"
	fromSitePackages = "python3 site-packages"
)

// An Attempt is one place a library was looked for and why it was not used.
type Attempt struct {
	Path string // the file or bare soname given to the dynamic loader; empty if none was reached
	From string // the environment variable, "dynamic loader" or "python3 site-packages"
	Err  error  // the loader's error, a *SymbolsError, a *VersionError, ...
}

func (a Attempt) String() string {
	if a.Path == "" {
		return fmt.Sprintf("%s: %v", a.From, a.Err)
	}
	return fmt.Sprintf("%s (%s): %v", a.Path, a.From, a.Err)
}

// LoadError says that no usable copy of a library was found, and lists
// everything tried. It unwraps to each attempt's error, so errors.As finds
// a *VersionError or *SymbolsError among them.
type LoadError struct {
	Library string // the soname
	EnvVar  string // the variable that names the file to use
	Tried   []Attempt
}

func (e *LoadError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "cuda: no usable %s (set %s to its path)", e.Library, e.EnvVar)
	// Files that do not exist are many and say nothing more: name them,
	// by where they were looked for.
	var places []string
	absent := map[string][]string{}
	for _, a := range e.Tried {
		if a.Path == "" || !notFound(a.Err) {
			b.WriteString("; " + a.String())
			continue
		}
		if absent[a.From] == nil {
			places = append(places, a.From)
		}
		absent[a.From] = append(absent[a.From], a.Path)
	}
	for _, from := range places {
		fmt.Fprintf(&b, "; not found (%s): %s", from, strings.Join(absent[from], ", "))
	}
	return b.String()
}

// notFound reports whether err says the file does not exist, as dlopen
// says it (in words) or the file system does.
func notFound(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || strings.HasSuffix(err.Error(), "No such file or directory")
}

func (e *LoadError) Unwrap() []error {
	errs := make([]error, len(e.Tried))
	for i, a := range e.Tried {
		errs[i] = a.Err
	}
	return errs
}

// SymbolsError says a library lacks functions we require.
type SymbolsError struct {
	Missing []string
	Need    string // what would have them, e.g. "NCCL 2.7 or newer"
}

func (e *SymbolsError) Error() string {
	return fmt.Sprintf("missing %s (need %s)", strings.Join(e.Missing, ", "), e.Need)
}

// load opens the first candidate for lib that check accepts, and returns
// its handle and path. check gets the open handle and must leave it open
// only when it returns nil.
func (s Search) load(ctx context.Context, lib librarySpec, check func(h uintptr) error) (uintptr, string, error) {
	lookupEnv, open := s.lookupEnv(), s.open()
	fail := &LoadError{Library: lib.soname, EnvVar: lib.envVar}
	try := func(path, from string) (uintptr, bool) {
		h, err := open(path)
		if err == nil {
			if err = check(h); err != nil {
				dlclose(h)
			}
		}
		if err != nil {
			fail.Tried = append(fail.Tried, Attempt{Path: path, From: from, Err: err})
			return 0, false
		}
		return h, true
	}

	if path, ok := lookupEnv(lib.envVar); ok && path != "" {
		if h, ok := try(path, lib.envVar); ok {
			return h, path, nil
		}
		return 0, "", fail
	}
	if h, ok := try(lib.soname, fromLoader); ok {
		return h, lib.soname, nil
	}
	dirs, err := s.sitePackages(ctx)
	if err != nil {
		fail.Tried = append(fail.Tried, Attempt{From: fromSitePackages, Err: err})
	}
	for _, dir := range dirs {
		for _, sub := range lib.wheelDirs {
			path := filepath.Join(dir, filepath.FromSlash(sub), lib.soname)
			if h, ok := try(path, fromSitePackages); ok {
				return h, path, nil
			}
		}
	}
	return 0, "", fail
}

func (s Search) lookupEnv() func(string) (string, bool) {
	if s.LookupEnv == nil {
		return func(string) (string, bool) { return "", false }
	}
	return s.LookupEnv
}

func (s Search) open() func(string) (uintptr, error) {
	if s.dlopen == nil {
		return dlopen
	}
	return s.dlopen
}

// sitePackages lists the folders under which the wheels' folders are
// searched.
func (s Search) sitePackages(ctx context.Context) ([]string, error) {
	if s.SitePackages != nil {
		return s.SitePackages(ctx)
	}
	return sitePackagesOf(ctx, cmp.Or(s.Python, "python3"))
}

// pythonTimeout bounds the python3 that lists site-packages: it starts in
// tens of milliseconds, and a worker must not hang on a broken one.
const pythonTimeout = 5 * time.Second

// sitePackagesScript prints one folder per line: the interpreter's and the
// user's site-packages, and any on sys.path (a virtualenv's, PYTHONPATH's).
const sitePackagesScript = `import site, sys
dirs = list(getattr(site, "getsitepackages", lambda: [])())
if getattr(site, "ENABLE_USER_SITE", False):
    dirs.append(site.getusersitepackages())
dirs += [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
print("\n".join(dirs))`

// sitePackagesOf runs python, a command name or path, and returns the
// absolute folders it lists, each once, in its order.
func sitePackagesOf(ctx context.Context, python string) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, pythonTimeout)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, python, "-c", sitePackagesScript)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w after %v", ctx.Err(), pythonTimeout)
		}
		if msg := strings.TrimSpace(stderr.String()); msg != "" {
			err = fmt.Errorf("%w: %s", err, lastLine(msg))
		}
		return nil, fmt.Errorf("listing site-packages with %s: %w", python, err)
	}
	var dirs []string
	seen := map[string]bool{}
	for line := range strings.Lines(string(out)) {
		dir := strings.TrimSpace(line)
		if filepath.IsAbs(dir) && !seen[dir] {
			seen[dir] = true
			dirs = append(dirs, dir)
		}
	}
	if len(dirs) == 0 {
		return nil, fmt.Errorf("%s lists no site-packages folder", python)
	}
	return dirs, nil
}

// lastLine is the last line of s: the exception of a Python traceback.
func lastLine(s string) string {
	return s[strings.LastIndexByte(s, '\n')+1:]
}
