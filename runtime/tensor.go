package runtime

import (
	"fmt"
	"unsafe"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/cuda"
)

// DType is the element type of a Tensor.
type DType = collective.DType

// The element types a Tensor can hold.
const (
	Int8     = collective.Int8
	Uint8    = collective.Uint8
	Int32    = collective.Int32
	Int64    = collective.Int64
	Float16  = collective.Float16
	BFloat16 = collective.BFloat16
	Float32  = collective.Float32
	Float64  = collective.Float64
)

// Elem is the set of Go element types a Tensor wraps directly. The 16-bit
// floating-point types have no Go type: Float16s and BFloat16s wrap their
// bit patterns, held as uint16.
type Elem interface {
	int8 | uint8 | int32 | int64 | float32 | float64
}

// Tensor is a view of a Go slice as a flat buffer of one DType. It shares
// the slice's memory, without copying: a collective writes its result
// straight into the caller's slice, and writes to the slice are what the
// next collective sends. Copying a Tensor copies the view, not the data.
//
// A Tensor may instead view GPU memory (see DeviceTensor): every
// collective and message takes device tensors as well, but its host
// accessors (Bytes, Elems, HalfBits) panic on them; Copy moves data
// between the host and a GPU.
//
// The zero Tensor is an empty int8 tensor on the host.
type Tensor struct {
	data  []byte
	dtype DType

	// A device tensor's memory is bytes [off, off+size) of buf; data is
	// nil.
	buf       *cuda.DeviceBuffer
	off, size int
}

// Of wraps s.
func Of[T Elem](s []T) Tensor {
	return view(s, dtypeOf[T]())
}

// Float16s wraps IEEE 754 half-precision values, given as their bit
// patterns (see ToFloat16).
func Float16s(s []uint16) Tensor { return view(s, Float16) }

// BFloat16s wraps bfloat16 values, given as their bit patterns (see
// ToBFloat16).
func BFloat16s(s []uint16) Tensor { return view(s, BFloat16) }

// view reinterprets s's memory as bytes.
func view[T any](s []T, dt DType) Tensor {
	if len(s) == 0 {
		return Tensor{dtype: dt}
	}
	return Tensor{
		data:  unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*dt.Size()),
		dtype: dt,
	}
}

func dtypeOf[T Elem]() DType {
	var zero T
	switch any(zero).(type) {
	case int8:
		return Int8
	case uint8:
		return Uint8
	case int32:
		return Int32
	case int64:
		return Int64
	case float32:
		return Float32
	default: // float64, the last member of Elem
		return Float64
	}
}

// DType returns the element type.
func (t Tensor) DType() DType { return t.dtype }

// Len returns the number of elements.
func (t Tensor) Len() int { return t.byteLen() / t.dtype.Size() }

// byteLen is the size of the tensor's memory, wherever it is.
func (t Tensor) byteLen() int {
	if t.buf != nil {
		return t.size
	}
	return len(t.data)
}

// Bytes returns the tensor's memory, shared with the wrapped slice. It
// panics for a device tensor, whose memory the host cannot address.
func (t Tensor) Bytes() []byte {
	t.mustBeOnHost("Bytes")
	return t.data
}

// Slice returns the view of elements [from, to), sharing memory with t,
// on the host or on t's GPU. It panics when the bounds are out of range,
// as slicing does.
func (t Tensor) Slice(from, to int) Tensor {
	if from < 0 || to < from || to > t.Len() {
		panic(fmt.Sprintf("runtime: tensor slice [%d:%d] out of range for length %d", from, to, t.Len()))
	}
	n := t.dtype.Size()
	if t.buf != nil {
		return Tensor{dtype: t.dtype, buf: t.buf, off: t.off + from*n, size: (to - from) * n}
	}
	return Tensor{data: t.data[from*n : to*n : to*n], dtype: t.dtype}
}

func (t Tensor) String() string {
	if t.buf != nil {
		return fmt.Sprintf("Tensor(%s, %d, cuda:%d)", t.dtype, t.Len(), t.buf.Device().Ordinal())
	}
	return fmt.Sprintf("Tensor(%s, %d)", t.dtype, t.Len())
}

// Elems returns the elements of t as the slice it wraps. It panics when T
// does not match t's DType, as a failed type assertion does.
func Elems[T Elem](t Tensor) []T {
	return elems[T](t, dtypeOf[T]())
}

// HalfBits returns the bit patterns of a Float16 or BFloat16 tensor. It
// panics for any other DType.
func (t Tensor) HalfBits() []uint16 {
	t.mustBeOnHost("HalfBits")
	if t.dtype != Float16 && t.dtype != BFloat16 {
		panic(fmt.Sprintf("runtime: HalfBits of a %s tensor", t.dtype))
	}
	return elems[uint16](t, t.dtype)
}

func elems[T any](t Tensor, want DType) []T {
	t.mustBeOnHost("Elems")
	if t.dtype != want {
		panic(fmt.Sprintf("runtime: %s elements of a %s tensor", want, t.dtype))
	}
	if len(t.data) == 0 {
		return nil
	}
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(t.data))), t.Len())
}

// ToFloat16 rounds f to the nearest half-precision value and returns its
// bits.
func ToFloat16(f float32) uint16 { return collective.Float32ToFloat16(f) }

// FromFloat16 returns the value of half-precision bits h.
func FromFloat16(h uint16) float32 { return collective.Float16ToFloat32(h) }

// ToBFloat16 rounds f to the nearest bfloat16 value and returns its bits.
func ToBFloat16(f float32) uint16 { return collective.Float32ToBFloat16(f) }

// FromBFloat16 returns the value of bfloat16 bits b.
func FromBFloat16(b uint16) float32 { return collective.BFloat16ToFloat32(b) }

// ReduceOp is a reduction operator.
type ReduceOp = collective.Op

// The reduction operators. Avg applies to floating-point tensors only; the
// bitwise ones to integer tensors only.
const (
	Sum     = collective.Sum
	Product = collective.Product
	Min     = collective.Min
	Max     = collective.Max
	Avg     = collective.Avg
	BAnd    = collective.BAnd
	BOr     = collective.BOr
	BXor    = collective.BXor
)
