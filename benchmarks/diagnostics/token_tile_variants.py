"""The kernel variants of the token-tile diagnostic (``token_tiles.py``; imports cutlass:
load lazily), each a subclass of the shipped W8A16 swap-AB kernel that replaces its stage
loop; the shipped source is untouched. What each one tests is in ``token_tiles.py``'s
module doc and in docs/gemm_log.md (variants 58-62 and 64-66).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import torch
from cutlass import Int32, Int64
from cutlass.cute.nvgpu import warpgroup
from cutlass.cutlass_dsl import dsl_user_op

from mxfp8_fusion.format import CHUNK_BYTES, ROW_BLOCK
from mxfp8_fusion.kernels.gemm_sm90.constants import WG_THREADS
from mxfp8_fusion.kernels.gemm_sm90.device.common import (
    chunk_word,
    dequant_pair,
    load_smem_words,
    mul_bf16x2,
    scale_factors,
)
from mxfp8_fusion.kernels.gemm_sm90.device.slices import (
    convert_fragment_exact,
    convert_fragment_natural,
    load_fragment_natural,
    pair_selector,
)
from mxfp8_fusion.kernels.gemm_sm90.swap_ab.parts import TILE_W
from mxfp8_fusion.kernels.gemm_sm90.swap_ab.w8a16 import W8A16SwapABGemmSm90 as Shipped
from mxfp8_fusion.kernels.runtime.ptx import inline_ptx

PACKED_GROUP = 64
"""K bytes of one permuted group of ``packed``: one token-tile stage row."""
BLOCK_ROWS = 128
"""Weight rows of one ``blocked`` block: the token-tile kernel's weight tile."""
TURN_BAR = 4
"""``ping-pong``'s named barriers: TURN_BAR + c is consumer c's turn to issue (the shipped
kernel uses ids 1 to 3)."""


def packed_order() -> list[int]:
    """Byte p of a packed 64-byte group holds byte ``packed_order()[p]`` of the natural one:
    thread t's chunk t holds, for k16 block kb, the bytes 2t, 2t + 1, 2t + 8, 2t + 9 of the
    block, which its A fragment takes (pairs (2t, 2t + 1) and (2t + 8, 2t + 9))."""
    return [16 * kb + 2 * t + (j % 2) + 8 * (j // 2)
            for t in range(4) for kb in range(4) for j in range(4)]  # fmt: skip


def permute_weight(values: torch.Tensor) -> torch.Tensor:
    """The FP8 ``values`` [N, K] (K a multiple of 64) permuted as ``packed`` reads them."""
    n, k = values.shape
    order = torch.tensor(packed_order(), device=values.device)
    u8 = values.view(torch.uint8).view(n, k // PACKED_GROUP, PACKED_GROUP)
    return u8[:, :, order].contiguous().view(values.dtype).view(n, k)


def block_weight(values: torch.Tensor) -> torch.Tensor:
    """``permute_weight(values)`` in blocks of 128 rows x 64 K bytes, each contiguous, the
    blocks of a 128-row band in K order, the bands in row order."""
    n, k = values.shape
    packed = permute_weight(values)
    blocks = packed.view(n // BLOCK_ROWS, BLOCK_ROWS, k // PACKED_GROUP, PACKED_GROUP)
    return blocks.permute(0, 2, 1, 3).contiguous().view(n, k)


class DoubleBuffered(Shipped):
    """Two weight fragments per consumer: stage s is converted into one while the wgmmas of
    s - 1 read the other (variant 58); with ``convert`` False (NoConvert) the weight is
    neither loaded nor converted."""

    convert = True

    @cute.jit
    def _tile_stages(self, st, row0, t, w_tile, mma, load_pipe, ls, rel, k0, k1):
        tiled_mma, frag, frag_words, tCrB, acc = mma
        frag_b = tiled_mma.make_fragment_A(
            tiled_mma.get_slice(0).partition_shape_A((TILE_W, self.stage_k))
        )
        frags = (frag, frag_b)
        words = (frag_words, cute.recast_tensor(frag_b, Int32))
        blocks = self.stage_k // 16
        w8 = st.sW8.data_ptr().toint()
        sw = st.sSW.data_ptr().toint()
        selector = pair_selector(t)
        scale_row0 = (w_tile * self.tile_w) % ROW_BLOCK
        # pairs of stages, so that each stage's fragment is known at compile time
        for p in range((k1 - k0 + 1) // 2):
            for half in cutlass.range_constexpr(2):
                ks = k0 + 2 * p + half
                if ks < k1:
                    # the wgmmas two stages back read this fragment and their stage
                    warpgroup.wait_group(1)
                    if rel.count + 1 < ls.count:
                        load_pipe.consumer_release(rel)
                        rel.advance()
                    load_pipe.consumer_wait(ls)
                    if cutlass.const_expr(self.convert):
                        w_words, w_scales = load_fragment_natural(
                            w8 + ls.index * (self.tile_w * self.stage_k), row0, t,
                            sw + ls.index * CHUNK_BYTES, scale_row0, blocks,
                        )  # fmt: skip
                        convert_fragment_natural(
                            w_words, w_scales, selector, words[half], blocks, 2 * (ks % 2)
                        )  # fmt: skip
                    warpgroup.fence()
                    for kb in cutlass.range_constexpr(blocks):
                        cute.gemm(
                            tiled_mma, acc, frags[half][(None, None, kb)],
                            tCrB[(None, None, kb, ls.index)], acc,
                        )  # fmt: skip
                    warpgroup.commit_group()
                    ls.advance()
        # all but the last stage freed here; the shipped _tile_part frees that one
        warpgroup.wait_group(0)
        if rel.count + 1 < ls.count:
            load_pipe.consumer_release(rel)
            rel.advance()
        return ls, rel


class NoConvert(DoubleBuffered):
    """The double-buffered loop without the weight's loads and conversion (wrong bits)."""

    convert = False


class HookedLoop(Shipped):
    """The shipped stage loop with a hook at each of STAMP_POINTS of a stage (``_at``, a
    no-op here) and the weight's loads and conversion as methods, for the variants that
    only add something at those points or read the weight otherwise: the same wgmmas in
    the same order, so the same bits."""

    @cute.jit
    def _at(self, stage, row0, point: int):
        pass

    def _load_weight(self, stage, row0, t, scales, scale_row0, blocks):
        """This thread's weight words and scale words of a stage (natural K order)."""
        return load_fragment_natural(stage, row0, t, scales, scale_row0, blocks)

    def _convert_weight(self, words, scales, selector, frag_words, blocks, group0):
        """Those words into the A fragment."""
        convert_fragment_natural(words, scales, selector, frag_words, blocks, group0)

    @cute.jit
    def _tile_stages(self, st, row0, t, w_tile, mma, load_pipe, ls, rel, k0, k1):
        tiled_mma, frag, frag_words, tCrB, acc = mma
        blocks = self.stage_k // 16
        w8 = st.sW8.data_ptr().toint()
        sw = st.sSW.data_ptr().toint()
        selector = pair_selector(t)
        scale_row0 = (w_tile * self.tile_w) % ROW_BLOCK
        for ks in range(k0, k1):
            load_pipe.consumer_wait(ls)
            self._at(ls.count, row0, 0)
            w_words, w_scales = self._load_weight(
                w8 + ls.index * (self.tile_w * self.stage_k), row0, t,
                sw + ls.index * CHUNK_BYTES, scale_row0, blocks,
            )  # fmt: skip
            warpgroup.wait_group(0)
            self._at(ls.count, row0, 1)
            if rel.count < ls.count:
                load_pipe.consumer_release(rel)
                rel.advance()
            self._convert_weight(w_words, w_scales, selector, frag_words, blocks, 2 * (ks % 2))
            self._at(ls.count, row0, 2)
            warpgroup.fence()
            for kb in cutlass.range_constexpr(blocks):
                cute.gemm(
                    tiled_mma, acc, frag[(None, None, kb)], tCrB[(None, None, kb, ls.index)], acc
                )  # fmt: skip
            warpgroup.commit_group()
            self._at(ls.count, row0, 3)
            ls.advance()
        return ls, rel


class EarlyRelease(HookedLoop):
    """The shipped loop with each stage freed as soon as its wgmmas are done, before the
    wait for the next stage's load instead of after it: the same wgmmas in the same order,
    so the same bits."""

    @cute.jit
    def _tile_stages(self, st, row0, t, w_tile, mma, load_pipe, ls, rel, k0, k1):
        tiled_mma, frag, frag_words, tCrB, acc = mma
        blocks = self.stage_k // 16
        w8 = st.sW8.data_ptr().toint()
        sw = st.sSW.data_ptr().toint()
        selector = pair_selector(t)
        scale_row0 = (w_tile * self.tile_w) % ROW_BLOCK
        for ks in range(k0, k1):
            # the previous stage's wgmmas have read its token tile: free it while this
            # consumer waits for the next stage's load
            warpgroup.wait_group(0)
            if rel.count < ls.count:
                load_pipe.consumer_release(rel)
                rel.advance()
            load_pipe.consumer_wait(ls)
            w_words, w_scales = self._load_weight(
                w8 + ls.index * (self.tile_w * self.stage_k), row0, t,
                sw + ls.index * CHUNK_BYTES, scale_row0, blocks,
            )  # fmt: skip
            self._convert_weight(w_words, w_scales, selector, frag_words, blocks, 2 * (ks % 2))
            warpgroup.fence()
            for kb in cutlass.range_constexpr(blocks):
                cute.gemm(
                    tiled_mma, acc, frag[(None, None, kb)], tCrB[(None, None, kb, ls.index)], acc
                )  # fmt: skip
            warpgroup.commit_group()
            ls.advance()
        return ls, rel


@cute.jit
def load_before(stage, row0, t, scales, scale_row0):
    """``load_fragment_natural`` (64-byte rows) as it was before variant 65: each address
    summed from the stage's base on, which ptxas kept as one add per word."""
    words = []
    scale_words = []
    for rr in cutlass.range_constexpr(2):
        row = row0 + 8 * rr
        for kb in cutlass.range_constexpr(4):
            base = stage + row * 64 + ((kb ^ ((row >> 1) % 4)) << 4) + 4 * (t // 2)
            for hi in cutlass.range_constexpr(2):
                words.append(load_smem_words(base + 8 * hi, 1, 4))
        scale_words.append(load_smem_words(scales + chunk_word(scale_row0 + row) * 4, 1, 4))
    return words, scale_words


class Before(HookedLoop):
    """The stage loop before variant 65: :func:`load_before` and every factor made as
    ``convert_fragment_exact`` makes it (seven instructions each): the same bits."""

    def _load_weight(self, stage, row0, t, scales, scale_row0, blocks):
        return load_before(stage, row0, t, scales, scale_row0)

    def _convert_weight(self, words, scales, selector, frag_words, blocks, group0):
        convert_fragment_exact(words, scales, selector, frag_words, blocks, group0)


@cute.jit
def load_packed(stage, row0, t, scales, scale_row0, loads: cutlass.Constexpr):
    """Rows row0 and row0 + 8 of a packed stage (rows of 64 bytes, 64-byte swizzle): each
    row's scale word and chunk t (without ``loads``, words made from the scale word)."""
    words = []
    scale_words = []
    for rr in cutlass.range_constexpr(2):
        row = row0 + 8 * rr
        chunk = (t ^ ((row >> 1) % 4)) << 4
        scale_words.append(load_smem_words(scales + chunk_word(scale_row0 + row) * 4, 1, 4))
        if cutlass.const_expr(loads):
            words.append(load_smem_words(stage + row * PACKED_GROUP + chunk, 4, 16))
        else:  # per-stage values the compiler can neither fold nor hoist; no shared load
            fake = cute.make_rmem_tensor((4,), cutlass.Uint32)
            for q in cutlass.range_constexpr(4):
                fake[q] = (scale_words[rr][0] ^ cutlass.Uint32(row * 0x01010101 + q)) & 0x3F3F3F3F
            words.append(fake)
    return words, scale_words


@cute.jit
def convert_packed(words, scale_words, frag_words, group0):
    """Word kb of a row's chunk: bytes 0-1 the pair (2t, 2t + 1) of k16 block kb, bytes 2-3
    the pair (2t + 8, 2t + 9); converted as the shipped kernel converts."""
    big = Int32(0)
    rests = []
    for rr in cutlass.range_constexpr(2):
        for j in cutlass.range_constexpr(2):
            s = Int32(scale_words[rr][0] >> (8 * (group0 + j))) & 0xFF
            factor, rest, is_big = scale_factors(s)
            rests.append(rest)
            big = big | is_big
            for kb in cutlass.range_constexpr(2 * j, 2 * j + 2):
                for hi in cutlass.range_constexpr(2):
                    frag_words[rr + 2 * hi + 4 * kb] = dequant_pair(words[rr][kb], factor, hi == 1)
    if big != 0:
        for rr in cutlass.range_constexpr(2):
            for kb in cutlass.range_constexpr(4):
                for hi in cutlass.range_constexpr(2):
                    idx = rr + 2 * hi + 4 * kb
                    frag_words[idx] = mul_bf16x2(frag_words[idx], rests[2 * rr + kb // 2])


class Packed(HookedLoop):
    """The shipped stage loop on a :func:`permute_weight` weight, each row's fragment bytes
    one 16-byte load (variant 59); PackedNoLds without those loads, Blocked on a
    :func:`block_weight` weight (variant 60)."""

    loads = True
    blocked = False

    @cute.jit
    def _launch(self, tokens, mSA, mW, mSW, mD, mBias, m, partials, flags, stream):
        if cutlass.const_expr(self.blocked):
            # element (n, k) of the logical weight where block_weight put it
            kb = self.k // PACKED_GROUP
            block = BLOCK_ROWS * PACKED_GROUP
            layout = cute.make_layout(
                ((BLOCK_ROWS, self.n // BLOCK_ROWS), (PACKED_GROUP, kb)),
                stride=((PACKED_GROUP, kb * block), (1, block)),
            )
            mW = cute.make_tensor(mW.iterator, layout)
        Shipped._launch(self, tokens, mSA, mW, mSW, mD, mBias, m, partials, flags, stream)

    def _load_weight(self, stage, row0, t, scales, scale_row0, blocks):
        return load_packed(stage, row0, t, scales, scale_row0, self.loads)

    def _convert_weight(self, words, scales, selector, frag_words, blocks, group0):
        convert_packed(words, scales, frag_words, group0)


class Blocked(Packed):
    """``packed`` on the weight in contiguous 128-row x 64-byte stage blocks."""

    blocked = True


class PackedNoLds(Packed):
    """``packed`` with no shared loads of the weight (wrong bits)."""

    loads = False


STAMP_POINTS = ("data", "wgmma_done", "converted", "issued")
"""Per stage, where a consumer warp of ``stamped`` reads %clock64: its stage's load has
landed, its previous stage's wgmmas are done, the stage is converted, its wgmmas are issued.
The producer warp stamps the first two: the stage's slot is free, its loads are issued."""
STAMP_STAGES = 64
"""The stages ``stamped`` records per warp (its first ones)."""
STAMP_ROWS = STAMP_STAGES + 1
"""A warp's rows of stamps: one per recorded stage, then a consumer's start and end."""
STAMP_CTAS = 2
"""The CTAs ``stamped`` records (the first ones)."""
WARPS = 12
"""Warps of a two-consumer token-tile CTA (the producer's four first)."""


@dsl_user_op
def _stamp(addr, *, loc=None, ip=None):
    """``%clock64`` stored at global address ``addr``."""
    inline_ptx(
        "{\n.reg .u64 t;\nmov.u64 t, %clock64;\nst.global.u64 [$0], t;\n}",
        "l", [Int64(addr).ir_value(loc=loc, ip=ip)], None, True, loc=loc, ip=ip,
    )  # fmt: skip


class PingPong(HookedLoop):
    """The shipped stage loop, the two consumers taking turns to issue their wgmmas through
    named barriers TURN_BAR and TURN_BAR + 1 (variant 61): the same bits."""

    @cute.jit
    def _tiles_consumer(
        self, cw, ct, cta, st, tiled_mma, sA16, mD, mBias, m, mPartials, mFlags, load_pipe
    ):  # fmt: skip
        both = 2 * WG_THREADS
        if cw == 1:  # consumer 0 takes the first turn
            cute.arch.barrier_arrive(barrier_id=TURN_BAR, number_of_threads=both)
        Shipped._tiles_consumer(
            self, cw, ct, cta, st, tiled_mma, sA16, mD, mBias, m, mPartials, mFlags, load_pipe
        )  # fmt: skip
        if cw == 0:  # consumer 1's arrive after its last turn
            cute.arch.barrier(barrier_id=TURN_BAR, number_of_threads=both)

    @cute.jit
    def _at(self, stage, row0, point: int):
        cw = row0 // TILE_W
        if cutlass.const_expr(point == 2):  # converted: wait for this consumer's turn
            cute.arch.barrier(barrier_id=TURN_BAR + cw, number_of_threads=2 * WG_THREADS)
        if cutlass.const_expr(point == 3):  # issued: the other consumer's turn
            cute.arch.barrier_arrive(barrier_id=TURN_BAR + 1 - cw, number_of_threads=2 * WG_THREADS)


class ProducerHooks(Shipped):
    """The shipped producer's stage loop (tile_w 128) with hooks once a stage's slot is
    acquired and once its loads are issued (``_slot_acquired``, ``_loads_issued``; no-ops
    here): what ``stamped`` and ``prefetch`` add to it."""

    @cute.jit
    def _load_tile(self, t, token_tiles, k0, k1, loads, ps):
        tma_w, tWs, tWg, token_views, tma_sw, tSWs, tSWg, load_pipe, rank = loads
        w_group, token_tile = self._tile_coords(t, token_tiles)
        w_tile = self._w_tile(w_group, rank)
        w_chunk0 = ((w_tile * self.tile_w) // ROW_BLOCK) * self.k_tiles
        for ks in range(k0, k1):
            load_pipe.producer_acquire(ps)
            self._slot_acquired(ps)
            bar = load_pipe.producer_get_barrier(ps)
            cute.copy(tma_w, tWg[(None, w_tile, ks)], tWs[(None, ps.index)], tma_bar_ptr=bar)
            self._load_token_rows(token_views, token_tile, ks, ps.index, rank, bar)
            cute.copy(
                tma_sw, tSWg[(None, 0, w_chunk0 + ks // 2)], tSWs[(None, ps.index)],
                tma_bar_ptr=bar,
            )  # fmt: skip
            load_pipe.producer_commit(ps)
            self._loads_issued(ps, ks, k1, tma_w, tWg, w_tile)
            ps.advance()
        return ps

    def _slot_acquired(self, ps):
        pass

    def _loads_issued(self, ps, ks, k1, tma_w, tWg, w_tile):
        pass


PREFETCH_STAGES = 16
"""How many stages ahead of its loads ``prefetch`` asks L2 for the weight."""


class Prefetch(ProducerHooks):
    """The shipped kernel whose producer, after each stage's loads, asks L2 for the weight
    box PREFETCH_STAGES stages on (cp.async.bulk.prefetch.tensor), so that the stage's TMA
    finds it there rather than in DRAM: the same loads and wgmmas, the same bits."""

    @cute.jit
    def _loads_issued(self, ps, ks, k1, tma_w, tWg, w_tile):
        if ks + PREFETCH_STAGES < k1:
            cute.prefetch(tma_w, tWg[(None, w_tile, ks + PREFETCH_STAGES)])


class Stamped(ProducerHooks, HookedLoop):
    """The shipped stage loop with lane 0 of each consumer warp of the first STAMP_CTAS CTAs
    stamping STAMP_POINTS at its first STAMP_STAGES stages into the int64 buffer at
    ``stamps_addr`` ([cta][warp][row][point], STAMP_ROWS rows, a compile-time address), and
    the producer and the consumers' start and end: the same bits."""

    stamps_addr = 0

    @cute.jit
    def _at(self, stage, row0, point: int):
        tidx, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        if cta < STAMP_CTAS and tidx % 32 == 0 and stage < STAMP_STAGES:
            slot = ((cta * WARPS + tidx // 32) * STAMP_ROWS + stage) * len(STAMP_POINTS) + point
            _stamp(Int64(self.stamps_addr) + Int64(slot) * 8)

    @cute.jit
    def _tiles_consumer(
        self, cw, ct, cta, st, tiled_mma, sA16, mD, mBias, m, mPartials, mFlags, load_pipe
    ):  # fmt: skip
        """The shipped consumer, stamping its start and end (points 0 and 1 of its row
        STAMP_STAGES): the whole of its work, stores and split-tail sums included."""
        self._mark(0)
        Shipped._tiles_consumer(
            self, cw, ct, cta, st, tiled_mma, sA16, mD, mBias, m, mPartials, mFlags, load_pipe
        )  # fmt: skip
        self._mark(1)

    @cute.jit
    def _mark(self, point: int):
        tidx, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        if cta < STAMP_CTAS and tidx % 32 == 0:
            row = (cta * WARPS + tidx // 32) * STAMP_ROWS + STAMP_STAGES
            _stamp(Int64(self.stamps_addr) + Int64(row * len(STAMP_POINTS) + point) * 8)

    @cute.jit
    def _slot_acquired(self, ps):
        self._at(ps.count, 0, 0)

    @cute.jit
    def _loads_issued(self, ps, ks, k1, tma_w, tWg, w_tile):
        self._at(ps.count, 0, 1)


CLASSES = {
    "shipped": Shipped,
    "double-buffered": DoubleBuffered,
    "no-convert": NoConvert,
    "packed": Packed,
    "blocked": Blocked,
    "ping-pong": PingPong,
    "packed-no-lds": PackedNoLds,
    "stamped": Stamped,
    "pairs": Shipped,
    "prefetch": Prefetch,
    "before": Before,
    "early-release": EarlyRelease,
}
"""Each variant's kernel class, by its ``--variants`` name."""

CLUSTERS = {"pairs": 2}
"""The CTAs per cluster a variant's config asks for, where not 1."""

LAYOUTS = {"packed": permute_weight, "blocked": block_weight}
"""The weight layout a variant reads, where it is not the natural one."""
