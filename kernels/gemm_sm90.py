"""CuTe DSL MXFP8 GEMM for sm_90a: ``out[:M] = dequant(A) @ dequant(B).T (+ bias)``.

Hopper's FP8 wgmma has no block scales, so every 32-wide K group is issued as its own
wgmma (K = 32) into a temporary FP32 accumulator, which is then promoted into the main
accumulator with the group's scales: ``acc += tmp * (sa[m, g] * sb[n, g])``. Scales are
powers of two, so the promotion itself is exact; the FP8 wgmma's 32-wide group sum is not
IEEE FP32 (it aligns products to the group's largest and truncates, measured on the H200),
so results differ from the exact-FP32 reference by that and by summation order (the
tolerance and its derivation: tests/test_gemm_kernel.py).

Structure (one CTA = 3 warpgroups, persistent over output tiles):

* warp 0: TMA producer for the A/B value tiles and the raw E8M0 scale chunks. A K-tile is
  128 wide (4 groups), so one 128-row x 4-group scale chunk of the blocked layout (512
  contiguous bytes) covers a whole tile's rows: one 1-D TMA box per operand per stage.
* warps 2-3: convert the raw scale bytes of each stage into FP32 (``2**(b-127)``, 0xFF ->
  NaN) in shared memory once, so the consumers read ready floats instead of decoding each
  byte 16 times over.
* warpgroups 1-2: wgmma consumers, 64 rows each. Per group: issue the wgmma, wait, then
  64 FMULs (sa*sb) and 64 FFMAs from FP32 scales in shared memory. Each waits for its own group's wgmma before promoting (reading an accumulator while another
  wgmma of the same warpgroup is in flight makes ptxas serialize all wgmmas: C7514), so
  tensor-core / FP32 overlap comes from the two warpgroups interleaving. A warpgroup whose
  rows all lie past M skips the math (small token counts). Measured variants and their
  numbers: benchmarks/GEMM_LOG.md.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from mxfp8_fusion.format import GROUP

_TILE_M = 128  # two consumer warpgroups x 64 rows (one wgmma M)
_TILE_K = 128  # 4 scale groups: exactly one 512-byte scale chunk per operand per stage
_CHUNK_WORDS = 128  # a 512-byte chunk of the blocked scale layout, as int32 words
_THREADS = 384


@dataclass(frozen=True)
class GemmConfig:
    """Compile-time tiling: output tile N width, pipeline depth and persistent CTA count."""

    tile_n: int = 128
    stages: int = 5
    num_ctas: int = 132
    # mainloop schedule (gemm_sm90_kernel.MXFP8GemmSm90._k_tile); "serial" measured fastest
    # at tokens 4096: 6.47 ms vs early 7.49, overlap 6.71, pingpong 7.65 (GEMM_LOG.md)
    variant: str = "serial"


def choose_config(tokens: int, n: int, k: int, num_sms: int = 132) -> GemmConfig:
    """Tile heuristic by (tokens, N, K).

    Few tokens (fewer 128 x 128 tiles than SMs): tile N 64 doubles the CTAs working on the
    weight (tokens 16: 0.275 ms vs 0.306 ms with tile N 128). Otherwise 128 x 128 (tokens
    4096: 6.7 ms vs 8.2 ms with tile N 64). Tile N 256 would need 128 main + 128 temporary
    accumulator registers per thread, past the 232 a consumer thread gets. Stages fill
    shared memory: 5 x 37 KB (tile N 128) or 6 x 29 KB (tile N 64).
    """
    tiles_128 = -(-tokens // _TILE_M) * -(-n // 128)
    tile_n = 64 if tiles_128 < num_sms else 128
    return GemmConfig(tile_n=tile_n, stages=6 if tile_n == 64 else 5, num_ctas=num_sms)


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

    from . import gemm_sm90_kernel

    out_ty = getattr(cutlass, _TORCH_TO_CUTLASS[out_dtype])
    bias_ty = getattr(cutlass, _TORCH_TO_CUTLASS[bias_dtype]) if bias_dtype else out_ty
    kernel = gemm_sm90_kernel.MXFP8GemmSm90(cfg, n, k, ld_out, bias_dtype is not None, out_ty)
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
