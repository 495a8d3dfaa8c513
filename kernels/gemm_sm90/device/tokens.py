"""MXFP8 tokens -> BF16, in the swap-AB kernel's permuted K order (imports cutlass: load
lazily).

The swap-AB kernel's ``bf16_tokens`` schedule reads its token tiles through TMA instead of
converting them in every CTA: with 33-64 tokens each CTA converted as many token elements
per stage as weight elements, and every CTA converted all the tokens. This launch converts
each token element once, exactly (E4M3 times its E8M0 scale is a BF16 value), into a
``[m, K]`` BF16 buffer whose K order inside each 32-element scale group is the one the
weight fragment uses (gemm_sm90.device.common), so a TMA box of it is the BF16 token tile the
kernel used to build in shared memory.

One thread per 16-byte unit of FP8 (half a scale group); consecutive threads take
consecutive units of a row, so the loads coalesce.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Int32, Uint32

from ....format import CHUNK_BYTES, ROW_BLOCK
from ...runtime.launcher import address
from ..constants import TILE_K8
from .common import chunk_word, dequant_pair, load_gmem_word, mul_bf16x2, scale_factors

THREADS = 128
UNITS = TILE_K8 // 16  # 16-byte units per row and 128-K stage


def bf16_slot(kk: int) -> int:
    """Where K index ``kk`` of a 128-K stage lies in the BF16 token row (the weight
    fragment's order): byte q of word w of unit u (kk = 16 u + 4 w + q) goes to the pair
    slot the fragment gives it. A permutation inside each 32-element group."""
    u, w, q = kk // 16, (kk % 16) // 4, kk % 4
    b, t, hi = u // 2, 2 * (u % 2) + w // 2, q // 2
    chunk = 4 * (b % 2) + 2 * (w % 2) + hi
    return 64 * (b // 2) + 8 * chunk + 2 * t + q % 2


class TokensToBF16Sm90:
    """``out[r, kt * 128 + bf16_slot(j)] = dequant(A)[r, kt * 128 + j]`` for r < m."""

    def __init__(self, k: int):
        self.k = k
        self.k_tiles = -(-k // TILE_K8)
        self.units_per_row = self.k_tiles * UNITS

    @cute.jit
    def __call__(
        self,
        a: cute.Pointer,
        sa: cute.Pointer,
        out: cute.Pointer,
        m: cutlass.Int32,
        stream: cuda.CUstream,
    ):
        a_addr, sa_addr, out_addr = address(a), address(sa), address(out)
        blocks = (m * self.units_per_row + THREADS - 1) // THREADS
        self.kernel(a_addr, sa_addr, out_addr, m).launch(
            grid=[blocks, 1, 1], block=[THREADS, 1, 1], stream=stream
        )

    @cute.kernel
    def kernel(self, a_addr, sa_addr, out_addr, m):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        q = bidx * THREADS + tidx
        row = q // self.units_per_row
        rest = q - row * self.units_per_row
        kt = rest // UNITS
        u = rest - kt * UNITS
        col = kt * TILE_K8 + u * 16
        # K is a multiple of 32, so a unit lies wholly inside K or wholly past it
        if row < m and col < self.k:
            words = cute.make_rmem_tensor((4,), Uint32)
            src = cute.make_ptr(
                Uint32, a_addr + row * self.k + col, cute.AddressSpace.gmem, assumed_align=16
            )
            cute.autovec_copy(cute.make_tensor(src, cute.make_layout(4)), words)
            chunk = (row // ROW_BLOCK) * self.k_tiles + kt
            scale_word = load_gmem_word(
                sa_addr + chunk * CHUNK_BYTES + chunk_word(row % ROW_BLOCK) * 4
            )
            b = u // 2
            s = (scale_word >> (8 * b)) & 0xFF
            factor, extra, _ = scale_factors(s)
            # the unit's pairs fill slots 64 (b / 2) + 8 chunk + 2 t of the stage's row
            base = out_addr + (row * self.k + kt * TILE_K8 + 64 * (b // 2)) * 2
            for w in cutlass.range_constexpr(4):
                t = 2 * (u % 2) + w // 2
                for hi in cutlass.range_constexpr(2):
                    # branch-free: ``extra`` is 1.0 for scale bytes <= 134
                    v = mul_bf16x2(dequant_pair(words[w], factor, hi == 1), extra)
                    chunk16 = 4 * (b % 2) + 2 * (w % 2) + hi
                    dst = cute.make_ptr(
                        Int32, base + (8 * chunk16 + 2 * t) * 2, cute.AddressSpace.gmem,
                        assumed_align=4,
                    )  # fmt: skip
                    cute.make_tensor(dst, cute.make_layout(1))[0] = Int32(v)
