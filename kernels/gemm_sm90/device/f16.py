"""The FP16 operand path of the tiled SM90 GEMM (imports cutlass: load lazily).

Converting E4M3 to BF16 takes four ALU instructions per pair of values (PRMT, SHL, AND,
HMUL2: gemm_sm90.device.common); to FP16 it takes two (``cvt.rn.f16x2.e4m3x2`` is exact, then one
HMUL2 by the scale), which made the large GEMM markedly faster (docs/gemm_log.md,
'Numbers behind the kernel sources'). FP16 has only 5 exponent bits, so each row r of an
operand gets a reference exponent ``ref[r]`` and its values are converted as
``e4m3 * 2**(s - ref[r])``; the epilogue multiplies the FP32 sum by
``2**(ref_a[m] - 127) * 2**(ref_b[n] - 127)``. Both steps are exact (powers of two, see
times_pow2), so the result differs from the reference by summation order only, as the BF16
path's does.

``e4m3 * 2**d`` is an exact FP16 value for d in [-15, 7]: 448 * 2**7 = 57344 < 65504, and the
finest E4M3 step, 2**-9, times 2**-15 is FP16's 2**-24. The path uses d in [-14, 7], so a row
qualifies when its largest scale byte is at most 21 above its smallest; ``ref = max - 7``.
Byte 0 is left out of the smallest: it is the RCEIL byte of an all-zero group. Any other
group with byte 0 holds values of at most 448 * 2**-127; where its d falls below -14 the
factor is 0 and they drop out (the BF16 path drops them below 2**-133). A row with a NaN
scale (255), or a wider spread, sends its whole output tile down the BF16 path.
gemm_sm90.device.refs computes every row's reference in a launch before the GEMM; the GEMM
decides per output tile, before the tile's first conversion.
"""

from __future__ import annotations

import cutlass
from cutlass import Float32, Int32
from cutlass._mlir import ir
from cutlass.cutlass_dsl import dsl_user_op

from ....format import SCALE_BIAS, SCALE_NAN_BYTE
from ...runtime.ptx import asm_u32, inline_ptx

# e4m3 * 2**d is exact in FP16 for d in [-15, 7]; the path uses [-14, 7] so that every
# factor 2**d is a normal FP16 number (exponent field d + 15 >= 1, see f16_factor)
F16_BELOW = 14
F16_ABOVE = 7
# The smallest reference: keeps 2**(ref - 127) a normal FP32 factor in every epilogue split.
MIN_REF = 2
# FP16's exponent bias: the factor 2**d has exponent field d + 15 (f16_factor).
F16_BIAS = 15
# What turns a ring word (``ref - 127``, gemm_sm90.tiled) into f16_factor's ``low``
# (``ref - 15``).
RING_TO_LOW = SCALE_BIAS - F16_BIAS


@dsl_user_op
def dequant_pair_f16(word, factor, high: bool, *, loc=None, ip=None) -> Int32:
    """Bytes 0-1 (or 2-3) of ``word`` as an FP16x2 of ``e4m3 * factor`` (FP16x2 ``factor``)."""
    half = "h" if high else "l"
    return asm_u32(
        "{\n.reg .b16 l, h;\n.reg .b32 t;\n"
        "mov.b32 {l, h}, $1;\n"
        f"cvt.rn.f16x2.e4m3x2 t, {half};\n"
        "mul.rn.f16x2 $0, t, $2;\n}",
        "=r,r,r",
        word,
        factor,
        loc=loc,
        ip=ip,
    )


def f16_factor(s, low):
    """FP16x2 bits of 2**(s - ref) in both lanes, given ``low = ref - 15``: the exponent field
    ``s - low`` is 1..22 for every group of a qualifying row; an all-zero group's byte 0 may
    fall below and clamps to field 0, a factor of 0. (Three instructions: the field times
    0x04000400 places it in both halves.)"""
    return cutlass.max(s - low, 0) * 0x04000400


@dsl_user_op
def bytes_max(acc, word, *, loc=None, ip=None) -> Int32:
    """Lane-wise max of the u16x2 ``acc`` with ``word``'s bytes (0, 2) and (1, 3)."""
    return asm_u32(
        "{\n.reg .b32 l, h;\n"
        "and.b32 l, $2, 0x00FF00FF;\n"
        "shr.b32 h, $2, 8;\n"
        "and.b32 h, h, 0x00FF00FF;\n"
        "max.u16x2 $0, $1, l;\n"
        "max.u16x2 $0, $0, h;\n}",
        "=r,r,r",
        acc,
        word,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def bytes_min_nonzero(acc, word, *, loc=None, ip=None) -> Int32:
    """Lane-wise min of the u16x2 ``acc`` with ``word``'s bytes minus one, modulo 256 (a zero
    byte becomes 255 and so never wins): the min nonzero byte is the result + 1."""
    return asm_u32(
        "{\n.reg .b32 l, h;\n"
        "and.b32 l, $2, 0x00FF00FF;\n"
        "shr.b32 h, $2, 8;\n"
        "and.b32 h, h, 0x00FF00FF;\n"
        "add.u32 l, l, 0x00FF00FF;\n"
        "add.u32 h, h, 0x00FF00FF;\n"
        "and.b32 l, l, 0x00FF00FF;\n"
        "and.b32 h, h, 0x00FF00FF;\n"
        "min.u16x2 $0, $1, l;\n"
        "min.u16x2 $0, $0, h;\n}",
        "=r,r,r",
        acc,
        word,
        loc=loc,
        ip=ip,
    )


BYTES_MAX_INIT = 0
BYTES_MIN_INIT = 0x00FF00FF


def row_reference(mx_acc, mn_acc):
    """(ref, misfit) of a row from its :func:`bytes_max` / :func:`bytes_min_nonzero` sums:
    misfit is 1 when the row cannot take the FP16 path."""
    mx = cutlass.max(mx_acc & 0xFFFF, (mx_acc >> 16) & 0xFFFF)
    mn = cutlass.min(mn_acc & 0xFFFF, (mn_acc >> 16) & 0xFFFF) + 1  # 256: no nonzero byte
    ref = cutlass.max(mx - F16_ABOVE, MIN_REF)
    fits = (mx < SCALE_NAN_BYTE) & (mn >= ref - F16_BELOW)
    return ref, cutlass.select_(fits, Int32(0), Int32(1))


@dsl_user_op
def u16x2_max(a, b, *, loc=None, ip=None) -> Int32:
    """Lane-wise max of two u16x2 words (merges two :func:`bytes_max` sums)."""
    return asm_u32("max.u16x2 $0, $1, $2;", "=r,r,r", a, b, loc=loc, ip=ip)


@dsl_user_op
def u16x2_min(a, b, *, loc=None, ip=None) -> Int32:
    """Lane-wise min of two u16x2 words (merges two :func:`bytes_min_nonzero` sums)."""
    return asm_u32("min.u16x2 $0, $1, $2;", "=r,r,r", a, b, loc=loc, ip=ip)


@dsl_user_op
def times_pow2(value, e, *, loc=None, ip=None) -> Float32:
    """``value * 2**e`` for |e| <= 250 as two FP32 products by 2**(e >> 1) and the rest: every
    intermediate lies between the value and the result, so neither step rounds on its own."""
    operands = [Float32(value).ir_value(loc=loc, ip=ip), Int32(e).ir_value(loc=loc, ip=ip)]
    result = inline_ptx(
        "{\n.reg .b32 a, b;\n"
        "shr.s32 a, $2, 1;\n"
        "sub.s32 b, $2, a;\n"
        "add.s32 a, a, 127;\n"
        "add.s32 b, b, 127;\n"
        "shl.b32 a, a, 23;\n"
        "shl.b32 b, b, 23;\n"
        "mul.rn.f32 $0, $1, a;\n"
        "mul.rn.f32 $0, $0, b;\n}",
        "=f,f,r",
        operands,
        ir.F32Type.get(),
        loc=loc,
        ip=ip,
    )
    return Float32(result)
