package launcher

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/testenv"
)

// A link planted at any component gorun makes or resets is refused or
// removed, never followed: the folder it points to and the file in it
// are untouched.
func TestLogDirNeverFollowsLinks(t *testing.T) {
	outside := t.TempDir()
	precious := filepath.Join(outside, "0", "precious")
	if err := os.MkdirAll(filepath.Dir(precious), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(precious, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ link, rel string }{
		{"run", "run/attempt_0/0"},
		{"run/attempt_0", "run/attempt_0/0"},
		{"run/attempt_0/0", "run/attempt_0/0"}, // the folder reset itself: the link goes, a folder takes its place
	} {
		root := t.TempDir()
		if dir := filepath.Dir(filepath.Join(root, tt.link)); dir != root {
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Symlink(outside, filepath.Join(root, tt.link)); err != nil {
			t.Fatal(err)
		}
		d, err := OpenLogDir(root)
		if err != nil {
			t.Fatal(err)
		}
		rank, err := d.Reset(tt.rel)
		if err == nil {
			f, err := rank.Create("stdout.log")
			if err != nil {
				t.Fatal(err)
			}
			f.Close()
			rank.Close()
			if st, err := os.Lstat(filepath.Join(root, tt.rel)); err != nil || !st.IsDir() || st.Mode().Perm() != 0o700 {
				t.Errorf("link at %s: %s is %v, %v; want a folder 0700", tt.link, tt.rel, st, err)
			}
		}
		if b, err := os.ReadFile(precious); err != nil || string(b) != "keep" {
			t.Errorf("link at %s: the folder outside lost its file: %q, %v", tt.link, b, err)
		}
		if _, err := os.Stat(filepath.Join(outside, "0", "stdout.log")); err == nil {
			t.Errorf("link at %s: a log was written outside", tt.link)
		}
		d.Close()
	}
}

// Files are made anew, 0600: a link (symbolic or hard) at a log's name
// is replaced, and its target keeps its contents.
func TestLogDirCreateReplacesLinks(t *testing.T) {
	root := t.TempDir()
	target := filepath.Join(t.TempDir(), "target")
	if err := os.WriteFile(target, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(root, "a.log")); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(target, filepath.Join(root, "b.log")); err != nil {
		t.Fatal(err)
	}
	d, err := OpenLogDir(root)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for _, name := range []string{"a.log", "b.log"} {
		f, err := d.Create(name)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString("attack")
		f.Close()
		if st, err := os.Lstat(filepath.Join(root, name)); err != nil || !st.Mode().IsRegular() || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, %v; want a plain file 0600", name, st, err)
		}
	}
	if b, _ := os.ReadFile(target); string(b) != "keep" {
		t.Errorf("the links' target holds %q", b)
	}
	if _, err := d.Mkfifo("a.log"); err == nil {
		t.Error("Mkfifo replaced a plain file")
	}
}

func TestLogDirRefusesForeignFolders(t *testing.T) {
	testenv.MustHaveRoot(t, "giving a folder to another user")
	root := t.TempDir()
	if err := os.Chown(root, 4242, 4242); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenLogDir(root); !errors.Is(err, ErrForeignOwner) {
		t.Errorf("OpenLogDir of another user's folder: %v, want ErrForeignOwner", err)
	}
	mine := t.TempDir()
	if err := os.Mkdir(filepath.Join(mine, "run"), 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(mine, "run"), 4242, 4242); err != nil {
		t.Fatal(err)
	}
	d, err := OpenLogDir(mine)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := d.Reset("run/attempt_0/0"); !errors.Is(err, ErrForeignOwner) {
		t.Errorf("Reset under another user's folder: %v, want ErrForeignOwner", err)
	}
	open := t.TempDir()
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenLogDir(open); err == nil {
		t.Error("OpenLogDir accepted a folder every user can write to without the sticky bit")
	}
	if err := os.Chmod(open, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	if d, err := OpenLogDir(open); err != nil {
		t.Errorf("OpenLogDir of a sticky folder: %v", err)
	} else {
		d.Close()
	}
}

func TestRemoveTreeRemovesLinksNotTargets(t *testing.T) {
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "f"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	tree := filepath.Join(t.TempDir(), "tree")
	if err := os.MkdirAll(filepath.Join(tree, "a", "b"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(tree, "a", "link")); err != nil {
		t.Fatal(err)
	}
	if err := RemoveTree(tree); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(tree); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("tree still there: %v", err)
	}
	if _, err := os.Stat(filepath.Join(outside, "f")); err != nil {
		t.Errorf("the link's target lost its file: %v", err)
	}
}

// The watchdog's pipe is pollable: closing it ends a read in progress.
func TestLogDirMkfifoCloseEndsARead(t *testing.T) {
	d, err := OpenLogDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	f, err := d.Mkfifo("pipe")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error)
	go func() {
		_, err := f.Read(make([]byte, 1))
		done <- err
	}()
	f.Close()
	select {
	case err := <-done:
		if err == nil {
			t.Error("a read of a closed, empty pipe returned no error")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("closing the pipe did not end the read")
	}
}
