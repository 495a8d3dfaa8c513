"""Shared pieces of the SM90 MXFP8 GEMM tests: skip markers, random operands, and the
comparison of kernel (kernels/gemm_sm90/host/gemm.py) and reference.mm_into.

Tolerance, and why: E4M3 x E4M3 products times power-of-two scales are exact in FP32, and
every operand element times its scale is an exact BF16 value (or, on the tiled kernel's
FP16 path, an exact FP16 value times a per-row power of two that the epilogue restores
exactly), which the kernel feeds to 16-bit wgmma with FP32 accumulation. So the result
differs from the reference by summation order, plus whatever the tensor core's internal
K-16 sum keeps less than IEEE FP32 does (test_tensor_core_group_sum_probe: 30 * 2**-9 next
to 448*448 survives). Bound per output: ``|ours - ref| <= ulp_out(|ref|) + 2**-14 *
sum_k |a*b|`` (FP32 accumulation over K <= 43008 stays far below it: ~sqrt(K) * 2**-24 on
random data), plus aggregate checks that catch real bugs: relative Frobenius error below
half an output ulp, and most outputs bitwise equal (measured >= 99.5% for BF16, >= 87% for
FP16). Data whose scales span 2**+-20 per operand takes the BF16 path and exercises its
two-step scaling of E8M0 bytes above 134; spans of at most 21 take the FP16 path.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from mxfp8_fusion import reference
from mxfp8_fusion.format import GROUP, scale_bytes

HAS_CUTLASS = importlib.util.find_spec("cutlass") is not None
requires_cutlass = pytest.mark.skipif(not HAS_CUTLASS, reason="nvidia-cutlass-dsl not installed")


def _is_sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


requires_sm90 = pytest.mark.skipif(not _is_sm90(), reason="needs an sm_90 GPU")


def tiled(tile_m, tile_n, converters, stream_k=0, stages=None, fp16_tiles=True) -> dict:
    """The schedule (a measured-table entry: gemm_sm90.tuning.select) of the tiled config of that
    tile, B converters and ``stream_k`` (0 whole tiles, 1 stream-K, 2 a stream-K tail), with
    the (FP8, 16-bit) ``stages`` where not the tile's standard split."""
    from mxfp8_fusion.kernels.gemm_sm90 import config
    from mxfp8_fusion.kernels.gemm_sm90.tuning import select

    cfg = config.tiled_config(tile_m, tile_n, converters, stream_k, 132, stages, fp16_tiles)
    return select.schedule(cfg)


def swap_ab(consumers=3, bf16_tokens=False, tile_w=64, cluster=1) -> dict:
    """The schedule of a swap-AB config (its token tile and stages follow from the tokens)."""
    from mxfp8_fusion.kernels.gemm_sm90 import config
    from mxfp8_fusion.kernels.gemm_sm90.tuning import select

    return select.schedule(config.swap_ab_config(8, 132, consumers, bf16_tokens, tile_w, cluster))


W128 = dict(consumers=2, bf16_tokens=True, tile_w=128)
"""swap_ab's arguments for 128-row weight stages shared by two consumers."""


def config_of(schedule: dict, tokens: int, num_sms: int = 132):
    """The config ``schedule`` gives ``tokens`` on ``num_sms`` SMs (select.config_of)."""
    from mxfp8_fusion.kernels.gemm_sm90.tuning import select

    return select.config_of(schedule, tokens, num_sms)


def schedule_id(value) -> str | None:
    """A pytest id: a schedule's config's label; None (pytest's own) for other values."""
    from mxfp8_fusion.kernels.gemm_sm90.config import label

    return label(config_of(value, 1)) if isinstance(value, dict) else None


def random_operand(rows, k, capacity=None, spread=20, center=127, seed=0, device="cuda"):
    """Random E4M3 values (no NaN encodings) and blocked scales, bytes in center +- spread."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    capacity = capacity or rows
    raw = torch.randint(0, 256, (capacity, k), generator=gen, dtype=torch.uint8)
    raw = torch.where((raw & 0x7F) == 0x7F, raw ^ 0x01, raw)  # avoid the NaN encoding
    values = raw.view(torch.float8_e4m3fn).to(device)
    exps = torch.randint(
        center - spread, center + spread + 1, (capacity, k // GROUP), generator=gen
    )
    scales = reference.to_blocked(exps.to(torch.uint8)).view(torch.float8_e8m0fnu).to(device)
    assert scales.numel() == scale_bytes(capacity, k)
    return values, scales


def run_kernel(a, sa, b, sb, bias, out):
    from mxfp8_fusion.kernels.gemm_sm90.host import gemm as gemm_sm90

    assert gemm_sm90.refusal(a, sa, b, sb, bias, out) is None
    gemm_sm90.run(a, sa, b, sb, bias, out)


def check_close(ours, ref, a, sa, b, sb, slack=2.0**-14, min_same=None):
    """Per-output bound |ours-ref| <= ulp(|ref|) + slack * sum|a*b| (see module docstring);
    ``min_same``: the least share of bitwise-equal outputs (default 0.99 for BF16, 0.8 for
    FP16)."""
    m, n = ref.shape
    absdot = torch.empty(m, n, dtype=torch.float32, device=ref.device)
    abs_a = (a.view(torch.uint8) & 0x7F).view(torch.float8_e4m3fn)
    abs_b = (b.view(torch.uint8) & 0x7F).view(torch.float8_e4m3fn)
    reference.mm_into(abs_a, sa, abs_b, sb, None, absdot)
    o, r = ours.float(), ref.float()
    finite = torch.isfinite(r)
    assert torch.equal(torch.isnan(o), torch.isnan(r))
    assert torch.equal(o[~finite & ~torch.isnan(r)], r[~finite & ~torch.isnan(r)])
    o, r, absdot = o[finite], r[finite], absdot[finite]
    finfo = torch.finfo(ref.dtype)
    ulp = torch.clamp(r.abs(), min=finfo.tiny) * finfo.eps
    bound = ulp + slack * absdot  # tensor-core sums: see the module docstring
    excess = ((o - r).abs() - bound).max().item()
    rel = ((o - r).double().norm() / r.double().norm().clamp(min=1e-30)).item()
    same = (o == r).float().mean().item()
    worst = ((o - r).abs() / absdot.clamp(min=1e-30)).max().item()
    stats = (
        f"excess {excess:.3g}, max|d|/sum|ab| {worst:.3g}, rel {rel:.3g} "
        f"(eps {finfo.eps:.3g}), bitwise-equal {same:.4f}"
    )
    print("STATS", ref.shape, ref.dtype, stats)
    assert excess <= 0, stats
    assert rel < finfo.eps / 2, stats
    if min_same is None:
        min_same = 0.99 if ref.dtype == torch.bfloat16 else 0.8
    assert same > min_same, stats


def check_run(tokens, n, k, out_dtype, bias, spread, center, seeds, extra_rows):
    """Kernel vs reference on random operands into an ``out`` with ``extra_rows`` more rows
    than tokens, which must stay untouched (the config the kernel picks itself)."""
    check_config_run(None, tokens, n, k, out_dtype, bias, spread, center, seeds, extra_rows)


def check_config_run(cfg, tokens, n, k, out_dtype, bias, spread, center, seeds, extra_rows=5):
    """As :func:`check_run`, with the config ``cfg`` (None: the one the kernel picks);
    returns the operands and ``out``. ``run`` refuses a call the kernel does not serve."""
    from mxfp8_fusion.kernels.gemm_sm90.host import gemm as g

    capacity = tokens + extra_rows
    a_full, sa = random_operand(tokens, k, capacity, spread, center, seed=seeds[0])
    b, sb = random_operand(n, k, None, spread, center, seed=seeds[1])
    a = a_full[:tokens]
    out = torch.full((capacity, n), 1234.0, device="cuda", dtype=out_dtype)
    poison = out.clone()
    ref = torch.empty(tokens, n, device="cuda", dtype=out_dtype)
    reference.mm_into(a, sa, b, sb, bias, ref)
    g.run(a, sa, b, sb, bias, out, config=cfg)
    torch.cuda.synchronize()
    assert torch.equal(out[tokens:].view(torch.int16), poison[tokens:].view(torch.int16))
    check_close(out[:tokens], ref, a, sa, b, sb)
    return a, sa, b, sb, out


def check_two_streams(cfg, tokens, n, k, seed):
    """Launches of ``cfg`` overlapping on two streams give each stream's own result bitwise:
    the buffers kept per stream (workspaces, converted tokens) are not shared."""
    from mxfp8_fusion.kernels.gemm_sm90.host import gemm as g

    inputs = [random_operand(tokens, k, seed=seed + i) for i in range(2)]
    b, sb = random_operand(n, k, seed=seed + 2)
    expected = []
    for a, sa in inputs:
        out = torch.empty(tokens, n, device="cuda", dtype=torch.bfloat16)
        g.run(a, sa, b, sb, None, out, config=cfg)
        expected.append(out)
    torch.cuda.synchronize()
    streams = [torch.cuda.Stream() for _ in inputs]
    outs = [torch.empty_like(expected[0]) for _ in inputs]
    for _ in range(5):
        for stream, (a, sa), out in zip(streams, inputs, outs, strict=True):
            with torch.cuda.stream(stream):
                g.run(a, sa, b, sb, None, out, config=cfg)
    torch.cuda.synchronize()
    for out, want in zip(outs, expected, strict=True):
        assert torch.equal(out.view(torch.int16), want.view(torch.int16))
