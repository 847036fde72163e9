//go:build !linux

package cudatest

import "testing"

// Func fails t: the fakes, like CUDA and NCCL, load on Linux only.
func Func[F any](t testing.TB, path, name string) F {
	t.Helper()
	t.Fatalf("cudatest: %s: the fake libraries load on Linux only", path)
	var f F
	return f
}
