"""Every proven GEMM schedule (``gemm_sm90/tuning/proven.json``, both activations), and every one
pending its proof there, on an sm_90 GPU:
20 runs into poisoned outputs give the same bits, within the accumulation bound of an exact
product of the same operands, and leave the rows past M alone. What may be chosen, tuned or
warmed up is exactly this list (tests/kernels/test_gemm_proven.py), so a race in any
schedule anything can pick fails here.

The shapes make every schedule run more than a wave of tiles or units: 1000 tokens (a partial
row tile at every tile height) by N 4000 (a partial column tile) by K 4096 (32 stages), which
is one full wave and a rest of 124 tiles of 128 x 128 on 132 SMs (a stream-K tail), 60 of
192 x 128, 108 of 128 x 64, 116 of 64 x 128, 84 of 64 x 64; the swap-AB schedules stream
63 weight tiles of 32 stages, split over all CTAs, at 40 tokens (100 with 128-row weight
stages; W8A16 also 160 and 256, its 192- and 256-token tiles); the token-tiled ones take
1000 tokens in partial token tiles, more than a wave of (token tile, weight tile) pairs, and
with a split tail 100 tokens (every tile split over K) and five partial token tiles (a wave
and a split tail).
W8A16 reads three slices of widths 1024, 1920 and 1152, one a column view of a
wider buffer. W8A8's tokens mix rows whose scales allow the FP16 path with rows that do not.
Tolerance: tests/helpers/gemm.py (W8A8) and tests/kernels/test_gemm_w8a16.py (W8A16).
"""

from __future__ import annotations

import pytest
import torch
from helpers.gemm import check_close, random_operand, requires_cutlass, requires_sm90

from mxfp8_fusion import reference
from mxfp8_fusion.kernels.gemm_sm90.tuning import proven, select

pytestmark = [pytest.mark.gpu, requires_cutlass, requires_sm90]

RUNS = 20
N, K, WIDTHS = 4000, 4096, (1024, 1920, 1152)
POISON = float("nan")


def _token_counts(entry: dict) -> tuple[int, ...]:
    if entry["kernel"] == "swap-ab" and not entry.get("token_tiles"):
        if entry["tile_w"] == 64:
            return (40,)
        # W8A16 128-row stages hold up to 256 tokens (a 192- and a 256-token tile)
        return (100,) if entry.get("activation") != "bf16" else (100, 160, 256)
    if entry.get("split_tail"):
        # below a wave of tiles (every tile split) and five token tiles: a wave and a
        # tail of 28 tiles split four ways
        return (100, 5 * entry["token_tiles"] - 20)
    return (1000,)


CASES = [
    (entry, tokens)
    for entry in proven.entries() + proven.pending()
    for tokens in _token_counts(entry)
]


def _label(case) -> str:
    entry, tokens = case
    cfg = select.config_of(entry, tokens)
    return f"{cfg.__class__.__name__}{sorted(entry.items())}-{tokens}"


def _runs(launch, tokens: int, dtype=torch.bfloat16) -> torch.Tensor:
    """``RUNS`` launches, each into a fresh NaN-filled output with 8 spare rows; returns the
    first output after checking that the others are bitwise the same and the spare rows
    untouched."""
    outs = []
    for _ in range(RUNS):
        out = torch.full((tokens + 8, N), POISON, device="cuda", dtype=dtype)
        launch(out)
        outs.append(out)
    torch.cuda.synchronize()
    first = outs[0].view(torch.int16)
    distinct = sum(not torch.equal(o.view(torch.int16), first) for o in outs[1:])
    assert distinct == 0, f"{distinct} of {RUNS - 1} runs differ from the first"
    assert torch.isnan(outs[0][tokens:]).all()
    return outs[0][:tokens]


def _w8a8_tokens(tokens: int):
    """FP8 tokens whose first 512 rows span few binades (the FP16 path) and the rest many
    (the BF16 path); blocked scales join at a 128-row boundary."""
    narrow = random_operand(min(tokens, 512), K, 512, spread=8, center=127, seed=3)
    if tokens <= 512:
        return narrow[0][:tokens], narrow[1]
    rest = tokens - 512
    wide = random_operand(rest, K, -(-rest // 128) * 128, spread=30, center=120, seed=4)
    values = torch.cat([narrow[0], wide[0][:rest]])
    return values, torch.cat([narrow[1].view(-1), wide[1].view(-1)])


@pytest.mark.parametrize("case", CASES, ids=[_label(c) for c in CASES])
def test_twenty_runs_give_the_same_bits_within_the_bound(case):
    entry, tokens = case
    cfg = select.config_of(entry, tokens)
    b, sb = random_operand(N, K, None, spread=8 if cfg.activation == "mxfp8" else 30, seed=5)
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    if cfg.activation == "bf16":
        from mxfp8_fusion.kernels.gemm_sm90.host import w8a16

        gen = torch.Generator().manual_seed(6)
        wide = torch.randn(tokens, WIDTHS[1] + 256, generator=gen).to(torch.bfloat16).cuda()
        slices = [
            torch.randn(tokens, WIDTHS[0], generator=gen).to(torch.bfloat16).cuda(),
            wide[:, 128 : 128 + WIDTHS[1]],
            torch.randn(tokens, WIDTHS[2], generator=gen).to(torch.bfloat16).cuda(),
        ]
        scales = sb.view(torch.uint8)
        got = _runs(lambda out: w8a16.run(slices, b, scales, bias, out, config=cfg), tokens)
        x = torch.cat(slices, -1).double()
        w = reference.dequantize(b, scales).double()
        exact = x @ w.t() + bias.double()
        bound = 2.0**-8 * exact.abs() + 2.0**-126 + 2.0**-14 * (x.abs() @ w.abs().t())
        excess = ((got.double() - exact).abs() - bound).max().item()
        assert excess <= 0, f"excess {excess:.3g}"
        return
    from mxfp8_fusion.kernels.gemm_sm90.host import gemm as host

    a, sa = _w8a8_tokens(tokens)
    got = _runs(lambda out: host.run(a, sa, b, sb, bias, out, config=cfg), tokens)
    ref = torch.empty(tokens, N, device="cuda", dtype=torch.bfloat16)
    reference.mm_into(a, sa, b, sb, bias, ref)
    check_close(got, ref, a, sa, b, sb)
