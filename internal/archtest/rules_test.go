// Package archtest keeps docs/architecture.md true: its import rules, the
// fenced block marked archtest, are parsed here and checked against what
// `go list` says of the module (archtest_test.go). It has tests only.
package archtest

import (
	"bufio"
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// The block's grammar, one statement a line ('#' starts a comment):
//
//	PKG: A, B             PKG's non-test files import these module packages
//	                      and no others ("-" for none); each must be used
//	PKG tests: C, D       PKG's tests may also import these, besides what
//	                      PKG may, PKG itself and the test-only packages
//	test-only: P, Q       only tests, and other test-only packages, import these
//	env: P, Q             the libraries that read the process environment
//	never: P, Q -> R, S   P and Q depend on R and S in no way, not even
//	                      through other packages
//
// Packages are named relative to the module; "x/..." is x and every
// package below it. A package follows the rule named by its own path,
// else the pattern with the longest base that matches it.

// rules is the parsed block.
type rules struct {
	imports  []*importRule
	testOnly []entry
	env      []entry
	never    []neverRule
}

// entry is a package or pattern and the doc line that names it.
type entry struct {
	pattern string
	line    int
}

type importRule struct {
	entry
	text  string // the statement, for messages
	allow []string
	tests []string
	// testsLine is the line of the "tests" statement, 0 if none.
	testsLine int
}

type neverRule struct {
	from, to []string
	line     int
	text     string
}

// reserved are the statements that are not a package's name.
var reserved = []string{"test-only", "env", "never"}

// parseRules reads the block's text; line numbers count from first, the
// doc's line of the block's first statement.
func parseRules(text string, first int) (*rules, error) {
	r := &rules{}
	byPattern := map[string]*importRule{}
	var errs []string
	sc := bufio.NewScanner(strings.NewReader(text))
	for n := first; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		head, tail, ok := strings.Cut(line, ":")
		if !ok {
			errs = append(errs, fmt.Sprintf("line %d: %q: want PKG: A, B", n, line))
			continue
		}
		head = strings.TrimSpace(head)
		list := splitList(tail)
		switch {
		case head == "test-only":
			r.testOnly = append(r.testOnly, entries(list, n)...)
		case head == "env":
			r.env = append(r.env, entries(list, n)...)
		case head == "never":
			from, to, ok := strings.Cut(tail, "->")
			if !ok || len(splitList(from)) == 0 || len(splitList(to)) == 0 {
				errs = append(errs, fmt.Sprintf("line %d: %q: want never: A, B -> C, D", n, line))
				continue
			}
			r.never = append(r.never, neverRule{from: splitList(from), to: splitList(to), line: n, text: line})
		case strings.HasSuffix(head, " tests"):
			pkg := strings.TrimSpace(strings.TrimSuffix(head, " tests"))
			ir := byPattern[pkg]
			if ir == nil {
				errs = append(errs, fmt.Sprintf("line %d: %q: no rule %q before it", n, line, pkg+":"))
				continue
			}
			if ir.testsLine != 0 {
				errs = append(errs, fmt.Sprintf("line %d: a second %q (first at line %d)", n, head, ir.testsLine))
				continue
			}
			ir.tests, ir.testsLine = list, n
		default:
			if strings.ContainsAny(head, " \t") || slices.Contains(reserved, head) {
				errs = append(errs, fmt.Sprintf("line %d: %q is not a package", n, head))
				continue
			}
			if prev := byPattern[head]; prev != nil {
				errs = append(errs, fmt.Sprintf("line %d: a second rule for %s (first at line %d)", n, head, prev.line))
				continue
			}
			ir := &importRule{entry: entry{head, n}, text: line, allow: list}
			byPattern[head] = ir
			r.imports = append(r.imports, ir)
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("archtest: the rules block:\n\t%s", strings.Join(errs, "\n\t"))
	}
	return r, nil
}

// splitList reads "a, b, c"; "-" and "" are the empty list.
func splitList(s string) []string {
	var out []string
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f != "" && f != "-" {
			out = append(out, f)
		}
	}
	return out
}

func entries(list []string, line int) []entry {
	out := make([]entry, len(list))
	for i, p := range list {
		out[i] = entry{p, line}
	}
	return out
}

// match reports whether path is pattern or, for "x/...", x or below it.
func match(pattern, path string) bool {
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return path == base || strings.HasPrefix(path, base+"/")
	}
	return path == pattern
}

func matchAny(patterns []string, path string) bool {
	return slices.ContainsFunc(patterns, func(p string) bool { return match(p, path) })
}

// specificity orders the rules that match one package: its own path
// first, then patterns by the length of their base.
func specificity(pattern string) int {
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return len(base)
	}
	return 1 << 20
}

// pkg is what the check needs of one package of the module; paths are
// relative to the module and list module packages only.
type pkg struct {
	path string
	main bool
	// imports and testImports map each imported package to where it is
	// imported ("elastic/agent.go:17"); testImports are the _test.go files'.
	imports, testImports map[string]string
	// deps are the packages the non-test files depend on, directly or not.
	deps []string
	// testing is where a non-test file imports "testing", "" if none.
	testing string
	// envReads are the non-test files' reads of the process environment
	// ("launcher/ssh_dial.go:40: os.Getenv").
	envReads []string
}

// check returns every way pkgs break r, and every statement of r that
// describes nothing (a rule no package follows, an import no package
// makes), each message naming the doc's line: doc is the doc's name.
func check(r *rules, pkgs []pkg, doc string) []string {
	var out []string
	fail := func(line int, format string, args ...any) {
		out = append(out, fmt.Sprintf("%s:%d: ", doc, line)+fmt.Sprintf(format, args...))
	}
	byPath := map[string]*pkg{}
	for i := range pkgs {
		byPath[pkgs[i].path] = &pkgs[i]
	}
	exists := func(pattern string) bool {
		return slices.ContainsFunc(pkgs, func(p pkg) bool { return match(pattern, p.path) })
	}
	testOnly := func(path string) bool {
		return slices.ContainsFunc(r.testOnly, func(e entry) bool { return match(e.pattern, path) })
	}

	// Every package follows one rule; every rule is followed.
	followed := map[*importRule][]*pkg{}
	for i := range pkgs {
		p := &pkgs[i]
		var best *importRule
		for _, ir := range r.imports {
			if match(ir.pattern, p.path) && (best == nil || specificity(ir.pattern) > specificity(best.pattern)) {
				best = ir
			}
		}
		if best == nil {
			out = append(out, fmt.Sprintf("%s: package %s has no rule: add \"%s: <what it imports>\" to the archtest block", doc, p.path, p.path))
			continue
		}
		followed[best] = append(followed[best], p)
	}
	for _, ir := range r.imports {
		if len(followed[ir]) == 0 {
			fail(ir.line, "%q: no package of the module follows it (none is %s, or a more specific rule takes them); drop it", ir.text, ir.pattern)
		}
		for _, a := range slices.Concat(ir.allow, ir.tests) {
			if !exists(a) {
				fail(ir.line, "%q: %s is no package of the module", ir.text, a)
			}
		}
	}

	for _, ir := range r.imports {
		ps := followed[ir]
		usedAllow, usedTests := map[string]bool{}, map[string]bool{}
		for _, p := range ps {
			for _, imp := range sortedKeys(p.imports) {
				if a := firstMatch(ir.allow, imp); a != "" {
					usedAllow[a] = true
					continue
				}
				fail(ir.line, "%s imports %s, which the rule %q does not allow", p.imports[imp], imp, ir.text)
			}
			for _, imp := range sortedKeys(p.testImports) {
				if imp == p.path || matchAny(ir.allow, imp) || testOnly(imp) {
					continue
				}
				if a := firstMatch(ir.tests, imp); a != "" {
					usedTests[a] = true
					continue
				}
				fail(cmp.Or(ir.testsLine, ir.line), "%s (a test) imports %s, which neither %q nor a \"%s tests:\" rule allows", p.testImports[imp], imp, ir.text, ir.pattern)
			}
		}
		if len(ps) == 0 {
			continue
		}
		for _, a := range ir.allow {
			if !usedAllow[a] && exists(a) {
				fail(ir.line, "%q: no package under the rule imports %s; drop it from the rule", ir.text, a)
			}
		}
		for _, a := range ir.tests {
			if !usedTests[a] && exists(a) {
				fail(ir.testsLine, "%q tests: no test under the rule needs %s beyond what the rule allows; drop it", ir.pattern, a)
			}
		}
	}

	// Test helpers stay in tests.
	for _, e := range r.testOnly {
		if !exists(e.pattern) {
			fail(e.line, "test-only: %s is no package of the module", e.pattern)
		}
	}
	for _, p := range pkgs {
		if testOnly(p.path) {
			continue
		}
		for _, imp := range sortedKeys(p.imports) {
			if testOnly(imp) {
				line := r.testOnly[slices.IndexFunc(r.testOnly, func(e entry) bool { return match(e.pattern, imp) })].line
				fail(line, "%s imports the test helper %s outside a test: only tests (and test-only packages) may", p.imports[imp], imp)
			}
		}
		if p.testing != "" {
			out = append(out, fmt.Sprintf("%s: %s imports \"testing\" outside a _test.go file: move it into one, or list %s under test-only: in %s", p.testing, p.path, p.path, doc))
		}
	}

	// Libraries read no environment, but for the ones listed.
	envLine := 0
	if len(r.env) > 0 {
		envLine = r.env[0].line
	}
	for _, e := range r.env {
		if !exists(e.pattern) {
			fail(e.line, "env: %s is no package of the module", e.pattern)
		}
	}
	for _, p := range pkgs {
		if p.main || testOnly(p.path) {
			continue
		}
		listed := slices.ContainsFunc(r.env, func(e entry) bool { return match(e.pattern, p.path) })
		switch {
		case len(p.envReads) > 0 && !listed:
			fail(envLine, "%s reads the process environment, which a library must not (take an option, or read it in main or runtime.Init): %s",
				p.path, strings.Join(p.envReads, "; "))
		case len(p.envReads) == 0 && listed:
			fail(envLine, "env: %s reads no environment any more; drop it from the list", p.path)
		}
	}

	// Layers that never meet, not even through a third package.
	for _, nr := range r.never {
		for _, pat := range slices.Concat(nr.from, nr.to) {
			if !exists(pat) {
				fail(nr.line, "%q: %s is no package of the module", nr.text, pat)
			}
		}
		for _, p := range pkgs {
			if !matchAny(nr.from, p.path) {
				continue
			}
			for _, d := range p.deps {
				if matchAny(nr.to, d) {
					fail(nr.line, "%s depends on %s (%s), which %q forbids",
						p.path, d, strings.Join(chain(byPath, p.path, d), " → "), nr.text)
				}
			}
		}
	}
	return out
}

// chain is a shortest import path from one package to another, each step
// with the file that imports the next.
func chain(byPath map[string]*pkg, from, to string) []string {
	prev := map[string]string{from: ""}
	queue := []string{from}
	for len(queue) > 0 {
		at := queue[0]
		queue = queue[1:]
		if at == to {
			break
		}
		if p := byPath[at]; p != nil {
			for _, next := range sortedKeys(p.imports) {
				if _, seen := prev[next]; !seen {
					prev[next] = at
					queue = append(queue, next)
				}
			}
		}
	}
	if _, ok := prev[to]; !ok {
		return []string{from, "…", to}
	}
	var steps []string
	for at := to; at != from; at = prev[at] {
		steps = append(steps, byPath[prev[at]].imports[at]+" imports "+at)
	}
	slices.Reverse(steps)
	return steps
}

func firstMatch(patterns []string, path string) string {
	if i := slices.IndexFunc(patterns, func(p string) bool { return match(p, path) }); i >= 0 {
		return patterns[i]
	}
	return ""
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// rulesBlock finds the one fenced block marked archtest in a Markdown
// document and returns its text and the line number of its first line.
func rulesBlock(doc string) (string, int, error) {
	lines := strings.Split(doc, "\n")
	start, end := -1, -1
	for i, l := range lines {
		t := strings.TrimSpace(l)
		switch {
		case start < 0 && t == "```archtest":
			start = i + 1
		case start >= 0 && end < 0 && t == "```":
			end = i
		case start >= 0 && end >= 0 && t == "```archtest":
			return "", 0, fmt.Errorf("archtest: a second archtest block at line %d (the first at line %d)", i+1, start)
		}
	}
	if start < 0 || end < 0 {
		return "", 0, fmt.Errorf("archtest: no closed ```archtest block")
	}
	return strings.Join(lines[start:end], "\n"), start + 1, nil
}
