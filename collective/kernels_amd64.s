//go:build amd64 && !purego

#include "textflag.h"

// The AVX2 kernels of kernels_amd64.go, one loop each: dst = a op b over
// n bytes, n a multiple of 128, four 32-byte vectors per iteration. a is
// the first source operand, so a NaN result carries a's payload when both
// operands are NaN (the scalar loops carry either: Go leaves it to the
// compiler).

// func addFloat32AVX2(dst, a, b *byte, n int)
TEXT ·addFloat32AVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ n+24(FP), CX
	SHRQ $7, CX
	JZ   done

loop:
	VMOVDQU 0(SI), Y0
	VMOVDQU 32(SI), Y1
	VMOVDQU 64(SI), Y2
	VMOVDQU 96(SI), Y3
	VADDPS 0(DX), Y0, Y0
	VADDPS 32(DX), Y1, Y1
	VADDPS 64(DX), Y2, Y2
	VADDPS 96(DX), Y3, Y3
	VMOVDQU Y0, 0(DI)
	VMOVDQU Y1, 32(DI)
	VMOVDQU Y2, 64(DI)
	VMOVDQU Y3, 96(DI)
	ADDQ $128, SI
	ADDQ $128, DX
	ADDQ $128, DI
	DECQ CX
	JNZ  loop
	VZEROUPPER

done:
	RET

// func addFloat64AVX2(dst, a, b *byte, n int)
TEXT ·addFloat64AVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ n+24(FP), CX
	SHRQ $7, CX
	JZ   done

loop:
	VMOVDQU 0(SI), Y0
	VMOVDQU 32(SI), Y1
	VMOVDQU 64(SI), Y2
	VMOVDQU 96(SI), Y3
	VADDPD 0(DX), Y0, Y0
	VADDPD 32(DX), Y1, Y1
	VADDPD 64(DX), Y2, Y2
	VADDPD 96(DX), Y3, Y3
	VMOVDQU Y0, 0(DI)
	VMOVDQU Y1, 32(DI)
	VMOVDQU Y2, 64(DI)
	VMOVDQU Y3, 96(DI)
	ADDQ $128, SI
	ADDQ $128, DX
	ADDQ $128, DI
	DECQ CX
	JNZ  loop
	VZEROUPPER

done:
	RET

// func mulFloat32AVX2(dst, a, b *byte, n int)
TEXT ·mulFloat32AVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ n+24(FP), CX
	SHRQ $7, CX
	JZ   done

loop:
	VMOVDQU 0(SI), Y0
	VMOVDQU 32(SI), Y1
	VMOVDQU 64(SI), Y2
	VMOVDQU 96(SI), Y3
	VMULPS 0(DX), Y0, Y0
	VMULPS 32(DX), Y1, Y1
	VMULPS 64(DX), Y2, Y2
	VMULPS 96(DX), Y3, Y3
	VMOVDQU Y0, 0(DI)
	VMOVDQU Y1, 32(DI)
	VMOVDQU Y2, 64(DI)
	VMOVDQU Y3, 96(DI)
	ADDQ $128, SI
	ADDQ $128, DX
	ADDQ $128, DI
	DECQ CX
	JNZ  loop
	VZEROUPPER

done:
	RET

// func mulFloat64AVX2(dst, a, b *byte, n int)
TEXT ·mulFloat64AVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ n+24(FP), CX
	SHRQ $7, CX
	JZ   done

loop:
	VMOVDQU 0(SI), Y0
	VMOVDQU 32(SI), Y1
	VMOVDQU 64(SI), Y2
	VMOVDQU 96(SI), Y3
	VMULPD 0(DX), Y0, Y0
	VMULPD 32(DX), Y1, Y1
	VMULPD 64(DX), Y2, Y2
	VMULPD 96(DX), Y3, Y3
	VMOVDQU Y0, 0(DI)
	VMOVDQU Y1, 32(DI)
	VMOVDQU Y2, 64(DI)
	VMOVDQU Y3, 96(DI)
	ADDQ $128, SI
	ADDQ $128, DX
	ADDQ $128, DI
	DECQ CX
	JNZ  loop
	VZEROUPPER

done:
	RET

// func addInt8AVX2(dst, a, b *byte, n int)
TEXT ·addInt8AVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ n+24(FP), CX
	SHRQ $7, CX
	JZ   done

loop:
	VMOVDQU 0(SI), Y0
	VMOVDQU 32(SI), Y1
	VMOVDQU 64(SI), Y2
	VMOVDQU 96(SI), Y3
	VPADDB 0(DX), Y0, Y0
	VPADDB 32(DX), Y1, Y1
	VPADDB 64(DX), Y2, Y2
	VPADDB 96(DX), Y3, Y3
	VMOVDQU Y0, 0(DI)
	VMOVDQU Y1, 32(DI)
	VMOVDQU Y2, 64(DI)
	VMOVDQU Y3, 96(DI)
	ADDQ $128, SI
	ADDQ $128, DX
	ADDQ $128, DI
	DECQ CX
	JNZ  loop
	VZEROUPPER

done:
	RET

// func addInt32AVX2(dst, a, b *byte, n int)
TEXT ·addInt32AVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ n+24(FP), CX
	SHRQ $7, CX
	JZ   done

loop:
	VMOVDQU 0(SI), Y0
	VMOVDQU 32(SI), Y1
	VMOVDQU 64(SI), Y2
	VMOVDQU 96(SI), Y3
	VPADDD 0(DX), Y0, Y0
	VPADDD 32(DX), Y1, Y1
	VPADDD 64(DX), Y2, Y2
	VPADDD 96(DX), Y3, Y3
	VMOVDQU Y0, 0(DI)
	VMOVDQU Y1, 32(DI)
	VMOVDQU Y2, 64(DI)
	VMOVDQU Y3, 96(DI)
	ADDQ $128, SI
	ADDQ $128, DX
	ADDQ $128, DI
	DECQ CX
	JNZ  loop
	VZEROUPPER

done:
	RET

// func addInt64AVX2(dst, a, b *byte, n int)
TEXT ·addInt64AVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ n+24(FP), CX
	SHRQ $7, CX
	JZ   done

loop:
	VMOVDQU 0(SI), Y0
	VMOVDQU 32(SI), Y1
	VMOVDQU 64(SI), Y2
	VMOVDQU 96(SI), Y3
	VPADDQ 0(DX), Y0, Y0
	VPADDQ 32(DX), Y1, Y1
	VPADDQ 64(DX), Y2, Y2
	VPADDQ 96(DX), Y3, Y3
	VMOVDQU Y0, 0(DI)
	VMOVDQU Y1, 32(DI)
	VMOVDQU Y2, 64(DI)
	VMOVDQU Y3, 96(DI)
	ADDQ $128, SI
	ADDQ $128, DX
	ADDQ $128, DI
	DECQ CX
	JNZ  loop
	VZEROUPPER

done:
	RET

// func mulInt32AVX2(dst, a, b *byte, n int)
TEXT ·mulInt32AVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ n+24(FP), CX
	SHRQ $7, CX
	JZ   done

loop:
	VMOVDQU 0(SI), Y0
	VMOVDQU 32(SI), Y1
	VMOVDQU 64(SI), Y2
	VMOVDQU 96(SI), Y3
	VPMULLD 0(DX), Y0, Y0
	VPMULLD 32(DX), Y1, Y1
	VPMULLD 64(DX), Y2, Y2
	VPMULLD 96(DX), Y3, Y3
	VMOVDQU Y0, 0(DI)
	VMOVDQU Y1, 32(DI)
	VMOVDQU Y2, 64(DI)
	VMOVDQU Y3, 96(DI)
	ADDQ $128, SI
	ADDQ $128, DX
	ADDQ $128, DI
	DECQ CX
	JNZ  loop
	VZEROUPPER

done:
	RET

// func maxInt8AVX2(dst, a, b *byte, n int)
TEXT ·maxInt8AVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ n+24(FP), CX
	SHRQ $7, CX
	JZ   done

loop:
	VMOVDQU 0(SI), Y0
	VMOVDQU 32(SI), Y1
	VMOVDQU 64(SI), Y2
	VMOVDQU 96(SI), Y3
	VPMAXSB 0(DX), Y0, Y0
	VPMAXSB 32(DX), Y1, Y1
	VPMAXSB 64(DX), Y2, Y2
	VPMAXSB 96(DX), Y3, Y3
	VMOVDQU Y0, 0(DI)
	VMOVDQU Y1, 32(DI)
	VMOVDQU Y2, 64(DI)
	VMOVDQU Y3, 96(DI)
	ADDQ $128, SI
	ADDQ $128, DX
	ADDQ $128, DI
	DECQ CX
	JNZ  loop
	VZEROUPPER

done:
	RET

// func minInt8AVX2(dst, a, b *byte, n int)
TEXT ·minInt8AVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ n+24(FP), CX
	SHRQ $7, CX
	JZ   done

loop:
	VMOVDQU 0(SI), Y0
	VMOVDQU 32(SI), Y1
	VMOVDQU 64(SI), Y2
	VMOVDQU 96(SI), Y3
	VPMINSB 0(DX), Y0, Y0
	VPMINSB 32(DX), Y1, Y1
	VPMINSB 64(DX), Y2, Y2
	VPMINSB 96(DX), Y3, Y3
	VMOVDQU Y0, 0(DI)
	VMOVDQU Y1, 32(DI)
	VMOVDQU Y2, 64(DI)
	VMOVDQU Y3, 96(DI)
	ADDQ $128, SI
	ADDQ $128, DX
	ADDQ $128, DI
	DECQ CX
	JNZ  loop
	VZEROUPPER

done:
	RET

// func maxUint8AVX2(dst, a, b *byte, n int)
TEXT ·maxUint8AVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ n+24(FP), CX
	SHRQ $7, CX
	JZ   done

loop:
	VMOVDQU 0(SI), Y0
	VMOVDQU 32(SI), Y1
	VMOVDQU 64(SI), Y2
	VMOVDQU 96(SI), Y3
	VPMAXUB 0(DX), Y0, Y0
	VPMAXUB 32(DX), Y1, Y1
	VPMAXUB 64(DX), Y2, Y2
	VPMAXUB 96(DX), Y3, Y3
	VMOVDQU Y0, 0(DI)
	VMOVDQU Y1, 32(DI)
	VMOVDQU Y2, 64(DI)
	VMOVDQU Y3, 96(DI)
	ADDQ $128, SI
	ADDQ $128, DX
	ADDQ $128, DI
	DECQ CX
	JNZ  loop
	VZEROUPPER

done:
	RET

// func minUint8AVX2(dst, a, b *byte, n int)
TEXT ·minUint8AVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ n+24(FP), CX
	SHRQ $7, CX
	JZ   done

loop:
	VMOVDQU 0(SI), Y0
	VMOVDQU 32(SI), Y1
	VMOVDQU 64(SI), Y2
	VMOVDQU 96(SI), Y3
	VPMINUB 0(DX), Y0, Y0
	VPMINUB 32(DX), Y1, Y1
	VPMINUB 64(DX), Y2, Y2
	VPMINUB 96(DX), Y3, Y3
	VMOVDQU Y0, 0(DI)
	VMOVDQU Y1, 32(DI)
	VMOVDQU Y2, 64(DI)
	VMOVDQU Y3, 96(DI)
	ADDQ $128, SI
	ADDQ $128, DX
	ADDQ $128, DI
	DECQ CX
	JNZ  loop
	VZEROUPPER

done:
	RET

// func maxInt32AVX2(dst, a, b *byte, n int)
TEXT ·maxInt32AVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ n+24(FP), CX
	SHRQ $7, CX
	JZ   done

loop:
	VMOVDQU 0(SI), Y0
	VMOVDQU 32(SI), Y1
	VMOVDQU 64(SI), Y2
	VMOVDQU 96(SI), Y3
	VPMAXSD 0(DX), Y0, Y0
	VPMAXSD 32(DX), Y1, Y1
	VPMAXSD 64(DX), Y2, Y2
	VPMAXSD 96(DX), Y3, Y3
	VMOVDQU Y0, 0(DI)
	VMOVDQU Y1, 32(DI)
	VMOVDQU Y2, 64(DI)
	VMOVDQU Y3, 96(DI)
	ADDQ $128, SI
	ADDQ $128, DX
	ADDQ $128, DI
	DECQ CX
	JNZ  loop
	VZEROUPPER

done:
	RET

// func minInt32AVX2(dst, a, b *byte, n int)
TEXT ·minInt32AVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ n+24(FP), CX
	SHRQ $7, CX
	JZ   done

loop:
	VMOVDQU 0(SI), Y0
	VMOVDQU 32(SI), Y1
	VMOVDQU 64(SI), Y2
	VMOVDQU 96(SI), Y3
	VPMINSD 0(DX), Y0, Y0
	VPMINSD 32(DX), Y1, Y1
	VPMINSD 64(DX), Y2, Y2
	VPMINSD 96(DX), Y3, Y3
	VMOVDQU Y0, 0(DI)
	VMOVDQU Y1, 32(DI)
	VMOVDQU Y2, 64(DI)
	VMOVDQU Y3, 96(DI)
	ADDQ $128, SI
	ADDQ $128, DX
	ADDQ $128, DI
	DECQ CX
	JNZ  loop
	VZEROUPPER

done:
	RET

// func andBytesAVX2(dst, a, b *byte, n int)
TEXT ·andBytesAVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ n+24(FP), CX
	SHRQ $7, CX
	JZ   done

loop:
	VMOVDQU 0(SI), Y0
	VMOVDQU 32(SI), Y1
	VMOVDQU 64(SI), Y2
	VMOVDQU 96(SI), Y3
	VPAND 0(DX), Y0, Y0
	VPAND 32(DX), Y1, Y1
	VPAND 64(DX), Y2, Y2
	VPAND 96(DX), Y3, Y3
	VMOVDQU Y0, 0(DI)
	VMOVDQU Y1, 32(DI)
	VMOVDQU Y2, 64(DI)
	VMOVDQU Y3, 96(DI)
	ADDQ $128, SI
	ADDQ $128, DX
	ADDQ $128, DI
	DECQ CX
	JNZ  loop
	VZEROUPPER

done:
	RET

// func orBytesAVX2(dst, a, b *byte, n int)
TEXT ·orBytesAVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ n+24(FP), CX
	SHRQ $7, CX
	JZ   done

loop:
	VMOVDQU 0(SI), Y0
	VMOVDQU 32(SI), Y1
	VMOVDQU 64(SI), Y2
	VMOVDQU 96(SI), Y3
	VPOR 0(DX), Y0, Y0
	VPOR 32(DX), Y1, Y1
	VPOR 64(DX), Y2, Y2
	VPOR 96(DX), Y3, Y3
	VMOVDQU Y0, 0(DI)
	VMOVDQU Y1, 32(DI)
	VMOVDQU Y2, 64(DI)
	VMOVDQU Y3, 96(DI)
	ADDQ $128, SI
	ADDQ $128, DX
	ADDQ $128, DI
	DECQ CX
	JNZ  loop
	VZEROUPPER

done:
	RET

// func xorBytesAVX2(dst, a, b *byte, n int)
TEXT ·xorBytesAVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ n+24(FP), CX
	SHRQ $7, CX
	JZ   done

loop:
	VMOVDQU 0(SI), Y0
	VMOVDQU 32(SI), Y1
	VMOVDQU 64(SI), Y2
	VMOVDQU 96(SI), Y3
	VPXOR 0(DX), Y0, Y0
	VPXOR 32(DX), Y1, Y1
	VPXOR 64(DX), Y2, Y2
	VPXOR 96(DX), Y3, Y3
	VMOVDQU Y0, 0(DI)
	VMOVDQU Y1, 32(DI)
	VMOVDQU Y2, 64(DI)
	VMOVDQU Y3, 96(DI)
	ADDQ $128, SI
	ADDQ $128, DX
	ADDQ $128, DI
	DECQ CX
	JNZ  loop
	VZEROUPPER

done:
	RET

// The many-operand kernels: dst = ((srcs[0] op srcs[1]) op srcs[2]) ...
// over n bytes (a multiple of 128), nsrc >= 1 operands, in one pass; the
// result also goes to dst2 unless it is nil. The partial result is the
// first source operand of each step, as in the scalar loops.

// func addFloat32ManyAVX2(dst, dst2 *byte, srcs **byte, nsrc, n int)
TEXT ·addFloat32ManyAVX2(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ dst2+8(FP), BX
	MOVQ srcs+16(FP), SI
	MOVQ nsrc+24(FP), CX
	MOVQ n+32(FP), DX
	XORQ R8, R8
	TESTQ DX, DX
	JZ   done

block:
	MOVQ 0(SI), R9
	VMOVDQU 0(R9)(R8*1), Y0
	VMOVDQU 32(R9)(R8*1), Y1
	VMOVDQU 64(R9)(R8*1), Y2
	VMOVDQU 96(R9)(R8*1), Y3
	MOVQ $1, R10

operand:
	CMPQ R10, CX
	JEQ  store
	MOVQ 0(SI)(R10*8), R9
	VADDPS 0(R9)(R8*1), Y0, Y0
	VADDPS 32(R9)(R8*1), Y1, Y1
	VADDPS 64(R9)(R8*1), Y2, Y2
	VADDPS 96(R9)(R8*1), Y3, Y3
	INCQ R10
	JMP  operand

store:
	VMOVDQU Y0, 0(DI)(R8*1)
	VMOVDQU Y1, 32(DI)(R8*1)
	VMOVDQU Y2, 64(DI)(R8*1)
	VMOVDQU Y3, 96(DI)(R8*1)
	TESTQ BX, BX
	JZ   next
	VMOVDQU Y0, 0(BX)(R8*1)
	VMOVDQU Y1, 32(BX)(R8*1)
	VMOVDQU Y2, 64(BX)(R8*1)
	VMOVDQU Y3, 96(BX)(R8*1)

next:
	ADDQ $128, R8
	CMPQ R8, DX
	JNE  block
	VZEROUPPER

done:
	RET

// func addFloat64ManyAVX2(dst, dst2 *byte, srcs **byte, nsrc, n int)
TEXT ·addFloat64ManyAVX2(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ dst2+8(FP), BX
	MOVQ srcs+16(FP), SI
	MOVQ nsrc+24(FP), CX
	MOVQ n+32(FP), DX
	XORQ R8, R8
	TESTQ DX, DX
	JZ   done

block:
	MOVQ 0(SI), R9
	VMOVDQU 0(R9)(R8*1), Y0
	VMOVDQU 32(R9)(R8*1), Y1
	VMOVDQU 64(R9)(R8*1), Y2
	VMOVDQU 96(R9)(R8*1), Y3
	MOVQ $1, R10

operand:
	CMPQ R10, CX
	JEQ  store
	MOVQ 0(SI)(R10*8), R9
	VADDPD 0(R9)(R8*1), Y0, Y0
	VADDPD 32(R9)(R8*1), Y1, Y1
	VADDPD 64(R9)(R8*1), Y2, Y2
	VADDPD 96(R9)(R8*1), Y3, Y3
	INCQ R10
	JMP  operand

store:
	VMOVDQU Y0, 0(DI)(R8*1)
	VMOVDQU Y1, 32(DI)(R8*1)
	VMOVDQU Y2, 64(DI)(R8*1)
	VMOVDQU Y3, 96(DI)(R8*1)
	TESTQ BX, BX
	JZ   next
	VMOVDQU Y0, 0(BX)(R8*1)
	VMOVDQU Y1, 32(BX)(R8*1)
	VMOVDQU Y2, 64(BX)(R8*1)
	VMOVDQU Y3, 96(BX)(R8*1)

next:
	ADDQ $128, R8
	CMPQ R8, DX
	JNE  block
	VZEROUPPER

done:
	RET

// func mulFloat32ManyAVX2(dst, dst2 *byte, srcs **byte, nsrc, n int)
TEXT ·mulFloat32ManyAVX2(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ dst2+8(FP), BX
	MOVQ srcs+16(FP), SI
	MOVQ nsrc+24(FP), CX
	MOVQ n+32(FP), DX
	XORQ R8, R8
	TESTQ DX, DX
	JZ   done

block:
	MOVQ 0(SI), R9
	VMOVDQU 0(R9)(R8*1), Y0
	VMOVDQU 32(R9)(R8*1), Y1
	VMOVDQU 64(R9)(R8*1), Y2
	VMOVDQU 96(R9)(R8*1), Y3
	MOVQ $1, R10

operand:
	CMPQ R10, CX
	JEQ  store
	MOVQ 0(SI)(R10*8), R9
	VMULPS 0(R9)(R8*1), Y0, Y0
	VMULPS 32(R9)(R8*1), Y1, Y1
	VMULPS 64(R9)(R8*1), Y2, Y2
	VMULPS 96(R9)(R8*1), Y3, Y3
	INCQ R10
	JMP  operand

store:
	VMOVDQU Y0, 0(DI)(R8*1)
	VMOVDQU Y1, 32(DI)(R8*1)
	VMOVDQU Y2, 64(DI)(R8*1)
	VMOVDQU Y3, 96(DI)(R8*1)
	TESTQ BX, BX
	JZ   next
	VMOVDQU Y0, 0(BX)(R8*1)
	VMOVDQU Y1, 32(BX)(R8*1)
	VMOVDQU Y2, 64(BX)(R8*1)
	VMOVDQU Y3, 96(BX)(R8*1)

next:
	ADDQ $128, R8
	CMPQ R8, DX
	JNE  block
	VZEROUPPER

done:
	RET

// func mulFloat64ManyAVX2(dst, dst2 *byte, srcs **byte, nsrc, n int)
TEXT ·mulFloat64ManyAVX2(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ dst2+8(FP), BX
	MOVQ srcs+16(FP), SI
	MOVQ nsrc+24(FP), CX
	MOVQ n+32(FP), DX
	XORQ R8, R8
	TESTQ DX, DX
	JZ   done

block:
	MOVQ 0(SI), R9
	VMOVDQU 0(R9)(R8*1), Y0
	VMOVDQU 32(R9)(R8*1), Y1
	VMOVDQU 64(R9)(R8*1), Y2
	VMOVDQU 96(R9)(R8*1), Y3
	MOVQ $1, R10

operand:
	CMPQ R10, CX
	JEQ  store
	MOVQ 0(SI)(R10*8), R9
	VMULPD 0(R9)(R8*1), Y0, Y0
	VMULPD 32(R9)(R8*1), Y1, Y1
	VMULPD 64(R9)(R8*1), Y2, Y2
	VMULPD 96(R9)(R8*1), Y3, Y3
	INCQ R10
	JMP  operand

store:
	VMOVDQU Y0, 0(DI)(R8*1)
	VMOVDQU Y1, 32(DI)(R8*1)
	VMOVDQU Y2, 64(DI)(R8*1)
	VMOVDQU Y3, 96(DI)(R8*1)
	TESTQ BX, BX
	JZ   next
	VMOVDQU Y0, 0(BX)(R8*1)
	VMOVDQU Y1, 32(BX)(R8*1)
	VMOVDQU Y2, 64(BX)(R8*1)
	VMOVDQU Y3, 96(BX)(R8*1)

next:
	ADDQ $128, R8
	CMPQ R8, DX
	JNE  block
	VZEROUPPER

done:
	RET

// func addInt8ManyAVX2(dst, dst2 *byte, srcs **byte, nsrc, n int)
TEXT ·addInt8ManyAVX2(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ dst2+8(FP), BX
	MOVQ srcs+16(FP), SI
	MOVQ nsrc+24(FP), CX
	MOVQ n+32(FP), DX
	XORQ R8, R8
	TESTQ DX, DX
	JZ   done

block:
	MOVQ 0(SI), R9
	VMOVDQU 0(R9)(R8*1), Y0
	VMOVDQU 32(R9)(R8*1), Y1
	VMOVDQU 64(R9)(R8*1), Y2
	VMOVDQU 96(R9)(R8*1), Y3
	MOVQ $1, R10

operand:
	CMPQ R10, CX
	JEQ  store
	MOVQ 0(SI)(R10*8), R9
	VPADDB 0(R9)(R8*1), Y0, Y0
	VPADDB 32(R9)(R8*1), Y1, Y1
	VPADDB 64(R9)(R8*1), Y2, Y2
	VPADDB 96(R9)(R8*1), Y3, Y3
	INCQ R10
	JMP  operand

store:
	VMOVDQU Y0, 0(DI)(R8*1)
	VMOVDQU Y1, 32(DI)(R8*1)
	VMOVDQU Y2, 64(DI)(R8*1)
	VMOVDQU Y3, 96(DI)(R8*1)
	TESTQ BX, BX
	JZ   next
	VMOVDQU Y0, 0(BX)(R8*1)
	VMOVDQU Y1, 32(BX)(R8*1)
	VMOVDQU Y2, 64(BX)(R8*1)
	VMOVDQU Y3, 96(BX)(R8*1)

next:
	ADDQ $128, R8
	CMPQ R8, DX
	JNE  block
	VZEROUPPER

done:
	RET

// func addInt32ManyAVX2(dst, dst2 *byte, srcs **byte, nsrc, n int)
TEXT ·addInt32ManyAVX2(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ dst2+8(FP), BX
	MOVQ srcs+16(FP), SI
	MOVQ nsrc+24(FP), CX
	MOVQ n+32(FP), DX
	XORQ R8, R8
	TESTQ DX, DX
	JZ   done

block:
	MOVQ 0(SI), R9
	VMOVDQU 0(R9)(R8*1), Y0
	VMOVDQU 32(R9)(R8*1), Y1
	VMOVDQU 64(R9)(R8*1), Y2
	VMOVDQU 96(R9)(R8*1), Y3
	MOVQ $1, R10

operand:
	CMPQ R10, CX
	JEQ  store
	MOVQ 0(SI)(R10*8), R9
	VPADDD 0(R9)(R8*1), Y0, Y0
	VPADDD 32(R9)(R8*1), Y1, Y1
	VPADDD 64(R9)(R8*1), Y2, Y2
	VPADDD 96(R9)(R8*1), Y3, Y3
	INCQ R10
	JMP  operand

store:
	VMOVDQU Y0, 0(DI)(R8*1)
	VMOVDQU Y1, 32(DI)(R8*1)
	VMOVDQU Y2, 64(DI)(R8*1)
	VMOVDQU Y3, 96(DI)(R8*1)
	TESTQ BX, BX
	JZ   next
	VMOVDQU Y0, 0(BX)(R8*1)
	VMOVDQU Y1, 32(BX)(R8*1)
	VMOVDQU Y2, 64(BX)(R8*1)
	VMOVDQU Y3, 96(BX)(R8*1)

next:
	ADDQ $128, R8
	CMPQ R8, DX
	JNE  block
	VZEROUPPER

done:
	RET

// func addInt64ManyAVX2(dst, dst2 *byte, srcs **byte, nsrc, n int)
TEXT ·addInt64ManyAVX2(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ dst2+8(FP), BX
	MOVQ srcs+16(FP), SI
	MOVQ nsrc+24(FP), CX
	MOVQ n+32(FP), DX
	XORQ R8, R8
	TESTQ DX, DX
	JZ   done

block:
	MOVQ 0(SI), R9
	VMOVDQU 0(R9)(R8*1), Y0
	VMOVDQU 32(R9)(R8*1), Y1
	VMOVDQU 64(R9)(R8*1), Y2
	VMOVDQU 96(R9)(R8*1), Y3
	MOVQ $1, R10

operand:
	CMPQ R10, CX
	JEQ  store
	MOVQ 0(SI)(R10*8), R9
	VPADDQ 0(R9)(R8*1), Y0, Y0
	VPADDQ 32(R9)(R8*1), Y1, Y1
	VPADDQ 64(R9)(R8*1), Y2, Y2
	VPADDQ 96(R9)(R8*1), Y3, Y3
	INCQ R10
	JMP  operand

store:
	VMOVDQU Y0, 0(DI)(R8*1)
	VMOVDQU Y1, 32(DI)(R8*1)
	VMOVDQU Y2, 64(DI)(R8*1)
	VMOVDQU Y3, 96(DI)(R8*1)
	TESTQ BX, BX
	JZ   next
	VMOVDQU Y0, 0(BX)(R8*1)
	VMOVDQU Y1, 32(BX)(R8*1)
	VMOVDQU Y2, 64(BX)(R8*1)
	VMOVDQU Y3, 96(BX)(R8*1)

next:
	ADDQ $128, R8
	CMPQ R8, DX
	JNE  block
	VZEROUPPER

done:
	RET

// func mulInt32ManyAVX2(dst, dst2 *byte, srcs **byte, nsrc, n int)
TEXT ·mulInt32ManyAVX2(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ dst2+8(FP), BX
	MOVQ srcs+16(FP), SI
	MOVQ nsrc+24(FP), CX
	MOVQ n+32(FP), DX
	XORQ R8, R8
	TESTQ DX, DX
	JZ   done

block:
	MOVQ 0(SI), R9
	VMOVDQU 0(R9)(R8*1), Y0
	VMOVDQU 32(R9)(R8*1), Y1
	VMOVDQU 64(R9)(R8*1), Y2
	VMOVDQU 96(R9)(R8*1), Y3
	MOVQ $1, R10

operand:
	CMPQ R10, CX
	JEQ  store
	MOVQ 0(SI)(R10*8), R9
	VPMULLD 0(R9)(R8*1), Y0, Y0
	VPMULLD 32(R9)(R8*1), Y1, Y1
	VPMULLD 64(R9)(R8*1), Y2, Y2
	VPMULLD 96(R9)(R8*1), Y3, Y3
	INCQ R10
	JMP  operand

store:
	VMOVDQU Y0, 0(DI)(R8*1)
	VMOVDQU Y1, 32(DI)(R8*1)
	VMOVDQU Y2, 64(DI)(R8*1)
	VMOVDQU Y3, 96(DI)(R8*1)
	TESTQ BX, BX
	JZ   next
	VMOVDQU Y0, 0(BX)(R8*1)
	VMOVDQU Y1, 32(BX)(R8*1)
	VMOVDQU Y2, 64(BX)(R8*1)
	VMOVDQU Y3, 96(BX)(R8*1)

next:
	ADDQ $128, R8
	CMPQ R8, DX
	JNE  block
	VZEROUPPER

done:
	RET

// func maxInt8ManyAVX2(dst, dst2 *byte, srcs **byte, nsrc, n int)
TEXT ·maxInt8ManyAVX2(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ dst2+8(FP), BX
	MOVQ srcs+16(FP), SI
	MOVQ nsrc+24(FP), CX
	MOVQ n+32(FP), DX
	XORQ R8, R8
	TESTQ DX, DX
	JZ   done

block:
	MOVQ 0(SI), R9
	VMOVDQU 0(R9)(R8*1), Y0
	VMOVDQU 32(R9)(R8*1), Y1
	VMOVDQU 64(R9)(R8*1), Y2
	VMOVDQU 96(R9)(R8*1), Y3
	MOVQ $1, R10

operand:
	CMPQ R10, CX
	JEQ  store
	MOVQ 0(SI)(R10*8), R9
	VPMAXSB 0(R9)(R8*1), Y0, Y0
	VPMAXSB 32(R9)(R8*1), Y1, Y1
	VPMAXSB 64(R9)(R8*1), Y2, Y2
	VPMAXSB 96(R9)(R8*1), Y3, Y3
	INCQ R10
	JMP  operand

store:
	VMOVDQU Y0, 0(DI)(R8*1)
	VMOVDQU Y1, 32(DI)(R8*1)
	VMOVDQU Y2, 64(DI)(R8*1)
	VMOVDQU Y3, 96(DI)(R8*1)
	TESTQ BX, BX
	JZ   next
	VMOVDQU Y0, 0(BX)(R8*1)
	VMOVDQU Y1, 32(BX)(R8*1)
	VMOVDQU Y2, 64(BX)(R8*1)
	VMOVDQU Y3, 96(BX)(R8*1)

next:
	ADDQ $128, R8
	CMPQ R8, DX
	JNE  block
	VZEROUPPER

done:
	RET

// func minInt8ManyAVX2(dst, dst2 *byte, srcs **byte, nsrc, n int)
TEXT ·minInt8ManyAVX2(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ dst2+8(FP), BX
	MOVQ srcs+16(FP), SI
	MOVQ nsrc+24(FP), CX
	MOVQ n+32(FP), DX
	XORQ R8, R8
	TESTQ DX, DX
	JZ   done

block:
	MOVQ 0(SI), R9
	VMOVDQU 0(R9)(R8*1), Y0
	VMOVDQU 32(R9)(R8*1), Y1
	VMOVDQU 64(R9)(R8*1), Y2
	VMOVDQU 96(R9)(R8*1), Y3
	MOVQ $1, R10

operand:
	CMPQ R10, CX
	JEQ  store
	MOVQ 0(SI)(R10*8), R9
	VPMINSB 0(R9)(R8*1), Y0, Y0
	VPMINSB 32(R9)(R8*1), Y1, Y1
	VPMINSB 64(R9)(R8*1), Y2, Y2
	VPMINSB 96(R9)(R8*1), Y3, Y3
	INCQ R10
	JMP  operand

store:
	VMOVDQU Y0, 0(DI)(R8*1)
	VMOVDQU Y1, 32(DI)(R8*1)
	VMOVDQU Y2, 64(DI)(R8*1)
	VMOVDQU Y3, 96(DI)(R8*1)
	TESTQ BX, BX
	JZ   next
	VMOVDQU Y0, 0(BX)(R8*1)
	VMOVDQU Y1, 32(BX)(R8*1)
	VMOVDQU Y2, 64(BX)(R8*1)
	VMOVDQU Y3, 96(BX)(R8*1)

next:
	ADDQ $128, R8
	CMPQ R8, DX
	JNE  block
	VZEROUPPER

done:
	RET

// func maxUint8ManyAVX2(dst, dst2 *byte, srcs **byte, nsrc, n int)
TEXT ·maxUint8ManyAVX2(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ dst2+8(FP), BX
	MOVQ srcs+16(FP), SI
	MOVQ nsrc+24(FP), CX
	MOVQ n+32(FP), DX
	XORQ R8, R8
	TESTQ DX, DX
	JZ   done

block:
	MOVQ 0(SI), R9
	VMOVDQU 0(R9)(R8*1), Y0
	VMOVDQU 32(R9)(R8*1), Y1
	VMOVDQU 64(R9)(R8*1), Y2
	VMOVDQU 96(R9)(R8*1), Y3
	MOVQ $1, R10

operand:
	CMPQ R10, CX
	JEQ  store
	MOVQ 0(SI)(R10*8), R9
	VPMAXUB 0(R9)(R8*1), Y0, Y0
	VPMAXUB 32(R9)(R8*1), Y1, Y1
	VPMAXUB 64(R9)(R8*1), Y2, Y2
	VPMAXUB 96(R9)(R8*1), Y3, Y3
	INCQ R10
	JMP  operand

store:
	VMOVDQU Y0, 0(DI)(R8*1)
	VMOVDQU Y1, 32(DI)(R8*1)
	VMOVDQU Y2, 64(DI)(R8*1)
	VMOVDQU Y3, 96(DI)(R8*1)
	TESTQ BX, BX
	JZ   next
	VMOVDQU Y0, 0(BX)(R8*1)
	VMOVDQU Y1, 32(BX)(R8*1)
	VMOVDQU Y2, 64(BX)(R8*1)
	VMOVDQU Y3, 96(BX)(R8*1)

next:
	ADDQ $128, R8
	CMPQ R8, DX
	JNE  block
	VZEROUPPER

done:
	RET

// func minUint8ManyAVX2(dst, dst2 *byte, srcs **byte, nsrc, n int)
TEXT ·minUint8ManyAVX2(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ dst2+8(FP), BX
	MOVQ srcs+16(FP), SI
	MOVQ nsrc+24(FP), CX
	MOVQ n+32(FP), DX
	XORQ R8, R8
	TESTQ DX, DX
	JZ   done

block:
	MOVQ 0(SI), R9
	VMOVDQU 0(R9)(R8*1), Y0
	VMOVDQU 32(R9)(R8*1), Y1
	VMOVDQU 64(R9)(R8*1), Y2
	VMOVDQU 96(R9)(R8*1), Y3
	MOVQ $1, R10

operand:
	CMPQ R10, CX
	JEQ  store
	MOVQ 0(SI)(R10*8), R9
	VPMINUB 0(R9)(R8*1), Y0, Y0
	VPMINUB 32(R9)(R8*1), Y1, Y1
	VPMINUB 64(R9)(R8*1), Y2, Y2
	VPMINUB 96(R9)(R8*1), Y3, Y3
	INCQ R10
	JMP  operand

store:
	VMOVDQU Y0, 0(DI)(R8*1)
	VMOVDQU Y1, 32(DI)(R8*1)
	VMOVDQU Y2, 64(DI)(R8*1)
	VMOVDQU Y3, 96(DI)(R8*1)
	TESTQ BX, BX
	JZ   next
	VMOVDQU Y0, 0(BX)(R8*1)
	VMOVDQU Y1, 32(BX)(R8*1)
	VMOVDQU Y2, 64(BX)(R8*1)
	VMOVDQU Y3, 96(BX)(R8*1)

next:
	ADDQ $128, R8
	CMPQ R8, DX
	JNE  block
	VZEROUPPER

done:
	RET

// func maxInt32ManyAVX2(dst, dst2 *byte, srcs **byte, nsrc, n int)
TEXT ·maxInt32ManyAVX2(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ dst2+8(FP), BX
	MOVQ srcs+16(FP), SI
	MOVQ nsrc+24(FP), CX
	MOVQ n+32(FP), DX
	XORQ R8, R8
	TESTQ DX, DX
	JZ   done

block:
	MOVQ 0(SI), R9
	VMOVDQU 0(R9)(R8*1), Y0
	VMOVDQU 32(R9)(R8*1), Y1
	VMOVDQU 64(R9)(R8*1), Y2
	VMOVDQU 96(R9)(R8*1), Y3
	MOVQ $1, R10

operand:
	CMPQ R10, CX
	JEQ  store
	MOVQ 0(SI)(R10*8), R9
	VPMAXSD 0(R9)(R8*1), Y0, Y0
	VPMAXSD 32(R9)(R8*1), Y1, Y1
	VPMAXSD 64(R9)(R8*1), Y2, Y2
	VPMAXSD 96(R9)(R8*1), Y3, Y3
	INCQ R10
	JMP  operand

store:
	VMOVDQU Y0, 0(DI)(R8*1)
	VMOVDQU Y1, 32(DI)(R8*1)
	VMOVDQU Y2, 64(DI)(R8*1)
	VMOVDQU Y3, 96(DI)(R8*1)
	TESTQ BX, BX
	JZ   next
	VMOVDQU Y0, 0(BX)(R8*1)
	VMOVDQU Y1, 32(BX)(R8*1)
	VMOVDQU Y2, 64(BX)(R8*1)
	VMOVDQU Y3, 96(BX)(R8*1)

next:
	ADDQ $128, R8
	CMPQ R8, DX
	JNE  block
	VZEROUPPER

done:
	RET

// func minInt32ManyAVX2(dst, dst2 *byte, srcs **byte, nsrc, n int)
TEXT ·minInt32ManyAVX2(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ dst2+8(FP), BX
	MOVQ srcs+16(FP), SI
	MOVQ nsrc+24(FP), CX
	MOVQ n+32(FP), DX
	XORQ R8, R8
	TESTQ DX, DX
	JZ   done

block:
	MOVQ 0(SI), R9
	VMOVDQU 0(R9)(R8*1), Y0
	VMOVDQU 32(R9)(R8*1), Y1
	VMOVDQU 64(R9)(R8*1), Y2
	VMOVDQU 96(R9)(R8*1), Y3
	MOVQ $1, R10

operand:
	CMPQ R10, CX
	JEQ  store
	MOVQ 0(SI)(R10*8), R9
	VPMINSD 0(R9)(R8*1), Y0, Y0
	VPMINSD 32(R9)(R8*1), Y1, Y1
	VPMINSD 64(R9)(R8*1), Y2, Y2
	VPMINSD 96(R9)(R8*1), Y3, Y3
	INCQ R10
	JMP  operand

store:
	VMOVDQU Y0, 0(DI)(R8*1)
	VMOVDQU Y1, 32(DI)(R8*1)
	VMOVDQU Y2, 64(DI)(R8*1)
	VMOVDQU Y3, 96(DI)(R8*1)
	TESTQ BX, BX
	JZ   next
	VMOVDQU Y0, 0(BX)(R8*1)
	VMOVDQU Y1, 32(BX)(R8*1)
	VMOVDQU Y2, 64(BX)(R8*1)
	VMOVDQU Y3, 96(BX)(R8*1)

next:
	ADDQ $128, R8
	CMPQ R8, DX
	JNE  block
	VZEROUPPER

done:
	RET

// func andBytesManyAVX2(dst, dst2 *byte, srcs **byte, nsrc, n int)
TEXT ·andBytesManyAVX2(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ dst2+8(FP), BX
	MOVQ srcs+16(FP), SI
	MOVQ nsrc+24(FP), CX
	MOVQ n+32(FP), DX
	XORQ R8, R8
	TESTQ DX, DX
	JZ   done

block:
	MOVQ 0(SI), R9
	VMOVDQU 0(R9)(R8*1), Y0
	VMOVDQU 32(R9)(R8*1), Y1
	VMOVDQU 64(R9)(R8*1), Y2
	VMOVDQU 96(R9)(R8*1), Y3
	MOVQ $1, R10

operand:
	CMPQ R10, CX
	JEQ  store
	MOVQ 0(SI)(R10*8), R9
	VPAND 0(R9)(R8*1), Y0, Y0
	VPAND 32(R9)(R8*1), Y1, Y1
	VPAND 64(R9)(R8*1), Y2, Y2
	VPAND 96(R9)(R8*1), Y3, Y3
	INCQ R10
	JMP  operand

store:
	VMOVDQU Y0, 0(DI)(R8*1)
	VMOVDQU Y1, 32(DI)(R8*1)
	VMOVDQU Y2, 64(DI)(R8*1)
	VMOVDQU Y3, 96(DI)(R8*1)
	TESTQ BX, BX
	JZ   next
	VMOVDQU Y0, 0(BX)(R8*1)
	VMOVDQU Y1, 32(BX)(R8*1)
	VMOVDQU Y2, 64(BX)(R8*1)
	VMOVDQU Y3, 96(BX)(R8*1)

next:
	ADDQ $128, R8
	CMPQ R8, DX
	JNE  block
	VZEROUPPER

done:
	RET

// func orBytesManyAVX2(dst, dst2 *byte, srcs **byte, nsrc, n int)
TEXT ·orBytesManyAVX2(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ dst2+8(FP), BX
	MOVQ srcs+16(FP), SI
	MOVQ nsrc+24(FP), CX
	MOVQ n+32(FP), DX
	XORQ R8, R8
	TESTQ DX, DX
	JZ   done

block:
	MOVQ 0(SI), R9
	VMOVDQU 0(R9)(R8*1), Y0
	VMOVDQU 32(R9)(R8*1), Y1
	VMOVDQU 64(R9)(R8*1), Y2
	VMOVDQU 96(R9)(R8*1), Y3
	MOVQ $1, R10

operand:
	CMPQ R10, CX
	JEQ  store
	MOVQ 0(SI)(R10*8), R9
	VPOR 0(R9)(R8*1), Y0, Y0
	VPOR 32(R9)(R8*1), Y1, Y1
	VPOR 64(R9)(R8*1), Y2, Y2
	VPOR 96(R9)(R8*1), Y3, Y3
	INCQ R10
	JMP  operand

store:
	VMOVDQU Y0, 0(DI)(R8*1)
	VMOVDQU Y1, 32(DI)(R8*1)
	VMOVDQU Y2, 64(DI)(R8*1)
	VMOVDQU Y3, 96(DI)(R8*1)
	TESTQ BX, BX
	JZ   next
	VMOVDQU Y0, 0(BX)(R8*1)
	VMOVDQU Y1, 32(BX)(R8*1)
	VMOVDQU Y2, 64(BX)(R8*1)
	VMOVDQU Y3, 96(BX)(R8*1)

next:
	ADDQ $128, R8
	CMPQ R8, DX
	JNE  block
	VZEROUPPER

done:
	RET

// func xorBytesManyAVX2(dst, dst2 *byte, srcs **byte, nsrc, n int)
TEXT ·xorBytesManyAVX2(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ dst2+8(FP), BX
	MOVQ srcs+16(FP), SI
	MOVQ nsrc+24(FP), CX
	MOVQ n+32(FP), DX
	XORQ R8, R8
	TESTQ DX, DX
	JZ   done

block:
	MOVQ 0(SI), R9
	VMOVDQU 0(R9)(R8*1), Y0
	VMOVDQU 32(R9)(R8*1), Y1
	VMOVDQU 64(R9)(R8*1), Y2
	VMOVDQU 96(R9)(R8*1), Y3
	MOVQ $1, R10

operand:
	CMPQ R10, CX
	JEQ  store
	MOVQ 0(SI)(R10*8), R9
	VPXOR 0(R9)(R8*1), Y0, Y0
	VPXOR 32(R9)(R8*1), Y1, Y1
	VPXOR 64(R9)(R8*1), Y2, Y2
	VPXOR 96(R9)(R8*1), Y3, Y3
	INCQ R10
	JMP  operand

store:
	VMOVDQU Y0, 0(DI)(R8*1)
	VMOVDQU Y1, 32(DI)(R8*1)
	VMOVDQU Y2, 64(DI)(R8*1)
	VMOVDQU Y3, 96(DI)(R8*1)
	TESTQ BX, BX
	JZ   next
	VMOVDQU Y0, 0(BX)(R8*1)
	VMOVDQU Y1, 32(BX)(R8*1)
	VMOVDQU Y2, 64(BX)(R8*1)
	VMOVDQU Y3, 96(BX)(R8*1)

next:
	ADDQ $128, R8
	CMPQ R8, DX
	JNE  block
	VZEROUPPER

done:
	RET

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
