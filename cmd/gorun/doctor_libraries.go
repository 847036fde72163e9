package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"time"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/gorun/gorun/cuda/nvml"
)

// sharedLibrary is a library the NCCL backend loads at run time, and how
// the doctor finds it and reads its version.
type sharedLibrary struct {
	title   string
	soname  string
	envVar  string // names the file to load instead of searching
	version string // int fn(int *version), 0 on success
	format  func(int) string
	// pythonDirs are where NVIDIA's wheels put it under site-packages
	// (the CUDA driver normally comes with the kernel driver instead).
	pythonDirs []string
	// install says how to get it, for when none is found.
	install string
}

var runtimeLibraries = []sharedLibrary{
	{
		title: "NCCL", soname: "libnccl.so.2", envVar: "GORUN_NCCL_LIBRARY",
		version: "ncclGetVersion", format: ncclVersion, pythonDirs: []string{"nvidia/nccl/lib"},
		install: "install NCCL (package libnccl2, or pip's nvidia-nccl-cu12) or name the file in GORUN_NCCL_LIBRARY",
	},
	{
		title: "CUDA driver", soname: "libcuda.so.1", envVar: "GORUN_CUDA_LIBRARY",
		version: "cuDriverGetVersion", format: nvml.CUDAVersion, pythonDirs: []string{"nvidia/cu13/lib", "nvidia/cuda_runtime/lib"},
		install: "it comes with the NVIDIA driver; name the file in GORUN_CUDA_LIBRARY if it is elsewhere",
	},
}

// ncclVersion decodes NCCL_VERSION_CODE: 10000*major + 100*minor + patch
// since 2.9, 1000*major + 100*minor + patch before.
func ncclVersion(code int) string {
	if code >= 10000 {
		return fmt.Sprintf("%d.%d.%d", code/10000, code%10000/100, code%100)
	}
	return fmt.Sprintf("%d.%d.%d", code/1000, code%1000/100, code%100)
}

// libraryCandidate is one file considered for a library.
type libraryCandidate struct {
	source string // how it was found: the variable, LD_LIBRARY_PATH, ldconfig, python3
	path   string
	status string // "not found", the version, or why it cannot be loaded
}

// doctorLibraries reports every NCCL and CUDA driver library found, in the
// order a loader would meet them: the GORUN_* variable, LD_LIBRARY_PATH,
// the ldconfig cache, then Python's site-packages (pip's nvidia-nccl wheel).
func doctorLibraries(ctx context.Context, r *report, lookupEnv func(string) (string, bool), python string) {
	r.section("NCCL and CUDA libraries")
	ldcache, ldErr := ldconfigCache(ctx)
	sitePackages, pyErr := pythonSitePackages(ctx, python)
	for _, lib := range runtimeLibraries {
		r.line("%s (%s):", lib.title, lib.soname)
		found := lib.candidates(lookupEnv, ldcache, sitePackages)
		t := r.table()
		for _, c := range found {
			fmt.Fprintf(t, "  %s\t%s\t%s\n", c.source, c.path, c.status)
		}
		t.Flush()
		if len(found) == 0 {
			r.line("  none found: %s", lib.install)
		}
		r.line("  searched $%s, LD_LIBRARY_PATH, the ldconfig cache, %s's site-packages/{%s}", lib.envVar, python, strings.Join(lib.pythonDirs, ","))
	}
	if ldErr != nil {
		r.line("ldconfig cache unread: %v", ldErr)
	}
	if pyErr != nil {
		r.line("%s's site-packages unknown: %v", python, pyErr)
	}
	var nccl []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "NCCL_") || strings.HasPrefix(kv, "GORUN_NCCL_") || strings.HasPrefix(kv, "GORUN_CUDA_") {
			nccl = append(nccl, kv)
		}
	}
	slices.Sort(nccl)
	if len(nccl) == 0 {
		r.line("NCCL environment: none set")
	} else {
		r.line("NCCL environment: %s", strings.Join(nccl, " "))
	}
}

// candidates lists the files that may provide lib, each with its version
// or the reason it cannot be used. The file $envVar names is listed even
// when missing, since the user asked for it; other places only when they
// hold the library.
func (lib sharedLibrary) candidates(lookupEnv func(string) (string, bool), ldcache map[string][]string, sitePackages []string) []libraryCandidate {
	var out []libraryCandidate
	seen := map[string]bool{}
	add := func(source, path string, listMissing bool) {
		real, err := filepath.EvalSymlinks(path)
		if err != nil {
			if listMissing {
				out = append(out, libraryCandidate{source, path, "not found"})
			}
			return
		}
		if seen[real] {
			return
		}
		seen[real] = true
		out = append(out, libraryCandidate{source, path, lib.readVersion(path)})
	}
	if path, ok := lookupEnv(lib.envVar); ok && path != "" {
		add(lib.envVar, path, true)
	}
	if dirs, ok := lookupEnv("LD_LIBRARY_PATH"); ok {
		for _, dir := range filepath.SplitList(dirs) {
			if dir != "" {
				add("LD_LIBRARY_PATH", filepath.Join(dir, lib.soname), false)
			}
		}
	}
	for _, path := range ldcache[lib.soname] {
		add("ldconfig", path, false)
	}
	for _, dir := range sitePackages {
		for _, sub := range lib.pythonDirs {
			add("python", filepath.Join(dir, sub, lib.soname), false)
		}
	}
	return out
}

// readVersion loads the file and asks it its version. Loading runs the
// library's initialisers in this process, which for NCCL and the CUDA
// driver only set up their own state.
func (lib sharedLibrary) readVersion(path string) string {
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return fmt.Sprintf("cannot load: %v", err)
	}
	defer purego.Dlclose(h)
	fn, err := purego.Dlsym(h, lib.version)
	if err != nil {
		return fmt.Sprintf("not %s: no %s", lib.title, lib.version)
	}
	// On the heap, where it does not move while C writes to it.
	version := new(int32)
	ret, _, _ := purego.SyscallN(fn, uintptr(unsafe.Pointer(version)))
	goruntime.KeepAlive(version)
	if int32(ret) != 0 {
		return fmt.Sprintf("%s failed with error %d", lib.version, int32(ret))
	}
	return fmt.Sprintf("%s %s", lib.title, lib.format(int(*version)))
}

// ldconfigCache maps each soname in the dynamic loader's cache to the
// files it names (ldconfig -p).
func ldconfigCache(ctx context.Context) (map[string][]string, error) {
	ldconfig, err := exec.LookPath("ldconfig")
	if err != nil {
		// Often in sbin, which a user's PATH may lack.
		for _, dir := range []string{"/sbin", "/usr/sbin"} {
			if _, serr := os.Stat(filepath.Join(dir, "ldconfig")); serr == nil {
				ldconfig, err = filepath.Join(dir, "ldconfig"), nil
				break
			}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("ldconfig not found: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, ldconfig, "-p").Output()
	if err != nil {
		return nil, fmt.Errorf("%s -p: %w", ldconfig, err)
	}
	// Lines read "\tlibnccl.so.2 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libnccl.so.2".
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
	return cache, nil
}

// pythonSitePackages asks python for its site-packages folders, where pip
// installs the nvidia-nccl wheel that PyTorch uses.
func pythonSitePackages(ctx context.Context, python string) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	const script = "import site; print('\\n'.join(site.getsitepackages() + [site.getusersitepackages()]))"
	out, err := exec.CommandContext(ctx, python, "-c", script).Output()
	if err != nil {
		return nil, fmt.Errorf("%s -c 'import site...': %w", python, err)
	}
	var dirs []string
	for _, line := range strings.Split(string(out), "\n") {
		if dir := strings.TrimSpace(line); dir != "" {
			dirs = append(dirs, dir)
		}
	}
	return dirs, nil
}
