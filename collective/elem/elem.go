// Package elem names what the collectives of package collective and the
// NCCL communicators of package cuda both work on: the element types of
// their buffers (DType) and the element-wise operators that reduce them
// (Op). It is a leaf, so that cuda and collective need not import each
// other for two enums; both number them as NCCL does.
package elem

import "fmt"

// DType is an element type of a buffer.
type DType uint8

// The element types, numbered as NCCL numbers them where it has them.
const (
	Int8     DType = 0
	Uint8    DType = 1
	Int32    DType = 2
	Int64    DType = 4
	Float16  DType = 6
	Float32  DType = 7
	Float64  DType = 8
	BFloat16 DType = 9
)

// Size is the width of one element in bytes.
func (d DType) Size() int {
	switch d {
	case Int8, Uint8:
		return 1
	case Float16, BFloat16:
		return 2
	case Int32, Float32:
		return 4
	case Int64, Float64:
		return 8
	}
	return 0
}

// IsFloat reports whether d is a floating-point type.
func (d DType) IsFloat() bool {
	return d == Float16 || d == BFloat16 || d == Float32 || d == Float64
}

func (d DType) String() string {
	switch d {
	case Int8:
		return "int8"
	case Uint8:
		return "uint8"
	case Int32:
		return "int32"
	case Int64:
		return "int64"
	case Float16:
		return "float16"
	case BFloat16:
		return "bfloat16"
	case Float32:
		return "float32"
	case Float64:
		return "float64"
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// Op is a reduction operator.
type Op uint8

// The reduction operators, numbered as NCCL numbers the ones it has.
const (
	Sum     Op = 0
	Product Op = 1
	Max     Op = 2
	Min     Op = 3
	Avg     Op = 4 // float types only
	BAnd    Op = 5 // integer types only
	BOr     Op = 6 // integer types only
	BXor    Op = 7 // integer types only
)

func (o Op) String() string {
	switch o {
	case Sum:
		return "sum"
	case Product:
		return "product"
	case Max:
		return "max"
	case Min:
		return "min"
	case Avg:
		return "avg"
	case BAnd:
		return "band"
	case BOr:
		return "bor"
	case BXor:
		return "bxor"
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}
