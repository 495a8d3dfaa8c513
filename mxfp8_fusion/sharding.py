"""Splitting a linear layer's weight over tensor-parallel ranks, and reading one rank's part.

- :func:`split_out_features` / :func:`split_in_features`: which output rows (column
  parallelism) or input columns (row parallelism) each rank owns, 128-aligned.
- :func:`load_column_shard` / :func:`load_row_shard`: one rank's part of a full BF16/FP16
  weight or MXFP8 checkpoint, packed as MXFP8, reading only that part (a memory-mapped or
  lazily read checkpoint reads only its bytes).

Both rest on the format: quantization is per row and per 32 columns, and the blocked scale
layout keeps 128 rows x 128 columns per 512-byte chunk, so a 128-aligned part of a weight
quantizes to exactly that part of the quantized weight, and its scales are whole chunks.
"""

from __future__ import annotations

import itertools

import torch
from torch import Tensor

from . import api
from .format import (
    CHUNK_BYTES,
    GROUP,
    ROW_BLOCK,
    SCALE_DTYPE,
    STAGE_ALIGN,
    VALUE_DTYPE,
    MXFP8Weight,
    group_blocks,
    row_block_bytes,
    scale_bytes,
)

# --- how the features split over ranks ------------------------------------------------------


def split_out_features(out_features: int, world_size: int) -> list[tuple[int, int]]:
    """Output-feature rows ``[start, end)`` of each rank for column parallelism: equal shards,
    each a multiple of 128 rows.

    128 because a row block of the blocked scale layout holds 128 rows: a shard's scales are
    then one contiguous byte range of the full weight's, and its GEMM tiles are the full
    weight's tiles.

    Raises:
        ValueError: when ``out_features`` is not a multiple of ``128 * world_size``.
    """
    per_rank = out_features // world_size if world_size > 0 else 0
    if world_size <= 0 or out_features % world_size or per_rank % ROW_BLOCK or per_rank == 0:
        raise ValueError(
            f"out_features: expected a positive multiple of {ROW_BLOCK} * world size "
            f"({ROW_BLOCK * max(world_size, 1)}) for column parallelism, got {out_features}"
        )
    return [(r * per_rank, (r + 1) * per_rank) for r in range(world_size)]


def split_in_features(in_features: int, world_size: int) -> list[tuple[int, int]]:
    """Input-column ranges ``[start, end)`` of each rank for row parallelism: 128-column
    blocks dealt out as evenly as they go (ranks differ by at most one block).

    128 because that is the staging alignment: a range then covers whole 512-byte scale
    chunks, and a rank's input columns are a plain strided view of the input.

    Raises:
        ValueError: when ``in_features`` is not a multiple of 128 or has fewer 128-column
            blocks than there are ranks.
    """
    blocks = in_features // STAGE_ALIGN if world_size > 0 else 0
    if world_size <= 0 or in_features % STAGE_ALIGN or blocks < world_size:
        raise ValueError(
            f"in_features: expected a multiple of {STAGE_ALIGN} with at least one "
            f"{STAGE_ALIGN}-column block per rank ({max(world_size, 1)} ranks) for row "
            f"parallelism, got {in_features}"
        )
    edges = [r * blocks // world_size * STAGE_ALIGN for r in range(world_size + 1)]
    return list(itertools.pairwise(edges))


# --- reading one rank's part of a full weight -------------------------------------------------


def _shape(t, argument: str) -> tuple[int, ...]:
    """The shape of a tensor, or of a lazily read one (a safetensors slice: ``get_shape()``)."""
    if isinstance(t, Tensor):
        if t.device.type == "meta":
            raise ValueError(f"{argument}: expected a tensor with data, got one on the meta device")
        return tuple(t.shape)
    get_shape = getattr(t, "get_shape", None)
    if get_shape is None or not hasattr(t, "__getitem__"):
        raise TypeError(
            f"{argument}: expected a torch.Tensor or a sliceable lazy tensor (get_shape() and "
            f"[...] indexing, as a safetensors slice), got {type(t).__name__}"
        )
    return tuple(get_shape())


def _matrix_shape(t, argument: str) -> tuple[int, int]:
    shape = _shape(t, argument)
    if len(shape) != 2:
        raise ValueError(
            f"{argument}: expected a 2-D [out_features, in_features] weight, got shape {shape}"
        )
    return shape


def _is_blocked(scales, n: int, k: int) -> bool:
    """Whether ``scales`` is the blocked layout (1-D, as :class:`MXFP8Linear` stores it) rather
    than a checkpoint's row-major ``[N, K/32]``."""
    shape = _shape(scales, "scales")
    if len(shape) == 1:
        expected = scale_bytes(n, k)
        if shape[0] != expected:
            raise ValueError(
                f"scales: expected blocked scales of {expected} bytes or row-major "
                f"[{n}, {k // GROUP}], got shape {shape}"
            )
        return True
    return False


def _check_range(bounds, size: int, argument: str) -> tuple[int, int]:
    ok = (
        isinstance(bounds, (tuple, list))
        and len(bounds) == 2
        and all(type(b) is int for b in bounds)
        and 0 <= bounds[0] < bounds[1] <= size
    )
    if not ok:
        raise ValueError(
            f"{argument}: expected (start, end) with 0 <= start < end <= {size}, got {bounds!r}"
        )
    return bounds[0], bounds[1]


def _check_values(weight) -> None:
    if isinstance(weight, Tensor) and weight.dtype != VALUE_DTYPE:
        raise TypeError(f"weight: expected float8_e4m3fn values with scales, got {weight.dtype}")


def _as_scales(t: Tensor) -> Tensor:
    # blocked bytes as the module stores them: float8_e8m0fnu (a checkpoint may hold uint8)
    return t.contiguous().view(torch.uint8).view(SCALE_DTYPE)


def _detached(t: Tensor) -> Tensor:
    return t.detach() if isinstance(t, Tensor) else t


def _on(t: Tensor, device: torch.device) -> Tensor:
    # only the shard moves: a strided column range becomes a dense copy of its own size
    return t.to(device)


def load_column_shard(
    weight, rows: tuple[int, int], scales=None, device: torch.device | str | None = None
) -> MXFP8Weight:
    """This rank's output rows ``[start, end)`` of a full weight, packed as MXFP8 on ``device``.

    Only those rows are read from ``weight`` and ``scales`` (a memory-mapped checkpoint reads
    only their pages), so the full BF16 weight is never materialized:

    - ``weight`` BF16/FP16 ``[N, K]``: the rows are quantized on their own. MXFP8 quantization
      is per row and per 32 columns, so this gives exactly the rows of the quantized full
      weight.
    - ``weight`` E4M3 values with row-major ``[N, K/32]`` checkpoint scales: their rows.
    - ``weight`` E4M3 values with blocked scales (an :class:`MXFP8Linear`'s buffers): the
      rows and, with ``start`` and ``end`` multiples of 128, the row blocks' contiguous run
      of 512-byte scale chunks.

    Raises:
        TypeError, ValueError: on a wrong type, dtype, shape or range.
    """
    n, k = _matrix_shape(weight, "weight")
    start, end = _check_range(rows, n, "rows")
    device = torch.device(device) if device is not None else torch.get_default_device()
    if scales is None:
        return api.pack_weight(_on(weight[start:end], device))
    _check_values(weight)
    if _is_blocked(scales, n, k):
        if start % ROW_BLOCK or end % ROW_BLOCK:
            raise ValueError(f"rows: expected multiples of {ROW_BLOCK}, got {rows}")
        chunk_row = row_block_bytes(k)
        part = scales[start // ROW_BLOCK * chunk_row : end // ROW_BLOCK * chunk_row]
        values = _on(weight[start:end], device).contiguous()
        return MXFP8Weight(values, _as_scales(_on(part, device)))
    return api.pack_weight(_on(weight[start:end], device), _on(scales[start:end], device))


def load_row_shard(
    weight, columns: tuple[int, int], scales=None, device: torch.device | str | None = None
) -> MXFP8Weight:
    """This rank's input columns ``[start, end)`` (multiples of 128) of a full weight, packed
    as MXFP8 on ``device``; only those columns are read.

    - ``weight`` BF16/FP16 ``[N, K]``: the columns are quantized on their own. ``start`` is a
      multiple of 32, so the range holds whole scale groups and this gives exactly the
      columns of the quantized full weight.
    - E4M3 values with row-major ``[N, K/32]`` scales: the range covers whole scale groups,
      so the scales' columns ``[start/32, end/32)`` are the shard's scales.
    - E4M3 values with blocked scales: a 128-column range is whole 512-byte chunks (4 groups
      each) of every row block, a strided run of chunks that is copied out.

    Raises:
        TypeError, ValueError: on a wrong type, dtype, shape or range.
    """
    n, k = _matrix_shape(weight, "weight")
    start, end = _check_range(columns, k, "columns")
    if start % STAGE_ALIGN or end % STAGE_ALIGN:
        raise ValueError(f"columns: expected multiples of {STAGE_ALIGN}, got {columns}")
    device = torch.device(device) if device is not None else torch.get_default_device()
    if scales is None:
        return api.pack_weight(_on(weight[:, start:end], device))
    _check_values(weight)
    values = _on(weight[:, start:end], device)
    if _is_blocked(scales, n, k):
        per_row_block = group_blocks(k // GROUP)  # chunks per 128 rows
        flat = scales if isinstance(scales, Tensor) else scales[:]  # a lazy one: read (small)
        chunks = flat.view(-1, per_row_block, CHUNK_BYTES)
        part = _on(chunks[:, start // STAGE_ALIGN : end // STAGE_ALIGN], device)
        return MXFP8Weight(values.contiguous(), _as_scales(part.flatten()))
    return api.pack_weight(values, _on(scales[:, start // GROUP : end // GROUP], device))


__all__ = [
    "load_column_shard",
    "load_row_shard",
    "split_in_features",
    "split_out_features",
]
