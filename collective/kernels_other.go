//go:build !amd64 || purego

package collective

// combineVector is the vector kernels' entry point where there are none:
// it combines nothing, leaving the scalar loops all of it.
func combineVector(dst, a, b []byte, dt DType, op Op) int { return 0 }

// reduceManyVector is the many-operand vector kernels' entry point where
// there are none: it reduces nothing.
func reduceManyVector(dst, dst2 []byte, srcs [][]byte, dt DType, op Op) int { return 0 }

// combineFloat32Vector is combineVector for float32s: nothing here either.
func combineFloat32Vector(dst, a, b []byte, op Op) int { return 0 }
