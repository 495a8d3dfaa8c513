"""The tiled GEMM's weight-converter role (gemm_sm90.tiled; imports cutlass: load lazily).

Converter warpgroups turn the B (weight) half of each FP8 stage into scaled 16-bit stages of
K 64 in shared memory, which the consumers' RS wgmmas read. Per 32-element unit: two
16-byte shared loads, 16 pair conversions, four 16-byte shared stores, conflict-free under
the 128-byte swizzle, K permuted per scale group as the A fragment is (gemm_sm90.device.common).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Int32, Uint32

from ....format import CHUNK_BYTES, ROW_BLOCK
from ..constants import TILE_K8, TILE_K16
from ..device.common import (
    chunk_word,
    dequant_pair,
    load_smem_words,
    mul_bf16x2,
    scale_factors,
)
from ..device.f16 import RING_TO_LOW, dequant_pair_f16, f16_factor
from .schedule import HALVES, REF_STAGES, TiledSchedule


class WeightConverterRole(TiledSchedule):
    """The B-converter warpgroups' methods of MXFP8TiledGemmSm90. They read the tile
    geometry and work split of :class:`TiledSchedule` (``tile_n``, ``convert_threads``,
    ``stages8``, ``stages16``, the ring offsets, ``_my_units``, ``_segment``)."""

    @cute.jit
    def _converter(self, ct, m, st, load_pipe, conv_pipe, ref_pipe):
        """B half of each FP8 stage -> one scaled BF16 (or FP16) stage of K 64, K permuted
        per group."""
        refs = st.refs.data_ptr().toint()
        u, stop, hop = self._my_units(m)
        ls = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages8)
        cs = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages16)
        rfs = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, REF_STAGES)
        rows = self._converter_rows(ct)
        while u < stop:
            _t, _tm, tn, k0, k1, seg_end = self._segment(u, stop, m)
            b_row0 = (tn * self.tile_n) % ROW_BLOCK  # tile_n 64: the tile's rows in its chunk
            ref_pipe.consumer_wait(rfs)
            buf = refs + rfs.index * (self.ref_words * 4)
            mode = load_smem_words(buf + self.mode_word * 4, 1, 4)[0]
            # the FP16 factors want ref - 15 (f16_factor)
            row_lows = [
                Int32(load_smem_words(buf + (self.b_ref0 + r) * 4, 1, 4)[0]) + RING_TO_LOW
                for r in rows
            ]
            ref_pipe.consumer_release(rfs)
            rfs.advance()
            if cutlass.const_expr(self.bf16_path_only):
                ls, cs = self._convert_tile(
                    ct, st, b_row0, load_pipe, conv_pipe, ls, cs, None, k1 - k0
                )
            elif mode != 0:
                ls, cs = self._convert_tile(
                    ct, st, b_row0, load_pipe, conv_pipe, ls, cs, None, k1 - k0
                )
            else:
                ls, cs = self._convert_tile(
                    ct, st, b_row0, load_pipe, conv_pipe, ls, cs, row_lows, k1 - k0
                )
            u = self._next_unit(seg_end, hop)

    def _converter_rows(self, ct):
        """The B rows of converter thread ``ct``'s units (see _convert_b)."""
        units = 2 * self.tile_n // self.convert_threads
        return [(ct // 16) * 8 + ct % 8 + u * (self.convert_threads // 2) for u in range(units)]

    @cute.jit
    def _convert_tile(self, ct, st, b_row0, load_pipe, conv_pipe, ls, cs, row_lows, k_stages):
        """One segment's ``k_stages`` B stages (FP16 with ``row_lows``, else BF16)."""
        b8 = st.sB8.data_ptr().toint()
        b16 = st.sB16.data_ptr().toint()
        sb = st.sSB.data_ptr().toint()
        for _kt in range(k_stages):
            load_pipe.consumer_wait(ls)
            first = cs.clone()
            for h in cutlass.range_constexpr(HALVES):
                if cutlass.const_expr(h > 0):
                    cs.advance()
                conv_pipe.producer_acquire(cs)
                self._convert_b(
                    ct,
                    h,
                    b_row0,
                    b8 + ls.index * (self.tile_n * TILE_K8),
                    sb + ls.index * CHUNK_BYTES,
                    b16 + cs.index * (self.tile_n * TILE_K16 * 2),
                    row_lows,
                )
            # generic-proxy stores -> visible to wgmma (async proxy) after the barrier
            cute.arch.fence_proxy("async.shared", space="cta")
            conv_pipe.producer_commit(first)
            conv_pipe.producer_commit(cs)
            cs.advance()
            load_pipe.consumer_release(ls)
            ls.advance()
        return ls, cs

    @cute.jit
    def _convert_b(self, ct, h: int, b_row0, src, scales, dst, row_lows):
        """Unit (row, j): the 32 FP8 bytes of scale group 2h + j of ``row``.

        Thread ct takes rows (ct / 16) * 8 + ct % 8 + (converter threads / 2) u and j = (ct /
        8) % 2: eight consecutive threads hold eight consecutive rows, so under the 128-byte
        swizzle each quarter-warp's loads and stores hit 8 distinct 16-byte chunks. Output
        chunk 4j + 2i + hi of the BF16 row holds, in word t, the pair ``hi`` of FP8 word
        4 (t / 2) + 2 (t % 2) + i of the unit (the K slot the A fragment gives it). With
        ``row_lows`` (``ref - 15`` of the thread's rows) the stage is FP16 instead.
        """
        smem = cute.AddressSpace.smem
        j = (ct // 8) % 2
        rows = self._converter_rows(ct)
        # all loads first, then the arithmetic, then the stores: one basic block
        loaded = []
        for row in rows:
            words = cute.make_rmem_tensor((8,), Uint32)
            for q in cutlass.range_constexpr(2):
                chunk = ((4 * h + 2 * j + q) ^ (row % 8)) << 4
                cute.autovec_copy(
                    cute.make_tensor(
                        cute.make_ptr(Uint32, src + row * TILE_K8 + chunk, smem, assumed_align=16),
                        cute.make_layout(4),
                    ),
                    cute.make_tensor(words.iterator + 4 * q, cute.make_layout(4)),
                )
            r = b_row0 + row
            sword = load_smem_words(scales + chunk_word(r) * 4, 1, 4)
            loaded.append((words, sword))
        outs = []
        big = Int32(0)
        rests = []
        for u, (words, sword) in enumerate(loaded):
            s = Int32(sword[0] >> (8 * (2 * h + j))) & 0xFF
            if cutlass.const_expr(row_lows is not None):
                factor = f16_factor(s, row_lows[u])
            else:
                factor, rest, is_big = scale_factors(s)
                big = big | is_big
                rests.append(rest)
            out = cute.make_rmem_tensor((16,), Int32)
            for i in cutlass.range_constexpr(2):
                for hi in cutlass.range_constexpr(2):
                    for t in cutlass.range_constexpr(4):
                        w = words[4 * (t // 2) + 2 * (t % 2) + i]
                        if cutlass.const_expr(row_lows is not None):
                            pair = dequant_pair_f16(w, factor, hi == 1)
                        else:
                            pair = dequant_pair(w, factor, hi == 1)
                        out[4 * (2 * i + hi) + t] = pair
            outs.append(out)
        if cutlass.const_expr(row_lows is None):
            if big != 0:
                for out, rest in zip(outs, rests, strict=True):
                    for x in cutlass.range_constexpr(16):
                        out[x] = mul_bf16x2(out[x], rest)
        for row, out in zip(rows, outs, strict=True):
            for c in cutlass.range_constexpr(4):
                dst_addr = dst + row * (TILE_K16 * 2) + (((4 * j + c) ^ (row % 8)) << 4)
                cute.autovec_copy(
                    cute.make_tensor(out.iterator + 4 * c, cute.make_layout(4)),
                    cute.make_tensor(
                        cute.make_ptr(Int32, dst_addr, smem, assumed_align=16),
                        cute.make_layout(4),
                    ),
                )
