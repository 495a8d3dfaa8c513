"""MXFP8 format facts shared by every piece of the project.

Values are ``torch.float8_e4m3fn``, row-major ``[rows, K]``. Every 32 consecutive elements
of a row share one E8M0 scale (``torch.float8_e8m0fnu``, byte = exponent + 127) chosen by
the RCEIL rule, bit for bit as torchao's ``to_mx(..., ScaleCalculationMode.RCEIL)``.

GEMM operands keep their scales in the 128x4 blocked layout of cuBLAS / CUTLASS / torchao
``to_blocked``: one 512-byte chunk per 128-row x 4-group tile, stored as a flat byte buffer.
Rows are padded to a multiple of 128 and groups to a multiple of 4; padding holds scale
byte 127 (a scale of 1.0) and zero values.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

GROUP = 32
"""Elements of one row that share one scale."""

E4M3_MAX = 448.0
"""Largest finite ``float8_e4m3fn`` magnitude."""

SCALE_BIAS = 127
"""E8M0 exponent bias: scale byte ``b`` means ``2 ** (b - 127)``."""

SCALE_PAD = 127
"""Scale byte written into padding rows and groups (a scale of exactly 1.0)."""

ROW_BLOCK = 128
"""Rows covered by one 512-byte chunk of the blocked scale layout."""

GROUP_BLOCK = 4
"""Groups (of 32 columns) covered by one 512-byte chunk."""

CHUNK_BYTES = 512

STAGE_ALIGN = ROW_BLOCK
"""Staged slice widths and destination columns must be multiples of this: then a slice's
scales are a strided sub-view of the destination and no 512-byte chunk is shared."""

VALUE_DTYPE = torch.float8_e4m3fn
SCALE_DTYPE = torch.float8_e8m0fnu
SOURCE_DTYPES = (torch.bfloat16, torch.float16)


def ceil_div(a, b):
    """``ceil(a / b)`` for non-negative ints; also works on SymInts under tracing."""
    return (a + b - 1) // b


def padded_rows(rows):
    """Rows of the scale layout: ``rows`` rounded up to a multiple of 128."""
    return ceil_div(rows, ROW_BLOCK) * ROW_BLOCK


def scale_groups(k: int) -> int:
    """Scale groups of one row of ``k`` columns (``k`` must be a multiple of 32)."""
    return k // GROUP


def scale_bytes(rows, k: int):
    """Bytes of the blocked scale buffer for ``rows`` x ``k`` values, padding included."""
    return ceil_div(rows, ROW_BLOCK) * ceil_div(scale_groups(k), GROUP_BLOCK) * CHUNK_BYTES


def scale_offset(row, group, k: int):
    """Byte offset of (row, group) in the blocked layout; works on ints and int tensors.

    ``(r%32)*16 + ((r//32)%4)*4 + (g%4) + (g//4)*512 + (r//128)*G4*512``, ``G4 = ceil(G/4)``.
    """
    g4 = ceil_div(scale_groups(k), GROUP_BLOCK)
    return (
        (row % 32) * 16
        + ((row // 32) % 4) * 4
        + (group % 4)
        + (group // 4) * CHUNK_BYTES
        + (row // ROW_BLOCK) * g4 * CHUNK_BYTES
    )


@dataclass(frozen=True)
class MXFP8Input:
    """MXFP8 storage for the left GEMM operand (activations), ``capacity`` rows.

    ``values`` is ``[capacity, in_features]`` ``float8_e4m3fn``; ``scales`` is the flat
    blocked scale buffer of ``scale_bytes(capacity, in_features)`` ``float8_e8m0fnu`` bytes.
    Rows past the live token count are never read by the GEMM. ``dtype`` (BF16 or FP16)
    is the dtype the GEMM returns by default.
    """

    values: torch.Tensor
    scales: torch.Tensor
    dtype: torch.dtype = torch.bfloat16

    @property
    def capacity(self) -> int:
        return self.values.shape[0]

    @property
    def in_features(self) -> int:
        return self.values.shape[1]

    @property
    def device(self) -> torch.device:
        return self.values.device


@dataclass(frozen=True)
class MXFP8Weight:
    """A packed MXFP8 weight ``[out_features, in_features]`` (the right GEMM operand).

    ``values`` is ``[N, K]`` ``float8_e4m3fn`` (K contiguous); ``scales`` is the flat blocked
    scale buffer for N rows and K/32 groups.
    """

    values: torch.Tensor
    scales: torch.Tensor

    @property
    def out_features(self) -> int:
        return self.values.shape[0]

    @property
    def in_features(self) -> int:
        return self.values.shape[1]

    @property
    def device(self) -> torch.device:
        return self.values.device
