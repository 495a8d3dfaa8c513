"""Start-up on the GPU: a build loaded from the kernel cache writes the same bytes as the
same build freshly compiled and launched as compiled; warmup makes every build a model's
calls need ready, so no call compiles."""

from __future__ import annotations

import pytest
import torch
from helpers.gemm import random_operand, requires_cutlass, requires_sm90

import mxfp8_fusion as mf

pytestmark = [pytest.mark.gpu, requires_cutlass, requires_sm90]


def _outputs(tokens_list, n, k):
    """Quantizer and GEMM outputs at each token count (both kernels: swap-AB and tiled)."""
    from mxfp8_fusion.kernels.gemm_sm90.host import gemm as gemm_sm90
    from mxfp8_fusion.kernels.quantize import host as quantize_slice

    b, sb = random_operand(n, k, seed=1)
    got = []
    for tokens in tokens_list:
        gen = torch.Generator(device="cuda").manual_seed(tokens)
        x = torch.randn(tokens, k, generator=gen, device="cuda", dtype=torch.bfloat16)
        dest = mf.empty_input(tokens, k, "cuda")
        quantize_slice.run(x, dest.values, dest.raw_scales, 0)
        a, sa = random_operand(tokens, k, seed=tokens)
        out = torch.empty(tokens, n, dtype=torch.bfloat16, device="cuda")
        gemm_sm90.run(a, sa, b, sb, None, out)
        got += [dest.values.view(torch.uint8).clone(), dest.raw_scales.view(torch.uint8), out]
    torch.cuda.synchronize()
    return got


def test_loaded_build_writes_the_bytes_of_a_fresh_compile(monkeypatch, tmp_path):
    from mxfp8_fusion.kernels.runtime import cache as kernel_cache
    from mxfp8_fusion.kernels.runtime import launcher

    monkeypatch.setenv(kernel_cache.ENV, str(tmp_path))
    monkeypatch.setattr(launcher, "_functions", {})
    tokens = (5, 40, 300)  # swap-AB, swap-AB with BF16 tokens, tiled
    loaded = _outputs(tokens, 512, 1024)
    assert len(list(tmp_path.glob("*.o"))) >= 4
    fresh = {b: launcher.compile_build(b) for b in launcher._functions}
    monkeypatch.setattr(launcher, "_functions", fresh)  # the compiled objects themselves
    again = _outputs(tokens, 512, 1024)
    for x, y in zip(loaded, again, strict=True):
        assert torch.equal(x.view(torch.uint8), y.view(torch.uint8))


def test_warmup_readies_every_build_the_calls_need(monkeypatch, tmp_path):
    from mxfp8_fusion.kernels.runtime import cache as kernel_cache
    from mxfp8_fusion.kernels.runtime import launcher

    monkeypatch.setenv(kernel_cache.ENV, str(tmp_path))
    monkeypatch.setattr(launcher, "_functions", {})
    tokens = [1, 16, 40, 200]
    # packing quantizes the weight: its own quantizer build, made before the warm-up
    weight = mf.pack_weight(torch.randn(512, 1024, dtype=torch.bfloat16, device="cuda"))
    report = mf.warmup([(512, [512, 512])], tokens, workers=2, progress=False)
    assert report.compiled == report.builds > 0 and report.from_disk == 0
    monkeypatch.setattr(launcher, "compile_build", None)  # a compile now would fail
    for t in tokens:
        parts = [torch.randn(t, 512, dtype=torch.bfloat16, device="cuda") for _ in range(2)]
        dest = mf.empty_input(t, 1024, "cuda")
        mf.quantize_input_slices(parts, dest)
        mf.mm_quantized(dest, weight)
    torch.cuda.synchronize()
    # a second warm-up has nothing left to do
    assert mf.warmup([(512, [512, 512])], tokens, progress=False).ready == report.builds
