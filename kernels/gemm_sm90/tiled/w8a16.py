"""The tiled GEMM's W8A16 entry (imports cutlass: load lazily): ``out[:M] =
cat(slices, -1) @ dequant(B).T (+ bias)``, A read as it is from up to eight BF16 slices into
BF16 stages (gemm_sm90.device.slices) and moved into the RS wgmma's fragments without conversion,
B converted into a BF16 tile as in the W8A8 kernel. Every tile takes the BF16 path: the
host passes references that say so (gemm_sm90.host.buffers.bf16_references)."""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute

from ..device.slices import SlicesEntry, slice_operands
from .kernel import MXFP8TiledGemmSm90


class W8A16TiledGemmSm90(SlicesEntry, MXFP8TiledGemmSm90):
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
