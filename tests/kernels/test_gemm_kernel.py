"""The SM90 MXFP8 GEMM on an sm_90 GPU against reference.mm_into: the tiled kernel (its FP16
and BF16 paths, tile configs), NaN scales, CUDA Graphs, staged operands; the swap-AB
kernel's own tests are in test_gemm_swap_ab.py. The tolerance is explained in tests/helpers/gemm.py; stream-K and the measured
table's choices are in test_gemm_stream_k.py, the CPU tests in test_gemm_kernel_cpu.py."""

from __future__ import annotations

import pytest
import torch
from helpers.gemm import (
    check_close,
    check_run,
    config_of,
    random_operand,
    requires_cutlass,
    requires_sm90,
    run_kernel,
    schedule_id,
    tiled,
)

from mxfp8_fusion import reference
from mxfp8_fusion.format import GROUP, scale_bytes, scale_offset
from mxfp8_fusion.kernels.gemm_sm90 import config as gemm_config

SHAPES = [  # (tokens, N, K)
    (1, 128, 128),
    (17, 256, 512),
    (128, 7168, 1024),
    (1000, 384, 2048),
    (4096, 1024, 1024),
    (17, 512, 43008),
    (1000, 7168, 7168),
]


@pytest.mark.gpu
@requires_cutlass
@requires_sm90
@pytest.mark.parametrize("tokens,n,k", SHAPES)
@pytest.mark.parametrize(
    "out_dtype,spread,center",
    [
        (torch.bfloat16, 10, 127),  # every row's bytes span <= 20: the FP16 path
        (torch.bfloat16, 20, 127),  # spans up to 40: the BF16 path
        # FP16 overflows past 65504: a narrow, low scale range keeps its outputs finite
        (torch.float16, 4, 119),
    ],
)
@pytest.mark.parametrize("with_bias", [False, True])
def test_matches_reference(tokens, n, k, out_dtype, spread, center, with_bias):
    """Tiled-kernel shapes (few-token ones take the swap-AB kernel) on both of its paths
    (gemm_sm90.device.f16: a row takes FP16 when its scale bytes span at most 21)."""
    bias = torch.randn(n, device="cuda", dtype=torch.float32) * 4 if with_bias else None
    check_run(tokens, n, k, out_dtype, bias, spread, center, (tokens + k, n), extra_rows=37)


@pytest.mark.gpu
@requires_cutlass
@requires_sm90
@pytest.mark.parametrize("k", [1056, 43008])
def test_row_references_follow_the_fp16_rule(k):
    """The scan behind the FP16 path (gemm_sm90.device.f16), against the rule in plain torch: ref =
    max(largest byte - 7, 2); the row qualifies when no byte is 255 and its smallest nonzero
    byte is at least ref - 14; padding groups and rows past M / N do not count."""
    from mxfp8_fusion.kernels.gemm_sm90.host import buffers

    m, n = 200, 300
    _, sa = random_operand(m, k, 256, spread=10, center=120, seed=41)
    _, sb = random_operand(n, k, None, spread=10, center=120, seed=42)
    groups = k // GROUP
    sa_bytes, sb_bytes = sa.view(torch.uint8), sb.view(torch.uint8)
    # random bytes lie in 110..130
    sa_bytes[scale_offset(3, 5, k)] = 98  # row 3: below its ref - 14, misfits
    sa_bytes[scale_offset(4, 6, k)] = 0  # a zero group: row 4 still qualifies
    sa_bytes[scale_offset(5, groups - 1, k)] = 255  # NaN: row 5 misfits
    sa_bytes[scale_offset(230, 1, k)] = 255  # past M: ignored
    sb_bytes[scale_offset(7, 0, k)] = 140  # row 7: span 140 - 110 = 30, misfits
    sb_bytes[scale_offset(8, 9, k)] = 109  # row 8: on either side of the edge, by its max
    refs = buffers.row_references(sa, sb, m, n, k)
    torch.cuda.synchronize()

    def expected(scales, rows, valid):
        b = reference.from_blocked(scales.view(torch.uint8), rows, groups).int()
        mx = b.amax(dim=1)
        low = torch.where(b == 0, 256, b).amin(dim=1)
        ref = torch.clamp(mx - 7, min=2)
        fits = (mx < 255) & (low >= ref - 14)
        misfit = ~fits & (torch.arange(rows, device=b.device) < valid)
        return torch.where(misfit, -1, ref)

    a_rows = 256
    want_a, want_b = expected(sa, a_rows, m), expected(sb, 384, n)
    assert want_a[3] == -1 and want_a[4] >= 0 and want_a[5] == -1 and want_b[7] == -1
    assert torch.equal(refs[:a_rows], want_a.int())
    assert torch.equal(refs[a_rows : a_rows + 384], want_b.int())


@pytest.mark.gpu
@requires_cutlass
@requires_sm90
@pytest.mark.parametrize(
    "tile_m,tile_n,converters", [(128, 64, 1), (128, 128, 1), (128, 128, 2), (192, 128, 1)]
)
def test_fp16_and_bf16_tiles_in_one_launch(tile_m, tile_n, converters):
    """Per-tile path choice: one A row with a 40-byte scale span sends its 128-row band to the
    BF16 path, a NaN-scaled B row its column tile (and NaN into its column), an all-zero
    group (byte 0) does not disqualify its row, K past the last full 128 (padding groups of
    byte 127 must not count) -- every tile matches the reference, rows past M untouched."""
    from mxfp8_fusion.kernels.gemm_sm90.host import gemm as g

    tokens, n, k = 300, 640, 1056
    a_full, sa = random_operand(tokens, k, tokens + 20, spread=8, center=100, seed=31)
    b, sb = random_operand(n, k, None, spread=8, center=100, seed=32)
    a = a_full[:tokens]
    sa_bytes, sb_bytes = sa.view(torch.uint8), sb.view(torch.uint8)
    sa_bytes[scale_offset(150, 5, k)] = 60  # row band 128..255: BF16 path
    sb_bytes[scale_offset(400, 30, k)] = 0xFF  # NaN column 400
    a_full.view(torch.uint8)[7, 64:96] = 0  # row 7, group 2: all zero, byte 0
    sa_bytes[scale_offset(7, 2, k)] = 0
    out = torch.full((tokens + 20, n), 1234.0, device="cuda", dtype=torch.bfloat16)
    poison = out.clone()
    stages16 = 3 if tile_m == 192 else 4  # 4 + 4 stages of 192-row tiles overflow smem
    cfg = gemm_config.TiledConfig(
        tile_n=tile_n, converters=converters, tile_m=tile_m, stages16=stages16
    )
    g.run(a, sa, b, sb, None, out, config=cfg)
    ref = torch.empty(tokens, n, device="cuda", dtype=torch.bfloat16)
    reference.mm_into(a, sa, b, sb, None, ref)
    torch.cuda.synchronize()
    assert torch.equal(out[tokens:].view(torch.int16), poison[tokens:].view(torch.int16))
    assert ref[:, 400].isnan().all()
    check_close(out[:tokens], ref, a, sa, b, sb)


@pytest.mark.gpu
@requires_cutlass
@requires_sm90
@pytest.mark.parametrize("tokens", [5, 300, 1000])
def test_tile_configs_agree(tokens):
    """Tile shapes and pipeline depths give the same bytes (same K order per output). 192-row
    tiles start at row 64 of a scale chunk every other tile, and 1000 tokens put the last
    one's second chunk past the scales (TMA fills zeros)."""
    from mxfp8_fusion.kernels.gemm_sm90.host import gemm as g

    a, sa = random_operand(tokens, 1024, seed=1)
    b, sb = random_operand(640, 1024, seed=2)
    outs = []
    for cfg in (
        gemm_config.TiledConfig(tile_n=64, stages=4, stages16=4),
        gemm_config.TiledConfig(tile_n=128, stages=4, stages16=4),
        gemm_config.TiledConfig(tile_n=128, stages=3, stages16=6),
        gemm_config.TiledConfig(tile_n=128, converters=2),
        gemm_config.TiledConfig(tile_m=192, stages=4, stages16=3),
        gemm_config.TiledConfig(tile_m=192, stages=3, stages16=4),
    ):
        out = torch.empty(tokens, 640, device="cuda", dtype=torch.bfloat16)
        g.run(a, sa, b, sb, None, out, config=cfg)
        outs.append(out)
    for other in outs[1:]:
        assert torch.equal(outs[0].view(torch.int16), other.view(torch.int16))


@pytest.mark.gpu
@requires_cutlass
@requires_sm90
@pytest.mark.parametrize(
    "schedule", [tiled(128, 64, 1), tiled(192, 128, 1), tiled(128, 128, 2, 1), tiled(64, 128, 2, 1)],
    ids=schedule_id,
)  # fmt: skip
@pytest.mark.parametrize("n", [200, 203])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_tiled_epilogue_column_edges(schedule, n, out_dtype):
    """The epilogue stores 8 columns of a row at once where they lie inside M and N: N 200
    ends a column tile mid-way on a group of 8, N 203 inside one (stored one by one), into an
    ``out`` whose rows are 208 wide; with a bias. Rows past M and the padding columns stay
    untouched."""
    from mxfp8_fusion.kernels.gemm_sm90.host import gemm as g

    tokens, k = 77, 1056
    spread, center = (20, 127) if out_dtype == torch.bfloat16 else (4, 119)
    a_full, sa = random_operand(tokens, k, tokens + 5, spread, center, seed=41)
    b, sb = random_operand(n, k, None, spread, center, seed=42)
    a = a_full[:tokens]
    bias = (torch.randn(n, device="cuda") * 4).to(out_dtype)
    full = torch.full((tokens + 5, 208), 1234.0, device="cuda", dtype=out_dtype)
    poison = full.clone()
    out = full[:, :n]
    g.run(a, sa, b, sb, bias, out, config=config_of(schedule, tokens))
    ref = torch.empty(tokens, n, device="cuda", dtype=out_dtype)
    reference.mm_into(a, sa, b, sb, bias, ref)
    torch.cuda.synchronize()
    assert torch.equal(full[tokens:].view(torch.int16), poison[tokens:].view(torch.int16))
    assert torch.equal(full[:, n:].view(torch.int16), poison[:, n:].view(torch.int16))
    check_close(out[:tokens], ref, a, sa, b, sb)


@pytest.mark.gpu
@requires_cutlass
@requires_sm90
def test_tensor_core_group_sum_probe():
    """448*448 - 448*448 + 30 * 2**-9 in one 32-wide group is 0.0586 exactly. The H200's FP8
    wgmma returned 0.0 (products aligned to the largest and truncated); the BF16 wgmma that
    this kernel feeds with exactly scaled operands keeps them: bitwise the reference."""
    from mxfp8_fusion.kernels.gemm_sm90.host import gemm as g

    k = 128
    a = torch.zeros(1, k, dtype=torch.uint8)
    a[0, 0], a[0, 1], a[0, 2:32] = 0x7E, 0xFE, 0x01  # 448, -448, 2**-9
    b = torch.zeros(16, k, dtype=torch.uint8)
    b[:, 0], b[:, 1], b[:, 2:32] = 0x7E, 0x7E, 0x38  # 448, 448, 1.0
    ones = lambda rows: reference.to_blocked(torch.full((rows, k // GROUP), 127, dtype=torch.uint8))  # noqa: E731
    av, bv = a.view(torch.float8_e4m3fn).cuda(), b.view(torch.float8_e4m3fn).cuda()
    sa, sb = ones(1).view(torch.float8_e8m0fnu).cuda(), ones(16).view(torch.float8_e8m0fnu).cuda()
    out = torch.empty(1, 16, device="cuda", dtype=torch.bfloat16)
    ref = torch.empty_like(out)
    reference.mm_into(av, sa, bv, sb, None, ref)
    g.run(av, sa, bv, sb, None, out)
    assert ref[0, 0].item() == 30 * 2.0**-9
    assert torch.equal(out.view(torch.int16), ref.view(torch.int16))


@pytest.mark.gpu
@requires_cutlass
@requires_sm90
@pytest.mark.parametrize("tokens", [1, 200])
def test_nan_scale_propagates(tokens):
    k, n = 512, 256
    a, sa = random_operand(tokens, k, seed=3)
    b, sb = random_operand(n, k, seed=4)
    sa_bytes, sb_bytes = sa.view(torch.uint8), sb.view(torch.uint8)
    row = tokens - 1
    sa_bytes[scale_offset(row, 1, k)] = 0xFF
    col = 77
    sb_bytes[scale_offset(col, 6, k)] = 0xFF
    out = torch.empty(tokens, n, device="cuda", dtype=torch.bfloat16)
    ref = torch.empty_like(out)
    reference.mm_into(a, sa, b, sb, None, ref)
    run_kernel(a, sa, b, sb, None, out)
    assert ref[row].isnan().all() and ref[:, col].isnan().all()
    assert torch.equal(out.isnan(), ref.isnan())


@pytest.mark.gpu
@requires_cutlass
@requires_sm90
def test_cuda_graph_capture_and_replay():
    from mxfp8_fusion.kernels.gemm_sm90.host import gemm as g

    tokens, n, k = 300, 512, 1024
    a, sa = random_operand(tokens, k, seed=5)
    b, sb = random_operand(n, k, seed=6)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(tokens, n, device="cuda", dtype=torch.bfloat16)
    g.run(a, sa, b, sb, bias, out)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g.run(a, sa, b, sb, bias, out)
    a2, sa2 = random_operand(tokens, k, seed=7)
    a.copy_(a2)
    sa.copy_(sa2)
    out.zero_()
    graph.replay()
    eager = torch.empty_like(out)
    g.run(a, sa, b, sb, bias, eager)
    torch.cuda.synchronize()
    assert torch.equal(out.view(torch.int16), eager.view(torch.int16))


@pytest.mark.gpu
@requires_cutlass
@requires_sm90
def test_staged_and_one_shot_inputs_give_equal_bytes():
    """Slices quantized into their columns vs the concatenation quantized at once."""
    from mxfp8_fusion.kernels.gemm_sm90.host import gemm as g

    tokens, width, n = 200, 256, 384
    slices = [
        torch.randn(tokens, width, device="cuda", dtype=torch.bfloat16) * 10**i
        for i in range(-2, 3)
    ]
    k = width * len(slices)
    one_values, one_scales = reference.quantize(torch.cat(slices, dim=-1))
    capacity = 256
    st_values = torch.zeros(capacity, k, device="cuda", dtype=torch.float8_e4m3fn)
    st_scales = torch.full((scale_bytes(capacity, k),), 127, device="cuda", dtype=torch.uint8).view(
        torch.float8_e8m0fnu
    )
    for i, s in enumerate(slices):
        reference.quantize_slice_(s, st_values, st_scales, i * width)
    w_values, w_scales = reference.quantize(torch.randn(n, k, device="cuda"))
    # the heuristic's choice here (stream-K) and whole tiles per CTA
    for cfg in (None, config_of(tiled(128, 128, 2), tokens)):
        out_one = torch.empty(tokens, n, device="cuda", dtype=torch.bfloat16)
        out_st = torch.empty(tokens, n, device="cuda", dtype=torch.bfloat16)
        g.run(one_values, one_scales, w_values, w_scales, None, out_one, config=cfg)
        g.run(st_values[:tokens], st_scales, w_values, w_scales, None, out_st, config=cfg)
        torch.cuda.synchronize()
        assert torch.equal(out_one.view(torch.int16), out_st.view(torch.int16))


def _shifted(scales: torch.Tensor) -> torch.Tensor:
    """The bytes of ``scales`` in a buffer starting 4 bytes past a 16-byte boundary."""
    raw = torch.empty(scales.numel() + 16, device="cuda", dtype=torch.uint8)[4 : 4 + scales.numel()]
    return raw.copy_(scales.view(torch.uint8))


@pytest.mark.gpu
@requires_cutlass
@requires_sm90
@pytest.mark.parametrize("case", ["a_scales", "b_scales", "strided_bias", "float64_bias"])
def test_calls_the_kernels_cannot_read_take_the_ops_fallback(case, monkeypatch):
    """Scale buffers not 16-byte aligned and a bias that is no contiguous BF16/FP16/FP32
    vector: the kernels refuse them, the op gives the reference's bytes and warns once,
    naming the reason."""
    from mxfp8_fusion import ops

    tokens, n, k = 40, 256, 512
    a, sa = random_operand(tokens, k, seed=21)
    b, sb = random_operand(n, k, seed=22)
    sa, sb = sa.view(torch.uint8), sb.view(torch.uint8)
    bias, reason = None, "scale buffers"
    if case == "a_scales":
        sa = _shifted(sa)
    elif case == "b_scales":
        sb = _shifted(sb)
    elif case == "strided_bias":
        bias, reason = torch.randn(2 * n, device="cuda", dtype=torch.bfloat16)[::2], "bias"
    else:
        bias, reason = torch.randn(n, device="cuda", dtype=torch.float64), "bias"
    out = torch.empty(tokens, n, device="cuda", dtype=torch.bfloat16)
    monkeypatch.setattr(ops, "_warned", set())
    with pytest.warns(UserWarning, match=f"GPU sm_90: {reason}"):
        ops.mm_into(a, sa, b, sb, bias, out)
    ref = torch.empty_like(out)
    reference.mm_into(a, sa, b, sb, bias, ref)
    torch.cuda.synchronize()
    assert torch.equal(out.view(torch.int16), ref.view(torch.int16))
