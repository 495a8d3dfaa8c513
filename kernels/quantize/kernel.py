"""The slice quantizer's CuTe DSL kernel (imports cutlass: only
:func:`quantize_slice.compile_kernel` loads this module).

The tile layout, the padding walk, the few-token tile and the exactness rules are described
in ``quantize.host``'s docstring; the arithmetic is in ``quantize.ptx``.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint8, Uint32, const_expr

from ...format import CHUNK_BYTES, ROW_BLOCK, SCALE_INF_BYTE, SCALE_PAD
from ..runtime.launcher import address, int32_or_zero, wait_for_previous_kernel
from ..runtime.ptx import prefetch_l2
from . import ptx as qptx
from .geometry import (
    ROWS_PER_PASS,
    THREADS,
    THREADS_PER_ROW,
    TILE_COLS,
    QuantizerConfig,
    TileShape,
    big_shape,
    padding_row,
    small_shape,
)

# About the CTAs that can be resident while the previous kernel drains (6 per SM on the
# H200's 132 SMs). Only these prefetch before the PDL wait: in one large launch, every CTA
# prefetching cost copy bandwidth (docs/quantize_log.md, 'Numbers behind the kernel sources').
_PREFETCH_CTAS = 1024


def _store_values(out, addr):
    """Two 32-bit words (8 E4M3 bytes) to an 8-byte aligned global address."""
    ptr = cute.make_ptr(Uint32, addr, cute.AddressSpace.gmem, assumed_align=8)
    cute.autovec_copy(out, cute.make_tensor(ptr, cute.make_layout(2)))


def _store_byte(addr, value):
    """One byte to a global address."""
    ptr = cute.make_ptr(Uint8, addr, cute.AddressSpace.gmem, assumed_align=1)
    tensor = cute.make_tensor(ptr, cute.make_layout(1))
    tensor[0] = Uint8(Int32(value))


# The store helpers have no control flow, so the guarded regions below are single calls and
# the DSL's if-regions neither carry nor yield any local variable.


class _Tile:
    """The body of one CTA tile of ``shape`` (rows x column tiles); ``partial`` for the last
    row tile, which guards its rows and writes the padding scale bytes."""

    def __init__(self, config: QuantizerConfig, shape: TileShape, partial: bool):
        self.fp16 = config.fp16
        self.pdl = config.pdl
        self.prefetch = config.prefetch
        self.rows = shape.rows
        self.passes = shape.rows // ROWS_PER_PASS
        self.blocks = shape.blocks
        self.partial = partial

    @cute.jit
    def load_pass(self, frags, row, col0, src_addr, src_ld8):
        """One 16-byte load per column tile of the tile, all from source row ``row``."""
        for c in cutlass.range_constexpr(self.blocks):
            # 64-bit constant offsets per column tile fold into the load's immediate.
            offset = Int64(row) * src_ld8 + Int64(col0)
            ptr = cute.make_ptr(
                Uint32, src_addr + offset * 2 + c * TILE_COLS * 2, cute.AddressSpace.gmem,
                assumed_align=16,
            )  # fmt: skip
            cute.autovec_copy(cute.make_tensor(ptr, cute.make_layout(4)), frags[c])

    @cute.jit
    def quantize_pass(
        self, frags, row, tx, chunk0, dst_addr, dst_col0, dst_ld8, scale_addr, tokens, g4
    ):
        """Block max, scale byte, E4M3 values of row ``row`` for each column tile; stores
        (only for a live row when the tile is partial)."""
        # Blocked scale layout: this thread's group is g = column/32 + 4*ct + tx/4 for
        # column tile ct, so g % 4 = tx // 4 and g // 4 = column/128 + ct (column is a
        # multiple of 128); chunk0 is the byte offset of the first column tile's chunk.
        scale_row = chunk0 + (
            Int64(row // ROW_BLOCK) * Int64(g4) * CHUNK_BYTES
            + Int64((row % 32) * 16 + ((row // 32) % 4) * 4 + tx // 4)
        )
        dst_row = Int64(row) * dst_ld8 + dst_col0
        # Scale bytes of all column tiles first: their shuffle round trips overlap
        # instead of queuing behind each tile's branches and stores.
        scale_bytes = []
        for c in cutlass.range_constexpr(self.blocks):
            w = frags[c]
            amax = qptx.magnitude_max4(w[0], w[1], w[2], w[3])
            amax = qptx.umax(amax, cute.arch.shuffle_sync_bfly(amax, offset=1))
            amax = qptx.umax(amax, cute.arch.shuffle_sync_bfly(amax, offset=2))
            scale_bytes.append(qptx.scale_byte(amax, self.fp16))
        for c in cutlass.range_constexpr(self.blocks):
            w = frags[c]
            byte = scale_bytes[c]
            out = cute.make_rmem_tensor((2,), Uint32)
            if byte < SCALE_INF_BYTE:
                recip = qptx.reciprocal_bits(byte)
                out[0] = Uint32(qptx.quantize4(w[0], w[1], recip, self.fp16))
                out[1] = Uint32(qptx.quantize4(w[2], w[3], recip, self.fp16))
            else:
                out[0] = Uint32(qptx.quantize4_special(w[0], w[1], byte, self.fp16))
                out[1] = Uint32(qptx.quantize4_special(w[2], w[3], byte, self.fp16))
            value_addr = dst_addr + dst_row + c * TILE_COLS
            scale_addr_c = scale_addr + scale_row + c * CHUNK_BYTES
            if const_expr(self.partial):
                if row < tokens:
                    _store_values(out, value_addr)
                    if tx % 4 == 0:
                        _store_byte(scale_addr_c, byte)
            else:
                _store_values(out, value_addr)
                if tx % 4 == 0:
                    _store_byte(scale_addr_c, byte)

    @cute.jit
    def write_padding(self, tidx, chunk0, scale_addr, tokens, g4):
        """Scale byte 127 for the rows ``[tokens, roundup(tokens, 128))`` of this tile's
        chunks. The 256 threads walk each 512-byte chunk in address order (two bytes
        per thread and chunk), so every warp store covers 32 consecutive bytes."""
        row_block = (tokens - 1) // ROW_BLOCK
        base = scale_addr + chunk0 + Int64(row_block) * Int64(g4) * CHUNK_BYTES
        ty = tidx // THREADS_PER_ROW
        tx = tidx % THREADS_PER_ROW
        for k in cutlass.range_constexpr(2 * self.blocks):
            pad_row = padding_row(row_block, ty, tx, k % 2)
            if pad_row >= tokens:
                _store_byte(base + (k // 2) * CHUNK_BYTES + (k % 2) * THREADS + tidx, SCALE_PAD)

    @cute.jit
    def prefetch_then_wait(self, by, row0, col0, tx, last, src_addr, src_ld8):
        """With programmatic dependent launch, wait for the previous kernel before touching
        memory (the source may be its output). While it drains, the CTAs that can already
        be resident pull their source lines into L2 (one thread per 128-byte line), so their
        loads after the wait hit L2; later CTAs start after the wait anyway."""
        if const_expr(self.pdl):
            if const_expr(self.prefetch):
                bx, _, _ = cute.arch.block_idx()
                gx, _, _ = cute.arch.grid_dim()
                if (by * gx + bx < _PREFETCH_CTAS) & (tx % 8 == 0):
                    for i in cutlass.range_constexpr(self.passes):
                        row = row0 + i * ROWS_PER_PASS
                        if const_expr(self.partial):
                            row = cutlass.min(row, last)
                        line = src_addr + (Int64(row) * src_ld8 + Int64(col0)) * 2
                        for c in cutlass.range_constexpr(self.blocks):
                            prefetch_l2(line + c * TILE_COLS * 2)
            wait_for_previous_kernel()

    @cute.jit
    def __call__(self, src_addr, src_ld, column, ct0, by, dst_addr, scale_addr, tokens, dst_ld, g4):
        """Row tile ``by``, column tiles ``ct0 .. ct0 + blocks - 1`` of one slice."""
        tidx, _, _ = cute.arch.thread_idx()
        tx = tidx % THREADS_PER_ROW
        ty = tidx // THREADS_PER_ROW
        row0 = by * self.rows + ty  # this thread's row in pass 0
        col0 = ct0 * TILE_COLS + tx * 8  # first of its 8 columns in the first column tile
        # Source and destination row strides are multiples of 8 elements (checked by
        # refusal()), so every 16-byte load and 8-byte store below is aligned.
        src_ld8 = cute.assume(Int64(src_ld), divby=8)
        dst_ld8 = cute.assume(Int64(dst_ld), divby=8)
        dst_col0 = Int64(column + col0)
        chunk0 = Int64(column // TILE_COLS + ct0) * CHUNK_BYTES
        # First row of this thread's warp in pass 0: a warp covers rows 2w and 2w + 1 of
        # a pass, so "the warp holds a live row" is the same test in all its lanes.
        warp_row0 = by * self.rows + (tidx // 32) * 2
        last = tokens - 1
        self.prefetch_then_wait(by, row0, col0, tx, last, src_addr, src_ld8)

        words = []
        for _i in cutlass.range_constexpr(self.passes):
            frags = []
            for _c in cutlass.range_constexpr(self.blocks):
                frags.append(cute.make_rmem_tensor((4,), Uint32))
            words.append(frags)
        for i in cutlass.range_constexpr(self.passes):
            if const_expr(self.partial):
                # A lane past the last row (upper row of a half-live warp) loads the
                # last live row instead: in bounds, never stored, and the block max
                # only combines the 4 lanes of one row.
                if warp_row0 + i * ROWS_PER_PASS < tokens:
                    self.load_pass(
                        words[i], cutlass.min(row0 + i * ROWS_PER_PASS, last), col0, src_addr,
                        src_ld8,
                    )  # fmt: skip
            else:
                self.load_pass(words[i], row0 + i * ROWS_PER_PASS, col0, src_addr, src_ld8)
        if const_expr(self.partial):
            # Independent of the loads: issued while they are in flight.
            self.write_padding(tidx, chunk0, scale_addr, tokens, g4)
        for i in cutlass.range_constexpr(self.passes):
            if const_expr(self.partial):
                if warp_row0 + i * ROWS_PER_PASS < tokens:
                    self.quantize_pass(
                        words[i], row0 + i * ROWS_PER_PASS, tx, chunk0,
                        dst_addr, dst_col0, dst_ld8, scale_addr, tokens, g4,
                    )  # fmt: skip
            else:
                self.quantize_pass(
                    words[i], row0 + i * ROWS_PER_PASS, tx, chunk0,
                    dst_addr, dst_col0, dst_ld8, scale_addr, tokens, g4,
                )  # fmt: skip


class SliceQuantizer:
    """The kernel for one slice per launch (``config.slices`` 1): a launch's grid and the
    CTA-uniform choice of its tile body."""

    def __init__(self, config: QuantizerConfig):
        self.config = config
        self.slices = config.slices
        self.blocks = config.width // TILE_COLS  # column tiles per slice
        self.big = big_shape(config)
        self.small = small_shape(config)
        self.big_full = _Tile(config, self.big, partial=False)
        self.big_last = _Tile(config, self.big, partial=True)
        self.small_last = _Tile(config, self.small, partial=True) if self.small else None

    def grid(self, tokens):
        """As ``quantize.geometry.grid``, on the launch's runtime token count."""
        big_x = self.slices * self.blocks
        big_y = (tokens + (self.big.rows - 1)) // self.big.rows
        if self.small is None:
            return [big_x, big_y, 1]
        few = tokens <= self.small.rows
        small_x = Int32(self.slices * (self.blocks // self.small.blocks))
        grid_x = Int32(cutlass.select_(few, small_x, Int32(big_x)))
        grid_y = Int32(cutlass.select_(few, Int32(1), Int32(big_y)))
        return [grid_x, grid_y, 1]

    @cute.jit
    def dispatch(self, tokens, dst_addr, scale_addr, dst_ld, g4, addrs, lds, cols):
        """CTA-uniform choice of the tile (must agree with :meth:`grid`): the few-token tile
        (one row tile, so always the last one), else the default tile, with guards and
        padding only in the last row tile. The slice is picked once, before the branch: with
        one copy of the selects per tile variant the kernel needed 48 registers instead of
        40."""
        bx, by, _ = cute.arch.block_idx()
        # grid.x = slices x (blocks / tile blocks): the slice and its first column tile.
        s = bx // self.blocks
        ct0 = bx - s * self.blocks
        small = self.small
        if const_expr(small is not None):
            few = tokens <= small.rows
            per_slice = self.blocks // small.blocks
            small_s = bx // per_slice
            s = Int32(cutlass.select_(few, small_s, s))
            ct0 = Int32(cutlass.select_(few, (bx - small_s * per_slice) * small.blocks, ct0))
        src_addr, src_ld, column = addrs[0], lds[0], cols[0]
        for j in cutlass.range_constexpr(1, self.slices):
            pick = s == j
            src_addr = Int64(cutlass.select_(pick, addrs[j], src_addr))
            src_ld = Int32(cutlass.select_(pick, lds[j], src_ld))
            column = Int32(cutlass.select_(pick, cols[j], column))
        args = (src_addr, src_ld, column, ct0, by, dst_addr, scale_addr, tokens, dst_ld, g4)
        last_tile = by == (tokens - 1) // self.big.rows
        if const_expr(small is not None):
            if few:
                self.small_last(*args)
            elif last_tile:
                self.big_last(*args)
            else:
                self.big_full(*args)
        else:
            if last_tile:
                self.big_last(*args)
            else:
                self.big_full(*args)

    @cute.jit
    def __call__(
        self,
        source: cute.Pointer,
        values: cute.Pointer,
        scales: cute.Pointer,
        tokens: Int32,
        src_ld: Int32,
        dst_ld: Int32,
        column: Int32,
        scale_g4: Int32,
        stream,
    ):
        src_addr, dst_addr, scale_addr = address(source), address(values), address(scales)
        self.kernel(
            src_addr, dst_addr, scale_addr, tokens, src_ld, dst_ld, column, scale_g4
        ).launch(
            grid=self.grid(tokens), block=[THREADS, 1, 1], stream=stream, use_pdl=self.config.pdl
        )  # fmt: skip

    @cute.kernel
    def kernel(
        self,
        src_addr: Int64,
        dst_addr: Int64,
        scale_addr: Int64,
        tokens: Int32,
        src_ld: Int32,
        dst_ld: Int32,
        column: Int32,
        scale_g4: Int32,
    ):
        self.dispatch(
            tokens, dst_addr, scale_addr, dst_ld, scale_g4, [src_addr], [src_ld], [column]
        )


class ManySliceQuantizer(SliceQuantizer):
    """One launch for up to 8 equal-width slices: grid.x runs over (slice, column tiles).

    Slice descriptors are 8 fixed scalar slots (address, row stride, column); slots past
    ``slices`` are never read. One launch for all slices is faster than one per slice
    (docs/quantize_log.md, 'Numbers behind the kernel sources').
    """

    @cute.jit
    def __call__(
        self,
        values: cute.Pointer,
        scales: cute.Pointer,
        tokens: Int32,
        dst_ld: Int32,
        scale_g4: Int32,
        p0, p1, p2, p3, p4, p5, p6, p7,
        l0, l1, l2, l3, l4, l5, l6, l7,
        c0, c1, c2, c3, c4, c5, c6, c7,
        stream,
    ):  # fmt: skip
        # slots past the build's slice count are None: compile-time absent, 0 in the kernel
        a0, a1, a2, a3, a4, a5, a6, a7 = (address(p) for p in (p0, p1, p2, p3, p4, p5, p6, p7))
        l0, l1, l2, l3, l4, l5, l6, l7 = (
            int32_or_zero(v) for v in (l0, l1, l2, l3, l4, l5, l6, l7)
        )
        c0, c1, c2, c3, c4, c5, c6, c7 = (
            int32_or_zero(v) for v in (c0, c1, c2, c3, c4, c5, c6, c7)
        )
        self.kernel(
            address(values), address(scales), tokens, dst_ld, scale_g4,
            a0, a1, a2, a3, a4, a5, a6, a7,
            l0, l1, l2, l3, l4, l5, l6, l7,
            c0, c1, c2, c3, c4, c5, c6, c7,
        ).launch(
            grid=self.grid(tokens), block=[THREADS, 1, 1], stream=stream, use_pdl=self.config.pdl
        )  # fmt: skip

    @cute.kernel
    def kernel(
        self,
        dst_addr: Int64,
        scale_addr: Int64,
        tokens: Int32,
        dst_ld: Int32,
        scale_g4: Int32,
        a0: Int64, a1: Int64, a2: Int64, a3: Int64,
        a4: Int64, a5: Int64, a6: Int64, a7: Int64,
        l0: Int32, l1: Int32, l2: Int32, l3: Int32,
        l4: Int32, l5: Int32, l6: Int32, l7: Int32,
        c0: Int32, c1: Int32, c2: Int32, c3: Int32,
        c4: Int32, c5: Int32, c6: Int32, c7: Int32,
    ):  # fmt: skip
        self.dispatch(
            tokens, dst_addr, scale_addr, dst_ld, scale_g4,
            [a0, a1, a2, a3, a4, a5, a6, a7],
            [l0, l1, l2, l3, l4, l5, l6, l7],
            [c0, c1, c2, c3, c4, c5, c6, c7],
        )  # fmt: skip


def build(config: QuantizerConfig) -> SliceQuantizer:
    """The kernel object for ``config``: one slice per launch, or up to MAX_SLICES."""
    return SliceQuantizer(config) if config.slices == 1 else ManySliceQuantizer(config)
