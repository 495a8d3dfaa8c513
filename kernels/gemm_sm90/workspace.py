"""The stream-K workspace of both SM90 GEMM kernels, stated once: the host allocates it by
these rules (gemm_sm90.host.buffers) and the kernels lay it out by them (swap_ab.parts,
tiled.schedule). Plain ints from a config: no torch, no cutlass.

A CTA holds :func:`slots_per_cta` slots, each with one int32 flag. A slot holds two
partial sums (``PARTS_PER_SLOT``): part 0 the head or middle of a tile that the CTA
publishes for the CTA holding the tile's tail, part 1 that tail, kept for the fixup. A part
is one consumer warpgroup's accumulator, ``PART_ROWS`` rows by :func:`part_columns`, stored
as :func:`frag` FP32 values per thread, threads fastest, so that a warp's stores are
contiguous.
"""

from __future__ import annotations

from .config import SwapABConfig
from .constants import WG_THREADS

PART_ROWS = 64
"""Rows of one partial sum: a consumer warpgroup's accumulator (one wgmma M)."""

PARTS_PER_SLOT = 2
"""Partial sums per slot: the published head or middle part, and the CTA's own tail."""

MIN_COLUMNS = 64
"""The narrowest slot the host allocates: the tiled kernel's narrowest tile; the swap-AB
kernel's token tiles below it get slots this wide, so one workspace serves every token tile
up to 64 and the one kept per stream does not grow as a decode's token count does."""

FLOATS_PER_FLAG = PARTS_PER_SLOT * PART_ROWS * MIN_COLUMNS
"""FP32 values per flag of a workspace: those of the narrowest slot. Every config's slots
are at least this large, so a workspace of F floats has enough flags for any config whose
partial sums fit in it: the host keeps one workspace per stream for every config launched
there."""


def slots_per_cta(cfg) -> int:
    """Workspace slots (each with a flag) per CTA of ``cfg``'s kernel. Swap-AB: one per
    consumer that finishes weight tiles (consumer 0, or each consumer with ``tile_w`` 128,
    which finishes its own rows). Tiled: one per 64 output rows; a 64-row k-split tile
    two, the second for the hand-off of its second consumer's sums."""
    if isinstance(cfg, SwapABConfig):
        return cfg.consumers if cfg.tile_w != PART_ROWS else 1
    return 2 if cfg.tile_m == PART_ROWS else cfg.tile_m // PART_ROWS


def part_columns(cfg) -> int:
    """Columns of one partial sum: the swap-AB kernel's token tile, the tiled kernel's tile N."""
    return cfg.tokens_tile if isinstance(cfg, SwapABConfig) else cfg.tile_n


def frag(cfg) -> int:
    """FP32 values per thread of one partial sum (a warpgroup holds the part)."""
    return PART_ROWS * part_columns(cfg) // WG_THREADS


def floats(cfg) -> int | None:
    """FP32 partial sums the host allocates for a launch of ``cfg``: every slot of up to
    ``cfg.num_ctas`` CTAs, at least ``MIN_COLUMNS`` wide; None for a launch without stream-K
    (a tiled one without it, a swap-AB one with ``token_tiles`` but no ``split_tail``), which
    has no workspace."""
    if isinstance(cfg, SwapABConfig):
        stream_k = not cfg.token_tiles or cfg.split_tail
    else:
        stream_k = cfg.stream_k
    if not stream_k:
        return None
    columns = max(MIN_COLUMNS, part_columns(cfg))
    return cfg.num_ctas * slots_per_cta(cfg) * PARTS_PER_SLOT * PART_ROWS * columns


def flags(partial_floats: int) -> int:
    """Flags of a workspace of ``partial_floats`` FP32 partial sums (see FLOATS_PER_FLAG)."""
    return partial_floats // FLOATS_PER_FLAG
