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
from ..device.common import chunk_views, tma_views
from ..device.slices import (
    convert_fragment_natural,
    load_fragment_natural,
    load_stage_from_slices,
    pair_selector,
)
from .parts import TILE_W

RASTER_TOKENS = 1024
"""Tokens of one raster group: the CTAs at work at one time read about
``RASTER_TOKENS / tokens_tile`` token tiles and ``G tokens_tile / RASTER_TOKENS`` weight
tiles."""


class TokenTiles:
    """The token-tiled producer and consumers (mixed in before the swap-AB kernel class,
    whose kernel calls them in a ``token_tiles`` build)."""

    def _token_tile_count(self, m):
        return (m + self.tn - 1) // self.tn

    def _tiles(self, m):
        """(token tile, weight tile) pairs of ``m`` tokens."""
        return self._token_tile_count(m) * self.w_tiles

    @cute.jit
    def _tile_coords(self, t, token_tiles):
        """(weight tile, token tile) of tile ``t``: raster groups of token tiles, the token
        tile fastest within a group."""
        group = max(1, RASTER_TOKENS // self.tn)
        span = group * self.w_tiles
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
        tiles = token_tiles * self.w_tiles
        grid = cutlass.min(tiles, self.num_ctas_cap)
        for t in range(cta, tiles, grid):
            w_tile, token_tile = self._tile_coords(t, token_tiles)
            w_chunk0 = ((w_tile * self.tile_w) // ROW_BLOCK) * self.k_tiles
            for ks in range(self.k_stages):
                load_pipe.producer_acquire(ps)
                bar = load_pipe.producer_get_barrier(ps)
                cute.copy(tma_w, tWg[(None, w_tile, ks)], tWs[(None, ps.index)], tma_bar_ptr=bar)
                slot = lambda _h: ps.index  # noqa: E731  (one K half per stage)
                load_stage_from_slices(
                    token_views, self.slice_stages, token_tile, ks // 2, (ks % 2,), slot, bar, {}
                )  # fmt: skip
                cute.copy(
                    tma_sw, tSWg[(None, 0, w_chunk0 + ks // 2)], tSWs[(None, ps.index)],
                    tma_bar_ptr=bar,
                )  # fmt: skip
                load_pipe.producer_commit(ps)
                ps.advance()
        load_pipe.producer_tail(ps)

    @cute.jit
    def _tiles_consumer(self, cw, ct, cta, st, tiled_mma, sA16, mD, mBias, m, load_pipe):
        """Consumer ``cw`` (its 64 weight rows of every stage), tile by tile: all K stages
        into its accumulator, then the tile's outputs stored."""
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
        stages = self.stages
        token_tiles = self._token_tile_count(m)
        tiles = token_tiles * self.w_tiles
        grid = cutlass.min(tiles, self.num_ctas_cap)
        for tile in range(cta, tiles, grid):
            w_tile, token_tile = self._tile_coords(tile, token_tiles)
            g = (tile - cta) // grid * self.k_stages  # the stages this CTA took before
            ls = pipeline.PipelineState(stages, g, g % stages, (g // stages) % 2)
            rel = pipeline.PipelineState(stages, g, g % stages, (g // stages) % 2)
            acc.fill(0.0)
            ls, rel = self._tile_stages(st, row0, t, w_tile, mma, load_pipe, ls, rel)
            warpgroup.wait_group(0)
            load_pipe.consumer_release(rel)
            self._store_tile(thr, acc, mD, mBias, m, w_tile, cw, token_tile * self.tn)

    @cute.jit
    def _tile_stages(self, st, row0, t, w_tile, mma, load_pipe, ls, rel):
        """A tile's K stages of 64: per stage its weight rows converted into the A fragment
        (natural K order, the second K half's scale bytes for odd stages) and four k16
        wgmmas on the stage's token tile. Each stage is released once its wgmmas, which read
        the token tile, are done (at the next stage); the last stays with ``rel``."""
        tiled_mma, frag, frag_words, tCrB, acc = mma
        blocks = self.stage_k // 16
        w8 = st.sW8.data_ptr().toint()
        sw = st.sSW.data_ptr().toint()
        selector = pair_selector(t)
        scale_row0 = (w_tile * self.tile_w) % ROW_BLOCK
        for ks in range(self.k_stages):
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
