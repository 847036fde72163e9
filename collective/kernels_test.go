package collective

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

// scalar is the obvious one-element-at-a-time definition of every
// reduction, which the unrolled kernels must match bit for bit.
func scalar(dt DType, op Op, a, b []byte) []byte {
	out := make([]byte, len(a))
	switch dt {
	case Int8:
		scalarInts(view[int8](out), view[int8](a), view[int8](b), op)
	case Uint8:
		scalarInts(view[uint8](out), view[uint8](a), view[uint8](b), op)
	case Int32:
		scalarInts(view[int32](out), view[int32](a), view[int32](b), op)
	case Int64:
		scalarInts(view[int64](out), view[int64](a), view[int64](b), op)
	case Float32:
		d, x, y := view[float32](out), view[float32](a), view[float32](b)
		for i := range d {
			d[i] = float32(scalarFloat(float64(x[i]), float64(y[i]), op, func(v float64) float64 { return float64(float32(v)) }))
		}
	case Float64:
		d, x, y := view[float64](out), view[float64](a), view[float64](b)
		for i := range d {
			d[i] = scalarFloat(x[i], y[i], op, func(v float64) float64 { return v })
		}
	case Float16, BFloat16:
		to, from := Float16ToFloat32, Float32ToFloat16
		if dt == BFloat16 {
			to, from = BFloat16ToFloat32, Float32ToBFloat16
		}
		d, x, y := view[uint16](out), view[uint16](a), view[uint16](b)
		for i := range d {
			v := scalarFloat(float64(to(x[i])), float64(to(y[i])), op, func(v float64) float64 { return float64(float32(v)) })
			d[i] = from(float32(v))
		}
	}
	return out
}

func scalarInts[T integer](d, a, b []T, op Op) {
	for i := range d {
		x, y := a[i], b[i]
		switch op {
		case Sum:
			d[i] = x + y
		case Product:
			d[i] = x * y
		case Max:
			d[i] = x
			if y > x {
				d[i] = y
			}
		case Min:
			d[i] = x
			if y < x {
				d[i] = y
			}
		case BAnd:
			d[i] = x & y
		case BOr:
			d[i] = x | y
		case BXor:
			d[i] = x ^ y
		}
	}
}

// scalarFloat combines in float64 and rounds with round: exact for
// float32 operands, since a float64 sum or product of two float32 values
// rounds to the same float32 as the float32 operation.
func scalarFloat(x, y float64, op Op, round func(float64) float64) float64 {
	switch op {
	case Sum, Avg:
		return round(x + y)
	case Product:
		return round(x * y)
	case Max, Min:
		switch {
		case math.IsNaN(x):
			return x
		case math.IsNaN(y):
			return y
		case x == y && x == 0:
			if (op == Max) == math.Signbit(x) {
				return y
			}
			return x
		case (op == Max) == (x > y):
			return x
		}
		return y
	}
	panic("unreachable")
}

func randomBytes(rng *rand.Rand, dt DType, n int) []byte {
	b := make([]byte, n*dt.Size())
	switch dt {
	case Float32:
		v := view[float32](b)
		for i := range v {
			v[i] = float32(rng.NormFloat64() * 100)
		}
	case Float64:
		v := view[float64](b)
		for i := range v {
			v[i] = rng.NormFloat64() * 100
		}
	case Float16, BFloat16:
		randomFloats(b, dt, rng)
	default:
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
	}
	return b
}

func TestReduceIntoMatchesScalar(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, dt := range allDTypes {
		for _, op := range opsFor(dt) {
			// Lengths around the vector kernels' blocks (128 bytes), and
			// buffers that start off a vector's alignment.
			for _, n := range []int{0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 513, 1000, 4099} {
				skew := n % 3 * dt.Size()
				a, b := randomBytes(rng, dt, n+skew/dt.Size())[skew:], randomBytes(rng, dt, n)
				want := scalar(dt, op, a, b)
				if err := ReduceInto(a, b, dt, op); err != nil {
					t.Fatalf("%v %v: %v", dt, op, err)
				}
				if string(a) != string(want) {
					t.Fatalf("%v %v x %d: %s", dt, op, n, firstDiff(a, want))
				}
			}
		}
	}
}

func TestReduceIntoRejects(t *testing.T) {
	for _, dt := range allDTypes {
		for _, op := range []Op{Avg, BAnd, BOr, BXor} {
			err := ReduceInto(make([]byte, 8), make([]byte, 8), dt, op)
			if applies := (op == Avg) == dt.IsFloat(); applies != (err == nil) {
				t.Errorf("%v %v: %v", dt, op, err)
			}
		}
	}
	if err := ReduceInto(make([]byte, 8), make([]byte, 4), Float32, Sum); err == nil {
		t.Error("different lengths accepted")
	}
	if err := ReduceInto(make([]byte, 6), make([]byte, 6), Float32, Sum); err == nil {
		t.Error("partial element accepted")
	}
	if err := ReduceInto(nil, nil, DType(3), Sum); err == nil {
		t.Error("unknown dtype accepted")
	}
	if err := ReduceInto(nil, nil, Float32, Op(9)); err == nil {
		t.Error("unknown op accepted")
	}
}

func TestIntegersWrap(t *testing.T) {
	a, b := []int8{127, -128, 64}, []int8{1, -1, 2}
	if err := ReduceInto(bytesOf(a), bytesOf(b), Int8, Sum); err != nil {
		t.Fatal(err)
	}
	if a[0] != -128 || a[1] != 127 {
		t.Fatalf("int8 sum: %v", a)
	}
	a = []int8{127, -128, 64}
	if err := ReduceInto(bytesOf(a), bytesOf(b), Int8, Product); err != nil {
		t.Fatal(err)
	}
	if a[0] != 127 || a[1] != -128 || a[2] != -128 {
		t.Fatalf("int8 product: %v", a)
	}
}

// TestVectorSpecialValues runs NaNs, infinities, zeros of both signs
// and subnormals through every float kernel, vector blocks and scalar
// tail alike, against the scalar definition.
func TestVectorSpecialValues(t *testing.T) {
	specials := []float64{math.NaN(), math.Inf(1), math.Inf(-1), 0, math.Copysign(0, -1), 1, -1, 1e-40, -1e-310, math.MaxFloat32, 3.5}
	for _, dt := range []DType{Float32, Float64, Float16, BFloat16} {
		for _, op := range opsFor(dt) {
			// Every pair of specials, repeated past a few vector blocks.
			var xs, ys []float64
			for len(xs) < 700 {
				for _, x := range specials {
					for _, y := range specials {
						xs, ys = append(xs, x), append(ys, y)
					}
				}
			}
			a, b := floatsAs(dt, xs), floatsAs(dt, ys)
			want := scalar(dt, op, a, b)
			if err := ReduceInto(a, b, dt, op); err != nil {
				t.Fatal(err)
			}
			for i := 0; i < len(xs); i++ {
				if got, w := floatAt(dt, a, i), floatAt(dt, want, i); got != w && !(got != got && w != w) || math.Signbit(got) != math.Signbit(w) && got == got {
					t.Fatalf("%v %v(%v, %v) = %v, want %v", dt, op, xs[i], ys[i], got, w)
				}
			}
		}
	}
}

// floatsAs encodes vs as elements of dt.
func floatsAs(dt DType, vs []float64) []byte {
	b := make([]byte, len(vs)*dt.Size())
	for i, v := range vs {
		switch dt {
		case Float32:
			view[float32](b)[i] = float32(v)
		case Float64:
			view[float64](b)[i] = v
		case Float16:
			view[uint16](b)[i] = Float32ToFloat16(float32(v))
		case BFloat16:
			view[uint16](b)[i] = Float32ToBFloat16(float32(v))
		}
	}
	return b
}

// floatAt decodes element i of b, of dt.
func floatAt(dt DType, b []byte, i int) float64 {
	switch dt {
	case Float32:
		return float64(view[float32](b)[i])
	case Float64:
		return view[float64](b)[i]
	case Float16:
		return float64(Float16ToFloat32(view[uint16](b)[i]))
	}
	return float64(BFloat16ToFloat32(view[uint16](b)[i]))
}

func TestFloatSpecialValues(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	negZero := float32(math.Copysign(0, -1))
	for _, c := range []struct {
		op   Op
		x, y float32
		want float32
	}{
		{Max, nan, 1, nan}, {Max, 1, nan, nan}, {Min, nan, 1, nan}, {Min, 1, nan, nan},
		{Max, negZero, 0, 0}, {Max, 0, negZero, 0}, {Min, 0, negZero, negZero}, {Min, negZero, 0, negZero},
		{Max, -inf, 3, 3}, {Min, inf, 3, 3},
		{Sum, inf, -inf, nan}, {Sum, inf, 1, inf}, {Product, 0, inf, nan},
	} {
		a, b := []float32{c.x}, []float32{c.y}
		if err := ReduceInto(bytesOf(a), bytesOf(b), Float32, c.op); err != nil {
			t.Fatal(err)
		}
		got := a[0]
		same := math.Float32bits(got) == math.Float32bits(c.want) || got != got && c.want != c.want
		if !same {
			t.Errorf("%v(%v, %v) = %v, want %v", c.op, c.x, c.y, got, c.want)
		}
	}
}

func TestFloat16Conversion(t *testing.T) {
	for _, c := range []struct {
		f    float32
		want uint16
	}{
		{1, 0x3c00},
		{1 + 1.0/1024, 0x3c01},
		{1 + 1.0/2048, 0x3c00},                   // tie, to even (down)
		{1 + 3.0/2048, 0x3c02},                   // tie, to even (up)
		{1 + 1.0/2048 + 1.0/65536, 0x3c01},       // just above the tie
		{65504, 0x7bff},                          // the largest half
		{65519, 0x7bff},                          // below the tie with 65536
		{65520, 0x7c00},                          // tie with 65536, even: infinity
		{float32(math.Ldexp(1, -24)), 0x0001},    // the smallest subnormal
		{float32(math.Ldexp(1, -25)), 0x0000},    // tie with 0, even: 0
		{float32(math.Ldexp(3, -26)), 0x0001},    // above the tie
		{float32(math.Ldexp(1, -14)), 0x0400},    // the smallest normal
		{float32(math.Ldexp(1023, -24)), 0x03ff}, // the largest subnormal
		{float32(math.Ldexp(2047, -25)), 0x0400}, // rounds up into the normals
		{float32(math.Copysign(0, -1)), 0x8000},  // -0
		{-2, 0xc000},
		{float32(math.Inf(1)), 0x7c00},
		{float32(math.Inf(-1)), 0xfc00},
		{1e10, 0x7c00},
	} {
		if got := Float32ToFloat16(c.f); got != c.want {
			t.Errorf("Float32ToFloat16(%g) = %#04x, want %#04x", c.f, got, c.want)
		}
	}
	if h := Float32ToFloat16(float32(math.NaN())); h&0x7c00 != 0x7c00 || h&0x3ff == 0 {
		t.Errorf("NaN became %#04x", h)
	}
	// Every half widens exactly and narrows back to itself.
	for h := range 1 << 16 {
		f := Float16ToFloat32(uint16(h))
		if f != f {
			if back := Float32ToFloat16(f); back&0x7c00 != 0x7c00 || back&0x3ff == 0 {
				t.Fatalf("NaN %#04x came back as %#04x", h, back)
			}
			continue
		}
		if back := Float32ToFloat16(f); back != uint16(h) {
			t.Fatalf("%#04x -> %g -> %#04x", h, f, back)
		}
	}
}

func TestFloat16RoundsToNearestEven(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 200000 {
		f := math.Float32frombits(rng.Uint32())
		if f != f || math.Abs(float64(f)) > 65504 {
			continue
		}
		h := Float32ToFloat16(f)
		got := float64(Float16ToFloat32(h))
		// No neighbouring half is nearer, and a tie went to the even one.
		for _, n := range []uint16{h - 1, h + 1} {
			if n&0x7c00 == 0x7c00 {
				continue
			}
			other := float64(Float16ToFloat32(n))
			d0, d1 := math.Abs(got-float64(f)), math.Abs(other-float64(f))
			if d1 < d0 || d1 == d0 && h&1 == 1 && h&0x7fff != 0 {
				t.Fatalf("%g rounded to %#04x (%g); %#04x (%g) is nearer or even", f, h, got, n, other)
			}
		}
	}
}

func TestBFloat16Conversion(t *testing.T) {
	for _, c := range []struct {
		f    float32
		want uint16
	}{
		{1, 0x3f80},
		{1 + 1.0/128, 0x3f81},
		{1 + 1.0/256, 0x3f80},               // tie, to even (down)
		{1 + 3.0/256, 0x3f82},               // tie, to even (up)
		{1 + 1.0/256 + 1.0/(1<<20), 0x3f81}, // above the tie
		{-1, 0xbf80},
		{math.MaxFloat32, 0x7f80}, // rounds up to infinity
		{float32(math.Inf(-1)), 0xff80},
	} {
		if got := Float32ToBFloat16(c.f); got != c.want {
			t.Errorf("Float32ToBFloat16(%g) = %#04x, want %#04x", c.f, got, c.want)
		}
	}
	if h := Float32ToBFloat16(math.Float32frombits(0x7f800001)); h&0x7f80 != 0x7f80 || h&0x7f == 0 {
		t.Errorf("a signalling NaN whose payload is in the low bits became %#04x", h)
	}
	for h := range 1 << 16 {
		f := BFloat16ToFloat32(uint16(h))
		if f == f && Float32ToBFloat16(f) != uint16(h) {
			t.Fatalf("%#04x does not round-trip", h)
		}
	}
}

func TestHalfPrecisionReduction(t *testing.T) {
	// 2048 + 1 is not a float16; the sum rounds to even (2048).
	a, b := []uint16{Float32ToFloat16(2048)}, []uint16{Float32ToFloat16(1)}
	if err := ReduceInto(bytesOf(a), bytesOf(b), Float16, Sum); err != nil {
		t.Fatal(err)
	}
	if got := Float16ToFloat32(a[0]); got != 2048 {
		t.Fatalf("2048+1 in float16 = %v", got)
	}
	// 2048 + 3 ties between 2050 and 2052: even mantissa is 2052.
	a, b = []uint16{Float32ToFloat16(2048)}, []uint16{Float32ToFloat16(3)}
	if err := ReduceInto(bytesOf(a), bytesOf(b), Float16, Sum); err != nil {
		t.Fatal(err)
	}
	if got := Float16ToFloat32(a[0]); got != 2052 {
		t.Fatalf("2048+3 in float16 = %v", got)
	}
	// Avg divides once, in float32: (1+2)/2 = 1.5 exactly.
	buf := bytesOf([]uint16{Float32ToBFloat16(3)})
	divideBy(buf, BFloat16, 2)
	if got := BFloat16ToFloat32(view[uint16](buf)[0]); got != 1.5 {
		t.Fatalf("avg: %v", got)
	}
}

func TestCheckReductionErrorsAreClear(t *testing.T) {
	err := ReduceInto(nil, nil, Int32, Avg)
	if err == nil || err.Error() != "collective: avg needs a floating-point dtype, not int32" {
		t.Fatalf("got %v", err)
	}
	err = ReduceInto(nil, nil, Float16, BOr)
	if err == nil || err.Error() != "collective: bor needs an integer dtype, not float16" {
		t.Fatalf("got %v", err)
	}
	if errors.Is(err, ErrMismatch) {
		t.Fatal("an argument error is no mismatch")
	}
}

// TestReduceManyMatchesPairs: the one-pass reduction of many operands
// gives, bit for bit, what combining them pair by pair in order gives,
// for operand counts below, at and above what one pass takes, with the
// second destination being one of the operands.
func TestReduceManyMatchesPairs(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, dt := range allDTypes {
		for _, op := range opsFor(dt) {
			for _, nsrc := range []int{1, 2, 3, 4, 7, maxFused, maxFused + 1, 2*maxFused + 3} {
				for _, n := range []int{0, 1, 31, 32, 33, 100, 1000} {
					srcs := make([][]byte, nsrc)
					for i := range srcs {
						srcs[i] = randomBytes(rng, dt, n)
					}
					want := bytes.Clone(srcs[0])
					for _, s := range srcs[1:] {
						combine(want, want, s, dt, op)
					}
					alias := rng.IntN(nsrc)
					orig := bytes.Clone(srcs[alias])
					dst := make([]byte, len(want))
					reduceMany(dst, srcs[alias], srcs, dt, op)
					if !bytes.Equal(dst, want) {
						t.Fatalf("%v %v, %d operands of %d: %s", dt, op, nsrc, n, firstDiff(dst, want))
					}
					if !bytes.Equal(srcs[alias], want) {
						t.Fatalf("%v %v, %d operands of %d: second destination (operand %d, was %x...): %s",
							dt, op, nsrc, n, alias, orig[:min(8, len(orig))], firstDiff(srcs[alias], want))
					}
				}
			}
		}
	}
}

// eitherNaN reports whether, a and b being NaNs of dt both, got is one of
// them made quiet: which one a NaN result carries is the compiler's
// choice in the scalar loops (Go does not say, and a commutative
// instruction's operands may be swapped), so either is right.
func eitherNaN(dt DType, got, a, b uint16) bool {
	quiet, isNaN := uint16(0x0200), func(h uint16) bool { return h&0x7c00 == 0x7c00 && h&0x03ff != 0 }
	if dt == BFloat16 {
		quiet, isNaN = 0x0040, func(h uint16) bool { return h&0x7f80 == 0x7f80 && h&0x007f != 0 }
	}
	return isNaN(a) && isNaN(b) && (got == a|quiet || got == b|quiet)
}

// TestHalfVectorsMatchScalar runs every float16 and bfloat16 bit pattern,
// NaNs and subnormals included, through the vector kernels against the
// scalar loops that define them, bit for bit.
func TestHalfVectorsMatchScalar(t *testing.T) {
	const n = 1 << 16
	a := make([]uint16, n)
	for i := range a {
		a[i] = uint16(i)
	}
	for _, dt := range []DType{Float16, BFloat16} {
		for _, op := range []Op{Sum, Product, Avg} {
			for _, stride := range []int{1, 7919, 40503} {
				b := make([]uint16, n)
				for i := range b {
					b[i] = uint16(i*stride + stride/2)
				}
				want := make([]uint16, n)
				combineHalf(want, a, b, op, dt)
				got := make([]uint16, n)
				combine(bytesOf(got), bytesOf(a), bytesOf(b), dt, op)
				for i := range got {
					if got[i] != want[i] && !eitherNaN(dt, got[i], a[i], b[i]) {
						t.Fatalf("%v %v(%#04x, %#04x) = %#04x, want %#04x", dt, op, a[i], b[i], got[i], want[i])
					}
				}
			}
		}
	}
}

// TestExtremesKeepNaNPayloads: max and min return a NaN operand's bits,
// the first's when both are NaN, in the vector blocks and the scalar tail
// alike.
func TestExtremesKeepNaNPayloads(t *testing.T) {
	const nan32a, nan32b, one32 = 0x7fc00001, 0xffc00002, 0x3f800000
	const nan64a, nan64b, one64 = 0x7ff8000000000001, 0xfff8000000000002, 0x3ff0000000000000
	for _, op := range []Op{Max, Min} {
		checkExtremeBits[uint32](t, Float32, op, nan32a, nan32b, nan32a)
		checkExtremeBits[uint32](t, Float32, op, one32, nan32b, nan32b)
		checkExtremeBits[uint32](t, Float32, op, nan32a, one32, nan32a)
		checkExtremeBits[uint64](t, Float64, op, nan64a, nan64b, nan64a)
		checkExtremeBits[uint64](t, Float64, op, one64, nan64b, nan64b)
		checkExtremeBits[uint64](t, Float64, op, nan64a, one64, nan64a)
	}
}

// checkExtremeBits reduces 300 elements of bits x with 300 of bits y
// (whole 128-byte blocks, then a tail) and wants bits want in each.
func checkExtremeBits[T uint32 | uint64](t *testing.T, dt DType, op Op, x, y, want T) {
	t.Helper()
	a, b := make([]T, 300), make([]T, 300)
	for i := range a {
		a[i], b[i] = x, y
	}
	if err := ReduceInto(bytesOf(a), bytesOf(b), dt, op); err != nil {
		t.Fatal(err)
	}
	for i, got := range a {
		if got != want {
			t.Fatalf("%v %v(%#x, %#x) element %d = %#x, want %#x", dt, op, x, y, i, got, want)
		}
	}
}
