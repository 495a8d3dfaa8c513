"""The SM90 W8A16 GEMM (kernels/gemm_sm90/host/w8a16.py) on an sm_90 GPU: straight from BF16
slices, against an FP64 oracle on the same operands, bitwise equal to the same config on the
concatenated input, to CUDA Graph replay and to the compiled model.

Tolerance, and why: a BF16 activation times an E4M3 value times its power-of-two scale is
exact in FP32, and the kernels feed exactly those BF16 operands to BF16 wgmma with FP32
accumulation. So the result differs from the exact sum by summation order and the tensor
core's internal K-16 sums (tests/helpers/gemm.py: at most ``2**-14 * sum |x w|``), plus one
rounding to the output dtype (an ulp of it).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from helpers.gemm import random_operand, requires_cutlass, requires_sm90

import mxfp8_fusion as mf
from mxfp8_fusion import reference
from mxfp8_fusion.kernels.gemm_sm90.config import TOKEN_TILES, swap_ab_config
from mxfp8_fusion.kernels.gemm_sm90.host import w8a16
from mxfp8_fusion.kernels.gemm_sm90.host.gemm import gpu_of
from mxfp8_fusion.kernels.gemm_sm90.tuning import select as gemm_select

pytestmark = [pytest.mark.gpu, requires_cutlass, requires_sm90]


def _weight(n, k, spread=30, seed=1):
    values, scales = random_operand(n, k, spread=spread, center=127 - 10, seed=seed)
    return values, scales.view(torch.uint8)


def _slices(tokens, widths, seed=0, wide=False):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    k = sum(widths)
    if wide:  # column views of a wider buffer: strided slices
        base = torch.randn(tokens, k + 256, generator=gen).to(torch.bfloat16).cuda()
        parts, column = [], 128
        for w in widths:
            parts.append(base[:, column : column + w])
            column += w
        return parts
    return [torch.randn(tokens, w, generator=gen).to(torch.bfloat16).cuda() for w in widths]


def _check_bound(got, slices, values, scales, bias=None):
    x = torch.cat(slices, -1).double()
    w = reference.dequantize(values, scales).double()
    exact = x @ w.t() + (bias.double() if bias is not None else 0)
    magnitude = x.abs() @ w.abs().t()
    finfo = torch.finfo(got.dtype)
    bound = finfo.eps * exact.abs() + finfo.tiny + 2.0**-14 * magnitude
    excess = ((got.double() - exact).abs() - bound).max().item()
    assert excess <= 0, f"excess {excess:.3g}"


CASES = [  # (tokens, N, widths): every kernel form the choice makes, odd N and slice counts
    (1, 4096, (4096, 4096, 4096)),
    (3, 200, (128, 256)),
    (8, 7168, (1024,) * 8),
    (9, 640, (512, 384)),
    (16, 7168, (7168, 7168)),
    (32, 1024, (128,) * 3),
    (48, 7168, (2048, 2048)),
    (64, 2048, (7168,)),
    (65, 192, (384, 128)),
    (300, 7168, (2048, 2048, 2048)),
    (1000, 4096, (1024, 3072)),
]


@pytest.mark.parametrize(("tokens", "n", "widths"), CASES)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_slices_match_the_oracle_and_the_concatenation_bit_for_bit(tokens, n, widths, out_dtype):
    _check_against_the_concatenation(tokens, n, widths, out_dtype, None)


@pytest.mark.parametrize("tile", TOKEN_TILES)
@pytest.mark.parametrize("split_tail", [False, True])
@pytest.mark.parametrize("pairs", [1, 2])
@pytest.mark.parametrize(
    ("tokens", "n", "widths"),
    [(300, 200, (128, 384)), (1000, 640, (1024, 512)), (700, 4000, (2048, 1024))],
)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_token_tiles_match_the_oracle_and_the_concatenation_bit_for_bit(
    tile, split_tail, pairs, tokens, n, widths, out_dtype
):
    """Partial token and weight tiles, strided slices (odd token counts), bias; with
    ``split_tail``, K parts of every tile (fewer tiles than SMs) or of the tail after a
    whole wave (700 x 4000), and none where K is too short to split (300 x 200). On CTA
    pairs (``pairs`` 2) also an odd weight tile count (640: the last pair's second tile is
    past N); whole tiles there give the single CTAs' bits (the same sums in the same
    order)."""
    cfg = swap_ab_config(tokens, 132, 2, True, 128, pairs, "bf16", tile, split_tail)
    out = _check_against_the_concatenation(tokens + 1, n, widths, out_dtype, cfg)
    if pairs == 2 and not split_tail:
        alone = _check_against_the_concatenation(
            tokens + 1, n, widths, out_dtype, replace(cfg, cluster=1)
        )
        assert torch.equal(out.view(torch.int16), alone.view(torch.int16))


@pytest.mark.parametrize(
    ("tokens", "tile", "split_tail"),
    [(8, 0, False), (64, 0, False), (300, 128, False), (300, 64, True)],
)
def test_scale_bytes_of_128_and_more_give_the_same_bits_times_their_power_of_two(
    tokens, tile, split_tail
):
    """The conversion makes each factor two ways: a multiply-add where every scale byte of
    a stage is below 128, else clamped with a second factor past BF16's range. The same
    weight with every scale byte 18 higher (128-142: only the second way) must give exactly
    2**18 times the first (110-124: only the first way), bit for bit: the products and the
    FP32 sums scale exactly, and so does the rounding to BF16."""
    n, widths = 640, (1024, 512)
    values, scales = _weight(n, sum(widths), spread=7, seed=tokens)
    slices = _slices(tokens, widths, seed=tokens)
    # the swap-AB builds, which convert in registers (the choice takes the tiled kernel at
    # 64 tokens on this shape); tile 0: the decode schedule
    if tile:
        cfg = swap_ab_config(tokens, 132, 2, True, 128, 1, "bf16", tile, split_tail)
    else:
        cfg = swap_ab_config(tokens, 132, 3, True, 64, 1, "bf16")
    low = torch.empty(tokens, n, device="cuda", dtype=torch.bfloat16)
    high = torch.empty_like(low)
    w8a16.run(slices, values, scales, None, low, config=cfg)
    w8a16.run(slices, values, scales + 18, None, high, config=cfg)
    torch.cuda.synchronize()
    assert int(scales.max()) < 128 <= int((scales + 18).min())
    assert torch.equal(high.view(torch.int16), (low.float() * 2.0**18).bfloat16().view(torch.int16))
    _check_bound(low, slices, values, scales)


def _check_against_the_concatenation(tokens, n, widths, out_dtype, cfg):
    """``cfg`` (None: the choice) from the slices: the rows past M untouched, within the
    bound, and the bits of the same config on the concatenated input. Returns the output."""
    # scale exponents 117 +- 30 reach 2**20 times the values: BF16 holds such sums, FP16
    # (max 65504) only those of exponents near 117
    spread = 30 if out_dtype == torch.bfloat16 else 3
    values, scales = _weight(n, sum(widths), spread=spread, seed=n + tokens)
    slices = _slices(tokens, widths, seed=tokens, wide=tokens % 2 == 1)
    gen = torch.Generator(device="cpu").manual_seed(n)
    bias = torch.randn(n, generator=gen).to(out_dtype).cuda()
    out = torch.full((tokens + 3, n), 1234.0, device="cuda", dtype=out_dtype)
    w8a16.run(slices, values, scales, bias, out, config=cfg)
    concatenated = torch.full_like(out, 1234.0)
    gpu = gpu_of(torch.cuda.current_device())  # what the call above chose on
    cfg = cfg or gemm_select.choose_config(tokens, n, sum(widths), *gpu, activation="bf16")
    w8a16.run([torch.cat(slices, -1)], values, scales, bias, concatenated, config=cfg)
    torch.cuda.synchronize()
    assert (out[tokens:] == 1234.0).all()
    assert torch.equal(out.view(torch.int16), concatenated.view(torch.int16))
    _check_bound(out[:tokens], slices, values, scales, bias)
    return out


def _every_config():
    shapes = [(4096, 12288), (7168, 43008), (2048, 7168), (11008, 4096)]
    found = {}
    for n, k in shapes:
        for tokens in (1, 8, 16, 32, 48, 64, 128, 256, 1024, 4096):
            found.setdefault(gemm_select.choose_config(tokens, n, k, activation="bf16"), tokens)
    return sorted(found.items(), key=lambda item: item[1])


@pytest.mark.parametrize(("cfg", "tokens"), _every_config(), ids=lambda v: str(v)[:60])
def test_every_chosen_config_on_a_small_shape(cfg, tokens):
    tokens = min(tokens, getattr(cfg, "tokens_tile", tokens), 600)
    values, scales = _weight(640, 1536, seed=tokens)
    slices = _slices(tokens, (512, 1024), seed=tokens + 1)
    out = torch.empty(tokens, 640, device="cuda", dtype=torch.bfloat16)
    w8a16.run(slices, values, scales, None, out, config=cfg)
    torch.cuda.synchronize()
    _check_bound(out, slices, values, scales)


@pytest.mark.parametrize("tokens", [4, 40, 200])
def test_cuda_graph_replay_gives_the_eager_bits(tokens):
    """Captured once, replayed on new values in the same buffers: no allocation, no sync."""
    weight = mf.MXFP8Weight(*_weight(4096, 3 * 1024))
    slices = _slices(tokens, (1024,) * 3, seed=2)
    out = torch.empty(tokens, 4096, device="cuda", dtype=torch.bfloat16)
    mf.mm_slices_into(slices, weight, out)  # compile and warm up before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mf.mm_slices_into(slices, weight, out)
    for seed in (5, 6):
        for s, fresh in zip(slices, _slices(tokens, (1024,) * 3, seed=seed), strict=True):
            s.copy_(fresh)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, mf.mm_slices(slices, weight))


def test_the_compiled_w8a16_drafter_gives_the_eager_bits():
    class Drafter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(3 * 2048, 2048, dtype=torch.bfloat16, device="cuda")

        def forward(self, *hidden):
            return self.fc(torch.cat(hidden, -1))

    model = mf.convert(Drafter().eval(), activation="bf16")
    hidden = _slices(24, (2048,) * 3, seed=3)
    compiled = torch.compile(model, backend="mxfp8_fusion")
    with torch.no_grad():
        assert torch.equal(compiled(*hidden), model(*hidden))


def test_fp16_slices_run_the_reference_with_one_warning():
    weight = mf.MXFP8Weight(*_weight(256, 512))
    slices = [s.half() for s in _slices(4, (256, 256))]
    with pytest.warns(UserWarning, match="W8A16 GEMM.*FP16 slices run the reference"):
        got = mf.mm_slices(slices, weight)
    expected = torch.empty_like(got)
    reference.mm_slices_into(slices, weight.values, weight.raw_scales, None, expected)
    assert torch.equal(got, expected)
