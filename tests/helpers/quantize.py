"""What the slice quantizer's GPU tests share: the skip marker, poisoned destinations, the
bitwise check of one launch against the reference, and wide-range data. No tests here."""

import importlib.util

import pytest
import torch

from mxfp8_fusion import reference
from mxfp8_fusion.format import scale_bytes


def _has_kernel_gpu() -> bool:
    if not torch.cuda.is_available() or importlib.util.find_spec("cutlass") is None:
        return False
    from mxfp8_fusion.kernels.quantize.host import arch_for

    return arch_for(torch.cuda.get_device_capability()) is not None


requires_sm90 = pytest.mark.skipif(
    not _has_kernel_gpu(), reason="needs a GPU the quantizer is built for and nvidia-cutlass-dsl"
)

DTYPES = (torch.bfloat16, torch.float16)
POISON_VALUES = 0x5A
POISON_SCALES = 0xA5


def poisoned(capacity: int, k: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    values = torch.full((capacity, k), POISON_VALUES, dtype=torch.uint8, device=device)
    scales = torch.full(
        (scale_bytes(capacity, k),), POISON_SCALES, dtype=torch.uint8, device=device
    )
    return values.view(torch.float8_e4m3fn), scales.view(torch.float8_e8m0fnu)


def check_against_reference(
    source: torch.Tensor, k: int, column: int, capacity=None, **launch
) -> None:
    """``launch``: compile-time options of ``run`` (``tile_rows``, ``small_tokens``)."""
    from mxfp8_fusion.kernels.quantize import host as kernel

    tokens = source.shape[0]
    capacity = capacity or ((tokens + 127) // 128 * 128 + 128)
    values, scales = poisoned(capacity, k, source.device)
    ref_values, ref_scales = poisoned(capacity, k, source.device)
    assert kernel.refusal(source, values, column) is None
    kernel.run(source, values, scales, column, **launch)
    reference.quantize_slice_(source, ref_values, ref_scales, column)
    got_v, want_v = values.view(torch.uint8), ref_values.view(torch.uint8)
    got_s, want_s = scales.view(torch.uint8), ref_scales.view(torch.uint8)
    if not torch.equal(got_v, want_v):
        bad = (got_v != want_v).nonzero()[:5].tolist()
        details = [(r, c, int(got_v[r, c]), int(want_v[r, c])) for r, c in bad]
        pytest.fail(f"value bytes differ at (row, col, got, want): {details}")
    if not torch.equal(got_s, want_s):
        bad = (got_s != want_s).nonzero()[:5].flatten().tolist()
        details = [(i, int(got_s[i]), int(want_s[i])) for i in bad]
        pytest.fail(f"scale bytes differ at (offset, got, want): {details}")


def wide_range(tokens: int, width: int, dtype, device, generator) -> torch.Tensor:
    """Random data whose per-element magnitudes span most of the dtype's exponent range."""
    lo, hi = (-120, 120) if dtype == torch.bfloat16 else (-22, 13)
    x = torch.randn(tokens, width, device=device, generator=generator)
    exp = torch.randint(lo, hi, (tokens, width // 32, 1), device=device, generator=generator)
    spread = torch.randint(-12, 1, (tokens, width), device=device, generator=generator)
    x = x.view(tokens, width // 32, 32) * torch.exp2(exp.float())
    x = x.view(tokens, width) * torch.exp2(spread.float())
    x[torch.rand(tokens, width, device=device, generator=generator) < 0.02] = 0.0
    return x.to(dtype)
