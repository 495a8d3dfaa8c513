"""The swap-AB GEMM's W8A16 entry (imports cutlass: load lazily): ``out[:M] =
cat(slices, -1) @ dequant(W).T (+ bias)`` for M <= the token tile, the tokens read as they
are from up to eight BF16 slices (gemm_sm90.device.slices), the weight converted as in the W8A8
kernel, in natural K order."""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

from ..device.slices import SlicesEntry, slice_operands
from .kernel import MXFP8SwapABGemmSm90


class W8A16SwapABGemmSm90(SlicesEntry, MXFP8SwapABGemmSm90):
    """The swap-AB kernel on BF16 slices of widths ``widths`` (multiples of 128, K their sum);
    ``cfg`` has ``bf16_tokens`` (the tokens arrive BF16 through TMA)."""

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
