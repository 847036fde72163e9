package launcher

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// errNoCgroup says why this process may not hold its workers in a cgroup of
// its own; Contain then falls back to the subreaper.
var errNoCgroup = errors.New("launcher: no cgroup v2 of our own")

// cgroupPoll is how often a killed cgroup is checked for being empty.
const cgroupPoll = 5 * time.Millisecond

// createJobCgroup creates the job's cgroup under this process's own cgroup
// v2 and returns its directory. It fails, wrapping errNoCgroup, where the
// kernel cannot start a process inside a cgroup (clone3's
// CLONE_INTO_CGROUP, Linux 5.7), there is no cgroup2 mount, or this process
// may not create or move processes into a child of its cgroup (neither root
// nor the owner of a delegated subtree).
//
// A child of our own cgroup needs no controller: cgroup.procs and
// cgroup.kill work in any cgroup, and with no controller enabled the parent
// may keep the agent as a member while its children hold the workers.
func createJobCgroup() (string, error) {
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return "", fmt.Errorf("%w: uname: %v", errNoCgroup, err)
	}
	if release := unix.ByteSliceToString(uts.Release[:]); !kernelAtLeast(release, 5, 7) {
		return "", fmt.Errorf("%w: Linux %s cannot start a process inside a cgroup (5.7 can)", errNoCgroup, release)
	}
	mountinfo, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", fmt.Errorf("%w: %v", errNoCgroup, err)
	}
	membership, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", fmt.Errorf("%w: %v", errNoCgroup, err)
	}
	parent, err := ownCgroupDir(string(mountinfo), string(membership))
	if err != nil {
		return "", fmt.Errorf("%w: %v", errNoCgroup, err)
	}
	// The kernel lets a process start a child in, or move one to, a cgroup
	// when it may write cgroup.procs of the common ancestor: here our own.
	if err := unix.Faccessat(unix.AT_FDCWD, filepath.Join(parent, "cgroup.procs"), unix.W_OK, unix.AT_EACCESS); err != nil {
		return "", fmt.Errorf("%w: %s: %v", errNoCgroup, parent, err)
	}
	var nonce [4]byte
	rand.Read(nonce[:])
	dir := filepath.Join(parent, fmt.Sprintf("gorun-%d-%s", os.Getpid(), hex.EncodeToString(nonce[:])))
	if err := unix.Mkdir(dir, 0o755); err != nil {
		return "", fmt.Errorf("%w: %s: %v", errNoCgroup, dir, err)
	}
	// A parent that is a threaded cgroup gives us a threaded child, which
	// can hold threads but not processes of their own.
	if kind, err := os.ReadFile(filepath.Join(dir, "cgroup.type")); err != nil || strings.TrimSpace(string(kind)) != "domain" {
		unix.Rmdir(dir)
		return "", fmt.Errorf("%w: %s is not a domain cgroup (%q, %v)", errNoCgroup, dir, bytes.TrimSpace(kind), err)
	}
	if err := probeCgroup(dir); err != nil {
		unix.Rmdir(dir)
		return "", fmt.Errorf("%w: start a process in %s: %v", errNoCgroup, dir, err)
	}
	return dir, nil
}

// probeCgroup starts, inside the cgroup at dir, a program that does not
// exist. The clone into the cgroup is what may fail (a kernel or a cgroup
// that refuses it); an exec that then finds nothing proves it worked, and
// nothing runs.
func probeCgroup(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	missing := filepath.Join(dir, "gorun-probe")
	pid, err := syscall.ForkExec(missing, []string{missing}, &syscall.ProcAttr{
		Sys: &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd},
	})
	if err == nil { // cannot be: cgroupfs holds no such file
		syscall.Kill(pid, syscall.SIGKILL)
		syscall.Wait4(pid, nil, 0, nil)
		return fmt.Errorf("%s exists", missing)
	}
	if errors.Is(err, syscall.ENOENT) {
		return nil
	}
	return err
}

// ownCgroupDir returns the directory of this process's cgroup v2, given
// /proc/self/mountinfo and /proc/self/cgroup.
func ownCgroupDir(mountinfo, membership string) (string, error) {
	path, ok := "", false
	for line := range strings.Lines(membership) {
		if rest, found := strings.CutPrefix(strings.TrimRight(line, "\n"), "0::"); found {
			path, ok = rest, true
		}
	}
	if !ok {
		return "", errors.New("not in a cgroup v2 hierarchy")
	}
	// A cgroup outside our cgroup namespace shows as "/../...".
	if !strings.HasPrefix(path, "/") || path == "/.." || strings.HasPrefix(path, "/../") {
		return "", fmt.Errorf("own cgroup %q is outside this cgroup namespace", path)
	}
	for line := range strings.Lines(mountinfo) {
		// id parent major:minor root mountpoint options [optional...] - fstype source superoptions
		pre, post, found := strings.Cut(strings.TrimRight(line, "\n"), " - ")
		fields, after := strings.Fields(pre), strings.Fields(post)
		if !found || len(fields) < 5 || len(after) < 1 || after[0] != "cgroup2" {
			continue
		}
		root, mountpoint := unescapeMountinfo(fields[3]), unescapeMountinfo(fields[4])
		rel, inside := strings.CutPrefix(path, root)
		if root == "/" {
			rel, inside = path, true
		} else if inside && rel != "" && !strings.HasPrefix(rel, "/") {
			inside = false // root /a is no prefix of /ab
		}
		if inside {
			return filepath.Join(mountpoint, rel), nil
		}
	}
	return "", errors.New("no cgroup2 mount shows our cgroup")
}

// unescapeMountinfo undoes the octal escapes (\040 for a space) that
// mountinfo uses in paths.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// kernelAtLeast reports whether a kernel release such as "6.1.0-18-amd64"
// is major.minor or later; an unreadable release is not.
func kernelAtLeast(release string, major, minor int) bool {
	parts := strings.SplitN(release, ".", 3)
	if len(parts) < 2 {
		return false
	}
	maj, err1 := strconv.Atoi(parts[0])
	digits := strings.IndexFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' })
	if digits < 0 {
		digits = len(parts[1])
	}
	min, err2 := strconv.Atoi(parts[1][:digits])
	if err1 != nil || err2 != nil {
		return false
	}
	return maj > major || maj == major && min >= minor
}

// killCgroup SIGKILLs every process in the cgroup at dir and in the cgroups
// below it, and waits up to wait for them all to have exited. cgroup.kill
// (Linux 5.14) does it atomically, catching even a process forked while it
// runs; without it, the members are signalled until none is left.
// A cgroup that no longer exists is empty.
func killCgroup(dir string, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	err := os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0)
	atomic := err == nil
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if !fileExists(dir) {
			return nil
		}
		// An older kernel: the cgroup is there, cgroup.kill is not.
	case err != nil:
		return fmt.Errorf("launcher: kill cgroup %s: %w", dir, err)
	}
	for {
		populated, err := cgroupPopulated(dir)
		if err != nil || !populated {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("launcher: cgroup %s still holds processes %v after SIGKILL", dir, cgroupPids(dir))
		}
		if !atomic {
			// What forks between the read and the kill is found next time.
			for _, pid := range cgroupPids(dir) {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		time.Sleep(cgroupPoll)
	}
}

// cgroupPopulated reports whether any process is left in dir or below it.
func cgroupPopulated(dir string) (bool, error) {
	events, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("launcher: cgroup %s: %w", dir, err)
	}
	for line := range strings.Lines(string(events)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "populated "); ok {
			return v != "0", nil
		}
	}
	return false, fmt.Errorf("launcher: cgroup %s: no populated line in cgroup.events", dir)
}

// cgroupPids lists the processes in dir and in every cgroup below it.
func cgroupPids(dir string) []int {
	var pids []int
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		f, err := os.Open(filepath.Join(path, "cgroup.procs"))
		if err != nil {
			return nil
		}
		defer f.Close()
		scanner := bufio.NewScanner(f)
		for scanner.Scan() {
			if pid, err := strconv.Atoi(scanner.Text()); err == nil {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	return pids
}

// removeCgroup removes the cgroup at dir and every cgroup below it, deepest
// first (a cgroup with children cannot be removed); its members must be
// gone. A cgroup's directory holds only interface files, which rmdir
// takes along.
func removeCgroup(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("launcher: remove cgroup: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if e.IsDir() {
			errs = append(errs, removeCgroup(filepath.Join(dir, e.Name())))
		}
	}
	if err := unix.Rmdir(dir); err != nil && !errors.Is(err, unix.ENOENT) {
		errs = append(errs, fmt.Errorf("launcher: remove cgroup %s: %w", dir, err))
	}
	return errors.Join(errs...)
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
