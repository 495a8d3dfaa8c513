"""The swap-AB kernel's token-tiled schedule, for any token count (imports cutlass: load
lazily; W8A16 builds with ``token_tiles``).

The weight stays the wgmma M operand, converted from its FP8 stage straight into register
fragments, and the tokens the N operand, TMA'd from their slices: no 16-bit copy of the
weight goes through shared memory, and no warpgroup only converts. What changes is the
work: the tokens are cut into tiles of ``tokens_tile`` (128, 192 or 256, one wgmma N), and
each persistent CTA takes whole (token tile, weight tile) pairs over all of K, tile c, c + G,
c + 2G, ... of G CTAs. Every output is one CTA's sum in K order, so the bits do not depend
on timing or on the grid, and nothing is published or waited for.

Its stages hold K 64, not 128: a 256-token tile's BF16 tokens are 32 KB per 64 K, so five
stages fit in shared memory where two of K 128 did, and two stages had left the tensor
cores waiting for the next one (docs/gemm_log.md, variants 54 and 55).

With ``split_tail`` the last wave is not left partial: where T tiles fill F whole waves of the
G CTAs and T' tiles remain, the T' tiles are each split into S = min(G / T', SPLIT_LIMIT)
parts of K, CTA c taking part c / T' of tile F G + c % T' after its whole tiles (below G
tiles every tile is a tail tile). The parts of one K range run at the same time on
neighbouring tiles, so they share their loads in L2 as whole tiles do. The CTA of a tile's
last part waits for the others' flags (st.release / ld.acquire; only CTAs that never wait
are waited on) and adds their parts to its own in part order, then stores the tile: the
bits depend on the token count and the grid, never on timing.

With ``cluster`` 2 the CTAs run in pairs over pair tiles (token tile, two adjacent weight
tiles): both CTAs of a pair take the same pair tiles and K stages, each its own weight tile,
and each loads half the stage's token tile (its rows) into both (TMA multicast). Every CTA's
stage still holds the whole token tile, while the tokens cross L2 once per 256 weight rows
instead of per 128. The split tail splits pair tiles the same way, over pairs of CTAs.

Tiles run in groups of RASTER_TOKENS tokens: within a group the token tile turns fastest,
so the CTAs at work at one time share a few weight tiles and a few token tiles, and each
stage read from HBM is read again from L2 by the group's other CTAs.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Int32
from cutlass.cute.nvgpu import warpgroup

from ....format import CHUNK_BYTES, ROW_BLOCK
from ..constants import UNROLL_CHUNK, WG_THREADS
from ..device.common import add_parts, chunk_views, store_flag, tma_views, wait_flag
from ..device.slices import (
    convert_fragment_natural,
    load_fragment_natural,
    load_stage_from_slices,
    pair_selector,
)
from .parts import L2_EVICT_NORMAL, TILE_W

RASTER_TOKENS = 1024
"""Tokens of one raster group: the CTAs at work at one time read about
``RASTER_TOKENS / tokens_tile`` token tiles and ``G tokens_tile / RASTER_TOKENS`` weight
tiles."""


SPLIT_LIMIT = 8
"""The most K parts of one tail tile: the CTA of its last part adds the others' partial sums
(64 rows x the token tile in FP32 per consumer) after its own, so each more part costs it a
load that more parallel K no longer repays."""
SPLIT_MIN_STAGES = 8
"""The fewest K stages (of 64) in one part of a split tile."""


class TokenTiles:
    """The token-tiled producer and consumers (mixed in before the swap-AB kernel class,
    whose kernel calls them in a ``token_tiles`` build)."""

    def _token_tile_count(self, m):
        return (m + self.tn - 1) // self.tn

    def _w_groups(self):
        """Weight tile groups: the weight tiles, or with clusters their adjacent pairs."""
        return (self.w_tiles + self.cluster - 1) // self.cluster

    def _tiles(self, m):
        """(token tile, weight tile group) pairs of ``m`` tokens."""
        return self._token_tile_count(m) * self._w_groups()

    def _max_split(self):
        return max(1, min(SPLIT_LIMIT, self.k_stages // SPLIT_MIN_STAGES))

    @cute.jit
    def _tiles_plan(self, m):
        """(grid, whole, tail, split) of ``m`` tokens: the CTA groups launched (CTAs, or
        pairs with clusters), the tiles taken whole (a multiple of the grid), the tail tiles
        after them and the K parts of each (1 where nothing is split)."""
        tiles = cutlass.max(self._tiles(m), 1)
        cap = self.num_ctas_cap // self.cluster
        grid = cutlass.min(tiles, cap)
        whole = tiles
        tail = Int32(0)
        split = Int32(1)
        if cutlass.const_expr(self.split_tail):
            # below cap tiles: each split as often as the CTAs allow; else the CTA count
            most = self._max_split()
            grid = cutlass.min(tiles * cutlass.min(cutlass.max(cap // tiles, 1), most), cap)
            whole = tiles // grid * grid
            tail = tiles - whole
            split = cutlass.min(cutlass.max(grid // cutlass.max(tail, 1), 1), most)
        return grid, whole, tail, split

    @cute.jit
    def _tail_part(self, group, tail, split):
        """(tile, part, first stage, end stage) of CTA group ``group``'s tail part, counted
        from the first tail tile; first == end for a group without one."""
        tails = cutlass.max(tail, 1)
        i = group % tails
        j = group // tails
        k0 = j * self.k_stages // split
        k1 = cutlass.select_(group < tail * split, (j + 1) * self.k_stages // split, k0)
        return i, j, k0, k1

    @cute.jit
    def _tile_coords(self, t, token_tiles):
        """(weight tile group, token tile) of tile ``t``: raster groups of token tiles, the
        token tile fastest within a group."""
        group = max(1, RASTER_TOKENS // self.tn)
        span = group * self._w_groups()
        g = t // span
        first = g * group
        rows = cutlass.min(token_tiles - first, group)
        r = t - g * span
        return r // rows, first + r % rows

    @cute.jit
    def _tiles_producer(
        self, cta, m, tma_w, gW_full, tma_a, gA_full, tma_sw, gSW_full, sW8, sA8, sSW, load_pipe
    ):  # fmt: skip
        """Per tile, its K stages of 64: the weight tile's, the token tile's (from the slice
        holding it) and the scale chunk of the stage's 128 K. The weight keeps the default
        L2 priority: the raster group's other token tiles read it."""
        sk = self.stage_k
        tWs, tWg = tma_views(tma_w, sW8, gW_full, (self.tile_w, sk))
        token_views = self._token_views(tma_a, sA8, gA_full)
        tSWs, tSWg = chunk_views(tma_sw, sSW, gSW_full)
        ps = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        token_tiles = self._token_tile_count(m)
        grid, whole, tail, split = self._tiles_plan(m)
        group, rank = self._group_rank(cta)
        loads = (tma_w, tWs, tWg, token_views, tma_sw, tSWs, tSWg, load_pipe, rank)
        for t in range(group, whole, grid):
            ps = self._load_tile(t, token_tiles, 0, self.k_stages, loads, ps)
        if cutlass.const_expr(self.split_tail):
            i, _j, k0, k1 = self._tail_part(group, tail, split)
            ps = self._load_tile(whole + i, token_tiles, k0, k1, loads, ps)
        load_pipe.producer_tail(ps)

    @cute.jit
    def _load_tile(self, t, token_tiles, k0, k1, loads, ps):
        """Tile ``t``'s K stages k0 .. k1 - 1 into the pipeline from ``ps`` on."""
        tma_w, tWs, tWg, token_views, tma_sw, tSWs, tSWg, load_pipe, rank = loads
        w_group, token_tile = self._tile_coords(t, token_tiles)
        w_tile = self._w_tile(w_group, rank)
        w_chunk0 = ((w_tile * self.tile_w) // ROW_BLOCK) * self.k_tiles
        for ks in range(k0, k1):
            load_pipe.producer_acquire(ps)
            bar = load_pipe.producer_get_barrier(ps)
            cute.copy(tma_w, tWg[(None, w_tile, ks)], tWs[(None, ps.index)], tma_bar_ptr=bar)
            self._load_token_rows(token_views, token_tile, ks, ps.index, rank, bar)
            cute.copy(
                tma_sw, tSWg[(None, 0, w_chunk0 + ks // 2)], tSWs[(None, ps.index)],
                tma_bar_ptr=bar,
            )  # fmt: skip
            load_pipe.producer_commit(ps)
            ps.advance()
        return ps

    @cute.jit
    def _load_token_rows(self, token_views, token_tile, ks, index, rank, bar):
        """Stage ``ks`` of the token tile into stage ``index``: all of it, or with clusters
        this CTA's half of its rows into the stage of both CTAs (``_token_views``'s half
        boxes, slot 2 index + rank)."""
        kt, half = ks // 2, (ks % 2,)  # the slices' stages hold K 128: one half of one
        rows, slot, options = token_tile, (lambda _h: index), {}
        if cutlass.const_expr(self.cluster > 1):
            rows = self.cluster * token_tile + rank
            slot = lambda _h: self.cluster * index + rank  # noqa: E731
            options = {
                "mcast_mask": cutlass.Int16((1 << self.cluster) - 1),
                "cache_policy": cutlass.Int64(L2_EVICT_NORMAL),
            }
        load_stage_from_slices(token_views, self.slice_stages, rows, kt, half, slot, bar, options)

    @cute.jit
    def _tiles_consumer(
        self, cw, ct, cta, st, tiled_mma, sA16, mD, mBias, m, mPartials, mFlags, load_pipe
    ):  # fmt: skip
        """Consumer ``cw`` (its 64 weight rows of every stage), tile by tile: all K stages
        into its accumulator, then the tile's outputs stored; then its tail part, if any."""
        thr = tiled_mma.get_slice(ct)
        frag = tiled_mma.make_fragment_A(thr.partition_shape_A((TILE_W, self.stage_k)))
        frag_words = cute.recast_tensor(frag, Int32)
        tCrB = tiled_mma.make_fragment_B(thr.partition_B(sA16))
        acc = cute.make_rmem_tensor(thr.partition_shape_C((TILE_W, self.tn)), cutlass.Float32)
        tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
        mma = (tiled_mma, frag, frag_words, tCrB, acc)
        lane = ct % 32
        row0 = (ct // 32) * 16 + lane // 4 + cw * TILE_W
        t = lane % 4
        token_tiles = self._token_tile_count(m)
        grid, whole, tail, split = self._tiles_plan(m)
        group, rank = self._group_rank(cta)
        for tile in range(group, whole, grid):
            w_group, token_tile = self._tile_coords(tile, token_tiles)
            w_tile = self._w_tile(w_group, rank)
            g = (tile - group) // grid * self.k_stages  # the stages this CTA took before
            self._tile_part(st, row0, t, w_tile, mma, load_pipe, g, 0, self.k_stages)
            self._store_tile(thr, acc, mD, mBias, m, w_tile, cw, token_tile * self.tn)
        if cutlass.const_expr(self.split_tail):
            i, j, k0, k1 = self._tail_part(group, tail, split)
            if k1 > k0:
                w_group, token_tile = self._tile_coords(whole + i, token_tiles)
                w_tile = self._w_tile(w_group, rank)
                g = whole // grid * self.k_stages  # after its whole tiles
                self._tile_part(st, row0, t, w_tile, mma, load_pipe, g, k0, k1)
                slot = self._slot(cta, cw)
                if j < split - 1:
                    self._publish_part(ct, cw, acc, mPartials, mFlags, slot)
                else:
                    # part p of this tile: the CTA of this rank in group i + p tail
                    parts = lambda p: self._slot(self._cta_of(i + p * tail, rank), cw)  # noqa: E731
                    self._add_published(ct, cw, acc, mPartials, mFlags, split - 1, parts)
                    self._store_tile(thr, acc, mD, mBias, m, w_tile, cw, token_tile * self.tn)
                    self._rearm(ct, cw, mFlags, split - 1, parts)

    @cute.jit
    def _tile_part(self, st, row0, t, w_tile, mma, load_pipe, g, k0, k1):
        """The accumulator of one tile's stages k0 .. k1 - 1, this CTA's ``g``-th stage on:
        every stage consumed and released."""
        stages = self.stages
        ls = pipeline.PipelineState(stages, g, g % stages, (g // stages) % 2)
        rel = pipeline.PipelineState(stages, g, g % stages, (g // stages) % 2)
        mma[4].fill(0.0)
        ls, rel = self._tile_stages(st, row0, t, w_tile, mma, load_pipe, ls, rel, k0, k1)
        warpgroup.wait_group(0)
        load_pipe.consumer_release(rel)

    @cute.jit
    def _publish_part(self, ct, cw, acc, mPartials, mFlags, slot):
        """Write this consumer's partial sum to workspace slot ``slot`` and raise its flag
        once every thread's values are out."""
        for i0 in cutlass.range_constexpr(0, cute.size(acc), UNROLL_CHUNK):
            for i in cutlass.range_constexpr(i0, min(i0 + UNROLL_CHUNK, cute.size(acc))):
                mPartials[i, ct, 0, slot] = acc[i]
        cute.arch.fence_acq_rel_gpu()
        cute.arch.barrier(barrier_id=self._bar(cw), number_of_threads=WG_THREADS)
        if ct == 0:
            store_flag(mFlags.iterator + slot, 1)

    @cute.jit
    def _add_published(self, ct, cw, acc, mPartials, mFlags, count, slot_of):
        """Wait for parts 0 .. count - 1 (slots ``slot_of(p)``; a thread a flag) and add
        them to ``acc`` in that order."""
        for p in range(ct, count, WG_THREADS):
            wait_flag(mFlags.iterator + slot_of(p))
        cute.arch.barrier(barrier_id=self._bar(cw), number_of_threads=WG_THREADS)
        cute.arch.fence_acq_rel_gpu()
        add_parts(acc, 0, count, lambda p: mPartials[None, ct, 0, slot_of(p)])

    @cute.jit
    def _rearm(self, ct, cw, mFlags, count, slot_of):
        """Every thread has read the parts: clear their flags for the next launch."""
        cute.arch.barrier(barrier_id=self._bar(cw), number_of_threads=WG_THREADS)
        for p in range(ct, count, WG_THREADS):
            store_flag(mFlags.iterator + slot_of(p), 0)

    @cute.jit
    def _tile_stages(self, st, row0, t, w_tile, mma, load_pipe, ls, rel, k0, k1):
        """A tile's K stages of 64 from k0 to k1 - 1: per stage its weight rows converted into the A fragment
        (natural K order, the second K half's scale bytes for odd stages) and four k16
        wgmmas on the stage's token tile. Each stage is released once its wgmmas, which read
        the token tile, are done (at the next stage); the last stays with ``rel``."""
        tiled_mma, frag, frag_words, tCrB, acc = mma
        blocks = self.stage_k // 16
        w8 = st.sW8.data_ptr().toint()
        sw = st.sSW.data_ptr().toint()
        selector = pair_selector(t)
        scale_row0 = (w_tile * self.tile_w) % ROW_BLOCK
        for ks in range(k0, k1):
            load_pipe.consumer_wait(ls)
            w_words, w_scales = load_fragment_natural(
                w8 + ls.index * (self.tile_w * self.stage_k), row0, t,
                sw + ls.index * CHUNK_BYTES, scale_row0, blocks,
            )  # fmt: skip
            # the previous stage's wgmmas have read the fragment registers and token tile
            warpgroup.wait_group(0)
            if rel.count < ls.count:
                load_pipe.consumer_release(rel)
                rel.advance()
            convert_fragment_natural(w_words, w_scales, selector, frag_words, blocks, 2 * (ks % 2))
            warpgroup.fence()
            for kb in cutlass.range_constexpr(blocks):
                cute.gemm(
                    tiled_mma, acc, frag[(None, None, kb)], tCrB[(None, None, kb, ls.index)], acc
                )  # fmt: skip
            warpgroup.commit_group()
            ls.advance()
        return ls, rel
