"""The swap-AB GEMM's W8A16 variant (imports cutlass: load lazily): ``out[:M] =
cat(slices, -1) @ dequant(W).T (+ bias)`` for M <= the token tile, the tokens read as they
are from up to eight BF16 slices (gemm_sm90.device.slices), the weight converted as in the
W8A8 kernel, in natural K order.

A composition: :class:`SlicesTokens` overrides the base kernel's token hooks (where the
token tile comes from, and the weight's K order that goes with it), ``SlicesEntry`` the
entry's arguments; the base kernel (swap_ab.kernel) has no W8A16 branch of its own."""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

from ..constants import TILE_K16
from ..device.common import smem_layout
from ..device.slices import (
    SlicesEntry,
    convert_fragment_natural,
    load_fragment_natural,
    load_stage_from_slices,
    pair_selector,
    slice_operands,
    slice_tma,
    slice_views,
)
from .kernel import MXFP8SwapABGemmSm90
from .parts import L2_EVICT_NORMAL
from .token_tiles import TokenTiles


class SlicesTokens:
    """The swap-AB kernel's token tile read from BF16 slices through TMA, one atom per slice
    (mixed in before the kernel class): the weight then is converted in natural K order."""

    def _token_tma(self, tokens, a16_layout, tn: int):
        if self._half_rows():
            tn, a16_layout = self._half_boxes()
        return slice_tma(tokens, a16_layout, tn, multicast=self.cluster > 1)

    def _token_atoms(self, tma_a, tma_sa):
        return tuple(tma_a), ()

    def _token_views(self, tma_a, sA8, gA_full):
        if self._half_rows():
            rows, layout = self._half_boxes()
            return slice_views(tma_a, cute.make_tensor(sA8.iterator, layout.outer), gA_full, rows)
        return slice_views(tma_a, sA8, gA_full, self.tn)

    def _half_rows(self) -> bool:
        """Each CTA of a pair loads half the token tile's rows (token tiles on clusters;
        the decode schedule's pairs split a stage's K halves instead)."""
        return bool(self.token_tiles) and self.cluster > 1

    def _half_boxes(self):
        """(rows, stage layout) of the half-tile boxes: slot ``cluster * stage + rank`` is
        rank's rows of the stage, the same bytes as in the whole tile's 128-byte swizzled
        layout (the halves start at multiples of 8 rows)."""
        rows = self.tn // self.cluster
        return rows, smem_layout(cutlass.BFloat16, rows, TILE_K16, self.cluster * self.stages)

    @cute.jit
    def _load_token_stage(self, tma_a, views, ps, kt, rank, bar, token_tile):
        # from the slice holding stage kt; with clusters, K half ``rank`` into this stage
        # of both CTAs
        slot = lambda h: 2 * ps.index + h  # noqa: E731
        if cutlass.const_expr(self.cluster > 1):
            multicast = {
                "mcast_mask": cutlass.Int16((1 << self.cluster) - 1),
                "cache_policy": cutlass.Int64(L2_EVICT_NORMAL),
            }
            load_stage_from_slices(
                views, self.slice_stages, token_tile, kt, (rank,), slot, bar, multicast
            )
        else:
            load_stage_from_slices(views, self.slice_stages, token_tile, kt, (0, 1), slot, bar, {})

    def _fragment_selector(self, t):
        return pair_selector(t)

    def _load_weight_fragment(self, stage, row0, t, scales, scale_row0):
        # the tokens are in natural K order (TMA'd from the slices): so is the weight
        return load_fragment_natural(stage, row0, t, scales, scale_row0)

    def _convert_weight_fragment(self, w_words, w_scales, selector, frag_words):
        convert_fragment_natural(w_words, w_scales, selector, frag_words)


class W8A16SwapABGemmSm90(SlicesEntry, SlicesTokens, TokenTiles, MXFP8SwapABGemmSm90):
    """The swap-AB kernel on BF16 slices of widths ``widths`` (multiples of 128, K their sum);
    ``cfg`` has ``bf16_tokens`` (the tokens arrive BF16 through TMA); with ``token_tiles``
    the tokens in tiles, any count of them (swap_ab.token_tiles)."""

    def __init__(self, cfg, n: int, widths: tuple[int, ...], ld_out: int, bias_dtype, out_dtype):
        super().__init__(cfg, n, widths, ld_out, bias_dtype, out_dtype)
        if not self.bf16_tokens:
            raise ValueError(f"W8A16 reads BF16 tokens through TMA: bf16_tokens, got {cfg}")

    @cute.jit
    def __call__(
        self,
        a0, a1, a2, a3, a4, a5, a6, a7,  # the slices (None past the build's count)
        ld0, ld1, ld2, ld3, ld4, ld5, ld6, ld7,  # their row strides, in elements
        b: cute.Pointer, sb: cute.Pointer, bias, out: cute.Pointer, m: cutlass.Int32,
        partials: cute.Pointer, flags: cute.Pointer,  # the stream-K workspace
        stream: cuda.CUstream,
    ):  # fmt: skip
        """Launch on ``stream``; ``bias`` is None in a build without bias."""
        tokens, mW, mSW, mD, mBias = slice_operands(
            self, (a0, a1, a2, a3, a4, a5, a6, a7), (ld0, ld1, ld2, ld3, ld4, ld5, ld6, ld7),
            b, sb, bias, out, m, self.w_chunks,
        )  # fmt: skip
        self._launch(tokens, None, mW, mSW, mD, mBias, m, partials, flags, stream)
