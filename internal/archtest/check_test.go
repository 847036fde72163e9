package archtest

import (
	"slices"
	"strings"
	"testing"
)

// fakeModule is a small module: a store at the bottom, a launcher and a
// worker library above it, a command on top, and a test helper.
func fakeModule() []pkg {
	return []pkg{
		{path: "store", imports: map[string]string{}, testImports: map[string]string{"testhelp": "store/store_test.go:5"}},
		{path: "launcher", imports: map[string]string{"store": "launcher/l.go:3"}, testImports: map[string]string{}, deps: []string{"store"},
			envReads: []string{"launcher/ssh.go:40: os.Getenv"}},
		{path: "worker", imports: map[string]string{"store": "worker/w.go:3"}, testImports: map[string]string{"worker": "worker/x_test.go:3"}, deps: []string{"store"}},
		{path: "cmd/tool", main: true, imports: map[string]string{"launcher": "cmd/tool/main.go:4"}, testImports: map[string]string{}, deps: []string{"launcher", "store"},
			envReads: []string{"cmd/tool/main.go:9: os.Getenv"}},
		{path: "testhelp", imports: map[string]string{}, testImports: map[string]string{}, testing: "testhelp/h.go:3", envReads: []string{"testhelp/h.go:20: os.Getenv"}},
	}
}

const fakeRules = `
store: -
launcher: store
worker: store
cmd/...: launcher
testhelp: -
test-only: testhelp
env: launcher
never: launcher, cmd/... -> worker
never: store -> launcher, worker
`

func TestCheck(t *testing.T) {
	tests := []struct {
		name   string
		rules  string
		change func(ps []pkg) []pkg
		want   []string // one substring per message, in order; none: no message
	}{
		{name: "true", rules: fakeRules},
		{
			name:  "an import the rule does not allow",
			rules: fakeRules,
			change: func(ps []pkg) []pkg {
				ps[0].imports["launcher"] = "store/s.go:7"
				ps[0].deps = []string{"launcher", "store"}
				return ps
			},
			want: []string{
				`doc.md:2: store/s.go:7 imports launcher, which the rule "store: -" does not allow`,
				`doc.md:10: store depends on launcher (store/s.go:7 imports launcher), which "never: store -> launcher, worker" forbids`,
			},
		},
		{
			name:  "an allowed import no package makes",
			rules: strings.Replace(fakeRules, "worker: store", "worker: store, launcher", 1),
			want:  []string{`doc.md:4: "worker: store, launcher": no package under the rule imports launcher; drop it from the rule`},
		},
		{
			name:  "a package without a rule",
			rules: strings.Replace(fakeRules, "worker: store\n", "", 1),
			want:  []string{"package worker has no rule"},
		},
		{
			name:  "a rule for no package",
			rules: fakeRules + "gone: store\n",
			want:  []string{`doc.md:11: "gone: store": no package of the module follows it (none is gone`},
		},
		{
			name:  "a never broken through a third package",
			rules: fakeRules,
			change: func(ps []pkg) []pkg {
				ps[1].imports["worker"] = "launcher/l.go:4"
				ps[1].deps = append(ps[1].deps, "worker")
				ps[3].deps = append(ps[3].deps, "worker")
				return ps
			},
			want: []string{
				"launcher/l.go:4 imports worker, which the rule \"launcher: store\" does not allow",
				"launcher depends on worker (launcher/l.go:4 imports worker)",
				"cmd/tool depends on worker (cmd/tool/main.go:4 imports launcher → launcher/l.go:4 imports worker)",
			},
		},
		{
			name:  "a test helper imported outside a test",
			rules: fakeRules,
			change: func(ps []pkg) []pkg {
				ps[2].imports["testhelp"] = "worker/w.go:4"
				return ps
			},
			want: []string{
				`worker/w.go:4 imports testhelp, which the rule "worker: store" does not allow`,
				"doc.md:7: worker/w.go:4 imports the test helper testhelp outside a test",
			},
		},
		{
			name:  "testing imported by a package not test-only",
			rules: strings.Replace(fakeRules, "test-only: testhelp", "test-only: -", 1),
			want: []string{
				`store/store_test.go:5 (a test) imports testhelp, which neither "store: -" nor a "store tests:" rule allows`,
				`testhelp/h.go:3: testhelp imports "testing" outside a _test.go file`,
				"testhelp reads the process environment",
			},
		},
		{
			name:  "a test import beyond the rule",
			rules: fakeRules,
			change: func(ps []pkg) []pkg {
				ps[0].testImports["worker"] = "store/store_test.go:6"
				return ps
			},
			want: []string{`doc.md:2: store/store_test.go:6 (a test) imports worker, which neither "store: -" nor a "store tests:" rule allows`},
		},
		{
			name:  "a test import the tests rule allows",
			rules: strings.Replace(fakeRules, "store: -\n", "store: -\nstore tests: worker\n", 1),
			change: func(ps []pkg) []pkg {
				ps[0].testImports["worker"] = "store/store_test.go:6"
				return ps
			},
		},
		{
			name:  "a tests rule no test needs",
			rules: strings.Replace(fakeRules, "store: -\n", "store: -\nstore tests: worker\n", 1),
			want:  []string{`doc.md:3: "store" tests: no test under the rule needs worker`},
		},
		{
			name:  "a library that reads the environment",
			rules: fakeRules,
			change: func(ps []pkg) []pkg {
				ps[2].envReads = []string{"worker/w.go:9: os.LookupEnv"}
				return ps
			},
			want: []string{"doc.md:8: worker reads the process environment, which a library must not (take an option, or read it in main or runtime.Init): worker/w.go:9: os.LookupEnv"},
		},
		{
			name:  "a listed library that no longer reads it",
			rules: fakeRules,
			change: func(ps []pkg) []pkg {
				ps[1].envReads = nil
				return ps
			},
			want: []string{"doc.md:8: env: launcher reads no environment any more; drop it from the list"},
		},
		{
			name:  "the most specific rule applies",
			rules: fakeRules + "cmd/tool: launcher, store\n",
			want: []string{
				`doc.md:5: "cmd/...: launcher": no package of the module follows it`,
				`doc.md:11: "cmd/tool: launcher, store": no package under the rule imports store`,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := parseRules(tt.rules, 1)
			if err != nil {
				t.Fatal(err)
			}
			ps := fakeModule()
			if tt.change != nil {
				ps = tt.change(ps)
			}
			got := check(r, ps, "doc.md")
			if len(got) != len(tt.want) {
				t.Fatalf("got %d messages, want %d:\n%s", len(got), len(tt.want), strings.Join(got, "\n"))
			}
			for i, w := range tt.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("message %d:\n got %s\nwant it to contain %s", i, got[i], w)
				}
			}
		})
	}
}

func TestParseRulesErrors(t *testing.T) {
	tests := []struct{ text, want string }{
		{"store", `line 1: "store": want PKG: A, B`},
		{"store: -\nstore: launcher", "line 2: a second rule for store (first at line 1)"},
		{"store tests: worker", `line 1: "store tests: worker": no rule "store:" before it`},
		{"store: -\nstore tests: a\nstore tests: b", `line 3: a second "store tests" (first at line 2)`},
		{"never: a, b", `line 1: "never: a, b": want never: A, B -> C, D`},
		{"never: -> b", "want never: A, B -> C, D"},
		{"some thing: a", `line 1: "some thing" is not a package`},
	}
	for _, tt := range tests {
		_, err := parseRules(tt.text, 1)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("parseRules(%q) = %v, want an error with %q", tt.text, err, tt.want)
		}
	}
}

func TestParseRules(t *testing.T) {
	r, err := parseRules("# comment\nstore: -   # a leaf\nlauncher: store, x/...\nlauncher tests: y\ntest-only: h1, h2\nenv: launcher\nnever: a, b -> c\n", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.imports) != 2 || r.imports[0].pattern != "store" || r.imports[0].line != 11 || len(r.imports[0].allow) != 0 {
		t.Errorf("store's rule: %+v", r.imports[0])
	}
	if l := r.imports[1]; !slices.Equal(l.allow, []string{"store", "x/..."}) || !slices.Equal(l.tests, []string{"y"}) || l.testsLine != 13 {
		t.Errorf("launcher's rule: %+v", l)
	}
	if len(r.testOnly) != 2 || r.testOnly[1].pattern != "h2" || len(r.env) != 1 {
		t.Errorf("test-only %v, env %v", r.testOnly, r.env)
	}
	if len(r.never) != 1 || !slices.Equal(r.never[0].from, []string{"a", "b"}) || !slices.Equal(r.never[0].to, []string{"c"}) || r.never[0].line != 16 {
		t.Errorf("never: %+v", r.never)
	}
}

func TestMatch(t *testing.T) {
	tests := []struct {
		pattern, path string
		want          bool
	}{
		{"rendezvous", "rendezvous", true},
		{"rendezvous", "rendezvous/etcd", false},
		{"rendezvous/...", "rendezvous", true},
		{"rendezvous/...", "rendezvous/etcd", true},
		{"rendezvous/...", "rendezvousx", false},
		{"cmd/...", "cmd", true},
	}
	for _, tt := range tests {
		if got := match(tt.pattern, tt.path); got != tt.want {
			t.Errorf("match(%q, %q) = %v, want %v", tt.pattern, tt.path, got, tt.want)
		}
	}
}

func TestRulesBlock(t *testing.T) {
	text, first, err := rulesBlock("# Map\n\n```archtest\nstore: -\n```\n\n```go\nx\n```\n")
	if err != nil || text != "store: -" || first != 4 {
		t.Errorf("rulesBlock = %q, %d, %v; want \"store: -\", 4, nil", text, first, err)
	}
	if _, _, err := rulesBlock("```archtest\na: -\n```\n```archtest\nb: -\n```\n"); err == nil {
		t.Error("two blocks: no error")
	}
	if _, _, err := rulesBlock("```archtest\na: -\n"); err == nil {
		t.Error("an unclosed block: no error")
	}
}
