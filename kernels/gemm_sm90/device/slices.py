"""The W8A16 GEMMs' activation read straight from its slices (imports cutlass: load lazily).

W8A16 multiplies 16-bit activations as they are by the MXFP8 weight. The activation is
``cat(slices, -1)``, but it is never concatenated: each slice gets a TMA descriptor of its
own (``[M, width]`` at its own address and row stride), and each K stage of 128 columns is
loaded from the one slice that holds it (widths are multiples of 128, so no stage straddles
two slices). A stage's tile is loaded as two K halves of 64 BF16 (one 128-byte swizzle row
each), as the tokens of the swap-AB kernel's ``bf16_tokens`` schedule are.

The order of K inside a stage decides how each operand's registers are filled:

* tiled kernel (the tokens are the wgmma A operand, in registers): the weight's 16-bit tile
  is written in the permuted K order of gemm_sm90.device.common, in which thread (g, t) holds
  elements 8t..8t+7 of each 32-element group of its rows. Those are 16 consecutive bytes
  of a BF16 row as TMA stored it, so a consumer fills its fragment with one 16-byte shared
  load per row and group (:func:`load_fragment_bf16`): no conversion at all.
* swap-AB kernel (the weight is the A operand, the tokens the smem B operand in their
  natural order): the weight fragment is taken in natural K order instead
  (:func:`load_fragment_natural`): thread (g, t) holds bytes 2t, 2t + 1, 2t + 8, 2t + 9 of
  each 16-byte k16 block of its rows, two 4-byte shared loads per row and block, and picks
  its 2-byte half of each word as it converts it (:func:`convert_fragment_natural`).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32
from cutlass.cutlass_dsl import dsl_user_op

from ...runtime.launcher import address
from ...runtime.ptx import asm_u32
from ..constants import TILE_K8, TILE_K16
from .common import (
    _LANE_MASK,
    chunk_word,
    gemm_tensors,
    load_smem_words,
    mul_bf16x2,
    scale_factors,
    tma_load,
    tma_views,
)

K_BLOCKS = TILE_K8 // 16  # k16 blocks per 128-K stage: one 16-byte chunk of an FP8 row each
# PRMT selectors of bytes 0-1 and 2-3 of a word, each sign-extended into a 16-bit lane
LOW_PAIR = 0x9180
HIGH_PAIR = 0xB3A2
# PRMT selector of byte 0 of a word, the other three zero: plus i, byte i
SCALE_BYTE_SELECT = 0x4440
SCALE_HIGH_BITS = 0x80808080  # bit 7 of each scale byte of a word
FACTOR_STEP = 0x00800080  # one E8M0 step in both lanes of a BF16x2 factor
FACTOR_BIAS = 120 * FACTOR_STEP  # s * FACTOR_STEP + FACTOR_BIAS: the factor 2**(s - 7)


def slice_stages(widths: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """The K stages ``[first, end)`` of each slice (widths are multiples of 128)."""
    stages, first = [], 0
    for width in widths:
        stages.append((first, first + width // TILE_K8))
        first += width // TILE_K8
    return tuple(stages)


def slice_tensors(addrs, strides, widths, m):
    """The BF16 ``[m, width]`` global tensors of the slices at ``addrs`` with row
    ``strides`` (elements; multiples of 8, so every row starts 16-byte aligned)."""
    tensors = []
    for addr, stride, width in zip(addrs, strides, widths, strict=True):
        ptr = cute.make_ptr(cutlass.BFloat16, addr, cute.AddressSpace.gmem, assumed_align=16)
        layout = cute.make_layout((m, width), stride=(cute.assume(stride, divby=8), 1))
        tensors.append(cute.make_tensor(ptr, layout))
    return tensors


def slice_tma(tensors, stage_layout, rows: int, multicast: bool = False):
    """One TMA load atom per slice tensor, of ``rows`` x 64 boxes into one half-stage of
    ``stage_layout``: ``(atoms, global views)``, tuples in slice order."""
    loads = [tma_load(t, stage_layout, (rows, TILE_K16), multicast) for t in tensors]
    return tuple(a for a, _ in loads), tuple(g for _, g in loads)


def slice_views(atoms, smem, gmem_views, rows: int):
    """Per slice, ``(atom, shared view, global view)`` of its TMA copies (see tma_views):
    the shared one by half-stage, the global one by (row tile, 64-column tile)."""
    return tuple(
        (atom, *tma_views(atom, smem, g, (rows, TILE_K16)))
        for atom, g in zip(atoms, gmem_views, strict=True)
    )


@cute.jit
def load_stage_from_slices(views, stages, row_tile, kt, halves, slot, bar, copy_options):
    """TMA the K ``halves`` (of 64) of activation stage ``kt``, row tile ``row_tile``, from
    the slice that holds the stage into half-stage ``slot(h)``, on barrier ``bar``, with
    ``cute.copy``'s ``copy_options`` (a dict: multicast mask, cache policy)."""
    for s in cutlass.range_constexpr(len(views)):
        first, end = stages[s]
        if (kt >= first) & (kt < end):
            atom, smem, gmem = views[s]
            for h in halves:
                cute.copy(
                    atom, gmem[(None, row_tile, 2 * (kt - first) + h)], smem[(None, slot(h))],
                    tma_bar_ptr=bar, **copy_options,
                )  # fmt: skip


@cute.jit
def load_fragment_bf16(half_stage, row0, t):
    """Tiled kernel: thread (g, t)'s A fragment words from a BF16 half-stage (rows of 64
    elements, 128-byte swizzled) at byte address ``half_stage``: rows ``row0`` and
    ``row0 + 8``, elements 8t..8t+7 of each of the half's two 32-element groups, one
    16-byte load each. Returns ``words[2 * rr + j]`` (4 words each)."""
    words = []
    for rr in cutlass.range_constexpr(2):
        row = row0 + 8 * rr
        for j in cutlass.range_constexpr(2):
            chunk = ((4 * j + t) ^ (row % 8)) << 4
            words.append(load_smem_words(half_stage + row * (TILE_K16 * 2) + chunk, 4, 16))
    return words


@cute.jit
def place_fragment_bf16(words, frag_words):
    """:func:`load_fragment_bf16`'s words into the RS wgmma's A fragment (Int32 view):
    word q of group j (elements 8t + 2q, 8t + 2q + 1) is the pair the permuted K order puts
    at k16 block 2j + q / 2, slot 2t + 8 (q % 2), i.e. fragment word
    rr + 2 (q % 2) + 4 (2j + q / 2)."""
    for rr in cutlass.range_constexpr(2):
        for j in cutlass.range_constexpr(2):
            for q in cutlass.range_constexpr(4):
                frag_words[rr + 2 * (q % 2) + 4 * (2 * j + q // 2)] = words[2 * rr + j][q]


@dsl_user_op
def dequant_pair_sel(word, factor, selector, *, loc=None, ip=None) -> Int32:
    """The bytes ``selector`` picks (:data:`LOW_PAIR` or :data:`HIGH_PAIR`) of ``word`` as a
    BF16x2 of ``e4m3 * 2**-120 * factor`` (gemm_sm90.device.common.dequant_pair, with the byte pair
    chosen at run time)."""
    return asm_u32(
        "{\n.reg .b32 t;\n"
        "prmt.b32 t, $1, 0, $3;\n"
        "shl.b32 t, t, 4;\n"
        f"and.b32 t, t, {_LANE_MASK};\n"
        "mul.rn.bf16x2 $0, t, $2;\n}",
        "=r,r,r,r",
        word,
        factor,
        selector,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def scale_byte(word, selector, *, loc=None, ip=None) -> Int32:
    """The byte of ``word`` that ``selector`` (:data:`SCALE_BYTE_SELECT` + its index)
    names, zero-extended."""
    return asm_u32("prmt.b32 $0, $1, 0, $2;", "=r,r,r", word, selector, loc=loc, ip=ip)


def pair_selector(t):
    """The PRMT selector of thread ``t``'s (``lane % 4``) byte pair in each word it loads
    for :func:`load_fragment_natural`: bytes 2t, 2t + 1 of a 16-byte block lie in word
    t / 2, low half for even t."""
    return cutlass.select_(t % 2 == 1, Int32(HIGH_PAIR), Int32(LOW_PAIR))


@cute.jit
def load_fragment_natural(stage, row0, t, scales, scale_row0, blocks: int = K_BLOCKS):
    """Swap-AB kernel: the FP8 words and scale words behind thread (g, t)'s A fragment in
    natural K order, from a swizzled FP8 stage of ``blocks`` k16 blocks per row at byte
    address ``stage`` (8: rows of K 128, 128-byte swizzle; 4: rows of K 64, 64-byte
    swizzle): rows ``row0`` and ``row0 + 8``; per k16 block kb (chunk kb of the row) the
    words holding bytes 2t, 2t + 1 and 2t + 8, 2t + 9; per row its scale word (tile row r is
    row ``scale_row0 + r`` of the 512-byte chunk at ``scales``). Returns
    (``words[2 blocks rr + 2 kb + hi]``, ``scale_words[rr]``)."""
    words = []
    scale_words = []
    for rr in cutlass.range_constexpr(2):
        row = row0 + 8 * rr
        for kb in cutlass.range_constexpr(blocks):
            if cutlass.const_expr(blocks == K_BLOCKS):
                offset = row * TILE_K8 + ((kb ^ (row % 8)) << 4) + 4 * (t // 2)
            else:  # 64-byte rows: the 64-byte swizzle pairs rows
                offset = row * 64 + ((kb ^ ((row >> 1) % 4)) << 4) + 4 * (t // 2)
            for hi in cutlass.range_constexpr(2):
                # the stage's base added last: each load is one LDS [offset + base] of an
                # offset the loop does not change
                words.append(load_smem_words(stage + (offset + 8 * hi), 1, 4))
        scale_words.append(load_smem_words(scales + chunk_word(scale_row0 + row) * 4, 1, 4))
    return words, scale_words


@cute.jit
def convert_fragment_natural(words, scale_words, selector, frag_words, blocks=K_BLOCKS, group0=0):
    """:func:`load_fragment_natural`'s words (of ``blocks`` k16 blocks) -> the BF16 A
    fragment (Int32 view): fragment word rr + 2 hi + 4 kb is the pair (row g + 8 rr, k 2t +
    8 hi) of block kb, exact (E4M3 times its E8M0 scale, as
    gemm_sm90.device.common.convert_fragment converts). Block kb's scale is byte ``group0 +
    kb / 2`` of its row's scale word (``group0`` 2 for the second K half of a chunk).

    Where every scale byte of the fragment is below 128 (scales below 2: every block whose
    largest weight is below 512 has one) each factor is one byte select and one
    multiply-add, and one test covers the fragment; otherwise :func:`convert_fragment_exact`
    makes the same bits for any byte."""
    groups = blocks // 2
    high_bits = cutlass.Uint32(((1 << (8 * groups)) - 1) & SCALE_HIGH_BITS)
    high = (scale_words[0][0] | scale_words[1][0]) & (high_bits << (8 * group0))
    if high != 0:
        convert_fragment_exact(words, scale_words, selector, frag_words, blocks, group0)
    else:
        for rr in cutlass.range_constexpr(2):
            for j in cutlass.range_constexpr(groups):
                s = scale_byte(scale_words[rr][0], SCALE_BYTE_SELECT + group0 + j)
                factor = s * FACTOR_STEP + FACTOR_BIAS  # scale_factors(s)[0] for s < 128
                _convert_group(words, factor, selector, frag_words, blocks, rr, j)


@cute.jit
def convert_fragment_exact(words, scale_words, selector, frag_words, blocks=K_BLOCKS, group0=0):
    """:func:`convert_fragment_natural` for any scale bytes: each factor clamped to BF16's
    range and a second factor past it (gemm_sm90.device.common.scale_factors)."""
    big = Int32(0)
    rests = []
    groups = blocks // 2
    for rr in cutlass.range_constexpr(2):
        for j in cutlass.range_constexpr(groups):  # the stage's scale groups
            s = Int32(scale_words[rr][0] >> (8 * (group0 + j))) & 0xFF
            factor, rest, is_big = scale_factors(s)
            rests.append(rest)
            big = big | is_big
            _convert_group(words, factor, selector, frag_words, blocks, rr, j)
    if big != 0:  # scale bytes above ONE_FACTOR_MAX: the second, exact factor
        for rr in cutlass.range_constexpr(2):
            for kb in cutlass.range_constexpr(blocks):
                for hi in cutlass.range_constexpr(2):
                    idx = rr + 2 * hi + 4 * kb
                    frag_words[idx] = mul_bf16x2(frag_words[idx], rests[groups * rr + kb // 2])


def _convert_group(words, factor, selector, frag_words, blocks, rr, j):
    """Scale group j of fragment row rr (k16 blocks 2j and 2j + 1) converted with
    ``factor`` into its four fragment words (called while tracing: plain loops unroll)."""
    for kb in range(2 * j, 2 * j + 2):
        for hi in range(2):
            word = words[2 * blocks * rr + 2 * kb + hi][0]
            frag_words[rr + 2 * hi + 4 * kb] = dequant_pair_sel(word, factor, selector)


class SlicesEntry:
    """What a W8A16 build adds to its kernel class (mixed in before it): the slices' widths
    (multiples of 128; K is their sum) and each one's K stages."""

    def __init__(self, cfg, n: int, widths: tuple[int, ...], ld_out: int, bias_dtype, out_dtype):
        super().__init__(cfg, n, sum(widths), ld_out, bias_dtype, out_dtype)
        self.slices = tuple(widths)
        self.slice_stages = slice_stages(self.slices)


def slice_operands(kernel, slices, strides, b, sb, bias, out, m, weight_chunks: int):
    """Inside a W8A16 ``@cute.jit`` entry: the slices' BF16 tensors (the first
    ``len(kernel.slices)`` of the entry's ``slices`` pointers and row ``strides``; the rest
    are None), and the weight, its ``weight_chunks`` scale chunks, out and bias as
    gemm_sm90.device.common's gemm_tensors makes them (``kernel`` supplies the compile-time
    facts)."""
    count = len(kernel.slices)
    addrs = [address(p) for p in slices[:count]]
    zero = cutlass.Int64(0)
    weight = (zero, zero, *(address(p) for p in (b, sb, bias, out)))
    _a, _sa, mW, mSW, mD, mBias = gemm_tensors(kernel, weight, m, 1, weight_chunks)
    return tuple(slice_tensors(addrs, strides[:count], kernel.slices, m)), mW, mSW, mD, mBias
