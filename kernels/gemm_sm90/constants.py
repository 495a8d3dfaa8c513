"""Constants more than one kernel module uses: plain ints, so host modules import them
without cutlass. Format facts (group size, chunk bytes, ...) are in ``mxfp8_fusion.format``."""

from __future__ import annotations

from ...format import CHUNK_BYTES, GROUP, GROUP_BLOCK

WG_THREADS = 128
"""Threads of one warpgroup (4 warps): the unit of wgmma and of register reallocation."""

TILE_K8 = GROUP * GROUP_BLOCK
"""K of one FP8 GEMM stage (128): 4 scale groups, one 512-byte scale chunk per 128 rows."""

TILE_K16 = 64
"""K of one 16-bit GEMM stage: one 128-byte swizzle row of BF16/FP16."""

CHUNK_WORDS = CHUNK_BYTES // 4
"""One 512-byte chunk of the blocked scale layout as int32 words: the scale TMA boxes' unit."""

UNROLL_CHUNK = 32
"""Iterations of one static (unrolled) loop over a register fragment. A fragment of 64 or
more values is walked in chunks: the DSL warns of one static loop that long (slow to
compile), and ``cutlass.range(..., unroll_full=True)``, which it suggests, changes the PTX.
Chunks unroll to exactly the same code."""

MAX_SLICES = 8
"""Slices a W8A16 kernel reads (one TMA descriptor each, in its launch's parameters); a call
with more runs the reference."""
