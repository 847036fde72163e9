package archtest

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// flagFiles define gorun's flags; flagMakers are the calls that define one,
// with the flag's name as the first argument.
var (
	flagFiles  = []string{"cmd/gorun/flags.go", "cmd/gorun/head.go"}
	flagMakers = []string{"stringFlag", "boolFlag", "hiddenStringFlag", "hiddenBoolFlag", "stringSliceFlag"}
)

// TestFlagTable checks that the doc's table of where each flag is
// resolved has a row for every flag gorun defines, and names no flag it
// does not.
func TestFlagTable(t *testing.T) {
	root := moduleRoot(t)
	doc, err := os.ReadFile(filepath.Join(root, docPath))
	if err != nil {
		t.Fatal(err)
	}
	var defined []string
	for _, f := range flagFiles {
		names, err := definedFlags(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		defined = append(defined, names...)
	}
	if len(defined) < 40 {
		t.Fatalf("found %d flags in %v; gorun has more: did the way flags are defined change?", len(defined), flagFiles)
	}
	rows, err := flagRows(string(doc))
	if err != nil {
		t.Fatalf("%s: %v", docPath, err)
	}
	for _, name := range defined {
		if !slices.Contains(rows, name) {
			t.Errorf("%s: flag --%s (defined in %s) has no row in the table of where each flag is resolved", docPath, name, strings.Join(flagFiles, " or "))
		}
	}
	for _, name := range rows {
		if !slices.Contains(defined, name) {
			t.Errorf("%s: the flag table names --%s, which %s do not define", docPath, name, strings.Join(flagFiles, " and "))
		}
	}
}

// moduleRoot is the folder of the go.mod above the test's folder.
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's folder")
		}
		dir = parent
	}
}

// definedFlags returns the names of the flags file defines through
// flagMakers, reading a name given as a constant from the file's package.
func definedFlags(file string) ([]string, error) {
	fset := token.NewFileSet()
	pkgFiles, err := filepath.Glob(filepath.Join(filepath.Dir(file), "*.go"))
	if err != nil {
		return nil, err
	}
	consts := map[string]string{}
	var target *ast.File
	for _, name := range pkgFiles {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		if name == file {
			target = f
		}
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, id := range vs.Names {
					if i < len(vs.Values) {
						if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
							consts[id.Name], _ = strconv.Unquote(lit.Value)
						}
					}
				}
			}
		}
	}
	if target == nil {
		return nil, fmt.Errorf("archtest: %s is not a file of its package", file)
	}
	var names []string
	var bad []string
	ast.Inspect(target, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || len(call.Args) == 0 {
			return true
		}
		fn, ok := call.Fun.(*ast.Ident)
		if !ok || !slices.Contains(flagMakers, fn.Name) {
			return true
		}
		switch arg := call.Args[0].(type) {
		case *ast.BasicLit:
			name, _ := strconv.Unquote(arg.Value)
			names = append(names, name)
		case *ast.Ident:
			if v, ok := consts[arg.Name]; ok {
				names = append(names, v)
				return true
			}
			bad = append(bad, fset.Position(arg.Pos()).String())
		default:
			bad = append(bad, fset.Position(arg.Pos()).String())
		}
		return true
	})
	if len(bad) > 0 {
		return nil, fmt.Errorf("archtest: flag names that are neither a string nor a string constant: %s", strings.Join(bad, ", "))
	}
	return names, nil
}

// flagCell is a flag as the table's first column writes it: `--name` or `-x`.
var flagCell = regexp.MustCompile("`--?([a-z0-9][a-z0-9-]*)`")

// flagRows returns the flags named in the first column of the table under
// the heading "Where each flag is resolved".
func flagRows(doc string) ([]string, error) {
	_, section, ok := strings.Cut(doc, "\n## Where each flag is resolved\n")
	if !ok {
		return nil, fmt.Errorf("no section \"## Where each flag is resolved\"")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var names []string
	inTable := false
	for line := range strings.SplitSeq(section, "\n") {
		if !strings.HasPrefix(line, "|") {
			if inTable {
				break // the table has ended
			}
			continue
		}
		inTable = true
		cells := strings.Split(line, "|")
		if len(cells) < 3 {
			continue
		}
		for _, m := range flagCell.FindAllStringSubmatch(cells[1], -1) {
			names = append(names, m[1])
		}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("no flag in the first column of the section's table")
	}
	return names, nil
}

func TestFlagRows(t *testing.T) {
	doc := "# x\n\n## Where each flag is resolved\n\ntext `--not-a-row`\n\n| Flag | Where |\n|---|---|\n" +
		"| `--nnodes` | resolve |\n| `--module`, `--no-python` | program |\n| `-x` | planHead |\n| `--node-hosts` (hidden) | `--other` in the second column |\n\nafter `--after`\n\n## Next\n| `--next` | |\n"
	got, err := flagRows(doc)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"nnodes", "module", "no-python", "x", "node-hosts"}
	if !slices.Equal(got, want) {
		t.Errorf("flagRows = %v, want %v", got, want)
	}
	if _, err := flagRows("# no such section\n"); err == nil {
		t.Error("a doc without the section: no error")
	}
}

func TestDefinedFlags(t *testing.T) {
	dir := t.TempDir()
	src := "package main\n\nconst hidden = \"secret-flag\"\n\nfunc flags() []any {\n\treturn []any{\n" +
		"\t\tstringFlag(\"nnodes\", \"1\", \"usage\"),\n\t\tboolFlag(\"module\", \"usage\", \"m\"),\n" +
		"\t\thiddenBoolFlag(hidden, \"usage\"),\n\t\tstringSliceFlag(\"x\", \"usage\"),\n\t\tother(\"not-a-flag\"),\n\t}\n}\n"
	file := filepath.Join(dir, "flags.go")
	if err := os.WriteFile(file, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := definedFlags(file)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"nnodes", "module", "secret-flag", "x"}; !slices.Equal(got, want) {
		t.Errorf("definedFlags = %v, want %v", got, want)
	}
	if err := os.WriteFile(file, []byte("package main\n\nfunc f() { stringFlag(prefix+\"x\", \"\", \"\") }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := definedFlags(file); err == nil {
		t.Error("a computed flag name: no error")
	}
}
