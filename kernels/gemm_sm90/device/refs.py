"""Per-row FP16 reference bytes of both GEMM operands, for the tiled kernel's FP16 path
(gemm_sm90.device.f16). Imports cutlass: load lazily.

One CTA per 128-row block of A or of B reads the block's whole blocked-scale stripe (K / 128
chunks of 512 bytes, contiguous): warp w takes chunks w, w + 16, ..., lane l the 16 bytes of
rows l, l + 32, l + 64, l + 96 in each. Every row then gets one int32: its reference byte,
or -1 when it cannot take the FP16 path. Rows past the operand's valid rows get their
reference too but never -1 (they are padding or unused capacity). A separate launch, so the
scan runs on every SM at once instead of stalling each GEMM tile's start.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Int32
from cutlass.memory import SmemAllocator

from ....format import (
    CHUNK_BYTES,
    GROUP_BLOCK,
    ROW_BLOCK,
    group_blocks,
    row_blocks,
    scale_groups,
)
from ...runtime.launcher import address
from .common import load_smem_words, store_smem_word
from .f16 import (
    BYTES_MAX_INIT,
    BYTES_MIN_INIT,
    bytes_max,
    bytes_min_nonzero,
    row_reference,
    u16x2_max,
    u16x2_min,
)

WARPS = 16


class RowReferencesSm90:
    """``refs[r]`` for the rows of A (first ``ceil(m / 128) * 128`` words) and then of B."""

    def __init__(self, k: int):
        self.k = k
        self.k_tiles = group_blocks(scale_groups(k))  # chunks per row block
        # groups of the last chunk past K are padding
        self.last_groups = scale_groups(k) % GROUP_BLOCK

    @cute.jit
    def __call__(
        self,
        sa: cute.Pointer,
        sb: cute.Pointer,
        refs: cute.Pointer,
        m: cutlass.Int32,
        n: cutlass.Int32,
        stream: cuda.CUstream,
    ):
        sa_addr, sb_addr, refs_addr = address(sa), address(sb), address(refs)
        a_blocks = row_blocks(m)
        b_blocks = row_blocks(n)

        @cute.struct
        class Storage:
            mx: cute.struct.Align[cute.struct.MemRange[cutlass.Int32, WARPS * ROW_BLOCK], 16]
            mn: cute.struct.Align[cute.struct.MemRange[cutlass.Int32, WARPS * ROW_BLOCK], 16]

        self.storage = Storage
        self.kernel(sa_addr, sb_addr, refs_addr, m, n, a_blocks).launch(
            grid=[a_blocks + b_blocks, 1, 1], block=[WARPS * 32, 1, 1], stream=stream
        )

    @cute.kernel
    def kernel(self, sa_addr, sb_addr, refs_addr, m, n, a_blocks):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        warp = tidx // 32
        lane = tidx % 32
        st = SmemAllocator().allocate(self.storage)
        mx_s = st.mx.data_ptr().toint()
        mn_s = st.mn.data_ptr().toint()
        is_b = bidx >= a_blocks
        block = cutlass.select_(is_b, bidx - a_blocks, bidx)
        scales = cutlass.select_(is_b, sb_addr, sa_addr)
        base = scales + (block * self.k_tiles * CHUNK_BYTES + lane * 16)
        stats = cute.make_rmem_tensor((8,), Int32)
        for i in cutlass.range_constexpr(4):
            stats[i] = Int32(BYTES_MAX_INIT)
            stats[4 + i] = Int32(BYTES_MIN_INIT)
        for kt in cutlass.range(warp, self.k_tiles, WARPS, unroll=4):
            words = cute.make_rmem_tensor((4,), Int32)
            cute.autovec_copy(
                cute.make_tensor(
                    cute.make_ptr(
                        Int32, base + kt * CHUNK_BYTES, cute.AddressSpace.gmem, assumed_align=16
                    ),
                    cute.make_layout(4),
                ),
                words,
            )
            for i in cutlass.range_constexpr(4):
                w = words[i]
                if cutlass.const_expr(self.last_groups != 0):
                    mask = (1 << (8 * self.last_groups)) - 1
                    w = w & cutlass.select_(kt == self.k_tiles - 1, Int32(mask), Int32(-1))
                stats[i] = bytes_max(stats[i], w)
                stats[4 + i] = bytes_min_nonzero(stats[4 + i], w)
        for i in cutlass.range_constexpr(4):
            slot = (warp * ROW_BLOCK + lane + 32 * i) * 4
            store_smem_word(mx_s + slot, stats[i])
            store_smem_word(mn_s + slot, stats[4 + i])
        cute.arch.sync_threads()
        if tidx < ROW_BLOCK:
            mx = Int32(BYTES_MAX_INIT)
            mn = Int32(BYTES_MIN_INIT)
            for w in cutlass.range_constexpr(WARPS):
                slot = (w * ROW_BLOCK + tidx) * 4
                mx = u16x2_max(mx, Int32(load_smem_words(mx_s + slot, 1, 4)[0]))
                mn = u16x2_min(mn, Int32(load_smem_words(mn_s + slot, 1, 4)[0]))
            ref, misfit = row_reference(mx, mn)
            valid = block * ROW_BLOCK + tidx < cutlass.select_(is_b, n, m)
            value = cutlass.select_(valid & (misfit != 0), Int32(-1), ref)
            a_rows = a_blocks * ROW_BLOCK
            out = refs_addr + (cutlass.select_(is_b, a_rows, 0) + block * ROW_BLOCK + tidx) * 4
            dst = cute.make_ptr(Int32, out, cute.AddressSpace.gmem, assumed_align=4)
            cute.make_tensor(dst, cute.make_layout(1))[0] = value
