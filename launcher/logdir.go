package launcher

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// LogDir is an open folder under which gorun makes, resets and removes
// the folders and files of a job's logs without ever following a
// symbolic link: every operation goes from the descriptor of a folder
// gorun holds open, one path component at a time, with O_NOFOLLOW, so
// that a link planted (or swapped in while gorun runs) at any component
// makes the operation fail instead of reaching outside. Folders below the
// root must belong to the user gorun runs as; gorun makes them 0700 and
// its files 0600, so that no other user can add, swap or read entries.
//
// This matters when gorun runs as root with a --log-dir other users can
// write to: a link at <log-dir>/<run-id>/attempt_0 would otherwise have
// root empty and write to a folder of the user's choosing.
type LogDir struct {
	path string
	fd   int
}

// ErrForeignOwner says a folder gorun was to write in belongs to another
// user.
var ErrForeignOwner = errors.New("launcher: folder belongs to another user")

// OpenLogDir makes the folder at path as the user named it (components
// that already exist are taken as they are, links included) and opens
// it. The folder must belong to the user gorun runs as or to root, and
// must not be open to everyone without the sticky bit: a user who can
// rename entries in it could swap the folders under it.
func OpenLogDir(path string) (*LogDir, error) {
	if err := os.MkdirAll(path, 0o700); err != nil {
		return nil, fmt.Errorf("launcher: log folder: %w", err)
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("launcher: open log folder %s: %w", path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("launcher: stat log folder %s: %w", path, err)
	}
	if err := checkRoot(st, os.Geteuid()); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("launcher: log folder %s: %w", path, err)
	}
	return &LogDir{path: path, fd: fd}, nil
}

// checkRoot accepts the root of a log tree: a folder of uid's or root's
// that other users cannot rename entries in.
func checkRoot(st unix.Stat_t, uid int) error {
	if int(st.Uid) != uid && st.Uid != 0 {
		return fmt.Errorf("%w (uid %d, gorun runs as uid %d)", ErrForeignOwner, st.Uid, uid)
	}
	if st.Mode&unix.S_IWOTH != 0 && st.Mode&unix.S_ISVTX == 0 {
		return errors.New("launcher: folder is writable by every user and not sticky")
	}
	return nil
}

// Path is the folder's path, as opened.
func (d *LogDir) Path() string { return d.path }

// Close closes the folder's descriptor.
func (d *LogDir) Close() error {
	if d == nil || d.fd < 0 {
		return nil
	}
	err := unix.Close(d.fd)
	d.fd = -1
	return err
}

// MkdirAll makes the folders of rel under d (mode 0700), or opens them
// where they exist, and returns the last one, open. rel is a relative
// path of plain names: no "..", no empty component.
func (d *LogDir) MkdirAll(rel string) (*LogDir, error) {
	names, err := components(rel)
	if err != nil {
		return nil, err
	}
	cur := d
	for _, name := range names {
		next, err := cur.mkdirOpen(name)
		if cur != d {
			cur.Close()
		}
		if err != nil {
			return nil, err
		}
		cur = next
	}
	if cur == d {
		return d.dup()
	}
	return cur, nil
}

// Reset empties the folder rel under d, making it and its parents as
// MkdirAll does, and returns it, open: torchrun wipes an attempt's folder
// it reuses. Whatever is at rel (a folder, a file, a link) is removed,
// without following links, and a new folder made in its place.
func (d *LogDir) Reset(rel string) (*LogDir, error) {
	parent, name, err := d.parentOf(rel)
	if err != nil {
		return nil, err
	}
	defer parent.Close()
	if err := parent.RemoveAll(name); err != nil {
		return nil, err
	}
	return parent.mkdirOpen(name)
}

// parentOf opens the folder holding rel's last component.
func (d *LogDir) parentOf(rel string) (*LogDir, string, error) {
	names, err := components(rel)
	if err != nil {
		return nil, "", err
	}
	if len(names) == 0 {
		return nil, "", fmt.Errorf("launcher: empty path under %s", d.path)
	}
	parent, err := d.MkdirAll(filepath.Join(names[:len(names)-1]...))
	if err != nil {
		return nil, "", err
	}
	return parent, names[len(names)-1], nil
}

// Create makes the file name in d (mode 0600) and opens it for writing.
// A file already there is removed first, never opened: it may be a link,
// hard or symbolic, to a file elsewhere.
func (d *LogDir) Create(name string) (*os.File, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	path := filepath.Join(d.path, name)
	if err := unix.Unlinkat(d.fd, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return nil, fmt.Errorf("launcher: replace %s: %w", path, err)
	}
	fd, err := unix.Openat(d.fd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("launcher: create %s: %w", path, err)
	}
	return os.NewFile(uintptr(fd), path), nil
}

// Mkfifo makes the named pipe name in d (mode 0600), replacing a named
// pipe already there; any other file there is refused rather than
// removed. It returns the pipe opened for reading and writing, pollable.
func (d *LogDir) Mkfifo(name string) (*os.File, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	path := filepath.Join(d.path, name)
	var st unix.Stat_t
	switch err := unix.Fstatat(d.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); {
	case err == nil && st.Mode&unix.S_IFMT != unix.S_IFIFO:
		return nil, fmt.Errorf("launcher: %s exists and is not a named pipe", path)
	case err == nil:
		if err := unix.Unlinkat(d.fd, name, 0); err != nil {
			return nil, fmt.Errorf("launcher: replace %s: %w", path, err)
		}
	case !errors.Is(err, unix.ENOENT):
		return nil, fmt.Errorf("launcher: stat %s: %w", path, err)
	}
	if err := unix.Mkfifoat(d.fd, name, 0o600); err != nil {
		return nil, fmt.Errorf("launcher: make %s: %w", path, err)
	}
	// Non-blocking, so that os.NewFile makes it pollable and closing it
	// ends a read in progress.
	fd, err := unix.Openat(d.fd, name, unix.O_RDWR|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Unlinkat(d.fd, name, 0)
		return nil, fmt.Errorf("launcher: open %s: %w", path, err)
	}
	return os.NewFile(uintptr(fd), path), nil
}

// Remove removes the file name from d (not a folder); a missing file is
// not an error.
func (d *LogDir) Remove(name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	if err := unix.Unlinkat(d.fd, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("launcher: remove %s: %w", filepath.Join(d.path, name), err)
	}
	return nil
}

// RemoveAll removes name from d and, when it is a folder, everything in
// it, going down by descriptors: a link anywhere in the tree is removed,
// not followed. A missing name is not an error.
func (d *LogDir) RemoveAll(name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	if err := removeAt(d.fd, name); err != nil {
		return fmt.Errorf("launcher: remove %s: %w", filepath.Join(d.path, name), err)
	}
	return nil
}

// RemoveTree removes the folder or file at path without following a link
// at its last component or anywhere below it.
func RemoveTree(path string) error {
	path = filepath.Clean(path)
	parent, name := filepath.Split(path)
	if err := checkName(name); err != nil {
		return err
	}
	fd, err := unix.Open(cmp.Or(parent, "."), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("launcher: remove %s: %w", path, err)
	}
	defer unix.Close(fd)
	if err := removeAt(fd, name); err != nil {
		return fmt.Errorf("launcher: remove %s: %w", path, err)
	}
	return nil
}

// removeAt removes name from folder dirfd, and its contents first when
// it is a folder.
func removeAt(dirfd int, name string) error {
	err := unix.Unlinkat(dirfd, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EPERM) {
		return err
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return err
	}
	dir := os.NewFile(uintptr(fd), name)
	defer dir.Close()
	for {
		// A batch at a time: removing entries while reading the rest is
		// fine on Linux file systems, and reading them all first would
		// hold a huge folder in memory.
		entries, err := dir.ReadDir(256)
		for _, e := range entries {
			if err := removeAt(fd, e.Name()); err != nil {
				return err
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
	}
	if err := unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
		return err
	}
	return nil
}

// mkdirOpen makes folder name in d unless it exists and opens it, never
// through a link. The folder must be this user's: another user's folder
// there (made before gorun came, or swapped in) could be emptied and
// refilled by that user while gorun writes in it.
func (d *LogDir) mkdirOpen(name string) (*LogDir, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	path := filepath.Join(d.path, name)
	if err := unix.Mkdirat(d.fd, name, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
		return nil, fmt.Errorf("launcher: make %s: %w", path, err)
	}
	fd, err := unix.Openat(d.fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
		return nil, fmt.Errorf("launcher: %s is not a folder (a link or a file): refusing to follow it", path)
	}
	if err != nil {
		return nil, fmt.Errorf("launcher: open %s: %w", path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("launcher: stat %s: %w", path, err)
	}
	if uid := os.Geteuid(); int(st.Uid) != uid {
		unix.Close(fd)
		return nil, fmt.Errorf("%w: %s (uid %d, gorun runs as uid %d)", ErrForeignOwner, path, st.Uid, uid)
	}
	return &LogDir{path: path, fd: fd}, nil
}

// dup opens d again, for a caller that closes what it gets.
func (d *LogDir) dup() (*LogDir, error) {
	fd, err := unix.FcntlInt(uintptr(d.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("launcher: %s: %w", d.path, err)
	}
	return &LogDir{path: d.path, fd: fd}, nil
}

// components splits rel into plain names.
func components(rel string) ([]string, error) {
	if rel == "" || rel == "." {
		return nil, nil
	}
	if filepath.IsAbs(rel) {
		return nil, fmt.Errorf("launcher: %q is not a relative path", rel)
	}
	names := strings.Split(filepath.ToSlash(rel), "/")
	for _, n := range names {
		if err := checkName(n); err != nil {
			return nil, err
		}
	}
	return names, nil
}

// checkName accepts one plain path component.
func checkName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") {
		return fmt.Errorf("launcher: %q is not a plain file name", name)
	}
	return nil
}

// HasLogFiles reports whether a worker's log (a file named *.log) is
// anywhere under dir; links are not followed.
func HasLogFiles(dir string) bool {
	found := errors.New("found")
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && filepath.Ext(path) == ".log" {
			return found
		}
		return nil
	})
	return err == found
}
