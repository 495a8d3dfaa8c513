"""The tiled GEMM's W8A16 variant (imports cutlass: load lazily): ``out[:M] =
cat(slices, -1) @ dequant(B).T (+ bias)``, A read as it is from up to eight BF16 slices into
BF16 stages (gemm_sm90.device.slices) and moved into the RS wgmma's fragments without
conversion, B converted into a BF16 tile as in the W8A8 kernel. Every tile takes the BF16
path: the host passes references that say so (gemm_sm90.host.buffers.bf16_references).

A composition: :class:`SlicesA` overrides the base kernel's A hooks (its stages, loads and
placement, and when its stages are released), ``SlicesEntry`` the entry's arguments; the
base kernel (tiled.kernel, tiled.consumer) has no W8A16 branch of its own."""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

from ....format import CHUNK_BYTES
from ..constants import TILE_K8, TILE_K16
from ..device.common import chunk_slots, smem_layout
from ..device.slices import (
    SlicesEntry,
    load_fragment_bf16,
    load_stage_from_slices,
    place_fragment_bf16,
    slice_operands,
    slice_tma,
    slice_views,
)
from .kernel import MXFP8TiledGemmSm90


class SlicesA:
    """The tiled kernel's A read from BF16 slices through TMA, one atom per slice, and moved
    into the wgmma fragments unconverted (mixed in before the kernel class)."""

    bf16_path_only = True
    staged_a_chunks = 0  # no A scales

    def _a_operand(self, tokens, mSA):
        # two K halves of BF16 per stage; no A scales (the slot below is unused)
        a_type = bf16 = cutlass.BFloat16
        a_layout = smem_layout(bf16, self.tile_m, TILE_K16, 2 * self.stages8)
        tma_a, gA = slice_tma(tokens, a_layout, self.tile_m)
        sa_slots = 1
        sa_layout = chunk_slots(sa_slots)
        tma_sa, gSA = None, None
        a_bytes = self.tile_m * TILE_K8 * 2
        scale_bytes = CHUNK_BYTES
        return a_type, a_layout, tma_a, gA, sa_slots, sa_layout, tma_sa, gSA, a_bytes, scale_bytes

    def _a_atoms(self, tma_a, tma_sa):
        return tuple(tma_a), ()

    def _a_views(self, tma_a, sA, gA_full):
        return slice_views(tma_a, sA, gA_full, self.tile_m)

    def _a_scale_views(self, tma_sa, sSA, gSA_full):
        return None, None

    @cute.jit
    def _load_a_stage(self, tma_a, views, ps, tm, kt, bar):
        # from the slice holding stage kt, both K halves (rows past M: zeros)
        load_stage_from_slices(
            views, self.slice_stages, tm, kt, (0, 1), lambda h: 2 * ps.index + h, bar, {}
        )

    def _load_a_half(self, a8, sa, ls, h, row0, t, groups, scale_row0):
        # BF16 A, TMA'd: no conversion, no scales
        half_stage = a8 + (2 * ls.index + h) * (self.tile_m * TILE_K16 * 2)
        return load_fragment_bf16(half_stage, row0, t), None

    def _place_a_half(
        self, words, scales, groups, frag_words, row_lows, conv_pipe, rel, rs, load_pipe, ls,
        last,
    ):  # fmt: skip
        place_fragment_bf16(words, frag_words)
        return rel

    def _after_half_issued(self, conv_pipe, rel, rs, load_pipe, ls, last):
        # BF16 A goes from its shared-memory loads straight to the wgmmas: nothing before
        # them waits for the loads, and an mbarrier arrive does not either (ptxas: the
        # arrive issued with the loads in flight, and the producer's next TMA raced them:
        # docs/gemm_log.md, variant 53). The wgmmas' issue waits for the loaded registers,
        # so the stages are released after it.
        rel = self._release_b16(conv_pipe, rel, rs)
        if last:
            load_pipe.consumer_release(ls)
        return rel


class W8A16TiledGemmSm90(SlicesEntry, SlicesA, MXFP8TiledGemmSm90):
    """The tiled kernel on BF16 slices of widths ``widths`` (multiples of 128, K their sum)."""

    @cute.jit
    def __call__(
        self,
        a0, a1, a2, a3, a4, a5, a6, a7,  # the slices (None past the build's count)
        ld0, ld1, ld2, ld3, ld4, ld5, ld6, ld7,  # their row strides, in elements
        b: cute.Pointer, sb: cute.Pointer, bias, out: cute.Pointer, m: cutlass.Int32,
        refs_a: cute.Pointer, refs_b: cute.Pointer,  # every row -1: the BF16 path
        partials, flags,  # the stream-K workspace (None in a build without stream-K)
        stream: cuda.CUstream,
    ):  # fmt: skip
        """Launch on ``stream``; ``bias`` is None in a build without bias."""
        tokens, mB, mSB, mD, mBias = slice_operands(
            self, (a0, a1, a2, a3, a4, a5, a6, a7), (ld0, ld1, ld2, ld3, ld4, ld5, ld6, ld7),
            b, sb, bias, out, m, self.b_chunks,
        )  # fmt: skip
        self._launch(tokens, None, mB, mSB, mD, mBias, m, refs_a, refs_b, partials, flags, stream)
