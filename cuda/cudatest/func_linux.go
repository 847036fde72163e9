package cudatest

import (
	"testing"

	"github.com/ebitengine/purego"
)

// Func binds the function name of the library at path, which the test
// has loaded (through package cuda): the loader hands back the same copy,
// with the state the test's calls left in it.
func Func[F any](t testing.TB, path, name string) F {
	t.Helper()
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		t.Fatalf("cudatest: %v", err)
	}
	addr, err := purego.Dlsym(h, name)
	if err != nil {
		t.Fatalf("cudatest: %s has no %s: %v", path, name, err)
	}
	var f F
	purego.RegisterFunc(&f, addr)
	return f
}
