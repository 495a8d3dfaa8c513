"""Inline-PTX building blocks of the slice quantizer (imported only inside the compile).

Everything here works on raw 32-bit registers so that the arithmetic is exactly the one
the RCEIL rule defines, independent of any fast-math lowering:

* the block maximum is an integer max over magnitude bits (``x & 0x7FFF``): for IEEE
  half formats that order is the numeric one, and NaN patterns sort above Inf above every
  finite value, so one max finds "NaN in block", "Inf in block" and the finite amax at once;
* ``ceil(log2(amax / 448))`` is read off the FP32 bits of amax (no ``log2`` approximation);
* scaling is ``mul.rn.f32`` (never ``.ftz``: subnormal inputs must scale like the reference)
  and rounding to E4M3 is the hardware ``cvt.rn.satfinite.e4m3x2.f32`` (round to nearest
  even, saturating to +-448 as the reference's clamp does).
"""

from __future__ import annotations

from cutlass import Int32
from cutlass.cutlass_dsl import dsl_user_op

from ...format import SCALE_INF_BYTE, SCALE_NAN_BYTE
from ..runtime.ptx import asm_u32


@dsl_user_op
def magnitude_max4(w0, w1, w2, w3, *, loc=None, ip=None) -> Int32:
    """Largest magnitude bit pattern (``x & 0x7FFF``) among the 8 halves of 4 words."""
    return asm_u32(
        "{\n"
        ".reg .b32 a, b, c, d;\n"
        "and.b32 a, $1, 0x7FFF7FFF;\n"
        "and.b32 b, $2, 0x7FFF7FFF;\n"
        "and.b32 c, $3, 0x7FFF7FFF;\n"
        "and.b32 d, $4, 0x7FFF7FFF;\n"
        "max.u16x2 a, a, b;\n"
        "max.u16x2 c, c, d;\n"
        "max.u16x2 a, a, c;\n"
        "shr.u32 b, a, 16;\n"
        "and.b32 a, a, 0xFFFF;\n"
        "max.u32 $0, a, b;\n"
        "}",
        "=r,r,r,r,r",
        w0,
        w1,
        w2,
        w3,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def umax(a, b, *, loc=None, ip=None) -> Int32:
    """Unsigned 32-bit max."""
    return asm_u32("max.u32 $0, $1, $2;", "=r,r,r", a, b, loc=loc, ip=ip)


# ceil(log2(amax / 448)) from amax = 1.m * 2**E (FP32 bits, biased exponent Eb):
# amax / 448 = (1.m / 1.75) * 2**(E - 8); 1.m / 1.75 lies in (0.5, 1] when 1.m <= 1.75 and in
# (1, 8/7) otherwise, so the ceiling is E - 8 + (m > 0.75), i.e. byte = Eb - 8 + (M > 0x600000)
# with the low clamp at 0 (exponent -127). An FP32-subnormal amax (Eb = 0) lands below the clamp,
# as log2 of its (even smaller) descale does. The rounded FP32 division of the reference cannot
# move a quotient across a power of two: the nearest BF16/FP16 amax to 448 * 2**k is at least
# 2**-10 away in relative terms, far beyond one FP32 rounding step. The largest finite BF16 gives
# 247, so the high clamp (254) is never reached by finite data.
_SCALE_BYTE_TAIL = (
    "shr.u32 e, f, 23;\n"
    "and.b32 m, f, 0x7FFFFF;\n"
    "setp.gt.u32 p, m, 0x600000;\n"
    "selp.u32 m, 1, 0, p;\n"
    "add.s32 e, e, m;\n"
    "sub.s32 e, e, 8;\n"
    "max.s32 e, e, 0;\n"
)


@dsl_user_op
def scale_byte(amax_bits, is_fp16: bool, *, loc=None, ip=None) -> Int32:
    """RCEIL E8M0 byte of a block from its magnitude bit pattern (0..0xFFFF)."""
    if is_fp16:
        widen = ".reg .b16 h;\n.reg .f32 x;\ncvt.u16.u32 h, $1;\ncvt.f32.f16 x, h;\nmov.b32 f, x;\n"
        inf = "0x7C00"
    else:
        widen = "shl.b32 f, $1, 16;\n"
        inf = "0x7F80"
    return asm_u32(
        "{\n"
        ".reg .b32 f, e, m;\n"
        ".reg .pred p;\n"
        + widen
        + _SCALE_BYTE_TAIL
        + f"setp.eq.u32 p, $1, {inf};\n"
        + f"selp.b32 e, {SCALE_INF_BYTE}, e, p;\n"
        + f"setp.gt.u32 p, $1, {inf};\n"
        + f"selp.b32 $0, {SCALE_NAN_BYTE}, e, p;\n"
        + "}",
        "=r,r",
        amax_bits,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def reciprocal_bits(byte, *, loc=None, ip=None) -> Int32:
    """FP32 bits of the multiplier 2**(127 - byte); 1.0 for byte 0 (bytes 1..253 only)."""
    return asm_u32(
        "{\n"
        ".reg .b32 r;\n"
        ".reg .pred p;\n"
        "sub.s32 r, 254, $1;\n"
        "shl.b32 r, r, 23;\n"
        "setp.eq.u32 p, $1, 0;\n"
        "selp.b32 $0, 0x3F800000, r, p;\n"
        "}",
        "=r,r",
        byte,
        loc=loc,
        ip=ip,
    )


def _widen_pair(word: str, lo: str, hi: str, is_fp16: bool) -> str:
    if is_fp16:
        return (
            "{\n.reg .b16 h0, h1;\n"
            f"mov.b32 {{h0, h1}}, {word};\n"
            f"cvt.f32.f16 {lo}, h0;\n"
            f"cvt.f32.f16 {hi}, h1;\n}}\n"
        )
    return (
        "{\n.reg .b32 t;\n"
        f"shl.b32 t, {word}, 16;\n"
        f"mov.b32 {lo}, t;\n"
        f"and.b32 t, {word}, 0xFFFF0000;\n"
        f"mov.b32 {hi}, t;\n}}\n"
    )


def _scale4(factor: str) -> str:
    return "".join(f"mul.rn.f32 {x}, {x}, {factor};\n" for x in "abcd")


def _pack4(dst: str) -> str:
    # round to E4M3 (nearest even, saturating), bytes a b c d from low to high
    return (
        "cvt.rn.satfinite.e4m3x2.f32 lo, b, a;\n"
        "cvt.rn.satfinite.e4m3x2.f32 hi, d, c;\n"
        f"mov.b32 {dst}, {{lo, hi}};\n"
    )


@dsl_user_op
def quantize4(w0, w1, recip_bits, is_fp16: bool, *, loc=None, ip=None) -> Int32:
    """4 halves (2 words) times the multiplier -> 4 packed E4M3 bytes (finite blocks)."""
    return asm_u32(
        "{\n"
        ".reg .f32 a, b, c, d, r;\n"
        ".reg .b16 lo, hi;\n"
        "mov.b32 r, $3;\n"
        + _widen_pair("$1", "a", "b", is_fp16)
        + _widen_pair("$2", "c", "d", is_fp16)
        + _scale4("r")
        + _pack4("$0")
        + "}",
        "=r,r,r,r",
        w0,
        w1,
        recip_bits,
        loc=loc,
        ip=ip,
    )


def _nan_fix(src: str, shift: int) -> str:
    # torch rounds a NaN to E4M3 as sign | 0x7F: keep the FP32 sign bit of the product.
    return (
        "{\n.reg .b32 t;\n.reg .pred n;\n"
        f"testp.notanumber.f32 n, {src};\n"
        f"mov.b32 t, {src};\n"
        "shr.u32 t, t, 24;\n"
        "or.b32 t, t, 0x7F;\n"
        f"@n bfi.b32 q, t, q, {shift}, 8;\n}}\n"
    )


@dsl_user_op
def quantize4_special(w0, w1, byte, is_fp16: bool, *, loc=None, ip=None) -> Int32:
    """:func:`quantize4` for blocks holding Inf (byte 254) or NaN (byte 255).

    Byte 254 multiplies by 2**-127, an FP32 subnormal; it is applied as 2**-64 * 2**-63 so
    that no operand is subnormal: a product below 2**-126 rounds to a signed E4M3 zero either
    way, and +-Inf stays +-Inf (then saturates to +-448). Byte 255 multiplies by NaN.
    """
    return asm_u32(
        "{\n"
        ".reg .f32 a, b, c, d, r, s;\n"
        ".reg .b32 q;\n"
        ".reg .b16 lo, hi;\n"
        ".reg .pred p;\n"
        f"setp.eq.u32 p, $3, {SCALE_NAN_BYTE};\n"
        "selp.b32 q, 0x7FC00000, 0x1F800000, p;\n"
        "mov.b32 r, q;\n"
        "selp.b32 q, 0x3F800000, 0x20000000, p;\n"
        "mov.b32 s, q;\n"
        + _widen_pair("$1", "a", "b", is_fp16)
        + _widen_pair("$2", "c", "d", is_fp16)
        + _scale4("r")
        + _scale4("s")
        + _pack4("q")
        + _nan_fix("a", 0)
        + _nan_fix("b", 8)
        + _nan_fix("c", 16)
        + _nan_fix("d", 24)
        + "mov.b32 $0, q;\n"
        "}",
        "=r,r,r,r",
        w0,
        w1,
        byte,
        loc=loc,
        ip=ip,
    )
