"""The tiled SM90 GEMM's stream-K schedules (every tile shape, the K split, fewer units than
CTAs, whole waves with a stream-K tail, repeats, graph replay, two streams) and the configs
the measured table picks, on an sm_90 GPU against reference.mm_into (tolerance:
tests/helpers/gemm.py)."""

from __future__ import annotations

import functools

import pytest
import torch
from helpers.gemm import (
    check_close,
    check_config_run,
    check_two_streams,
    config_of,
    random_operand,
    requires_cutlass,
    requires_sm90,
    schedule_id,
    tiled,
)

from mxfp8_fusion import reference
from mxfp8_fusion.format import GROUP
from mxfp8_fusion.kernels.gemm_sm90.tuning import select as gemm_select

STREAM_K_SCHEDULES = [
    tiled(128, 128, 2, 1),
    tiled(192, 128, 1, 1),
    tiled(128, 64, 1, 1),
    tiled(64, 128, 2, 1),  # k-split: two consumer warpgroups on alternate K halves
]
OUTPUT_CASES = [  # (output dtype, scale spread, scale center, bias dtype)
    (torch.bfloat16, 10, 127, None),  # the FP16 path
    (torch.bfloat16, 20, 127, torch.float32),  # the BF16 path, bias
    (torch.float16, 4, 119, torch.float16),
]


def _check_schedule(schedule, tokens, num_sms, out_dtype, spread, center, bias_dtype):
    """``schedule``'s config on ``num_sms`` CTAs at N 640, K 4160 (33 stages, the last one
    partial) against the reference."""

    n, k = 640, 4160
    bias = None
    if bias_dtype is not None:
        bias = (torch.randn(n, device="cuda") * 4).to(bias_dtype)
    cfg = config_of(schedule, tokens, num_sms)
    check_config_run(cfg, tokens, n, k, out_dtype, bias, spread, center, (tokens, 7))


@pytest.mark.gpu
@requires_cutlass
@requires_sm90
@pytest.mark.parametrize("schedule", STREAM_K_SCHEDULES, ids=schedule_id)
# one token; one row tile's worth (one live consumer warpgroup of 64 rows); just past it;
# partial row tiles of 128 and 192 rows; each tile split over up to ~9 CTAs (495 units)
@pytest.mark.parametrize("tokens", [1, 64, 65, 200, 300])
@pytest.mark.parametrize("out_dtype,spread,center,bias_dtype", OUTPUT_CASES)
def test_stream_k_matches_reference(schedule, tokens, out_dtype, spread, center, bias_dtype):
    """The tiled kernel's stream-K schedule: K 4160 (33 stages, the last one partial), N 640
    (5 or 10 column tiles), tiles split across CTAs as heads, middles and tails; 64-row
    tiles start at row 64 of a scale chunk every other tile."""
    _check_schedule(schedule, tokens, 132, out_dtype, spread, center, bias_dtype)


# stream_k 2: whole tiles for the full waves, stream-K over the rest
TAIL_SCHEDULES = [tiled(128, 128, 2, 2), tiled(192, 128, 1, 2), tiled(128, 64, 1, 2)]


@pytest.mark.gpu
@requires_cutlass
@requires_sm90
@pytest.mark.parametrize("schedule", TAIL_SCHEDULES, ids=schedule_id)
# on 8 CTAs, N 640: 5 (10 at tile N 64) column tiles per row tile. 128 x 128 tiles: 1 token
# is under one wave (all stream-K); 200 one wave and 2 tiles (a partial row tile); 300 one
# wave and 7; 640 three waves and one tile split over all 8 CTAs; 1024 five whole waves, of
# which the last is split (nothing would be left). 192 x 128 and 128 x 64 tiles cut them
# into other waves and rests, partial row tiles among them
@pytest.mark.parametrize("tokens", [1, 200, 300, 640, 1024])
@pytest.mark.parametrize("out_dtype,spread,center,bias_dtype", OUTPUT_CASES)
def test_stream_k_tail_matches_reference(schedule, tokens, out_dtype, spread, center, bias_dtype):
    """The schedule of whole waves and a stream-K tail, on few CTAs so that small launches
    run several waves: K 4160 (33 stages, the last one partial), N 640."""
    _check_schedule(schedule, tokens, 8, out_dtype, spread, center, bias_dtype)


@pytest.mark.gpu
@requires_cutlass
@requires_sm90
# on 8 CTAs, N 640, 128 x 128 tiles. K 256 (2 stages): 640 tokens are 25 tiles, three waves
# and one tile of 2 units, fewer than the CTAs, so the last wave joins the split (9 tiles,
# 18 units); 1024 tokens five waves and nothing left (the fifth is split). K 128 (1 stage):
# 300 tokens are one wave and 7 tiles of one unit each, so the wave joins the split too
@pytest.mark.parametrize("tokens,k", [(640, 256), (1024, 256), (300, 128), (1, 128)])
def test_stream_k_tail_with_few_k_stages(tokens, k):

    cfg = config_of(tiled(128, 128, 2, 2), tokens, 8)
    check_config_run(cfg, tokens, 640, k, torch.bfloat16, None, 10, 127, (tokens, 13))


@pytest.mark.gpu
@requires_cutlass
@requires_sm90
@pytest.mark.parametrize("schedule", TAIL_SCHEDULES, ids=schedule_id)
# N 4096 on all 132 SMs: 600 tokens are 160 tiles of 128 x 128 (one wave and 28), 1100 are
# 288 (two waves and 24); in 192-row tiles 520 and 600 tokens are under one wave, 1100 one
# wave and 60; in 128 x 64 tiles 520 tokens are two waves and 56
@pytest.mark.parametrize("tokens", [1, 520, 600, 1100])
def test_stream_k_tail_on_every_sm(schedule, tokens):

    cfg = config_of(schedule, tokens)
    check_config_run(cfg, tokens, 4096, 4160, torch.bfloat16, None, 10, 127, (tokens, 11))


@pytest.mark.gpu
@requires_cutlass
@requires_sm90
@pytest.mark.parametrize("schedule", [tiled(64, 128, 1, 1)], ids=schedule_id)
@pytest.mark.parametrize("tokens", [1, 64, 200])
def test_k_split_tiles_match_reference(schedule, tokens):
    """64-row tiles whose two consumer warpgroups split K, with one converter warpgroup
    (test_stream_k_matches_reference covers two)."""

    cfg = config_of(schedule, tokens)
    check_config_run(cfg, tokens, 640, 4160, torch.bfloat16, None, 20, 127, (tokens, 17))


@pytest.mark.gpu
@requires_cutlass
@requires_sm90
def test_stream_k_with_fewer_units_than_ctas():
    """Two (tile, stage) units: two CTAs, one head and one tail."""

    for schedule in (tiled(128, 128, 2, 1), tiled(64, 128, 2, 1)):
        cfg = config_of(schedule, 1)
        check_config_run(cfg, 1, 128, 256, torch.bfloat16, None, 20, 127, (3, 4))
        check_config_run(cfg, 100, 128, 256, torch.bfloat16, None, 20, 127, (5, 6))


@pytest.mark.gpu
@requires_cutlass
@requires_sm90
@pytest.mark.parametrize(
    "schedule,num_sms",
    [
        (tiled(128, 128, 2, 1), 132),
        (tiled(64, 128, 2, 1), 132),
        (tiled(128, 128, 2, 2), 8),  # one whole wave, 7 tiles split over 8 CTAs
    ],
    ids=schedule_id,
)
def test_stream_k_repeats_bitwise_and_graph_replays(schedule, num_sms):
    """The parts are summed in K order, so launches agree to the bit; the flags re-arm for
    the next launch; a captured launch (its own workspace) replays with new tokens."""
    from mxfp8_fusion.kernels.gemm_sm90.host import gemm as g

    cfg = config_of(schedule, 300, num_sms)
    tokens, n, k = 300, 640, 4160
    a, sa, b, sb, out = check_config_run(cfg, tokens, n, k, torch.bfloat16, None, 10, 127, (8, 9))
    first = out[:tokens].clone()
    for _ in range(3):
        out.zero_()
        g.run(a, sa, b, sb, None, out[:tokens], config=cfg)
        assert torch.equal(out[:tokens].view(torch.int16), first.view(torch.int16))
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g.run(a, sa, b, sb, None, out[:tokens], config=cfg)
    a2, sa2 = random_operand(tokens, k, tokens + 5, 10, 127, seed=10)
    a.copy_(a2[:tokens])
    sa.copy_(sa2)
    for _ in range(2):
        out.zero_()
        graph.replay()
        eager = torch.empty_like(out[:tokens])
        g.run(a, sa, b, sb, None, eager, config=cfg)
        torch.cuda.synchronize()
        assert torch.equal(out[:tokens].view(torch.int16), eager.view(torch.int16))
    ref = torch.empty_like(eager)
    reference.mm_into(a, sa, b, sb, None, ref)
    check_close(eager, ref, a, sa, b, sb)


@pytest.mark.gpu
@requires_cutlass
@requires_sm90
def test_stream_k_on_two_streams_at_once():
    """The tiled stream-K workspace is per stream: overlapping launches on two streams do
    not share partial sums or flags."""

    cfg = config_of(tiled(128, 128, 2, 1), 300)
    tokens, n, k = 300, 640, 4160
    check_two_streams(cfg, tokens, n, k, seed=40)


def _table_points():
    """(tokens, N, K): every table shape at one token and at and around every point where
    the table's choice changes."""
    from mxfp8_fusion.kernels.gemm_sm90.tuning import table

    points = []
    for (n, k), rows in table.shapes(table.MEASURED_DEVICE, 132).items():
        tokens = {1}
        for i in range(1, len(rows)):
            if rows[i][1] != rows[i - 1][1]:  # t0 takes the one schedule, t0 + 1 the other
                t0 = rows[i - 1][0]
                tokens |= {t0 - 1, t0, t0 + 1}
        points += [(t, n, k) for t in sorted(tokens) if t > 0]
    return points


@functools.lru_cache(maxsize=1)
def _table_weight(n: int, k: int):
    """One random weight per table shape, drawn on the GPU (a CPU draw of 300 MB per test
    would cost seconds)."""
    gen = torch.Generator(device="cuda").manual_seed(n + k)
    raw = torch.randint(0, 256, (n, k), generator=gen, device="cuda", dtype=torch.uint8)
    raw = torch.where((raw & 0x7F) == 0x7F, raw ^ 0x01, raw)
    exps = torch.randint(117, 138, (n, k // GROUP), generator=gen, device="cuda")
    scales = reference.to_blocked(exps.to(torch.uint8)).view(torch.float8_e8m0fnu)
    return raw.view(torch.float8_e4m3fn), scales


@pytest.mark.gpu
@requires_cutlass
@requires_sm90
@pytest.mark.parametrize(
    "tokens,n,k", [pytest.param(*p, id=f"{p[1]}x{p[2]}-{p[0]}") for p in _table_points()]
)
def test_table_choices_match_reference(tokens, n, k):
    """The configs the measured table picks, at and around each of its switch points."""
    from mxfp8_fusion.kernels.gemm_sm90.host import gemm as g

    cfg = gemm_select.choose_config(tokens, n, k)
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    raw = torch.randint(0, 256, (tokens, k), generator=gen, device="cuda", dtype=torch.uint8)
    a = torch.where((raw & 0x7F) == 0x7F, raw ^ 0x01, raw).view(torch.float8_e4m3fn)
    exps = torch.randint(117, 138, (tokens, k // GROUP), generator=gen, device="cuda")
    sa = reference.to_blocked(exps.to(torch.uint8)).view(torch.float8_e8m0fnu)
    b, sb = _table_weight(n, k)
    out = torch.full((tokens + 3, n), 1234.0, device="cuda", dtype=torch.bfloat16)
    ref = torch.empty(tokens, n, device="cuda", dtype=torch.bfloat16)
    reference.mm_into(a, sa, b, sb, None, ref)
    g.run(a, sa, b, sb, None, out, config=cfg)
    torch.cuda.synchronize()
    assert (out[tokens:] == 1234.0).all()
    # Rounding flips between two FP32 summation orders grow with K: at K 43008 98.7-98.9% of
    # BF16 outputs matched bitwise, for main's whole-tile 192-row kernel and for stream-K
    # alike (within the per-output bound everywhere)
    check_close(out[:tokens], ref, a, sa, b, sb, min_same=0.98 if k > 16384 else None)
