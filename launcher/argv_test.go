package launcher

import (
	"slices"
	"testing"
)

func TestArgv(t *testing.T) {
	args := []string{"--lr", "0.1"}
	tests := []struct {
		name             string
		program, python  string
		module, noPython bool
		want             []string
	}{
		{"python script", "train.py", "python3.11", false, false, []string{"python3.11", "-u", "train.py", "--lr", "0.1"}},
		{"default interpreter", "train.py", "", false, false, []string{"python3", "-u", "train.py", "--lr", "0.1"}},
		{"module", "pkg.train", "py", true, false, []string{"py", "-u", "-m", "pkg.train", "--lr", "0.1"}},
		{"no python", "train.py", "py", false, true, []string{"train.py", "--lr", "0.1"}},
		{"no python wins over module", "pkg.train", "py", true, true, []string{"pkg.train", "--lr", "0.1"}},
		{"binary", "./worker", "py", false, false, []string{"./worker", "--lr", "0.1"}},
		{"script without .py", "train.sh", "py", false, false, []string{"train.sh", "--lr", "0.1"}},
	}
	for _, tt := range tests {
		got := Argv(tt.program, args, tt.python, tt.module, tt.noPython)
		if !slices.Equal(got, tt.want) {
			t.Errorf("%s: Argv = %q, want %q", tt.name, got, tt.want)
		}
	}
	if got := Argv("./worker", nil, "", false, false); !slices.Equal(got, []string{"./worker"}) {
		t.Errorf("Argv without args = %q", got)
	}
}
