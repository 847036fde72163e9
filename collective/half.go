package collective

import "math"

// Float32ToFloat16 rounds f to the nearest IEEE 754 binary16 value, ties
// to even. Values beyond the largest half (65504) round to infinity as the
// rounding rule says; NaNs stay NaNs (quiet, sign kept, top payload bits
// kept).
func Float32ToFloat16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23) & 0xff
	mant := b & 0x7fffff

	if exp == 0xff {
		if mant != 0 {
			return sign | 0x7e00 | uint16(mant>>13)
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15 // the half's biased exponent
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 {
		// A half subnormal: m × 2^-24 with m = significand × 2^(exp-126).
		if e < -10 {
			return sign // below half the smallest subnormal
		}
		mant |= 0x800000
		shift := uint32(14 - e)
		h := mant >> shift
		rem := mant & (1<<shift - 1)
		halfway := uint32(1) << (shift - 1)
		if rem > halfway || rem == halfway && h&1 == 1 {
			h++ // may carry into the smallest normal, which is right
		}
		return sign | uint16(h)
	}
	h := uint32(e)<<10 | mant>>13
	rem := mant & 0x1fff
	if rem > 0x1000 || rem == 0x1000 && h&1 == 1 {
		h++ // a carry out of the mantissa bumps the exponent, up to infinity
	}
	return sign | uint16(h)
}

// Float16ToFloat32 widens an IEEE 754 binary16 value exactly.
func Float16ToFloat32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch exp {
	case 0:
		if mant == 0 {
			return math.Float32frombits(sign)
		}
		e := uint32(127 - 15 + 1)
		for mant&0x400 == 0 {
			mant <<= 1
			e--
		}
		return math.Float32frombits(sign | e<<23 | (mant&0x3ff)<<13)
	case 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
}

// Float32ToBFloat16 rounds f to the nearest bfloat16 (the top half of a
// float32), ties to even; NaNs stay quiet NaNs.
func Float32ToBFloat16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// BFloat16ToFloat32 widens a bfloat16 exactly.
func BFloat16ToFloat32(h uint16) float32 {
	return math.Float32frombits(uint32(h) << 16)
}
