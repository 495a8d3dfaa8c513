"""The slice quantizer's CuTe DSL kernel (imports cutlass: only
:func:`quantize_slice.compile_kernel` loads this module).

The tile layout, the padding walk, the few-token tile and the exactness rules are described
in ``quantize_slice``'s docstring; the arithmetic is in ``quantize_ptx``.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint8, Uint32, const_expr

from mxfp8_fusion.format import CHUNK_BYTES, ROW_BLOCK, SCALE_INF_BYTE, SCALE_PAD

from . import quantize_ptx as qptx
from .launcher import wait_for_previous_kernel
from .ptx import prefetch_l2
from .quantize_geometry import (
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
# prefetching cost 3% of copy bandwidth (docs/quantize_log.md).
_PREFETCH_CTAS = 1024


def build(config: QuantizerConfig):
    """The kernel object for ``config``: one slice per launch, or up to MAX_SLICES."""
    fp16 = config.fp16
    slices = config.slices
    blocks = config.width // TILE_COLS  # column tiles per slice
    big = big_shape(config)
    small = small_shape(config)
    gmem = cute.AddressSpace.gmem

    # Plain helpers (no control flow): the bodies of the guarded regions below are single
    # calls, so the DSL's if-regions neither carry nor yield any local variable.
    def store_values(out, addr):
        ptr = cute.make_ptr(Uint32, addr, gmem, assumed_align=8)
        cute.autovec_copy(out, cute.make_tensor(ptr, cute.make_layout(2)))

    def store_byte(addr, value):
        ptr = cute.make_ptr(Uint8, addr, gmem, assumed_align=1)
        tensor = cute.make_tensor(ptr, cute.make_layout(1))
        tensor[0] = Uint8(Int32(value))

    def make_tile(shape: TileShape, partial: bool):
        """The tile body for ``shape``; ``partial`` for the last row tile (guards, padding)."""
        passes = shape.rows // ROWS_PER_PASS
        tile_blocks = shape.blocks

        @cute.jit
        def load_pass(frags, row, col0, src_addr, src_ld8):
            """One 16-byte load per column tile of the tile, all from source row ``row``."""
            for c in cutlass.range_constexpr(tile_blocks):
                # 64-bit constant offsets per column tile fold into the load's immediate.
                offset = Int64(row) * src_ld8 + Int64(col0)
                ptr = cute.make_ptr(
                    Uint32, src_addr + offset * 2 + c * TILE_COLS * 2, gmem, assumed_align=16
                )
                cute.autovec_copy(cute.make_tensor(ptr, cute.make_layout(4)), frags[c])

        @cute.jit
        def quantize_pass(
            frags, row, tx, chunk0, dst_addr, dst_col0, dst_ld8, scale_addr, tokens, g4
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
            for c in cutlass.range_constexpr(tile_blocks):
                w = frags[c]
                amax = qptx.magnitude_max4(w[0], w[1], w[2], w[3])
                amax = qptx.umax(amax, cute.arch.shuffle_sync_bfly(amax, offset=1))
                amax = qptx.umax(amax, cute.arch.shuffle_sync_bfly(amax, offset=2))
                scale_bytes.append(qptx.scale_byte(amax, fp16))
            for c in cutlass.range_constexpr(tile_blocks):
                w = frags[c]
                byte = scale_bytes[c]
                out = cute.make_rmem_tensor((2,), Uint32)
                if byte < SCALE_INF_BYTE:
                    recip = qptx.reciprocal_bits(byte)
                    out[0] = Uint32(qptx.quantize4(w[0], w[1], recip, fp16))
                    out[1] = Uint32(qptx.quantize4(w[2], w[3], recip, fp16))
                else:
                    out[0] = Uint32(qptx.quantize4_special(w[0], w[1], byte, fp16))
                    out[1] = Uint32(qptx.quantize4_special(w[2], w[3], byte, fp16))
                value_addr = dst_addr + dst_row + c * TILE_COLS
                scale_addr_c = scale_addr + scale_row + c * CHUNK_BYTES
                if const_expr(partial):
                    if row < tokens:
                        store_values(out, value_addr)
                        if tx % 4 == 0:
                            store_byte(scale_addr_c, byte)
                else:
                    store_values(out, value_addr)
                    if tx % 4 == 0:
                        store_byte(scale_addr_c, byte)

        @cute.jit
        def write_padding(tidx, chunk0, scale_addr, tokens, g4):
            """Scale byte 127 for the rows ``[tokens, roundup(tokens, 128))`` of this tile's
            chunks. The 256 threads walk each 512-byte chunk in address order (two bytes
            per thread and chunk), so every warp store covers 32 consecutive bytes."""
            row_block = (tokens - 1) // ROW_BLOCK
            base = scale_addr + chunk0 + Int64(row_block) * Int64(g4) * CHUNK_BYTES
            ty = tidx // THREADS_PER_ROW
            tx = tidx % THREADS_PER_ROW
            for k in cutlass.range_constexpr(2 * tile_blocks):
                pad_row = padding_row(row_block, ty, tx, k % 2)
                if pad_row >= tokens:
                    store_byte(base + (k // 2) * CHUNK_BYTES + (k % 2) * THREADS + tidx, SCALE_PAD)

        @cute.jit
        def tile(src_addr, src_ld, column, ct0, by, dst_addr, scale_addr, tokens, dst_ld, g4):
            """Row tile ``by``, column tiles ``ct0 .. ct0 + blocks - 1`` of one slice."""
            tidx, _, _ = cute.arch.thread_idx()
            tx = tidx % THREADS_PER_ROW
            ty = tidx // THREADS_PER_ROW
            row0 = by * shape.rows + ty  # this thread's row in pass 0
            col0 = ct0 * TILE_COLS + tx * 8  # first of its 8 columns in the first column tile
            # Source and destination row strides are multiples of 8 elements (checked by
            # refusal()), so every 16-byte load and 8-byte store below is aligned.
            src_ld8 = cute.assume(Int64(src_ld), divby=8)
            dst_ld8 = cute.assume(Int64(dst_ld), divby=8)
            dst_col0 = Int64(column + col0)
            chunk0 = Int64(column // TILE_COLS + ct0) * CHUNK_BYTES
            # First row of this thread's warp in pass 0: a warp covers rows 2w and 2w + 1 of
            # a pass, so "the warp holds a live row" is the same test in all its lanes.
            warp_row0 = by * shape.rows + (tidx // 32) * 2
            last = tokens - 1
            if const_expr(config.pdl):
                if const_expr(config.prefetch):
                    # While the previous kernel drains, the CTAs that can already be resident
                    # pull their source lines into L2 (one thread per 128-byte line), so their
                    # loads after the wait hit L2. Later CTAs start after the wait anyway.
                    bx, _, _ = cute.arch.block_idx()
                    gx, _, _ = cute.arch.grid_dim()
                    if (by * gx + bx < _PREFETCH_CTAS) & (tx % 8 == 0):
                        for i in cutlass.range_constexpr(passes):
                            row = row0 + i * ROWS_PER_PASS
                            if const_expr(partial):
                                row = cutlass.min(row, last)
                            line = src_addr + (Int64(row) * src_ld8 + Int64(col0)) * 2
                            for c in cutlass.range_constexpr(tile_blocks):
                                prefetch_l2(line + c * TILE_COLS * 2)
                wait_for_previous_kernel()  # the source may be the previous kernel's output

            words = []
            for _i in cutlass.range_constexpr(passes):
                frags = []
                for _c in cutlass.range_constexpr(tile_blocks):
                    frags.append(cute.make_rmem_tensor((4,), Uint32))
                words.append(frags)
            for i in cutlass.range_constexpr(passes):
                if const_expr(partial):
                    # A lane past the last row (upper row of a half-live warp) loads the
                    # last live row instead: in bounds, never stored, and the block max
                    # only combines the 4 lanes of one row.
                    if warp_row0 + i * ROWS_PER_PASS < tokens:
                        load_pass(
                            words[i],
                            cutlass.min(row0 + i * ROWS_PER_PASS, last),
                            col0,
                            src_addr,
                            src_ld8,
                        )
                else:
                    load_pass(words[i], row0 + i * ROWS_PER_PASS, col0, src_addr, src_ld8)
            if const_expr(partial):
                # Independent of the loads: issued while they are in flight.
                write_padding(tidx, chunk0, scale_addr, tokens, g4)
            for i in cutlass.range_constexpr(passes):
                if const_expr(partial):
                    if warp_row0 + i * ROWS_PER_PASS < tokens:
                        quantize_pass(
                            words[i], row0 + i * ROWS_PER_PASS, tx, chunk0,
                            dst_addr, dst_col0, dst_ld8, scale_addr, tokens, g4,
                        )  # fmt: skip
                else:
                    quantize_pass(
                        words[i], row0 + i * ROWS_PER_PASS, tx, chunk0,
                        dst_addr, dst_col0, dst_ld8, scale_addr, tokens, g4,
                    )  # fmt: skip

        return tile

    big_full = make_tile(big, partial=False)
    big_last = make_tile(big, partial=True)
    small_last = make_tile(small, partial=True) if small is not None else None

    @cute.jit
    def dispatch(tokens, dst_addr, scale_addr, dst_ld, g4, addrs, lds, cols):
        """CTA-uniform choice of the tile (must agree with ``grid``): the few-token tile (one
        row tile, so always the last one), else the default tile, with guards and padding
        only in the last row tile. The slice is picked once, before the branch: with one
        copy of the selects per tile variant the kernel needed 48 registers instead of 40."""
        bx, by, _ = cute.arch.block_idx()
        # grid.x = slices x (blocks / tile blocks): the slice and its first column tile.
        s = bx // blocks
        ct0 = bx - s * blocks
        if const_expr(small is not None):
            few = tokens <= small.rows
            per_slice = blocks // small.blocks
            small_s = bx // per_slice
            s = Int32(cutlass.select_(few, small_s, s))
            ct0 = Int32(cutlass.select_(few, (bx - small_s * per_slice) * small.blocks, ct0))
        src_addr, src_ld, column = addrs[0], lds[0], cols[0]
        for j in cutlass.range_constexpr(1, slices):
            pick = s == j
            src_addr = Int64(cutlass.select_(pick, addrs[j], src_addr))
            src_ld = Int32(cutlass.select_(pick, lds[j], src_ld))
            column = Int32(cutlass.select_(pick, cols[j], column))
        args = (src_addr, src_ld, column, ct0, by, dst_addr, scale_addr, tokens, dst_ld, g4)
        last_tile = by == (tokens - 1) // big.rows
        if const_expr(small is not None):
            if few:
                small_last(*args)
            elif last_tile:
                big_last(*args)
            else:
                big_full(*args)
        else:
            if last_tile:
                big_last(*args)
            else:
                big_full(*args)

    def grid(tokens):
        """As ``quantize_geometry.grid``, on the launch's runtime token count."""
        big_x = slices * blocks
        big_y = (tokens + (big.rows - 1)) // big.rows
        if small is None:
            return [big_x, big_y, 1]
        few = tokens <= small.rows
        grid_x = Int32(cutlass.select_(few, Int32(slices * (blocks // small.blocks)), Int32(big_x)))
        grid_y = Int32(cutlass.select_(few, Int32(1), Int32(big_y)))
        return [grid_x, grid_y, 1]

    class _SliceQuantizer:
        @cute.jit
        def __call__(
            self,
            src_addr: Int64,
            dst_addr: Int64,
            scale_addr: Int64,
            tokens: Int32,
            src_ld: Int32,
            dst_ld: Int32,
            column: Int32,
            scale_g4: Int32,
            stream,
        ):
            self.kernel(
                src_addr, dst_addr, scale_addr, tokens, src_ld, dst_ld, column, scale_g4
            ).launch(grid=grid(tokens), block=[THREADS, 1, 1], stream=stream, use_pdl=config.pdl)

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
            dispatch(tokens, dst_addr, scale_addr, dst_ld, scale_g4, [src_addr], [src_ld], [column])

    class _ManySliceQuantizer:
        """One launch for up to 8 equal-width slices: grid.x runs over (slice, column tiles).

        Slice descriptors are 8 fixed scalar slots (address, row stride, column); slots past
        ``slices`` are never read. H200, six 4096 x 7168 slices: 0.133 ms (0.97 of the copy
        bandwidth) against 0.150 ms for six launches (0.162 ms without PDL; receipt
        benchmarks/results/quantize_slice.json).
        """

        @cute.jit
        def __call__(
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
            stream,
        ):  # fmt: skip
            self.kernel(
                dst_addr, scale_addr, tokens, dst_ld, scale_g4,
                a0, a1, a2, a3, a4, a5, a6, a7,
                l0, l1, l2, l3, l4, l5, l6, l7,
                c0, c1, c2, c3, c4, c5, c6, c7,
            ).launch(
                grid=grid(tokens), block=[THREADS, 1, 1], stream=stream, use_pdl=config.pdl
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
            dispatch(
                tokens, dst_addr, scale_addr, dst_ld, scale_g4,
                [a0, a1, a2, a3, a4, a5, a6, a7],
                [l0, l1, l2, l3, l4, l5, l6, l7],
                [c0, c1, c2, c3, c4, c5, c6, c7],
            )  # fmt: skip

    return _SliceQuantizer() if slices == 1 else _ManySliceQuantizer()
