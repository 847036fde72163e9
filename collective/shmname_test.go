package collective

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/gorun/gorun/internal/testenv"
)

// A name read from the store is used only in the form newSegmentName
// makes, for the process that published it.
func TestSegmentNamesFromTheStoreAreValidated(t *testing.T) {
	name, err := newSegmentName(7)
	if err != nil {
		t.Fatal(err)
	}
	pid := os.Getpid()
	if !validSegmentName(name, pid) {
		t.Fatalf("validSegmentName(%q, %d) = false for our own name", name, pid)
	}
	if validSegmentName(name, pid+1) {
		t.Errorf("validSegmentName(%q, %d) = true for another process's name", name, pid+1)
	}
	mid := "-" + strconv.Itoa(pid) + "-"
	for _, bad := range []string{
		"../../tmp/x",
		"gorun-collective-0123456789abcdef-7",
		strings.Replace(name, mid, "-../..-", 1),
		name + "/..",
		name + "x",
	} {
		if validSegmentName(bad, pid) {
			t.Errorf("validSegmentName(%q) = true", bad)
		}
	}
}

// A link at a valid name is not opened: the name came from the store.
func TestOpenSegmentRefusesLinks(t *testing.T) {
	name, err := newSegmentName(9)
	if err != nil {
		t.Fatal(err)
	}
	target := t.TempDir() + "/target"
	if err := os.WriteFile(target, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	link := shmDir + "/" + name
	if err := os.Symlink(target, link); err != nil {
		testenv.MustHave(t, err, "a writable "+shmDir+" to plant a link in", "")
	}
	defer os.Remove(link)
	if s, err := openSegment(name, 4096); err == nil {
		s.unmap()
		t.Fatal("openSegment followed a link")
	}
}
