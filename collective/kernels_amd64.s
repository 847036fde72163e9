//go:build amd64 && !purego

#include "textflag.h"

// A kernel is a loop (PAIRWISE, MANY) around a STEP macro that sets
// acc = acc op m for one 32-byte vector m in memory, OP being the
// instruction it builds on and y, t1, t2 scratch registers.

// APPLY is the STEP of the operators that are one instruction, which
// take their operand straight from memory.
#define APPLY(OP, acc, m, y, t1, t2) OP m, acc, acc

// The float extremes keep torch's rules (kernels.go) in a few
// instructions more. OP (VMAXPS, VMINPS, VMAXPD, VMINPD) keeps acc where
// it wins and takes y otherwise, y also where either is NaN or both are
// equal. So where acc is NaN it is put back (a NaN propagates, the first
// operand's payload when both are), and where the operands are equal
// their bits are joined (JOIN: AND for max, OR for min), which picks +0,
// or -0, between zeros of both signs and changes nothing between equal
// values. CMP is the matching compare (predicate 3: unordered, 0: equal),
// BLEND the blend.
#define FEXTREME(OP, CMP, BLEND, JOIN, acc, m, y, t1, t2) \
	VMOVDQU m, y; \
	OP    y, acc, t1; \
	CMP   $3, acc, acc, t2; \
	BLEND t2, acc, t1, t1; \
	CMP   $0, y, acc, t2; \
	JOIN  y, acc, y; \
	BLEND t2, y, t1, acc

#define FMAXPS(OP, acc, m, y, t1, t2) FEXTREME(OP, VCMPPS, VBLENDVPS, VANDPS, acc, m, y, t1, t2)
#define FMINPS(OP, acc, m, y, t1, t2) FEXTREME(OP, VCMPPS, VBLENDVPS, VORPS, acc, m, y, t1, t2)
#define FMAXPD(OP, acc, m, y, t1, t2) FEXTREME(OP, VCMPPD, VBLENDVPD, VANDPD, acc, m, y, t1, t2)
#define FMINPD(OP, acc, m, y, t1, t2) FEXTREME(OP, VCMPPD, VBLENDVPD, VORPD, acc, m, y, t1, t2)

// MAXQ and MINQ are the signed 64-bit extremes, which AVX2 has no
// instruction for: OP (VPCMPGTQ) compares, and the blend keeps acc where
// it wins, else y.
#define MAXQ(OP, acc, m, y, t1, t2) \
	VMOVDQU   m, y; \
	OP        y, acc, t1; \
	VPBLENDVB t1, acc, y, acc

#define MINQ(OP, acc, m, y, t1, t2) \
	VMOVDQU   m, y; \
	OP        acc, y, t1; \
	VPBLENDVB t1, acc, y, acc

// PAIRWISE is the body of a kernel dst = a op b: func(dst, a, b *byte,
// n int), n a multiple of 128, four vectors per iteration.
#define PAIRWISE(STEP, OP) \
	MOVQ dst+0(FP), DI; \
	MOVQ a+8(FP), SI; \
	MOVQ b+16(FP), DX; \
	MOVQ n+24(FP), CX; \
	SHRQ $7, CX; \
	JZ   done; \
	loop: VMOVDQU 0(SI), Y0; \
	VMOVDQU 32(SI), Y1; \
	VMOVDQU 64(SI), Y2; \
	VMOVDQU 96(SI), Y3; \
	STEP(OP, Y0, 0(DX), Y4, Y5, Y6); \
	STEP(OP, Y1, 32(DX), Y7, Y8, Y9); \
	STEP(OP, Y2, 64(DX), Y10, Y11, Y12); \
	STEP(OP, Y3, 96(DX), Y13, Y14, Y15); \
	VMOVDQU Y0, 0(DI); \
	VMOVDQU Y1, 32(DI); \
	VMOVDQU Y2, 64(DI); \
	VMOVDQU Y3, 96(DI); \
	ADDQ $128, SI; \
	ADDQ $128, DX; \
	ADDQ $128, DI; \
	DECQ CX; \
	JNZ  loop; \
	VZEROUPPER; \
	done: RET

// MANY is the body of a kernel dst = ((srcs[0] op srcs[1]) op ...):
// func(dst, dst2 *byte, srcs **byte, nsrc, n int), one pass over n bytes
// (a multiple of 128) per block of four vectors; dst2 gets the result too
// unless it is nil.
#define MANY(STEP, OP) \
	MOVQ dst+0(FP), DI; \
	MOVQ dst2+8(FP), BX; \
	MOVQ srcs+16(FP), SI; \
	MOVQ nsrc+24(FP), CX; \
	MOVQ n+32(FP), DX; \
	XORQ R8, R8; \
	TESTQ DX, DX; \
	JZ   done; \
	block: MOVQ 0(SI), R9; \
	VMOVDQU 0(R9)(R8*1), Y0; \
	VMOVDQU 32(R9)(R8*1), Y1; \
	VMOVDQU 64(R9)(R8*1), Y2; \
	VMOVDQU 96(R9)(R8*1), Y3; \
	MOVQ $1, R10; \
	operand: CMPQ R10, CX; \
	JEQ  store; \
	MOVQ 0(SI)(R10*8), R9; \
	STEP(OP, Y0, 0(R9)(R8*1), Y4, Y5, Y6); \
	STEP(OP, Y1, 32(R9)(R8*1), Y7, Y8, Y9); \
	STEP(OP, Y2, 64(R9)(R8*1), Y10, Y11, Y12); \
	STEP(OP, Y3, 96(R9)(R8*1), Y13, Y14, Y15); \
	INCQ R10; \
	JMP  operand; \
	store: VMOVDQU Y0, 0(DI)(R8*1); \
	VMOVDQU Y1, 32(DI)(R8*1); \
	VMOVDQU Y2, 64(DI)(R8*1); \
	VMOVDQU Y3, 96(DI)(R8*1); \
	TESTQ BX, BX; \
	JZ   next; \
	VMOVDQU Y0, 0(BX)(R8*1); \
	VMOVDQU Y1, 32(BX)(R8*1); \
	VMOVDQU Y2, 64(BX)(R8*1); \
	VMOVDQU Y3, 96(BX)(R8*1); \
	next: ADDQ $128, R8; \
	CMPQ R8, DX; \
	JNE  block; \
	VZEROUPPER; \
	done: RET

// The AVX2 kernels of kernels_amd64.go, one loop each: dst = a op b over
// n bytes, n a multiple of 128, four 32-byte vectors per iteration. a is
// the first source operand, so a NaN result carries a's payload when both
// operands are NaN (the scalar loops carry either: Go leaves it to the
// compiler).

// func addFloat32AVX2(dst, a, b *byte, n int)
TEXT ·addFloat32AVX2(SB), NOSPLIT, $0-32
	PAIRWISE(APPLY, VADDPS)

// func addFloat64AVX2(dst, a, b *byte, n int)
TEXT ·addFloat64AVX2(SB), NOSPLIT, $0-32
	PAIRWISE(APPLY, VADDPD)

// func mulFloat32AVX2(dst, a, b *byte, n int)
TEXT ·mulFloat32AVX2(SB), NOSPLIT, $0-32
	PAIRWISE(APPLY, VMULPS)

// func mulFloat64AVX2(dst, a, b *byte, n int)
TEXT ·mulFloat64AVX2(SB), NOSPLIT, $0-32
	PAIRWISE(APPLY, VMULPD)

// func addInt8AVX2(dst, a, b *byte, n int)
TEXT ·addInt8AVX2(SB), NOSPLIT, $0-32
	PAIRWISE(APPLY, VPADDB)

// func addInt32AVX2(dst, a, b *byte, n int)
TEXT ·addInt32AVX2(SB), NOSPLIT, $0-32
	PAIRWISE(APPLY, VPADDD)

// func addInt64AVX2(dst, a, b *byte, n int)
TEXT ·addInt64AVX2(SB), NOSPLIT, $0-32
	PAIRWISE(APPLY, VPADDQ)

// func mulInt32AVX2(dst, a, b *byte, n int)
TEXT ·mulInt32AVX2(SB), NOSPLIT, $0-32
	PAIRWISE(APPLY, VPMULLD)

// func maxInt8AVX2(dst, a, b *byte, n int)
TEXT ·maxInt8AVX2(SB), NOSPLIT, $0-32
	PAIRWISE(APPLY, VPMAXSB)

// func minInt8AVX2(dst, a, b *byte, n int)
TEXT ·minInt8AVX2(SB), NOSPLIT, $0-32
	PAIRWISE(APPLY, VPMINSB)

// func maxUint8AVX2(dst, a, b *byte, n int)
TEXT ·maxUint8AVX2(SB), NOSPLIT, $0-32
	PAIRWISE(APPLY, VPMAXUB)

// func minUint8AVX2(dst, a, b *byte, n int)
TEXT ·minUint8AVX2(SB), NOSPLIT, $0-32
	PAIRWISE(APPLY, VPMINUB)

// func maxInt32AVX2(dst, a, b *byte, n int)
TEXT ·maxInt32AVX2(SB), NOSPLIT, $0-32
	PAIRWISE(APPLY, VPMAXSD)

// func minInt32AVX2(dst, a, b *byte, n int)
TEXT ·minInt32AVX2(SB), NOSPLIT, $0-32
	PAIRWISE(APPLY, VPMINSD)

// func andBytesAVX2(dst, a, b *byte, n int)
TEXT ·andBytesAVX2(SB), NOSPLIT, $0-32
	PAIRWISE(APPLY, VPAND)

// func orBytesAVX2(dst, a, b *byte, n int)
TEXT ·orBytesAVX2(SB), NOSPLIT, $0-32
	PAIRWISE(APPLY, VPOR)

// func xorBytesAVX2(dst, a, b *byte, n int)
TEXT ·xorBytesAVX2(SB), NOSPLIT, $0-32
	PAIRWISE(APPLY, VPXOR)

// The many-operand kernels: dst = ((srcs[0] op srcs[1]) op srcs[2]) ...
// over n bytes (a multiple of 128), nsrc >= 1 operands, in one pass; the
// result also goes to dst2 unless it is nil. The partial result is the
// first source operand of each step, as in the scalar loops.

// func addFloat32ManyAVX2(dst, dst2 *byte, srcs **byte, nsrc, n int)
TEXT ·addFloat32ManyAVX2(SB), NOSPLIT, $0-40
	MANY(APPLY, VADDPS)

// func addFloat64ManyAVX2(dst, dst2 *byte, srcs **byte, nsrc, n int)
TEXT ·addFloat64ManyAVX2(SB), NOSPLIT, $0-40
	MANY(APPLY, VADDPD)

// func mulFloat32ManyAVX2(dst, dst2 *byte, srcs **byte, nsrc, n int)
TEXT ·mulFloat32ManyAVX2(SB), NOSPLIT, $0-40
	MANY(APPLY, VMULPS)

// func mulFloat64ManyAVX2(dst, dst2 *byte, srcs **byte, nsrc, n int)
TEXT ·mulFloat64ManyAVX2(SB), NOSPLIT, $0-40
	MANY(APPLY, VMULPD)

// func addInt8ManyAVX2(dst, dst2 *byte, srcs **byte, nsrc, n int)
TEXT ·addInt8ManyAVX2(SB), NOSPLIT, $0-40
	MANY(APPLY, VPADDB)

// func addInt32ManyAVX2(dst, dst2 *byte, srcs **byte, nsrc, n int)
TEXT ·addInt32ManyAVX2(SB), NOSPLIT, $0-40
	MANY(APPLY, VPADDD)

// func addInt64ManyAVX2(dst, dst2 *byte, srcs **byte, nsrc, n int)
TEXT ·addInt64ManyAVX2(SB), NOSPLIT, $0-40
	MANY(APPLY, VPADDQ)

// func mulInt32ManyAVX2(dst, dst2 *byte, srcs **byte, nsrc, n int)
TEXT ·mulInt32ManyAVX2(SB), NOSPLIT, $0-40
	MANY(APPLY, VPMULLD)

// func maxInt8ManyAVX2(dst, dst2 *byte, srcs **byte, nsrc, n int)
TEXT ·maxInt8ManyAVX2(SB), NOSPLIT, $0-40
	MANY(APPLY, VPMAXSB)

// func minInt8ManyAVX2(dst, dst2 *byte, srcs **byte, nsrc, n int)
TEXT ·minInt8ManyAVX2(SB), NOSPLIT, $0-40
	MANY(APPLY, VPMINSB)

// func maxUint8ManyAVX2(dst, dst2 *byte, srcs **byte, nsrc, n int)
TEXT ·maxUint8ManyAVX2(SB), NOSPLIT, $0-40
	MANY(APPLY, VPMAXUB)

// func minUint8ManyAVX2(dst, dst2 *byte, srcs **byte, nsrc, n int)
TEXT ·minUint8ManyAVX2(SB), NOSPLIT, $0-40
	MANY(APPLY, VPMINUB)

// func maxInt32ManyAVX2(dst, dst2 *byte, srcs **byte, nsrc, n int)
TEXT ·maxInt32ManyAVX2(SB), NOSPLIT, $0-40
	MANY(APPLY, VPMAXSD)

// func minInt32ManyAVX2(dst, dst2 *byte, srcs **byte, nsrc, n int)
TEXT ·minInt32ManyAVX2(SB), NOSPLIT, $0-40
	MANY(APPLY, VPMINSD)

// func andBytesManyAVX2(dst, dst2 *byte, srcs **byte, nsrc, n int)
TEXT ·andBytesManyAVX2(SB), NOSPLIT, $0-40
	MANY(APPLY, VPAND)

// func orBytesManyAVX2(dst, dst2 *byte, srcs **byte, nsrc, n int)
TEXT ·orBytesManyAVX2(SB), NOSPLIT, $0-40
	MANY(APPLY, VPOR)

// func xorBytesManyAVX2(dst, dst2 *byte, srcs **byte, nsrc, n int)
TEXT ·xorBytesManyAVX2(SB), NOSPLIT, $0-40
	MANY(APPLY, VPXOR)

// func maxFloat32AVX2(dst, a, b *byte, n int)
TEXT ·maxFloat32AVX2(SB), NOSPLIT, $0-32
	PAIRWISE(FMAXPS, VMAXPS)

// func minFloat32AVX2(dst, a, b *byte, n int)
TEXT ·minFloat32AVX2(SB), NOSPLIT, $0-32
	PAIRWISE(FMINPS, VMINPS)

// func maxFloat64AVX2(dst, a, b *byte, n int)
TEXT ·maxFloat64AVX2(SB), NOSPLIT, $0-32
	PAIRWISE(FMAXPD, VMAXPD)

// func minFloat64AVX2(dst, a, b *byte, n int)
TEXT ·minFloat64AVX2(SB), NOSPLIT, $0-32
	PAIRWISE(FMINPD, VMINPD)

// func maxInt64AVX2(dst, a, b *byte, n int)
TEXT ·maxInt64AVX2(SB), NOSPLIT, $0-32
	PAIRWISE(MAXQ, VPCMPGTQ)

// func minInt64AVX2(dst, a, b *byte, n int)
TEXT ·minInt64AVX2(SB), NOSPLIT, $0-32
	PAIRWISE(MINQ, VPCMPGTQ)

// func maxFloat32ManyAVX2(dst, dst2 *byte, srcs **byte, nsrc, n int)
TEXT ·maxFloat32ManyAVX2(SB), NOSPLIT, $0-40
	MANY(FMAXPS, VMAXPS)

// func minFloat32ManyAVX2(dst, dst2 *byte, srcs **byte, nsrc, n int)
TEXT ·minFloat32ManyAVX2(SB), NOSPLIT, $0-40
	MANY(FMINPS, VMINPS)

// func maxFloat64ManyAVX2(dst, dst2 *byte, srcs **byte, nsrc, n int)
TEXT ·maxFloat64ManyAVX2(SB), NOSPLIT, $0-40
	MANY(FMAXPD, VMAXPD)

// func minFloat64ManyAVX2(dst, dst2 *byte, srcs **byte, nsrc, n int)
TEXT ·minFloat64ManyAVX2(SB), NOSPLIT, $0-40
	MANY(FMINPD, VMINPD)

// func maxInt64ManyAVX2(dst, dst2 *byte, srcs **byte, nsrc, n int)
TEXT ·maxInt64ManyAVX2(SB), NOSPLIT, $0-40
	MANY(MAXQ, VPCMPGTQ)

// func minInt64ManyAVX2(dst, dst2 *byte, srcs **byte, nsrc, n int)
TEXT ·minInt64ManyAVX2(SB), NOSPLIT, $0-40
	MANY(MINQ, VPCMPGTQ)

// The half-precision kernels: dst = narrow(widen(a) op widen(b)) over n
// bytes (a multiple of 32), 16 elements per iteration, exactly as the
// scalar loops compute it (kernels.go: combineHalf).

// The constants of bfloat16 rounding (Float32ToBFloat16): round to
// nearest even by adding 0x7fff plus the kept part's lowest bit; NaNs
// (magnitude above 0x7f800000) keep their top bits, made quiet (0x40).
DATA bf16consts<>+0(SB)/4, $0x00007fff
DATA bf16consts<>+4(SB)/4, $0x00000001
DATA bf16consts<>+8(SB)/4, $0x7fffffff
DATA bf16consts<>+12(SB)/4, $0x7f800000
DATA bf16consts<>+16(SB)/4, $0x00000040
GLOBL bf16consts<>(SB), RODATA|NOPTR, $20

// BF16WIDEN loads 8 bfloat16 at addr into the float32s of y.
#define BF16WIDEN(addr, y) \
	VPMOVZXWD addr, y; \
	VPSLLD    $16, y, y

// BF16NARROW rounds the float32s of y to bfloat16, each in the low half
// of its 32-bit lane; t1, t2, t3 are scratch.
#define BF16NARROW(y, t1, t2, t3) \
	VPSRLD    $16, y, t1; \
	VPAND     Y9, t1, t2; \
	VPADDD    Y8, t2, t2; \
	VPADDD    t2, y, t2; \
	VPSRLD    $16, t2, t2; \
	VPAND     Y10, y, t3; \
	VPCMPGTD  Y11, t3, t3; \
	VPOR      Y12, t1, t1; \
	VPBLENDVB t3, t1, t2, y

// func addBFloat16AVX2(dst, a, b *byte, n int)
TEXT ·addBFloat16AVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ n+24(FP), CX
	SHRQ $5, CX
	JZ   done
	VPBROADCASTD bf16consts<>+0(SB), Y8
	VPBROADCASTD bf16consts<>+4(SB), Y9
	VPBROADCASTD bf16consts<>+8(SB), Y10
	VPBROADCASTD bf16consts<>+12(SB), Y11
	VPBROADCASTD bf16consts<>+16(SB), Y12

loop:
	BF16WIDEN(0(SI), Y0)
	BF16WIDEN(16(SI), Y1)
	BF16WIDEN(0(DX), Y2)
	BF16WIDEN(16(DX), Y3)
	VADDPS Y2, Y0, Y0
	VADDPS Y3, Y1, Y1
	BF16NARROW(Y0, Y4, Y5, Y6)
	BF16NARROW(Y1, Y4, Y5, Y6)
	VPACKUSDW Y1, Y0, Y0
	VPERMQ    $0xD8, Y0, Y0
	VMOVDQU   Y0, 0(DI)
	ADDQ $32, SI
	ADDQ $32, DX
	ADDQ $32, DI
	DECQ CX
	JNZ  loop
	VZEROUPPER

done:
	RET

// func mulBFloat16AVX2(dst, a, b *byte, n int)
TEXT ·mulBFloat16AVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ n+24(FP), CX
	SHRQ $5, CX
	JZ   done
	VPBROADCASTD bf16consts<>+0(SB), Y8
	VPBROADCASTD bf16consts<>+4(SB), Y9
	VPBROADCASTD bf16consts<>+8(SB), Y10
	VPBROADCASTD bf16consts<>+12(SB), Y11
	VPBROADCASTD bf16consts<>+16(SB), Y12

loop:
	BF16WIDEN(0(SI), Y0)
	BF16WIDEN(16(SI), Y1)
	BF16WIDEN(0(DX), Y2)
	BF16WIDEN(16(DX), Y3)
	VMULPS Y2, Y0, Y0
	VMULPS Y3, Y1, Y1
	BF16NARROW(Y0, Y4, Y5, Y6)
	BF16NARROW(Y1, Y4, Y5, Y6)
	VPACKUSDW Y1, Y0, Y0
	VPERMQ    $0xD8, Y0, Y0
	VMOVDQU   Y0, 0(DI)
	ADDQ $32, SI
	ADDQ $32, DX
	ADDQ $32, DI
	DECQ CX
	JNZ  loop
	VZEROUPPER

done:
	RET

// func addFloat16F16C(dst, a, b *byte, n int)
TEXT ·addFloat16F16C(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ n+24(FP), CX
	SHRQ $5, CX
	JZ   done

loop:
	VCVTPH2PS 0(SI), Y0
	VCVTPH2PS 16(SI), Y1
	VCVTPH2PS 0(DX), Y2
	VCVTPH2PS 16(DX), Y3
	VADDPS Y2, Y0, Y0
	VADDPS Y3, Y1, Y1
	VCVTPS2PH $0, Y0, 0(DI)
	VCVTPS2PH $0, Y1, 16(DI)
	ADDQ $32, SI
	ADDQ $32, DX
	ADDQ $32, DI
	DECQ CX
	JNZ  loop
	VZEROUPPER

done:
	RET

// func mulFloat16F16C(dst, a, b *byte, n int)
TEXT ·mulFloat16F16C(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ n+24(FP), CX
	SHRQ $5, CX
	JZ   done

loop:
	VCVTPH2PS 0(SI), Y0
	VCVTPH2PS 16(SI), Y1
	VCVTPH2PS 0(DX), Y2
	VCVTPH2PS 16(DX), Y3
	VMULPS Y2, Y0, Y0
	VMULPS Y3, Y1, Y1
	VCVTPS2PH $0, Y0, 0(DI)
	VCVTPS2PH $0, Y1, 16(DI)
	ADDQ $32, SI
	ADDQ $32, DX
	ADDQ $32, DI
	DECQ CX
	JNZ  loop
	VZEROUPPER

done:
	RET
