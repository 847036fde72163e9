// Package torch2test gives tests a Debian 13 (trixie) root with Debian's
// python3-torch 2.6, so that torch 2.x runs beside the machine's own torch
// 1.13: Ensure builds the root once with debootstrap, caches it at a fixed
// path, and mounts what a worker in it needs. Processes chrooted into it
// share the network, so a torch 2.6 worker reaches a gorun store on
// loopback, and gorun on the host starts them with
//
//	gorun --no-python chroot DIR python3 -u script.py
//
// It is used only by tests, and by CI to build the root before they run.
package torch2test

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testenv"
)

// DefaultDir is where the root is cached between runs (about 1.5 GB).
const DefaultDir = "/var/cache/gorun-torch2"

// Package is the Debian package that builds the root.
const Package = "debootstrap"

// ErrUnavailable means that no root can be built or entered here: that
// needs root and debootstrap.
var ErrUnavailable = errors.New("torch2test: a torch 2.6 root needs root and debootstrap (apt-get install " + Package + ")")

// Options say where the root is and what it shares with the host.
type Options struct {
	// Dir is the root (DefaultDir when empty).
	Dir string
	// Share are host folders that must be seen in the root at the same
	// path, such as the tests' temporary folder. /tmp, /dev and /sys
	// always are, as /proc (the root's own).
	Share []string
	// Log receives debootstrap's output while the root is built.
	Log io.Writer
	// Python, when set, is a python3 with torch 2.x to run as it is
	// instead of a root's, such as a GPU machine's, whose TCPStore has
	// libuv: then nothing is built or mounted.
	Python string
}

// Root is a working torch 2.6 root, or the python3 of Options.Python.
type Root struct {
	Dir    string
	python string // Options.Python; empty for the root's own
}

// Python returns the command line that runs the root's python3 with args.
func (r *Root) Python(args ...string) []string {
	if r.python != "" {
		return append([]string{r.python}, args...)
	}
	return append([]string{"chroot", r.Dir, "python3"}, args...)
}

// Torchrun returns the command line that runs torch 2.6's torchrun with
// args, through the torchrun.py that WriteSupport wrote into support.
func (r *Root) Torchrun(support string, args ...string) []string {
	return r.Python(append([]string{filepath.Join(support, "torchrun.py")}, args...)...)
}

// binds are the host folders every root shares, beside its own /proc.
var binds = []string{"/sys", "/dev", "/tmp"}

// lockPoll is how often Ensure looks whether another build is done.
const lockPoll = 200 * time.Millisecond

// Ensure returns the root of opts, building it if it lacks a python3 that
// imports torch, and mounting /proc, /sys, /dev, /tmp and opts.Share into
// it. A file lock beside the root keeps two test binaries from building or
// mounting it at once. Without root or debootstrap it returns an error
// that wraps ErrUnavailable.
func Ensure(ctx context.Context, opts Options) (*Root, error) {
	if opts.Python != "" {
		r := &Root{python: opts.Python}
		return r, r.importsTorch(ctx)
	}
	if opts.Dir == "" {
		opts.Dir = DefaultDir
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("torch2test: %w", err)
	}
	if os.Getuid() != 0 {
		return nil, fmt.Errorf("%w: not running as root", ErrUnavailable)
	}
	if _, err := exec.LookPath("chroot"); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	unlock, err := lock(ctx, dir+".lock")
	if err != nil {
		return nil, err
	}
	defer unlock()

	r := &Root{Dir: dir}
	if _, err := os.Stat(filepath.Join(dir, "usr", "bin", "python3")); err == nil {
		if err := r.mount(opts.Share); err != nil {
			return nil, err
		}
		if r.importsTorch(ctx) == nil {
			return r, r.writeHosts()
		}
	}
	if err := build(ctx, dir, opts.Log); err != nil {
		return nil, err
	}
	if err := r.mount(opts.Share); err != nil {
		return nil, err
	}
	if err := r.importsTorch(ctx); err != nil {
		return nil, fmt.Errorf("torch2test: the new root at %s: %w", dir, err)
	}
	return r, r.writeHosts()
}

// Require is Ensure for a test, bounded by ten minutes. Where no root can
// be had here (no root, no chroot, no debootstrap) the test is skipped
// naming the package to install, or fails under CI=true, where every
// component must be present (testenv's rule).
func Require(tb testing.TB, opts Options) *Root {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	r, err := Ensure(ctx, opts)
	if errors.Is(err, ErrUnavailable) {
		testenv.MustHave(tb, err, "a torch 2.6 root", Package)
	}
	if err != nil {
		tb.Fatal(err)
	}
	return r
}

// importsTorch runs the root's python3 -c 'import torch'.
func (r *Root) importsTorch(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	argv := r.Python("-c", "import torch.distributed")
	out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("torch2test: %s cannot import torch: %w: %s", strings.Join(argv[:len(argv)-2], " "), err, lastLine(out))
	}
	return nil
}

// build debootstraps a new root beside dir and moves it into place, so
// that a build stopped halfway leaves nothing that looks like a root.
func build(ctx context.Context, dir string, log io.Writer) error {
	if _, err := exec.LookPath("debootstrap"); err != nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if log == nil {
		log = io.Discard
	}
	staging := dir + ".build"
	if err := remove(staging); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return fmt.Errorf("torch2test: %w", err)
	}
	cmd := exec.CommandContext(ctx, "debootstrap", "--variant=minbase", "--include=python3-torch", "trixie", staging)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("torch2test: debootstrap trixie %s: %w", staging, err)
	}
	// debootstrap mounts into its target while it installs.
	if err := unmountUnder(staging); err != nil {
		return err
	}
	if err := remove(dir); err != nil {
		return err
	}
	if err := os.Rename(staging, dir); err != nil {
		return fmt.Errorf("torch2test: %w", err)
	}
	return nil
}

// remove deletes dir once nothing is mounted under it: removing a root
// with the host's /tmp bound into it would empty the host's /tmp.
func remove(dir string) error {
	if err := unmountUnder(dir); err != nil {
		return err
	}
	if left, err := mountsUnder(dir); err != nil || len(left) > 0 {
		return fmt.Errorf("torch2test: will not remove %s: still mounted under it: %v %v", dir, left, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("torch2test: %w", err)
	}
	return nil
}

// mount mounts the root's /proc and binds the shared folders, each at most
// once.
func (r *Root) mount(share []string) error {
	mounted, err := mountsUnder(r.Dir)
	if err != nil {
		return err
	}
	is := map[string]bool{}
	for _, m := range mounted {
		is[m] = true
	}
	if p := filepath.Join(r.Dir, "proc"); !is[p] {
		if err := syscall.Mount("proc", p, "proc", 0, ""); err != nil {
			return fmt.Errorf("torch2test: mount proc on %s: %w", p, err)
		}
	}
	for _, src := range bindsFor(share) {
		dst := filepath.Join(r.Dir, src)
		if is[dst] {
			continue
		}
		if err := os.MkdirAll(dst, 0o755); err != nil {
			return fmt.Errorf("torch2test: %w", err)
		}
		if err := syscall.Mount(src, dst, "", syscall.MS_BIND, ""); err != nil {
			return fmt.Errorf("torch2test: bind %s on %s: %w", src, dst, err)
		}
	}
	return nil
}

// bindsFor returns the host folders to bind: the fixed ones and those of
// share that no other bind already shows.
func bindsFor(share []string) []string {
	all := append([]string(nil), binds...)
	for _, s := range share {
		s = filepath.Clean(s)
		if !under(s, all) {
			all = append(all, s)
		}
	}
	return all
}

// under reports whether path is one of dirs or inside one.
func under(path string, dirs []string) bool {
	for _, d := range dirs {
		if path == d || strings.HasPrefix(path, strings.TrimSuffix(d, "/")+"/") {
			return true
		}
	}
	return false
}

// unmountUnder detaches every mount at or under dir, deepest first.
func unmountUnder(dir string) error {
	mounts, err := mountsUnder(dir)
	if err != nil {
		return err
	}
	for _, m := range mounts {
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			return fmt.Errorf("torch2test: unmount %s: %w", m, err)
		}
	}
	return nil
}

// mountsUnder lists the mount points at or under dir, deepest first.
func mountsUnder(dir string) ([]string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("torch2test: %w", err)
	}
	var out []string
	for _, m := range mountPoints(b) {
		if under(m, []string{dir}) {
			out = append(out, m)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out, nil
}

// mountPoints reads the mount points of a mountinfo file (proc(5)): the
// fifth field, with space, tab, newline and backslash escaped in octal.
func mountPoints(mountinfo []byte) []string {
	var out []string
	for _, line := range strings.Split(string(mountinfo), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		out = append(out, unescapeOctal(f[4]))
	}
	return out
}

func unescapeOctal(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && isOctal(s[i+1]) && isOctal(s[i+2]) && isOctal(s[i+3]) {
			b.WriteByte((s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0'))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }

// writeHosts gives the root the host's /etc/hosts with the host's name in
// it: c10d resolves this machine's hostname, and warns forever if it
// cannot.
func (r *Root) writeHosts() error {
	hosts, err := os.ReadFile("/etc/hosts")
	if err != nil {
		return fmt.Errorf("torch2test: %w", err)
	}
	name, err := os.Hostname()
	if err != nil {
		return fmt.Errorf("torch2test: %w", err)
	}
	want := withHostname(hosts, name)
	path := filepath.Join(r.Dir, "etc", "hosts")
	if have, err := os.ReadFile(path); err == nil && bytes.Equal(have, want) {
		return nil
	}
	if err := os.WriteFile(path, want, 0o644); err != nil {
		return fmt.Errorf("torch2test: %w", err)
	}
	return nil
}

// withHostname returns hosts with a loopback line for name unless some
// line already names it.
func withHostname(hosts []byte, name string) []byte {
	for _, line := range strings.Split(string(hosts), "\n") {
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		for _, n := range f[min(1, len(f)):] {
			if n == name {
				return hosts
			}
		}
	}
	out := append([]byte(nil), hosts...)
	if len(out) > 0 && out[len(out)-1] != '\n' {
		out = append(out, '\n')
	}
	return append(out, "127.0.0.1 "+name+"\n"...)
}

// lock takes an exclusive flock on path, polling until ctx ends.
func lock(ctx context.Context, path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("torch2test: %w", err)
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("torch2test: lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("torch2test: waiting for %s: %w", path, ctx.Err())
		case <-time.After(lockPoll):
		}
	}
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}

//go:embed python/*.py
var support embed.FS

// WriteSupport writes into dir the Python files that let torch 2.6 run
// without libuv (see python/nolibuv.py): sitecustomize.py, which applies
// the default in every Python process whose PYTHONPATH names dir
// (SupportEnv), and torchrun.py, torchrun with the default (Torchrun). dir
// must be seen in the root: under /tmp or in Options.Share.
func WriteSupport(dir string) error {
	return fs.WalkDir(support, "python", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := support.ReadFile(path)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, d.Name()), b, 0o644); err != nil {
			return fmt.Errorf("torch2test: %w", err)
		}
		return nil
	})
}

// SupportEnv is the environment variable that makes Python processes in
// the root load dir's sitecustomize.py.
func SupportEnv(dir string) string { return "PYTHONPATH=" + dir }
