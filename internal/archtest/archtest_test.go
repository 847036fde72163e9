package archtest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gorun/gorun/internal/testenv"
)

// docPath is the map whose rules the module must keep, from the module's root.
const docPath = "docs/architecture.md"

// TestImportRules checks the module against the rules of docs/architecture.md:
// what each package imports, that test helpers stay in tests, which
// libraries read the environment, and which layers never meet.
func TestImportRules(t *testing.T) {
	goTool := requireGo(t)
	mod := loadModule(t, goTool)
	doc, err := os.ReadFile(filepath.Join(mod.dir, docPath))
	if err != nil {
		t.Fatal(err)
	}
	text, first, err := rulesBlock(string(doc))
	if err != nil {
		t.Fatalf("%s: %v", docPath, err)
	}
	r, err := parseRules(text, first)
	if err != nil {
		t.Fatalf("%s: %v", docPath, err)
	}
	if len(mod.pkgs) < 10 {
		t.Fatalf("go list found %d packages of %s; the module has more", len(mod.pkgs), mod.path)
	}
	for _, msg := range check(r, mod.pkgs, docPath) {
		t.Error(msg)
	}
}

// requireGo returns the go tool's path; without one the test skips, and
// fails under CI=true, where one is always installed.
func requireGo(t *testing.T) string {
	t.Helper()
	return testenv.MustHaveCommand(t, "go", "golang-go")
}

// module is the module as go list and the parser see it.
type module struct {
	path, dir string
	pkgs      []pkg
}

// listed is what go list -json says of a package.
type listed struct {
	ImportPath                                   string
	Name                                         string
	Dir                                          string
	GoFiles, CgoFiles, TestGoFiles, XTestGoFiles []string
	Imports, TestImports, XTestImports, Deps     []string
	Error                                        *struct{ Err string }
}

// loadModule lists every package of the module this test belongs to and
// reads their files for where each import and environment read is.
func loadModule(t *testing.T, goTool string) module {
	t.Helper()
	var m module
	var info struct{ Path, Dir string }
	if err := json.Unmarshal(goList(t, goTool, "", "list", "-m", "-json"), &info); err != nil {
		t.Fatalf("go list -m: %v", err)
	}
	m.path, m.dir = info.Path, info.Dir
	out := goList(t, goTool, m.dir, "list", "-e",
		"-json=ImportPath,Name,Dir,GoFiles,CgoFiles,TestGoFiles,XTestGoFiles,Imports,TestImports,XTestImports,Deps,Error", "./...")
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var l listed
		if err := dec.Decode(&l); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list: %v", err)
		}
		if l.Error != nil {
			t.Fatalf("go list: %s: %s", l.ImportPath, l.Error.Err)
		}
		p, err := readPackage(m, l)
		if err != nil {
			t.Fatal(err)
		}
		m.pkgs = append(m.pkgs, p)
	}
	return m
}

func goList(t *testing.T, goTool, dir string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(goTool, args...)
	cmd.Dir = dir
	// This module alone, whatever go.work lies above it.
	cmd.Env = append(os.Environ(), "GOWORK=off")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr.Bytes())
	}
	return out
}

// readPackage turns go list's view of a package into the check's, with
// the file and line of each import and environment read.
func readPackage(m module, l listed) (pkg, error) {
	rel := func(importPath string) (string, bool) {
		if importPath == m.path {
			return ".", true
		}
		r, ok := strings.CutPrefix(importPath, m.path+"/")
		return r, ok
	}
	p := pkg{main: l.Name == "main", imports: map[string]string{}, testImports: map[string]string{}}
	p.path, _ = rel(l.ImportPath)
	for _, d := range l.Deps {
		if r, ok := rel(d); ok {
			p.deps = append(p.deps, r)
		}
	}
	fset := token.NewFileSet()
	parse := func(names []string, imports map[string]string, test bool) error {
		for _, name := range names {
			file := filepath.Join(l.Dir, name)
			mode := parser.ImportsOnly | parser.SkipObjectResolution
			if !test {
				mode = parser.SkipObjectResolution
			}
			f, err := parser.ParseFile(fset, file, nil, mode)
			if err != nil {
				return fmt.Errorf("archtest: %w", err)
			}
			where := func(pos token.Pos) string {
				return fmt.Sprintf("%s/%s:%d", p.path, name, fset.Position(pos).Line)
			}
			for _, spec := range f.Imports {
				path, _ := strconv.Unquote(spec.Path.Value)
				if r, ok := rel(path); ok {
					if _, seen := imports[r]; !seen {
						imports[r] = where(spec.Pos())
					}
				} else if path == "testing" && !test && p.testing == "" {
					p.testing = where(spec.Pos())
				}
			}
			if !test {
				for _, read := range envReads(f) {
					p.envReads = append(p.envReads, where(read.Pos())+": "+read.name)
				}
			}
		}
		return nil
	}
	if err := parse(slices.Concat(l.GoFiles, l.CgoFiles), p.imports, false); err != nil {
		return pkg{}, err
	}
	if err := parse(slices.Concat(l.TestGoFiles, l.XTestGoFiles), p.testImports, true); err != nil {
		return pkg{}, err
	}
	// go list is the authority on what is imported; the parser only says
	// where. An import it saw that go list did not (a file of another
	// platform) or the other way round means the two disagree on files.
	for _, want := range [][2][]string{{l.Imports, sortedKeys(p.imports)}, {slices.Concat(l.TestImports, l.XTestImports), sortedKeys(p.testImports)}} {
		var mine []string
		for _, imp := range want[0] {
			if r, ok := rel(imp); ok && r != p.path && !slices.Contains(mine, r) {
				mine = append(mine, r)
			}
		}
		got := slices.DeleteFunc(slices.Clone(want[1]), func(s string) bool { return s == p.path })
		slices.Sort(mine)
		if !slices.Equal(mine, got) {
			return pkg{}, fmt.Errorf("archtest: %s: go list says it imports %v, its files %v", p.path, mine, got)
		}
	}
	return p, nil
}

// envFuncs are the calls that read (or change) the process environment.
var envFuncs = map[string][]string{
	"os":      {"Getenv", "LookupEnv", "Environ", "ExpandEnv", "Setenv", "Unsetenv", "Clearenv"},
	"syscall": {"Getenv", "Environ", "Setenv", "Unsetenv", "Clearenv"},
}

type envRead struct {
	ast.Node
	name string
}

// envReads finds every use of envFuncs in f, called or passed as a value
// (a default such as lookupEnv = os.LookupEnv reads it too).
func envReads(f *ast.File) []envRead {
	local := map[string]string{} // the name a file gives os or syscall
	for _, spec := range f.Imports {
		path, _ := strconv.Unquote(spec.Path.Value)
		if _, ok := envFuncs[path]; !ok {
			continue
		}
		name := path
		if spec.Name != nil {
			name = spec.Name.Name
		}
		local[name] = path
	}
	var reads []envRead
	ast.Inspect(f, func(n ast.Node) bool {
		sel, ok := n.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		id, ok := sel.X.(*ast.Ident)
		if !ok {
			return true
		}
		if path, ok := local[id.Name]; ok && slices.Contains(envFuncs[path], sel.Sel.Name) {
			reads = append(reads, envRead{sel, path + "." + sel.Sel.Name})
		}
		return true
	})
	return reads
}
