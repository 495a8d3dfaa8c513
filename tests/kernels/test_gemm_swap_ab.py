"""The swap-AB MXFP8 GEMM (few tokens) on an sm_90 GPU against reference.mm_into: both token
sources (converted in every CTA, or once before the GEMM), 128-row weight stages, CTA pairs
multicasting the token tile, every token tile, CUDA Graph replay and two streams. The
tolerance is explained in tests/helpers/gemm.py."""

from __future__ import annotations

import pytest
import torch
from helpers import gemm as checks
from helpers.gemm import (
    W128,
    config_of,
    random_operand,
    requires_cutlass,
    requires_sm90,
    schedule_id,
    swap_ab,
)

from mxfp8_fusion import reference
from mxfp8_fusion.format import scale_offset
from mxfp8_fusion.kernels.gemm_sm90 import config as gemm_config


def check_swap_ab_run(cfg, tokens, n, k, out_dtype, seeds):
    """:func:`check_config_run` with a bias and scale bytes that exercise the swap-AB
    kernel's conversion: 97-157 for BF16 output (both conversion factors), 115-123 for FP16
    output (its narrower range)."""
    spread, center = (30, 127) if out_dtype == torch.bfloat16 else (4, 119)
    bias = torch.randn(n, device="cuda", dtype=out_dtype)
    checks.check_config_run(cfg, tokens, n, k, out_dtype, bias, spread, center, seeds)


SWAP_AB_SHAPES = [  # (tokens, N, K): N past a 64-row tile, K past a 128 stage, odd stage counts
    (1, 7168, 4096),
    (3, 200, 4160),
    (8, 128, 128),
    (9, 640, 1056),
    (16, 7168, 43008),
    (31, 192, 384),
    (64, 1024, 2048),
]


@pytest.mark.gpu
@requires_cutlass
@requires_sm90
@pytest.mark.parametrize("tokens,n,k", SWAP_AB_SHAPES)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bf16_tokens", [0, 1])
def test_swap_ab_kernel_matches_reference(tokens, n, k, out_dtype, bf16_tokens):
    """The few-token kernel, converting its tokens in every CTA or reading them converted
    once (``bf16_tokens``): scale bytes 97-157 (both conversion factors), bias, rows past
    the tokens untouched."""

    # the swap-AB kernel itself, whichever kernel the measured table picks for this shape
    cfg = gemm_config.swap_ab_config(tokens, bf16_tokens=bf16_tokens)
    check_swap_ab_run(cfg, tokens, n, k, out_dtype, (tokens + 7 * k, n + 1))


W128_SHAPES = [  # (tokens, N, K): one unit, N past a 128-row stage, every token tile
    (1, 7168, 4096),
    (9, 128, 128),
    (17, 200, 4160),
    (33, 192, 384),
    (64, 1024, 2048),
    (65, 640, 1056),
    (100, 7168, 14336),
    (128, 384, 43008),
]


@pytest.mark.gpu
@requires_cutlass
@requires_sm90
@pytest.mark.parametrize("tokens,n,k", W128_SHAPES)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_swap_ab_w128_matches_reference(tokens, n, k, out_dtype):
    """128-row weight stages shared by two consumers (``tile_w`` 128), up to 128 tokens:
    scale bytes 97-157, bias, rows past the tokens untouched."""

    cfg = config_of(swap_ab(**W128), tokens)
    check_swap_ab_run(cfg, tokens, n, k, out_dtype, (tokens + k, n + 3))


@pytest.mark.gpu
@requires_cutlass
@requires_sm90
@pytest.mark.parametrize(
    "schedule,tiles,seed,stream_tokens",
    [
        (swap_ab(**W128), (8, 16, 32, 64, 128, 128), 41, 100),
        (swap_ab(bf16_tokens=True, cluster=2), (8, 16, 32, 64, 64), 51, 60),
        (swap_ab(**W128, cluster=2), (8, 16, 32, 64, 64, 128), 51, 60),
    ],
    ids=schedule_id,
)
def test_swap_ab_shared_token_tile_repeat_graph_replay_and_streams(
    schedule, tiles, seed, stream_tokens
):
    """Schedules that share a stage's token tile (two consumers of a 128-row stage
    ``tile_w`` 128, CTA pairs ``cluster`` 2): every token tile gives the same bytes (the same
    split and K order per output), launches repeat bitwise, a captured launch replays with
    new tokens, and launches on two streams at once keep their own workspaces."""
    from mxfp8_fusion.kernels.gemm_sm90.host import gemm as g

    tokens, n, k = 7, 1000, 6144
    a, sa = random_operand(tokens, k, seed=seed)
    b, sb = random_operand(n, k, seed=seed + 1)
    outs = []
    for tile in tiles:
        out = torch.empty(tokens, n, device="cuda", dtype=torch.bfloat16)
        g.run(a, sa, b, sb, None, out, config=config_of(schedule, tile))
        outs.append(out)
    for other in outs[1:]:
        assert torch.equal(outs[0].view(torch.int16), other.view(torch.int16))
    out = outs[0]
    cfg = config_of(schedule, tokens)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g.run(a, sa, b, sb, None, out, config=cfg)
    a2, sa2 = random_operand(tokens, k, seed=seed + 2)
    a.copy_(a2)
    sa.copy_(sa2)
    graph.replay()
    ref = torch.empty_like(out)
    reference.mm_into(a, sa, b, sb, None, ref)
    torch.cuda.synchronize()
    checks.check_close(out, ref, a, sa, b, sb)
    checks.check_two_streams(
        config_of(schedule, stream_tokens), stream_tokens, 2048, 8192, seed + 3
    )


PAIRS = swap_ab(bf16_tokens=True, cluster=2)
W128_PAIRS = swap_ab(**W128, cluster=2)
MULTICAST_SHAPES = [  # (schedule, tokens, N, K): a lone CTA pair (one unit, one tile past N),
    # odd tile counts (the second CTA of the last pair past N), N past a tile, every token tile
    (PAIRS, 1, 64, 128),
    (PAIRS, 9, 192, 384),
    (PAIRS, 17, 200, 4160),
    (PAIRS, 33, 7168, 4096),
    (PAIRS, 64, 7168, 43008),
    (W128_PAIRS, 1, 128, 128),
    (W128_PAIRS, 16, 640, 1056),
    (W128_PAIRS, 48, 7168, 14336),
    (W128_PAIRS, 65, 200, 4160),
    (W128_PAIRS, 128, 18432, 7168),
]


@pytest.mark.gpu
@requires_cutlass
@requires_sm90
@pytest.mark.parametrize("schedule,tokens,n,k", MULTICAST_SHAPES, ids=schedule_id)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_swap_ab_multicast_matches_reference(schedule, tokens, n, k, out_dtype):
    """CTA pairs sharing each stage's token tile by TMA multicast (``cluster`` 2), 64- and
    128-row weight stages: scale bytes 97-157, bias, rows past the tokens untouched."""

    cfg = config_of(schedule, tokens)
    check_swap_ab_run(cfg, tokens, n, k, out_dtype, (tokens + 3 * k, n + 5))


@pytest.mark.gpu
@requires_cutlass
@requires_sm90
def test_swap_ab_tiles_agree_and_graph_replays():
    """Every token tile that fits gives the same bytes (same K order per output, same
    two-stream split), and a captured launch replays with new tokens."""
    from mxfp8_fusion.kernels.gemm_sm90.host import gemm as g

    tokens, n, k = 7, 384, 2048
    a, sa = random_operand(tokens, k, seed=11)
    b, sb = random_operand(n, k, seed=12)
    outs = []
    for tile in (8, 16, 32, 64):
        for bf16_tokens in (0, 1):  # tokens converted once sum in the same order
            out = torch.empty(tokens, n, device="cuda", dtype=torch.bfloat16)
            g.run(
                a,
                sa,
                b,
                sb,
                None,
                out,
                config=gemm_config.swap_ab_config(tile, bf16_tokens=bf16_tokens),
            )
            outs.append(out)
    for other in outs[1:]:
        assert torch.equal(outs[0].view(torch.int16), other.view(torch.int16))
    out = outs[0]
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g.run(a, sa, b, sb, None, out, config=gemm_config.swap_ab_config(tokens, bf16_tokens=True))
    a2, sa2 = random_operand(tokens, k, seed=13)
    a.copy_(a2)
    sa.copy_(sa2)
    graph.replay()
    ref = torch.empty_like(out)
    reference.mm_into(a, sa, b, sb, None, ref)
    torch.cuda.synchronize()
    checks.check_close(out, ref, a, sa, b, sb)


@pytest.mark.gpu
@requires_cutlass
@requires_sm90
@pytest.mark.parametrize("tokens,k", [(1, 128), (5, 4160), (64, 43008)])
def test_token_conversion_is_the_dequantized_tokens_in_fragment_order(tokens, k):
    """The ``bf16_tokens`` pre-pass writes dequant(A) exactly, each 128-K stage's columns
    in the weight fragment's order (gemm_sm90.device.tokens.bf16_slot); scale bytes 97-157 and
    a NaN scale included."""
    from mxfp8_fusion.kernels.gemm_sm90.device.tokens import bf16_slot
    from mxfp8_fusion.kernels.gemm_sm90.host import buffers

    a, sa = random_operand(tokens, k, spread=30, seed=31)
    sa.view(torch.uint8)[scale_offset(0, 1, k)] = 255  # row 0, group 1: a NaN scale
    stream = torch.cuda.current_stream().cuda_stream
    got = buffers.convert_tokens(
        buffers.tokens_build(k), a.data_ptr(), sa.data_ptr(), tokens, k, a.device, 0, stream
    )
    got = got[: tokens * k].view(tokens, k)
    want = reference.dequantize(a, sa).to(torch.bfloat16)
    col = torch.arange(k)
    slots = torch.tensor([bf16_slot(j) for j in range(128)])
    placed = torch.empty_like(want)
    placed[:, col // 128 * 128 + slots[col % 128]] = want
    torch.cuda.synchronize()
    nan = placed.isnan()
    assert torch.equal(got.isnan(), nan) and nan[0, 32:64].all()
    assert torch.equal(got[~nan].view(torch.int16), placed[~nan].view(torch.int16))


@pytest.mark.gpu
@requires_cutlass
@requires_sm90
@pytest.mark.parametrize("bf16_tokens", [0, 1])
def test_swap_ab_on_two_streams_at_once(bf16_tokens):
    """The stream-K workspace and the BF16 token buffer are per stream: overlapping launches
    on two streams do not share partial sums, flags or converted tokens."""

    tokens, n, k = 16, 2048, 8192
    cfg = gemm_config.swap_ab_config(tokens, bf16_tokens=bf16_tokens)
    checks.check_two_streams(cfg, tokens, n, k, seed=20)
