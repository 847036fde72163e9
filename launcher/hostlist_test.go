package launcher

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gorun/gorun/internal/testenv"
)

// hostlistTests are expressions with the names `scontrol show hostnames`
// prints for them (checked against slurm-client 22.05.8). slurm is false
// for gorun's extensions, which Slurm 22.05 rejects.
var hostlistTests = []struct {
	expr  string
	want  string // space-separated
	slurm bool
}{
	{"node1", "node1", true},
	{"node[01-04,07]", "node01 node02 node03 node04 node07", true},
	{"n[008-011]", "n008 n009 n010 n011", true},
	{"n[9-11]", "n9 n10 n11", true},
	{"n[09-11]", "n09 n10 n11", true},
	{"n[1-010]", "n1 n2 n3 n4 n5 n6 n7 n8 n9 n10", true}, // width of the lower bound
	{"n[00-0]", "n00", true},
	{"x[5]", "x5", true},
	{"[1-2]", "1 2", true},
	{"n[2,1,1]", "n2 n1 n1", true}, // order and duplicates kept
	{"a[1-2],b3", "a1 a2 b3", true},
	{"a1 b2,  c3", "a1 b2 c3", true},
	{"a,,b,", "a b", true},
	{"\ta1\t, b[1-2] ", "a1 b1 b2", true},
	{"r[1-2]n[1-2]", "r1n1 r1n2 r2n1 r2n2", true},
	{"n[1-2,5]m[7-8,10]", "n1m7 n1m8 n1m10 n2m7 n2m8 n2m10 n5m7 n5m8 n5m10", true},
	{"p[01-02]q[8-10]", "p01q8 p01q9 p01q10 p02q8 p02q9 p02q10", true},
	{"n[1-2]m[7-8],o[1-2]", "n1m7 n1m8 n2m7 n2m8 o1 o2", true},
	{"n[1-2][3-4]", "n13 n14 n23 n24", true},
	// Three or more groups: the second-to-last is outermost.
	{"x[1-2]y[3-4]z[5-6]", "x1y3z5 x1y3z6 x2y3z5 x2y3z6 x1y4z5 x1y4z6 x2y4z5 x2y4z6", true},
	{"a[1-2]b[1-2]c[1-2]d[1-2]", "a1b1c1d1 a1b1c1d2 a2b1c1d1 a2b1c1d2 a1b2c1d1 a1b2c1d2 a2b2c1d1 a2b2c1d2 " +
		"a1b1c2d1 a1b1c2d2 a2b1c2d1 a2b1c2d2 a1b2c2d1 a1b2c2d2 a2b2c2d1 a2b2c2d2", true},
	// Text after the last bracket: Slurm 22.05 says "Invalid hostlist".
	{"a[1-2]-ib,b3", "a1-ib a2-ib b3", false},
	{"a[1-2]b[01-02]c", "a1b01c a1b02c a2b01c a2b02c", false},
}

func TestExpandHostlist(t *testing.T) {
	for _, tt := range hostlistTests {
		got, err := ExpandHostlist(tt.expr)
		if err != nil {
			t.Errorf("ExpandHostlist(%q): %v", tt.expr, err)
			continue
		}
		if want := strings.Fields(tt.want); !slices.Equal(got, want) {
			t.Errorf("ExpandHostlist(%q) = %q, want %q", tt.expr, got, want)
		}
	}
}

func TestExpandHostlistErrors(t *testing.T) {
	tests := []struct{ expr, want string }{
		{"", "no host names"},
		{" , ,", "no host names"},
		{"n[]", "empty brackets"},
		{"n[5-3]", `range "5-3" is reversed`},
		{"n[1-2", "unbalanced '['"},
		{"n1-2]", "unbalanced ']'"},
		{"n[1-2]]", "unbalanced ']'"},
		{"n[1[2]]", "nested '['"},
		{"n[a-b]", `"a" is not a number`},
		{"n[-1]", "missing number"},
		{"n[1-]", "missing number"},
		{"n[,1]", "missing number"},
		{"n[1,]", "missing number"},
		{"n[1 - 2]", `range "1 - 2": "1 " is not a number`},
		{"a,n[1 - 2]", `"n[1 - 2]": range "1 - 2"`},
		{"n[+1]", `"+1" is not a number`},
		{"n[1-2-3]", `"2-3" is not a number`},
		{"n[99999999999999999999]", "out of range"},
		{"n[0-1048576]", "more than 1048576 hosts"},
		{"a[1-1024]b[1-1025]", "expands to more than 1048576 hosts"},
		{"a[1-1024]b[1-1024],c", "expands to more than 1048576 hosts"},
	}
	for _, tt := range tests {
		got, err := ExpandHostlist(tt.expr)
		if err == nil {
			t.Errorf("ExpandHostlist(%q) = %q, want an error", tt.expr, got)
			continue
		}
		if msg := err.Error(); !strings.HasPrefix(msg, "launcher: hostlist ") || !strings.Contains(msg, tt.want) {
			t.Errorf("ExpandHostlist(%q) error %q, want it to contain %q", tt.expr, msg, tt.want)
		}
	}
}

func TestExpandHostlistLimit(t *testing.T) {
	got, err := ExpandHostlist("a[1-1024]b[1-1024]")
	if err != nil || len(got) != MaxExpandedHosts {
		t.Fatalf("ExpandHostlist at the limit: %d hosts, %v", len(got), err)
	}
	if got[0] != "a1b1" || got[1] != "a1b2" || got[len(got)-1] != "a1024b1024" {
		t.Errorf("ExpandHostlist at the limit: %q %q ... %q", got[0], got[1], got[len(got)-1])
	}
	long := "n[" + strings.Repeat("0", 200) + "-65535]" // 64K names of 201 bytes each
	if _, err := ExpandHostlist(long + "," + long + "," + long + "," + long + "," + long + "," + long + "," + long + "," + long + "," + long + "," + long); err == nil || !strings.Contains(err.Error(), "bytes") {
		t.Errorf("ExpandHostlist of a huge padded list: err = %v, want a size error", err)
	}
}

// TestExpandHostlistMatchesScontrol checks every Slurm-compatible entry of
// hostlistTests against `scontrol show hostnames`. scontrol works offline
// given a slurm.conf with just ClusterName and SlurmctldHost. Without
// scontrol (Debian package slurm-client) the test is skipped, or fails
// under CI=true.
func TestExpandHostlistMatchesScontrol(t *testing.T) {
	scontrol := testenv.MustHaveCommand(t, "scontrol", "slurm-client")
	conf := filepath.Join(t.TempDir(), "slurm.conf")
	if err := os.WriteFile(conf, []byte("ClusterName=gorun-test\nSlurmctldHost=localhost\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range hostlistTests {
		if !tt.slurm {
			continue
		}
		cmd := exec.Command(scontrol, "show", "hostnames", tt.expr)
		cmd.Env = append(os.Environ(), "SLURM_CONF="+conf)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		// scontrol exits 0 on "Invalid hostlist"; it only says so on stderr.
		if err != nil || stderr.Len() > 0 {
			t.Errorf("scontrol show hostnames %q: %v: %s", tt.expr, err, stderr.String())
			continue
		}
		want := strings.Fields(string(out))
		got, err := ExpandHostlist(tt.expr)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("ExpandHostlist(%q) = %q, %v; scontrol prints %q", tt.expr, got, err, want)
		}
	}
}

func FuzzExpandHostlist(f *testing.F) {
	for _, tt := range hostlistTests {
		f.Add(tt.expr)
	}
	f.Add("n[0-1048575]")
	f.Add("a[1-9999]b[1-9999]c[1-9999]")
	f.Add("n[1-2")
	f.Fuzz(func(t *testing.T, expr string) {
		hosts, err := ExpandHostlist(expr)
		if err != nil {
			if hosts != nil {
				t.Fatalf("ExpandHostlist(%q) returned hosts with error %v", expr, err)
			}
			return
		}
		if len(hosts) == 0 || len(hosts) > MaxExpandedHosts {
			t.Fatalf("ExpandHostlist(%q) returned %d hosts", expr, len(hosts))
		}
		for _, h := range hosts {
			if h == "" || strings.ContainsAny(h, "[], \t\n") {
				t.Fatalf("ExpandHostlist(%q) returned bad name %q", expr, h)
			}
		}
	})
}

func TestExpandTasksPerNode(t *testing.T) {
	tests := []struct {
		spec string
		want []int
	}{
		{"1", []int{1}},
		{"2,1", []int{2, 1}},
		{"2(x3),1", []int{2, 2, 2, 1}},
		{"2(x2)", []int{2, 2}},
		{"4(x1), 8(x2)", []int{4, 8, 8}},
		{"72(x2),36", []int{72, 72, 36}},
	}
	for _, tt := range tests {
		got, err := ExpandTasksPerNode(tt.spec)
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("ExpandTasksPerNode(%q) = %v, %v; want %v", tt.spec, got, err, tt.want)
		}
	}
	bad := []struct{ spec, want string }{
		{"", "empty"},
		{"  ", "empty"},
		{"2,,1", `"" is not a positive integer`},
		{"0", `"0" is not a positive integer`},
		{"-1", `"-1" is not a positive integer`},
		{"x", `"x" is not a positive integer`},
		{"2(x0)", `repeat "0" is not a positive integer`},
		{"2(3)", "want N or N(xM)"},
		{"2(x3", "want N or N(xM)"},
		{"2(x3)1", "want N or N(xM)"},
		{"(x3)", `count "" is not`},
		{"2(x1048577)", "more than 1048576 nodes"},
		{"1(x1048576),1", "more than 1048576 nodes"},
	}
	for _, tt := range bad {
		got, err := ExpandTasksPerNode(tt.spec)
		if err == nil {
			t.Errorf("ExpandTasksPerNode(%q) = %v, want an error", tt.spec, got)
			continue
		}
		if msg := err.Error(); !strings.HasPrefix(msg, "launcher: tasks per node ") || !strings.Contains(msg, tt.want) {
			t.Errorf("ExpandTasksPerNode(%q) error %q, want it to contain %q", tt.spec, msg, tt.want)
		}
	}
}

// The size computed before expanding is the size of the names made,
// across digit counts and padding, so that the byte cap holds exactly.
func TestHostPatternSize(t *testing.T) {
	for _, tok := range []string{
		"n1", "n[0-9]", "n[8-12]", "n[08-12]", "n[0008-0012]", "n[95-105,7]",
		"a[1-3]b[09-11]c", "x[99999-100001]y[1-2]", "z[18446744073709551614-18446744073709551615]",
	} {
		p, err := parseHostPattern(tok)
		if err != nil {
			t.Fatalf("%s: %v", tok, err)
		}
		n := p.count()
		names := p.appendNames(nil, n, 0)
		total := 0
		for _, name := range names {
			total += len(name)
		}
		if len(names) != n || p.size(n) != total {
			t.Errorf("%s: %d names of %d bytes, count %d and size %d", tok, len(names), total, n, p.size(n))
		}
	}
}
