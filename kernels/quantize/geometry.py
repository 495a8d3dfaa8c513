"""The slice quantizer's compile-time facts and tile geometry (no torch, no cutlass).

The host side (``quantize.host``) and the kernel (``quantize.kernel``) both read these:
the config that keys a compile, the tile shapes a launch chooses from, its grid, and the
padding walk's row arithmetic. Plain ints and dataclasses, so they are checked on a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...format import GROUP, GROUP_BLOCK
from ..capability import QUANTIZER_TARGETS

TILE_COLS = GROUP * GROUP_BLOCK
"""Columns of one column tile: 4 scale groups, so one 512-byte scale chunk per 128 rows."""

THREADS = 256
"""Threads of one CTA."""

THREADS_PER_ROW = TILE_COLS // 8
"""Threads covering one row of a column tile, each with one 16-byte load of 8 halves."""

ROWS_PER_PASS = THREADS // THREADS_PER_ROW
"""Rows one pass of the CTA covers (16)."""

# Rows per CTA tile: 64 rows keep 4 loads of 16 bytes in flight per thread. On the H200, six
# 4096 x 7168 slices took the same time with 32 and 64 rows, within run-to-run noise, and
# longer with 16 or 128 (docs/quantize_log.md).
DEFAULT_TILE_ROWS = 64

# Calls with at most this many tokens use the few-token tile (16 rows x up to 4 column tiles).
# At one token the 64-row tile launches one CTA per column tile with a single live warp; the
# wide tile gives the same per-thread load depth (4) with a quarter of the CTAs, and the
# per-thread pass count (register use) is the same as the 64-row tile's, so the kernel that
# holds both keeps its occupancy. 0 turns the few-token tile off.
SMALL_TOKENS = 16

# Loads in flight per thread (passes of one tile): the few-token tile is kept at the default
# tile's depth so that compiling both shapes into one kernel costs no registers.
MAX_PASSES = DEFAULT_TILE_ROWS // ROWS_PER_PASS

MAX_SLICES = 8
"""Most slices one launch quantizes."""

ARCHS: dict[tuple[int, int], str] = QUANTIZER_TARGETS
"""Build target per compute capability: the capability table's (``kernels/capability.py``)."""
DEFAULT_ARCH = "sm_90a"


@dataclass(frozen=True)
class QuantizerConfig:
    """Compile-time facts of one kernel: source dtype, slice width, tile height, how many
    equal-width slices one launch quantizes (1 for ``run``, up to 8 for ``run_many``), the
    token count up to which the few-token tile is used, whether launches use programmatic
    dependent launch and the L2 prefetch before its wait, and the target arch (one of
    :data:`ARCHS`' values)."""

    fp16: bool
    width: int
    tile_rows: int = DEFAULT_TILE_ROWS
    slices: int = 1
    small_tokens: int = SMALL_TOKENS
    pdl: bool = True
    prefetch: bool = True
    arch: str = DEFAULT_ARCH


@dataclass(frozen=True)
class TileShape:
    """One CTA tile: ``rows`` rows (a multiple of 16) x ``blocks`` column tiles of 128."""

    rows: int
    blocks: int


def check_config(config: QuantizerConfig) -> None:
    """Raise ``ValueError`` naming the field of ``config`` the kernel cannot build."""
    if config.width % TILE_COLS or config.width <= 0:
        raise ValueError(f"width must be a positive multiple of 128, got {config.width}")
    if config.tile_rows not in (16, 32, 64, 128):
        raise ValueError(f"tile_rows must be one of 16, 32, 64, 128, got {config.tile_rows}")
    if not 1 <= config.slices <= MAX_SLICES:
        raise ValueError(f"slices must be in [1, {MAX_SLICES}], got {config.slices}")
    if config.small_tokens not in (0, 16, 32):
        raise ValueError(f"small_tokens must be one of 0, 16, 32, got {config.small_tokens}")
    if config.arch not in ARCHS.values():
        raise ValueError(f"arch must be one of {list(ARCHS.values())}, got {config.arch!r}")


def big_shape(config: QuantizerConfig) -> TileShape:
    """The default tile: ``tile_rows`` rows x one column tile."""
    return TileShape(config.tile_rows, 1)


def small_shape(config: QuantizerConfig) -> TileShape | None:
    """The few-token tile: ``small_tokens`` rows (so the call is one row tile) and as many
    column tiles as keep a thread at most ``MAX_PASSES`` loads deep and divide the width."""
    if not config.small_tokens:
        return None
    passes_per_block = config.small_tokens // ROWS_PER_PASS
    blocks = config.width // TILE_COLS
    for tile_blocks in (4, 2, 1):
        if tile_blocks * passes_per_block <= MAX_PASSES and blocks % tile_blocks == 0:
            return TileShape(config.small_tokens, tile_blocks)
    return TileShape(config.small_tokens, 1)


def shape_for(config: QuantizerConfig, tokens: int) -> TileShape:
    """The tile shape a launch with ``tokens`` rows uses (the kernel decides the same way)."""
    small = small_shape(config)
    return small if small is not None and tokens <= small.rows else big_shape(config)


def grid(config: QuantizerConfig, tokens: int) -> tuple[int, int]:
    """(grid.x, grid.y) of a launch: (slice, column tile group) x live row tiles."""
    shape = shape_for(config, tokens)
    blocks = config.width // TILE_COLS
    return config.slices * (blocks // shape.blocks), -(-tokens // shape.rows)


def padding_row(row_block, ty, tx, half):
    """Row of the scale byte at chunk offset ``ty * 16 + tx + 256 * half`` of row block
    ``row_block`` (inverse of the blocked layout's ``(r%32)*16 + ((r//32)%4)*4 + g``, with
    ``g = tx % 4``). Works on ints, int tensors and kernel integers."""
    return row_block * 128 + ty + 16 * half + 32 * (tx // 4)
