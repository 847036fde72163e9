package launcher

import (
	"maps"
	"path/filepath"
	"testing"
)

func TestStd(t *testing.T) {
	for _, tt := range []struct {
		std            Std
		stdout, stderr bool
	}{{StdNone, false, false}, {StdOut, true, false}, {StdErr, false, true}, {StdAll, true, true}} {
		if tt.std.Stdout() != tt.stdout || tt.std.Stderr() != tt.stderr {
			t.Errorf("Std(%d): Stdout()=%v Stderr()=%v", tt.std, tt.std.Stdout(), tt.std.Stderr())
		}
	}
}

func TestParseStd(t *testing.T) {
	tests := []struct {
		spec string
		want map[int]Std
	}{
		{"", map[int]Std{0: StdNone, 1: StdNone, 2: StdNone}},
		{"0", map[int]Std{0: StdNone, 1: StdNone, 2: StdNone}},
		{"3", map[int]Std{0: StdAll, 1: StdAll, 2: StdAll}},
		{" 1 ", map[int]Std{0: StdOut, 1: StdOut, 2: StdOut}},
		{"0:1,1:2", map[int]Std{0: StdOut, 1: StdErr, 2: StdNone}},
		{"2:3", map[int]Std{0: StdNone, 1: StdNone, 2: StdAll}},
		{"0:1, 2:2", map[int]Std{0: StdOut, 1: StdNone, 2: StdErr}},
	}
	for _, tt := range tests {
		got, err := ParseStd(tt.spec, 3)
		if err != nil || !maps.Equal(got, tt.want) {
			t.Errorf("ParseStd(%q) = %v, %v; want %v", tt.spec, got, err, tt.want)
		}
	}
}

func TestParseStdErrors(t *testing.T) {
	tests := map[string]string{
		"0:9":     `launcher: bad redirect spec "0:9": stream 9 not in 0-3`,
		"4":       `launcher: bad redirect spec "4": stream 4 not in 0-3`,
		"x":       `launcher: bad redirect spec "x": stream "x" is not a number`,
		"0:1,0:2": `launcher: bad redirect spec "0:1,0:2": local rank 0 given twice`,
		"3:1":     `launcher: bad redirect spec "3:1": local rank 3 not in 0-2`,
		"0:1,":    `launcher: bad redirect spec "0:1,": "" is not local_rank:stream`,
		"a:1":     `launcher: bad redirect spec "a:1": local rank "a" is not a number`,
		"0:":      `launcher: bad redirect spec "0:": stream "" is not a number`,
		"0:1;1:2": `launcher: bad redirect spec "0:1;1:2": stream "1;1:2" is not a number`,
	}
	for spec, want := range tests {
		if _, err := ParseStd(spec, 3); err == nil || err.Error() != want {
			t.Errorf("ParseStd(%q) error = %v, want %s", spec, err, want)
		}
	}
}

func TestParseRankFilter(t *testing.T) {
	got, err := ParseRankFilter("0, 2", 4)
	if want := map[int]bool{0: true, 2: true}; err != nil || !maps.Equal(got, want) {
		t.Errorf(`ParseRankFilter("0, 2") = %v, %v; want %v`, got, err, want)
	}
	got, err = ParseRankFilter("", 3)
	if want := map[int]bool{0: true, 1: true, 2: true}; err != nil || !maps.Equal(got, want) {
		t.Errorf(`ParseRankFilter("") = %v, %v; want every rank`, got, err)
	}
	for spec, want := range map[string]string{
		"4":   `launcher: bad local ranks filter "4": local rank 4 not in 0-3`,
		"-1":  `launcher: bad local ranks filter "-1": local rank -1 not in 0-3`,
		"0,x": `launcher: bad local ranks filter "0,x": local rank "x" is not a number`,
		"0,":  `launcher: bad local ranks filter "0,": local rank "" is not a number`,
	} {
		if _, err := ParseRankFilter(spec, 4); err == nil || err.Error() != want {
			t.Errorf("ParseRankFilter(%q) error = %v, want %s", spec, err, want)
		}
	}
}

func TestLogPaths(t *testing.T) {
	dir, stdout, stderr, errorFile := LogPaths("logs", "job1", 2, 3)
	want := filepath.Join("logs", "job1", "attempt_2", "3")
	if dir != want || stdout != filepath.Join(want, "stdout.log") ||
		stderr != filepath.Join(want, "stderr.log") || errorFile != filepath.Join(want, "error.json") {
		t.Errorf("LogPaths = %q %q %q %q", dir, stdout, stderr, errorFile)
	}
}
