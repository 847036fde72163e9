package shmname

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
)

func TestParseAcceptsOnlyTheFormGorunMakes(t *testing.T) {
	good := Name{Creator: Creator{PidNS: 4026531836, Pid: 4242, Start: 987654}, Random: "0123456789abcdef", Rank: 3}
	if got, ok := Parse(good.String()); !ok || got != good {
		t.Fatalf("Parse(%q) = %+v, %v; want %+v", good.String(), got, ok, good)
	}
	for _, bad := range []string{
		"",
		"../../tmp/x",
		"gorun-collective-../../tmp/x",
		"gorun-collective-1-2-3-0123456789abcdef-4/../../x",
		"gorun-collective-1-2-3-0123456789abcdef",          // no rank
		"gorun-collective-1-2-3-0123456789abcdef-4-5",      // one more
		"gorun-collective-1-2-3-0123456789ABCDEF-4",        // upper case
		"gorun-collective-1-2-3-0123456789abcde-4",         // 15 hex digits
		"gorun-collective-1-02-3-0123456789abcdef-4",       // leading zero
		"gorun-collective-1-0-3-0123456789abcdef-4",        // pid 0
		"gorun-collective-1-+2-3-0123456789abcdef-4",       // sign
		"gorun-collective-1-2-3-0123456789abcdef-4\x00",    // NUL
		"gorun-collective-1-2-3-0123456789abcdef-4 ",       // space
		"gorun-collective-1-99999999-3-0123456789abcdef-4", // beyond pid_max
		"gorun-collective-0123456789abcdef-4",              // the old form
		"xgorun-collective-1-2-3-0123456789abcdef-4",
	} {
		if n, ok := Parse(bad); ok {
			t.Errorf("Parse(%q) = %+v, want refused", bad, n)
		}
	}
}

func TestParseStat(t *testing.T) {
	line := "77 (a) b) (c) S 1 77 77 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 123456 1000 10"
	start, zombie, err := parseStat([]byte(line))
	if err != nil || start != 123456 || zombie {
		t.Errorf("parseStat = %d, %v, %v; want 123456, false, nil", start, zombie, err)
	}
	if _, zombie, _ := parseStat([]byte("77 (z) Z 1 77 77 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5 0 0")); !zombie {
		t.Error("a zombie's stat line is not taken for a zombie")
	}
}

// A segment whose creator exited is swept; the segments of a live
// creator, of another pid namespace, of another form, and a link are not.
func TestSweepRemovesOnlyDeadCreatorsSegments(t *testing.T) {
	dir := t.TempDir()
	self, err := Self()
	if err != nil {
		t.Fatal(err)
	}
	child := exec.Command("sleep", "60")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	start, _, err := processStart(child.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	dead := Name{Creator: Creator{PidNS: self.PidNS, Pid: child.Process.Pid, Start: start}, Random: "00000000000000aa", Rank: 1}
	reused := Name{Creator: Creator{PidNS: self.PidNS, Pid: self.Pid, Start: self.Start + 1}, Random: "00000000000000bb", Rank: 2}
	live := Name{Creator: self, Random: "00000000000000cc", Rank: 0}
	foreign := Name{Creator: Creator{PidNS: self.PidNS + 1, Pid: child.Process.Pid, Start: start}, Random: "00000000000000dd", Rank: 3}
	for _, n := range []string{dead.String(), reused.String(), live.String(), foreign.String(), "gorun-collective-x"} {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	target := filepath.Join(t.TempDir(), "target")
	if err := os.WriteFile(target, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	link := Name{Creator: dead.Creator, Random: "00000000000000ee", Rank: 4}.String()
	if err := os.Symlink(target, filepath.Join(dir, link)); err != nil {
		t.Fatal(err)
	}

	if removed, err := Sweep(dir); err != nil || !slices.Equal(removed, []string{reused.String()}) {
		t.Fatalf("with the child alive, Sweep = %v, %v; want only the reused pid's segment", removed, err)
	}
	child.Process.Kill()
	child.Wait()
	if removed, err := Sweep(dir); err != nil || !slices.Equal(removed, []string{dead.String()}) {
		t.Fatalf("with the child gone, Sweep = %v, %v; want %s", removed, err, dead)
	}
	for _, n := range []string{live.String(), foreign.String(), "gorun-collective-x", link} {
		if _, err := os.Lstat(filepath.Join(dir, n)); err != nil {
			t.Errorf("%s: %v; want it kept", n, err)
		}
	}
	if _, err := os.Stat(target); err != nil {
		t.Errorf("the link's target: %v", err)
	}
}
