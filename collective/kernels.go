package collective

import (
	"fmt"
	"math"
	"unsafe"
)

// The reduction kernels work on typed views of the byte buffers
// (unsafe.Slice, no copy), four elements per iteration with the bounds
// checks hoisted by re-slicing, and allocate nothing. Where the CPU has
// vector instructions for the pair, a vector kernel takes the buffers'
// whole blocks first (kernels_amd64.go) and these loops the rest.
//
// Semantics:
//   - Integers wrap on overflow (sum and product), as two's complement does.
//   - float16 and bfloat16 are widened to float32, combined, and rounded
//     back to nearest even after every combine.
//   - Max and Min propagate NaN: when an operand is NaN the result is NaN
//     (the first operand's when both are). Between zeros, Max prefers +0 and
//     Min -0, so the result does not depend on the operands' order. This is
//     torch.maximum/torch.minimum's rule.
//   - Avg reduces like Sum; the collective divides by the number of ranks
//     once at the end. It applies to floating-point types only.
//   - BAnd, BOr, BXor apply to integer types only.
//
// The algorithms combine in an order fixed per element (see allreduce.go),
// so results are bitwise identical on every rank.

// ReduceInto combines src into dst elementwise: dst[i] = dst[i] op src[i].
// Both hold elements of dt and have the same length. Avg accumulates like
// Sum (the caller divides); an op that does not apply to dt is an error.
func ReduceInto(dst, src []byte, dt DType, op Op) error {
	if err := checkReduction(dt, op); err != nil {
		return err
	}
	if len(dst) != len(src) {
		return fmt.Errorf("collective: reduce into %d bytes from %d bytes", len(dst), len(src))
	}
	if len(dst)%dt.Size() != 0 {
		return fmt.Errorf("collective: %d bytes is not a whole number of %v elements", len(dst), dt)
	}
	combine(dst, dst, src, dt, op)
	return nil
}

// checkReduction rejects unknown types and operators, and the pairs that
// make no sense.
func checkReduction(dt DType, op Op) error {
	if dt.Size() == 0 {
		return fmt.Errorf("collective: unknown dtype %v", dt)
	}
	switch op {
	case Sum, Product, Max, Min:
	case Avg:
		if !dt.IsFloat() {
			return fmt.Errorf("collective: avg needs a floating-point dtype, not %v", dt)
		}
	case BAnd, BOr, BXor:
		if dt.IsFloat() {
			return fmt.Errorf("collective: %v needs an integer dtype, not %v", op, dt)
		}
	default:
		return fmt.Errorf("collective: unknown reduction %v", op)
	}
	return nil
}

// combine sets dst = a op b elementwise. dst may be a or b (in place);
// the order of a and b only matters for NaN payloads, which is why the
// algorithms fix it. The arguments have been checked.
func combine(dst, a, b []byte, dt DType, op Op) {
	if n := combineVector(dst, a, b, dt, op); n > 0 {
		dst, a, b = dst[n:], a[n:], b[n:]
	}
	switch dt {
	case Int8:
		combineInt(view[int8](dst), view[int8](a), view[int8](b), op)
	case Uint8:
		combineInt(view[uint8](dst), view[uint8](a), view[uint8](b), op)
	case Int32:
		combineInt(view[int32](dst), view[int32](a), view[int32](b), op)
	case Int64:
		combineInt(view[int64](dst), view[int64](a), view[int64](b), op)
	case Float32:
		combineFloat(view[float32](dst), view[float32](a), view[float32](b), op)
	case Float64:
		combineFloat(view[float64](dst), view[float64](a), view[float64](b), op)
	case Float16, BFloat16:
		combineHalf(view[uint16](dst), view[uint16](a), view[uint16](b), op, dt)
	}
}

// maxFused bounds the operands of one pass of a many-operand kernel
// (reduceManyVector).
const maxFused = 16

// reduceMany sets dst, and dst2 unless nil, to the reduction of srcs in
// order, ((srcs[0] op srcs[1]) op srcs[2]) ..., elementwise: the bits
// combine gives pair by pair, in one pass over the operands where a
// vector kernel can (and in groups of maxFused where there are more).
// All have dst's length, len(srcs) >= 1. dst overlaps no operand; dst2
// may be one, as the same memory exactly: it is written only once every
// operand of its elements has been read.
func reduceMany(dst, dst2 []byte, srcs [][]byte, dt DType, op Op) {
	done := 0
	if len(srcs) >= 2 {
		first := dst2
		if len(srcs) > maxFused {
			first = nil // dst2 may be an operand of a later group
		}
		done = reduceManyVector(dst, first, srcs[:min(len(srcs), maxFused)], dt, op)
	}
	if done > 0 && len(srcs) > maxFused {
		// Fold the rest into what the first group left in dst.
		var group [maxFused][]byte
		for next := maxFused; next < len(srcs); next += maxFused - 1 {
			group[0] = dst[:done]
			m := 1 + copy(group[1:], srcs[next:])
			reduceManyVector(dst[:done], nil, group[:m], dt, op)
		}
		if dst2 != nil {
			copy(dst2[:done], dst[:done])
		}
	}
	rest := dst[done:]
	if len(srcs) == 1 {
		copy(rest, srcs[0][done:])
	} else {
		combine(rest, srcs[0][done:], srcs[1][done:], dt, op)
		for _, s := range srcs[2:] {
			combine(rest, rest, s[done:], dt, op)
		}
	}
	if dst2 != nil {
		copy(dst2[done:], rest)
	}
}

// view reinterprets b as a slice of T, dropping a partial trailing element.
func view[T any](b []byte) []T {
	var zero T
	n := len(b) / int(unsafe.Sizeof(zero))
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), n)
}

// unsafeBytes is view's inverse: s's memory as bytes.
func unsafeBytes[T any](s []T) []byte {
	var zero T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(zero)))
}

type integer interface {
	~int8 | ~uint8 | ~int32 | ~int64
}

type float interface {
	~float32 | ~float64
}

func combineInt[T integer](d, a, b []T, op Op) {
	switch op {
	case Sum:
		addSlices(d, a, b)
	case Product:
		mulSlices(d, a, b)
	case Max:
		maxInts(d, a, b)
	case Min:
		minInts(d, a, b)
	case BAnd:
		andSlices(d, a, b)
	case BOr:
		orSlices(d, a, b)
	case BXor:
		xorSlices(d, a, b)
	}
}

func combineFloat[T float](d, a, b []T, op Op) {
	switch op {
	case Sum, Avg:
		addSlices(d, a, b)
	case Product:
		mulSlices(d, a, b)
	case Max:
		maxFloats(d, a, b)
	case Min:
		minFloats(d, a, b)
	}
}

// halfBlock is how many half-precision elements combineHalf widens at a
// time, in arrays on the stack.
const halfBlock = 512

// combineHalf combines float16 or bfloat16 (dt) elements in float32.
// The conversions are called directly, not through function values, so
// that the arrays stay on the stack.
func combineHalf(d, a, b []uint16, op Op, dt DType) {
	var wa, wb [halfBlock]float32
	for len(d) > 0 {
		n := min(len(d), halfBlock)
		fa, fb := wa[:n], wb[:n]
		if dt == BFloat16 {
			widenBFloat16(fa, a[:n])
			widenBFloat16(fb, b[:n])
		} else {
			widenFloat16(fa, a[:n])
			widenFloat16(fb, b[:n])
		}
		ba := unsafeBytes(fa)
		done := combineFloat32Vector(ba, ba, unsafeBytes(fb), op) / 4
		combineFloat(fa[done:], fa[done:], fb[done:], op)
		if dt == BFloat16 {
			narrowBFloat16(d[:n], fa)
		} else {
			narrowFloat16(d[:n], fa)
		}
		d, a, b = d[n:], a[n:], b[n:]
	}
}

func widenFloat16(dst []float32, src []uint16) {
	src = src[:len(dst)]
	for i, h := range src {
		dst[i] = Float16ToFloat32(h)
	}
}

func narrowFloat16(dst []uint16, src []float32) {
	src = src[:len(dst)]
	for i, f := range src {
		dst[i] = Float32ToFloat16(f)
	}
}

func widenBFloat16(dst []float32, src []uint16) {
	src = src[:len(dst)]
	for i, h := range src {
		dst[i] = BFloat16ToFloat32(h)
	}
}

func narrowBFloat16(dst []uint16, src []float32) {
	src = src[:len(dst)]
	for i, f := range src {
		dst[i] = Float32ToBFloat16(f)
	}
}

// The elementwise loops below are unrolled by four; re-slicing each group
// to length four lets the compiler drop the bounds checks inside it.

func addSlices[T integer | float](d, a, b []T) {
	n := len(d)
	a, b = a[:n], b[:n]
	i := 0
	for ; i+4 <= n; i += 4 {
		dd, aa, bb := d[i:i+4:i+4], a[i:i+4:i+4], b[i:i+4:i+4]
		dd[0] = aa[0] + bb[0]
		dd[1] = aa[1] + bb[1]
		dd[2] = aa[2] + bb[2]
		dd[3] = aa[3] + bb[3]
	}
	for ; i < n; i++ {
		d[i] = a[i] + b[i]
	}
}

func mulSlices[T integer | float](d, a, b []T) {
	n := len(d)
	a, b = a[:n], b[:n]
	i := 0
	for ; i+4 <= n; i += 4 {
		dd, aa, bb := d[i:i+4:i+4], a[i:i+4:i+4], b[i:i+4:i+4]
		dd[0] = aa[0] * bb[0]
		dd[1] = aa[1] * bb[1]
		dd[2] = aa[2] * bb[2]
		dd[3] = aa[3] * bb[3]
	}
	for ; i < n; i++ {
		d[i] = a[i] * b[i]
	}
}

func andSlices[T integer](d, a, b []T) {
	n := len(d)
	a, b = a[:n], b[:n]
	i := 0
	for ; i+4 <= n; i += 4 {
		dd, aa, bb := d[i:i+4:i+4], a[i:i+4:i+4], b[i:i+4:i+4]
		dd[0] = aa[0] & bb[0]
		dd[1] = aa[1] & bb[1]
		dd[2] = aa[2] & bb[2]
		dd[3] = aa[3] & bb[3]
	}
	for ; i < n; i++ {
		d[i] = a[i] & b[i]
	}
}

func orSlices[T integer](d, a, b []T) {
	n := len(d)
	a, b = a[:n], b[:n]
	i := 0
	for ; i+4 <= n; i += 4 {
		dd, aa, bb := d[i:i+4:i+4], a[i:i+4:i+4], b[i:i+4:i+4]
		dd[0] = aa[0] | bb[0]
		dd[1] = aa[1] | bb[1]
		dd[2] = aa[2] | bb[2]
		dd[3] = aa[3] | bb[3]
	}
	for ; i < n; i++ {
		d[i] = a[i] | b[i]
	}
}

func xorSlices[T integer](d, a, b []T) {
	n := len(d)
	a, b = a[:n], b[:n]
	i := 0
	for ; i+4 <= n; i += 4 {
		dd, aa, bb := d[i:i+4:i+4], a[i:i+4:i+4], b[i:i+4:i+4]
		dd[0] = aa[0] ^ bb[0]
		dd[1] = aa[1] ^ bb[1]
		dd[2] = aa[2] ^ bb[2]
		dd[3] = aa[3] ^ bb[3]
	}
	for ; i < n; i++ {
		d[i] = a[i] ^ b[i]
	}
}

func maxInts[T integer](d, a, b []T) {
	n := len(d)
	a, b = a[:n], b[:n]
	for i := range d {
		d[i] = max(a[i], b[i])
	}
}

func minInts[T integer](d, a, b []T) {
	n := len(d)
	a, b = a[:n], b[:n]
	for i := range d {
		d[i] = min(a[i], b[i])
	}
}

func maxFloats[T float](d, a, b []T) {
	n := len(d)
	a, b = a[:n], b[:n]
	for i := range d {
		d[i] = maxFloat(a[i], b[i])
	}
}

func minFloats[T float](d, a, b []T) {
	n := len(d)
	a, b = a[:n], b[:n]
	for i := range d {
		d[i] = minFloat(a[i], b[i])
	}
}

// maxFloat is the larger of x and y, NaN if either is (x's when both
// are), +0 between zeros of both signs.
func maxFloat[T float](x, y T) T {
	switch {
	case x > y:
		return x
	case y > x:
		return y
	case x != x:
		return x
	case y != y:
		return y
	case x == 0 && math.Signbit(float64(x)):
		return y
	}
	return x
}

// minFloat is the smaller of x and y, NaN if either is (x's when both
// are), -0 between zeros of both signs.
func minFloat[T float](x, y T) T {
	switch {
	case x < y:
		return x
	case y < x:
		return y
	case x != x:
		return x
	case y != y:
		return y
	case x == 0 && !math.Signbit(float64(x)):
		return y
	}
	return x
}

// divideBy divides every element of buf by n, for Avg; half precision in
// float32, rounded to nearest even. Only floating-point types reach here.
func divideBy(buf []byte, dt DType, n int) {
	switch dt {
	case Float32:
		v, f := view[float32](buf), float32(n)
		for i := range v {
			v[i] /= f
		}
	case Float64:
		v, f := view[float64](buf), float64(n)
		for i := range v {
			v[i] /= f
		}
	case Float16:
		v, f := view[uint16](buf), float32(n)
		for i := range v {
			v[i] = Float32ToFloat16(Float16ToFloat32(v[i]) / f)
		}
	case BFloat16:
		v, f := view[uint16](buf), float32(n)
		for i := range v {
			v[i] = Float32ToBFloat16(BFloat16ToFloat32(v[i]) / f)
		}
	}
}
