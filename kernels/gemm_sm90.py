"""CuTe DSL MXFP8 GEMM for sm_90a: ``out[:M] = dequant(A) @ dequant(B).T (+ bias)``.

Hopper's wgmma has no block scales. An E4M3 value times its power-of-two E8M0 scale is
exactly a BF16 value, so the kernel (gemm_sm90_dequant) scales each FP8 tile into a BF16 tile
in shared memory and runs BF16 wgmma with FP32 accumulation: the result differs from the
exact-FP32 reference only by summation order. (The alternative, FP8 wgmma per 32-K group
plus an FP32 promotion ``acc += tmp * sa * sb``, measured the same speed at 4096 tokens but
its FP8 tensor-core group sums truncate small products; benchmarks/GEMM_LOG.md.)

This module holds the host side: the tile config and its heuristic, the support predicate,
the compile cache (keyed on compile-time facts; the token count M is a runtime value) and
the launch.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from mxfp8_fusion.format import GROUP

_TILE_M = 128  # two consumer warpgroups x 64 rows (one wgmma M)
_CHUNK_WORDS = 128  # a 512-byte chunk of the blocked scale layout, as int32 words


@dataclass(frozen=True)
class GemmConfig:
    """Compile-time tiling: output tile N (128 or 64), ``stages`` FP8 stages of K 128,
    ``bf16_stages`` BF16 stages of K 64, and the persistent CTA count."""

    tile_n: int = 128
    stages: int = 2
    bf16_stages: int = 4
    num_ctas: int = 132


# Shared memory per stage (bytes) of the dequant variant: FP8 (128 + tile_n) x 128 plus scale
# chunks, BF16 (128 + tile_n) x 64 x 2: 2 + 4 stages (tile N 128) or 4 + 4 (64) fill the
# 227 KB a CTA may use. Tile N 256 would need a 128-register accumulator per consumer thread,
# past the 96 registers ptxas gives each of the kernel's 640 threads. Measured at 4096 tokens
# (N 7168, K 43008): 2 + 4 stages 6.21 ms, 3 + 3 stages 6.69 ms.
_DEQUANT_STAGES = {128: (2, 4), 64: (4, 4)}


def choose_config(tokens: int, n: int, k: int, num_sms: int = 132) -> GemmConfig:
    """Tile heuristic by (tokens, N, K).

    Tile N 128 converts fewer FP8 bytes per FLOP than 64 (the A tile is shared by more
    columns); with fewer 128 x 128 tiles than SMs the GEMM streams the weight and needs CTAs
    on every SM, so 64 (tokens 16, N 7168: 112 CTAs).
    """
    tile_n = 128 if -(-tokens // _TILE_M) * -(-n // 128) >= num_sms else 64
    stages, bf16_stages = _DEQUANT_STAGES[tile_n]
    return GemmConfig(tile_n=tile_n, stages=stages, bf16_stages=bf16_stages, num_ctas=num_sms)


def supported(a_values: torch.Tensor, b_values: torch.Tensor, out: torch.Tensor) -> bool:
    """Whether this kernel serves the call (cheap: no compile, no sync)."""
    if a_values.dim() != 2 or b_values.dim() != 2 or out.dim() != 2:
        return False
    m, k = a_values.shape
    n = b_values.shape[0]
    if a_values.dtype != torch.float8_e4m3fn or b_values.dtype != torch.float8_e4m3fn:
        return False
    if out.dtype not in (torch.bfloat16, torch.float16):
        return False
    if k % GROUP != 0 or k == 0 or n == 0 or b_values.shape[1] != k:
        return False
    if a_values.stride(1) != 1 or a_values.stride(0) != k:
        return False
    if not b_values.is_contiguous() or out.stride(1) != 1 or out.shape[1] != n:
        return False
    if (out.stride(0) * out.element_size()) % 16 != 0 or out.shape[0] < m:
        return False
    return all(t.data_ptr() % 16 == 0 for t in (a_values, b_values, out))


_TORCH_TO_CUTLASS = {
    torch.bfloat16: "BFloat16",
    torch.float16: "Float16",
    torch.float32: "Float32",
}


@functools.cache
def _compiled(cfg: GemmConfig, n: int, k: int, ld_out: int, out_dtype, bias_dtype):
    """Compile for the compile-time facts only; the token count M stays a runtime value."""
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_ptr

    out_ty = getattr(cutlass, _TORCH_TO_CUTLASS[out_dtype])
    bias_ty = getattr(cutlass, _TORCH_TO_CUTLASS[bias_dtype]) if bias_dtype else out_ty
    from .gemm_sm90_dequant import MXFP8DequantGemmSm90

    kernel = MXFP8DequantGemmSm90(cfg, n, k, ld_out, bias_dtype is not None, out_ty)
    gmem = cute.AddressSpace.gmem
    fake = 1 << 20
    args = (
        make_ptr(cutlass.Float8E4M3FN, fake, gmem, assumed_align=16),
        make_ptr(cutlass.Int32, fake, gmem, assumed_align=16),
        make_ptr(cutlass.Float8E4M3FN, fake, gmem, assumed_align=16),
        make_ptr(cutlass.Int32, fake, gmem, assumed_align=16),
        make_ptr(bias_ty, fake, gmem, assumed_align=bias_ty.width // 8),
        make_ptr(out_ty, fake, gmem, assumed_align=16),
        cutlass.Int32(1),
        cutlass.Int32(1),
        cuda.CUstream(0),
    )
    return cute.compile(kernel, *args)


@functools.cache
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def run(a_values, a_scales, b_values, b_scales, bias, out, config: GemmConfig | None = None):
    """``out[:M] = dequant(A) @ dequant(B).T (+ bias)`` on the current stream; no sync.

    Call only where :func:`supported` is True. ``config`` overrides the heuristic (tests,
    benchmarks). Compiles once per (config, N, K, out row stride, out dtype, bias dtype).
    """
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_ptr

    m, k = a_values.shape
    n = b_values.shape[0]
    if m == 0:
        return
    odd_bias = bias is not None and (bias.dtype not in _TORCH_TO_CUTLASS or bias.stride(-1) != 1)
    if odd_bias or a_scales.data_ptr() % 16 or b_scales.data_ptr() % 16:
        # TMA needs 16-byte aligned scale chunks; the kernel reads bias as a contiguous
        # BF16/FP16/FP32 vector. Such calls are rare: the reference serves them.
        from mxfp8_fusion import reference

        reference.mm_into(a_values, a_scales, b_values, b_scales, bias, out)
        return
    dev = a_values.device.index if a_values.device.index is not None else 0
    cfg = config or choose_config(m, n, k, _num_sms(dev))
    bias_dtype = bias.dtype if bias is not None else None
    fn = _compiled(cfg, n, k, out.stride(0), out.dtype, bias_dtype)
    gmem = cute.AddressSpace.gmem
    out_ty = getattr(cutlass, _TORCH_TO_CUTLASS[out.dtype])
    bias_ty = getattr(cutlass, _TORCH_TO_CUTLASS[bias_dtype]) if bias is not None else out_ty
    bias_ptr = bias.data_ptr() if bias is not None else out.data_ptr()
    stream = cuda.CUstream(torch.cuda.current_stream(a_values.device).cuda_stream)
    fn(
        make_ptr(cutlass.Float8E4M3FN, a_values.data_ptr(), gmem, assumed_align=16),
        make_ptr(cutlass.Int32, a_scales.data_ptr(), gmem, assumed_align=16),
        make_ptr(cutlass.Float8E4M3FN, b_values.data_ptr(), gmem, assumed_align=16),
        make_ptr(cutlass.Int32, b_scales.data_ptr(), gmem, assumed_align=16),
        make_ptr(bias_ty, bias_ptr, gmem, assumed_align=bias_ty.width // 8),
        make_ptr(out_ty, out.data_ptr(), gmem, assumed_align=16),
        cutlass.Int32(m),
        cutlass.Int32(a_scales.numel() // (4 * _CHUNK_WORDS)),
        stream,
    )
