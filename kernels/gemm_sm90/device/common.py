"""Pieces both SM90 GEMM kernels share (imports cutlass: load lazily).

An E4M3 value times its power-of-two E8M0 scale is exactly a BF16 value (3 mantissa bits
fit in 7; the exponent range fits unless the product leaves BF16's range, where it rounds
as the FP32 reference's product would overflow or lose precision). So both kernels scale
FP8 operands into BF16 and run BF16 wgmma with FP32 accumulation: no per-32-K promotion and
no FP8 tensor-core truncation (docs/gemm_log.md), only the summation order differs
from the reference.

Both kernels permute K inside each 32-element scale group, identically for the two
operands: thread (g, t) of a warp holds bytes 8t..8t+7 of a group of its A-fragment rows,
bytes 0-3 feeding the group's first k16 wgmma and 4-7 the second, so it loads them with
one 8-byte shared load. The operand kept in shared memory as BF16 is written in that order.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Int32, Uint32
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.cutlass_dsl import dsl_user_op
from cutlass.tensor_utils import LayoutEnum

from ....format import CHUNK_BYTES, ROW_BLOCK, SCALE_NAN_BYTE, ceil_div
from ...runtime.ptx import asm_u32, inline_ptx
from ..constants import CHUNK_WORDS, TILE_K8, UNROLL_CHUNK
from .f16 import dequant_pair_f16, f16_factor

# E8M0 bytes up to this one give a BF16-normal factor 2**(s - 7) (see dequant_pair)
ONE_FACTOR_MAX = 134

# A 16-bit lane of PRMT's sign-replicating select holds the E4M3 byte sign-extended; <<4 and
# this mask leave sign | 0000 | eeee mmm 0000, the BF16 bits of value * 2**-120 (subnormal
# E4M3 land on BF16 subnormals, zero on zero). NaN bytes are never paired with a finite
# scale by the quantizer (a NaN in a block makes the block's scale NaN).
_LANE_MASK = "0x87F087F0"


@dsl_user_op
def dequant_pair(word, factor, high: bool, *, loc=None, ip=None) -> Int32:
    """Bytes 0-1 (or 2-3) of ``word`` as a BF16x2 of ``e4m3 * 2**-120 * factor``."""
    selector = "0xB3A2" if high else "0x9180"
    return asm_u32(
        "{\n.reg .b32 t;\n"
        f"prmt.b32 t, $1, 0, {selector};\n"
        "shl.b32 t, t, 4;\n"
        f"and.b32 t, t, {_LANE_MASK};\n"
        "mul.rn.bf16x2 $0, t, $2;\n}",
        "=r,r,r",
        word,
        factor,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def mul_bf16x2(a, b, *, loc=None, ip=None) -> Int32:
    """Lane-wise BF16x2 product, round to nearest even (subnormals kept)."""
    return asm_u32("mul.rn.bf16x2 $0, $1, $2;", "=r,r,r", a, b, loc=loc, ip=ip)


def scale_factors(s):
    """E8M0 byte -> (BF16x2 factor 2**(s - 7), BF16x2 rest past BF16's range, is-big).

    ``dequant_pair(w, factor)`` is exact for bytes up to ONE_FACTOR_MAX; above, the result
    times ``rest`` (2**(s - 134), NaN for byte 255) is; ``rest`` is 1.0 otherwise.
    """
    e = cutlass.min(s, ONE_FACTOR_MAX) + 120
    e2 = cutlass.max(s, ONE_FACTOR_MAX) - 7
    rest = cutlass.select_(s == SCALE_NAN_BYTE, Int32(0x7FC07FC0), (e2 << 7) | (e2 << 23))
    return (e << 7) | (e << 23), rest, Int32(s > ONE_FACTOR_MAX)


def load_smem_words(addr, count: int, align: int):
    """``count`` 32-bit words from shared-memory byte address ``addr``."""
    words = cute.make_rmem_tensor((count,), Uint32)
    cute.autovec_copy(
        cute.make_tensor(
            cute.make_ptr(Uint32, addr, cute.AddressSpace.smem, assumed_align=align),
            cute.make_layout(count),
        ),
        words,
    )
    return words


def chunk_word(row):
    """The index of row ``row``'s scale word (its four groups' bytes) in a 512-byte blocked
    chunk, ``row`` < 128: ``format.scale_offset`` over 4."""
    return (row % 32) * 4 + row // 32


@cute.jit
def load_fragment_bytes(stage, row0, t, groups, scales, scale_row0, chunks: int = 1):
    """The FP8 bytes and scale words behind one thread's RS-wgmma A fragment.

    ``stage`` is the byte address of a 128-byte-swizzled FP8 tile (rows of K 128),
    ``scales`` of its 512-byte blocked scale chunk, in which tile row r is chunk row
    ``scale_row0 + r`` (with ``chunks`` 2, rows past 128 lie in the next chunk, 512 bytes
    on). Thread (g, t) of its warp reads rows ``row0`` and ``row0 + 8``: for each scale
    group b in ``groups`` the 8 bytes 8t..8t+7 (one 8-byte load), and each row's scale word.
    Returns (words[2 * len(groups)], scale words[2]), row-major.
    """
    words = []
    scale_words = []
    for rr in cutlass.range_constexpr(2):
        row = row0 + 8 * rr
        base = stage + row * 128 + (t % 2) * 8
        for b in groups:
            words.append(load_smem_words(base + (((2 * b + t // 2) ^ (row % 8)) << 4), 2, 8))
        r = scale_row0 + row
        if cutlass.const_expr(chunks > 1):  # a 192-row tile's A spans two chunks
            offset = (r // ROW_BLOCK) * (CHUNK_BYTES // 4) + (r % 32) * 4 + (r % ROW_BLOCK) // 32
        else:
            offset = chunk_word(r)
        scale_words.append(load_smem_words(scales + offset * 4, 1, 4))
    return words, scale_words


@cute.jit
def convert_fragment(words, scale_words, groups, frag_words, lows=None):
    """:func:`load_fragment_bytes`'s bytes -> the BF16 A fragment (Int32 view): the j-th
    group's bytes 0-3 feed k16 block 2j, bytes 4-7 block 2j + 1; fragment word
    rr + 2 * hi + 4 * kb is the BF16 pair (row g + 8 rr, k 2t + 8 hi) of block kb. The rare
    second factor (scale bytes above ONE_FACTOR_MAX) is one branch for the whole fragment.

    With ``lows`` (``ref - 15`` of the two rows) the fragment is FP16 instead, each value
    times 2**(s - ref) (gemm_sm90.device.f16).
    """
    n = len(groups)
    big = Int32(0)
    rests = []
    for rr in cutlass.range_constexpr(2):
        for j in cutlass.range_constexpr(n):
            s = Int32(scale_words[rr][0] >> (8 * groups[j])) & 0xFF
            if cutlass.const_expr(lows is not None):
                factor = f16_factor(s, lows[rr])
            else:
                factor, rest, is_big = scale_factors(s)
                rests.append(rest)
                big = big | is_big
            for i in cutlass.range_constexpr(2):
                w = words[n * rr + j][i]
                for hi in cutlass.range_constexpr(2):
                    if cutlass.const_expr(lows is not None):
                        pair = dequant_pair_f16(w, factor, hi == 1)
                    else:
                        pair = dequant_pair(w, factor, hi == 1)
                    frag_words[rr + 2 * hi + 4 * (2 * j + i)] = pair
    if cutlass.const_expr(lows is None):
        if big != 0:
            for rr in cutlass.range_constexpr(2):
                for j in cutlass.range_constexpr(n):
                    for i in cutlass.range_constexpr(2):
                        for hi in cutlass.range_constexpr(2):
                            idx = rr + 2 * hi + 4 * (2 * j + i)
                            frag_words[idx] = mul_bf16x2(frag_words[idx], rests[n * rr + j])


def _flag_asm(asm: str, constraints: str, ptr, *values, loc=None, ip=None) -> None:
    """An inline-PTX statement on the global address of flag ``ptr`` (kept: side effects)."""
    operands = [ptr.toint(loc=loc, ip=ip).ir_value(loc=loc, ip=ip)]
    operands += [Int32(v).ir_value(loc=loc, ip=ip) for v in values]
    inline_ptx(asm, constraints, operands, None, side_effects=True, loc=loc, ip=ip)


@dsl_user_op
def store_flag(ptr, value, *, loc=None, ip=None):
    """``st.release.gpu`` of a 32-bit flag: everything this thread saw is visible first."""
    _flag_asm("st.release.gpu.global.b32 [$0], $1;", "l,r", ptr, value, loc=loc, ip=ip)


@dsl_user_op
def wait_flag(ptr, *, loc=None, ip=None):
    """Spin with ``ld.acquire.gpu`` until the 32-bit flag is non-zero."""
    _flag_asm(
        "{\n.reg .pred p;\n.reg .b32 v;\nWAIT:\n"
        "ld.acquire.gpu.global.b32 v, [$0];\n"
        "setp.eq.u32 p, v, 0;\n"
        "@p bra WAIT;\n}",
        "l",
        ptr,
        loc=loc,
        ip=ip,
    )


# A stream-K fixup loads the lower CTAs' parts this many FP32 values per thread at a time
# before it adds them in K order: one part at a time, each flag poll, fence and load was a
# round trip through L2 of its own (docs/gemm_log.md, 'Numbers behind the kernel sources').
FIXUP_FLOATS = 64


def parts_in_flight(floats_per_part: int) -> int:
    """Parts a fixup loads at once (1-8) when each holds ``floats_per_part`` per thread."""
    return max(1, min(8, FIXUP_FLOATS // floats_per_part))


@cute.jit
def add_parts(acc, first, last, part):
    """``acc[i] += part(c)[i]`` for the parts c = first .. last - 1, in that order (the sum
    order does not depend on timing), loading :func:`parts_in_flight` of them at a time.
    ``part(c)``: this thread's values of part c (a tensor of ``acc``'s size)."""
    size = cute.size(acc)
    batch = parts_in_flight(size)
    for c0 in range(first, last, batch):
        loaded = [cute.make_rmem_tensor((size,), cutlass.Float32) for _ in range(batch)]
        for j in cutlass.range_constexpr(batch):
            if c0 + j < last:
                values = part(c0 + j)
                for i0 in cutlass.range_constexpr(0, size, UNROLL_CHUNK):
                    for i in cutlass.range_constexpr(i0, min(i0 + UNROLL_CHUNK, size)):
                        loaded[j][i] = values[i]
        for j in cutlass.range_constexpr(batch):
            if c0 + j < last:
                for i0 in cutlass.range_constexpr(0, size, UNROLL_CHUNK):
                    for i in cutlass.range_constexpr(i0, min(i0 + UNROLL_CHUNK, size)):
                        acc[i] = acc[i] + loaded[j][i]


@cute.jit
def quad_transpose(words, t):
    """The 4 x 4 transpose of 32-bit words across the four threads of a quad: thread ``t``
    (``lane % 4``) holds ``words[s]`` and gets back word ``t`` of quad thread s, s = 0..3.
    Two butterfly rounds of two shuffles each; every thread of the warp takes part."""
    a = list(words)
    for mask in (1, 2):
        high = (t & mask) != 0
        for lo in (s for s in range(4) if not s & mask):
            hi = lo | mask
            # a thread sends the word its partner needs and keeps the one the partner sends
            got = cute.arch.shuffle_sync_bfly(cutlass.select_(high, a[lo], a[hi]), offset=mask)
            a[lo] = cutlass.select_(high, got, a[lo])
            a[hi] = cutlass.select_(high, a[hi], got)
    return a


def load_gmem_word(addr):
    """One 32-bit word from global byte address ``addr``."""
    ptr = cute.make_ptr(Int32, addr, cute.AddressSpace.gmem, assumed_align=4)
    return cute.make_tensor(ptr, cute.make_layout(1))[0]


def store_smem_word(addr, value):
    """One 32-bit word to shared-memory byte address ``addr``."""
    word = cute.make_rmem_tensor((1,), Int32)
    word[0] = value
    cute.autovec_copy(
        word,
        cute.make_tensor(
            cute.make_ptr(Int32, addr, cute.AddressSpace.smem, assumed_align=4),
            cute.make_layout(1),
        ),
    )


class Sm90Gemm:
    """Base of both SM90 GEMM kernels: the compile-time facts of a call (N, K, out's row
    stride, the out and bias dtypes, K's FP8 stages) and the store of one output."""

    def __init__(self, n: int, k: int, ld_out: int, bias_dtype, out_dtype):
        self.n = n
        self.k = k
        self.ld_out = ld_out
        self.has_bias = bias_dtype is not None
        # without a bias the launch still passes an address (out's): typed as out
        self.bias_dtype = bias_dtype or out_dtype
        self.out_dtype = out_dtype
        self.k_tiles = ceil_div(k, TILE_K8)

    @cute.jit
    def store_output(self, mD, mBias, row, col, v):
        """``out[row, col] = v (+ bias[col])``: the bias added in FP32, rounded once."""
        if cutlass.const_expr(self.has_bias):
            v = v + mBias[col].to(cutlass.Float32)
        mD[row, col] = v.to(mD.element_type)


def gemm_tensors(kernel, addrs, m, sa_chunks, b_chunks: int):
    """Global tensors from the launch's integer addresses (the host passes plain scalars):
    A [m, K], A scale chunks, B [N, K], B scale chunks, out [m, N] (row stride ld_out), bias.

    ``kernel`` supplies the compile-time facts: ``k``, ``n``, ``ld_out``, ``out_dtype``,
    ``bias_dtype``. A scale chunk is 512 bytes of the blocked layout (128 int32 words).
    """
    a_addr, sa_addr, b_addr, sb_addr, bias_addr, out_addr = addrs
    fp8 = cutlass.Float8E4M3FN
    gmem = cute.AddressSpace.gmem
    k, n = kernel.k, kernel.n

    def chunks(addr, count):
        ptr = cute.make_ptr(cutlass.Int32, addr, gmem, assumed_align=16)
        return cute.make_tensor(
            ptr, cute.make_layout((CHUNK_WORDS, count), stride=(1, CHUNK_WORDS))
        )

    mA = cute.make_tensor(
        cute.make_ptr(fp8, a_addr, gmem, assumed_align=16),
        cute.make_layout((m, k), stride=(k, 1)),
    )
    mB = cute.make_tensor(
        cute.make_ptr(fp8, b_addr, gmem, assumed_align=16),
        cute.make_layout((n, k), stride=(k, 1)),
    )
    mD = cute.make_tensor(
        cute.make_ptr(kernel.out_dtype, out_addr, gmem, assumed_align=16),
        cute.make_layout((m, n), stride=(kernel.ld_out, 1)),
    )
    bias_align = kernel.bias_dtype.width // 8
    mBias = cute.make_tensor(
        cute.make_ptr(kernel.bias_dtype, bias_addr, gmem, assumed_align=bias_align),
        cute.make_layout((n,)),
    )
    return mA, chunks(sa_addr, sa_chunks), mB, chunks(sb_addr, b_chunks), mD, mBias


def rs_tiled_mma(dtype, tile_mn):
    """One warpgroup's K-major wgmma of ``dtype`` x ``dtype`` -> FP32 on ``tile_mn``, its A
    operand in registers (RS)."""
    return sm90_utils.make_trivial_tiled_mma(
        dtype,
        dtype,
        cute.nvgpu.OperandMajorMode.K,
        cute.nvgpu.OperandMajorMode.K,
        cutlass.Float32,
        (1, 1, 1),
        tiler_mn=tile_mn,
        a_source=warpgroup.OperandSource.RMEM,
    )


def smem_layout(dtype, rows: int, k: int, stages: int):
    """K-major 128-byte-swizzled stages: byte (r, c) of a stage at r*128 + (c ^ (r%8)*16)."""
    atom = warpgroup.make_smem_layout_atom(
        sm90_utils.get_smem_layout_atom(LayoutEnum.ROW_MAJOR, dtype, k), dtype
    )
    return cute.tile_to_shape(atom, (rows, k, stages), order=(0, 1, 2))


def tma_load(tensor, stage_layout, tile, multicast: bool = False):
    """A TMA load atom (and its global view) of ``tile``-shaped boxes of ``tensor`` into one
    stage of ``stage_layout`` (rows, cols, stages). ``multicast``: each copy also writes the
    same shared-memory offset of the cluster's CTAs its ``mcast_mask`` names."""
    op = (
        cpasync.CopyBulkTensorTileG2SMulticastOp()
        if multicast
        else cpasync.CopyBulkTensorTileG2SOp()
    )
    return cpasync.make_tiled_tma_atom(
        op,
        tensor,
        cute.slice_(stage_layout, (None, None, 0)),
        tile,
    )


def chunk_slots(slots: int):
    """Shared-memory layout of ``slots`` 512-byte scale chunks, one after the other."""
    return cute.make_layout((CHUNK_WORDS, 1, slots), stride=(1, 1, CHUNK_WORDS))


def tma_load_chunks(chunks, slots_layout):
    """A TMA load atom (and its global view) of single 512-byte chunks of ``chunks`` (see
    :func:`gemm_tensors`) into the slots of ``slots_layout`` (:func:`chunk_slots`)."""
    return tma_load(chunks, slots_layout, (CHUNK_WORDS, 1))


def fp8_load_pipe(barriers, stages: int, consumer_threads: int, tx_bytes: int, cluster: int = 1):
    """The TMA pipeline of the FP8 stages: one producer thread, ``tx_bytes`` per stage,
    each stage released by ``consumer_threads`` (one arrive per warp). Its barriers wait for
    the kernel's ``mbarrier_init_fence`` (deferred, so it fences all its pipelines once).

    ``cluster`` > 1: the CTAs of a cluster multicast into each other's stages, so a stage is
    free only once the consumers of every CTA of the cluster have released it: each consumer
    warp arrives on the barrier of each CTA (lane r on rank r's)."""
    return pipeline.PipelineTmaAsync.create(
        barrier_storage=barriers,
        num_stages=stages,
        producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
        consumer_group=pipeline.CooperativeGroup(
            pipeline.Agent.Thread, cluster * consumer_threads // 32
        ),
        tx_count=tx_bytes,
        cta_layout_vmnk=cute.make_layout((1, cluster, 1, 1)),
        defer_sync=True,
    )


def tma_views(atom, smem, gmem, tile):
    """(shared, global) views of ``atom``'s copies: index the shared one by stage, the
    global one by (tile row, tile column)."""
    tiles = cute.local_tile(gmem, tile, (None, None))
    return cpasync.tma_partition(
        atom, 0, cute.make_layout(1), cute.group_modes(smem, 0, 2), cute.group_modes(tiles, 0, 2)
    )


def chunk_views(atom, smem, gmem):
    """:func:`tma_views` of a :func:`tma_load_chunks` atom: the shared one by slot, the
    global one by (0, chunk)."""
    return tma_views(atom, smem, gmem, (CHUNK_WORDS, 1))
