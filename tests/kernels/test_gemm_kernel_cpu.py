"""The SM90 MXFP8 GEMM on a CPU: it compiles for sm_90a (CUTE_DSL_ARCH), its launch
arguments match the DSL's marshalling, the kernels refuse configs that would deadlock, and
the host-side models hold: the stream-K split, the FP16 window, the refusal predicate. The
configs and their selection are in test_gemm_select.py; the GPU tests in test_gemm_kernel.py
and test_gemm_stream_k.py."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import replace

import pytest
import torch
from helpers.gemm import config_of, requires_cutlass, schedule_id, tiled

from mxfp8_fusion.format import scale_bytes
from mxfp8_fusion.kernels.gemm_sm90 import config as gemm_config
from mxfp8_fusion.kernels.gemm_sm90.tuning import select as gemm_select


@pytest.mark.slow
@requires_cutlass
def test_compiles_for_sm90a_without_gpu():
    """CI proof: the kernel compiles for Hopper on a CPU-only machine (CUTE_DSL_ARCH), and
    neither importing nor compiling it uses an API the DSL has deprecated or draws its
    optimization warnings (static loops of 64 or more iterations): both are errors here."""
    code = textwrap.dedent(
        """
        import sys, torch, warnings
        warnings.filterwarnings("error", message=r"cutlass\\.", category=DeprecationWarning)
        warnings.filterwarnings("error", message="This static loop has")
        from mxfp8_fusion.kernels.gemm_sm90.host import gemm as g
        from mxfp8_fusion.kernels.gemm_sm90.config import TiledConfig, swap_ab_config
        from mxfp8_fusion.kernels.gemm_sm90.config import tiled_config as tiled
        from mxfp8_fusion.kernels.gemm_sm90.tuning.select import choose_config
        assert "cutlass" not in sys.modules  # importing the modules must not import cutlass
        bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32
        for cfg, n, k, out, bias in [
            (TiledConfig(), 384, 1056, bf16, None),
            (choose_config(4096, 7168, 43008), 7168, 43008, bf16, bf16),
            (choose_config(512, 7168, 43008), 7168, 43008, fp16, None),
            (choose_config(300, 200, 512), 200, 512, fp16, fp32),
            (swap_ab_config(1), 200, 4160, fp16, fp32),
            (swap_ab_config(64), 7168, 43008, bf16, bf16),
            (swap_ab_config(40, bf16_tokens=True), 200, 4160, fp16, fp32),
            # stream-K: every tile shape
            (tiled(128, 128, 2, stream_k=1), 640, 4160, bf16, None),
            (tiled(192, 128, 1, stream_k=1), 7168, 43008, fp16, fp32),
            (tiled(128, 64, 1, stream_k=1), 200, 512, bf16, bf16),
            (tiled(64, 128, 2, stream_k=1), 640, 4160, bf16, None),
            # whole waves and a stream-K tail
            (tiled(192, 128, 1, stream_k=2), 640, 4160, fp16, fp32),
        ]:
            g.compile_gemm(cfg, n, k, n, out, bias)
        from mxfp8_fusion.kernels.gemm_sm90.host import buffers

        buffers.compile_refs(1056)  # the tiled kernel's per-row FP16 reference scan
        buffers.compile_tokens(4160)  # the swap-AB kernel's token conversion
        print("compiled")
        """
    )
    # the DSL ignores its optimization warnings unless asked (pytest's own filters show them)
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", CUTE_DSL_ENABLE_OPTIMIZATION_WARNINGS="1")
    res = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, res.stderr[-4000:]
    assert "compiled" in res.stdout


@pytest.mark.parametrize(
    "w_tiles,k_tiles,ctas",
    [(112, 336, 132), (4, 33, 132), (2, 1, 132), (7, 5, 6), (56, 336, 132), (15, 33, 132)],
)
def test_stream_k_split_model(w_tiles, k_tiles, ctas):
    """CPU model of the stream-K bookkeeping of the swap-AB kernel and of the tiled kernel's
    stream-K schedule (same integer formulas; the tiled one per consumer warpgroup): every
    (tile, stage) unit is computed once; each split tile is finished by the CTA holding its
    tail, which adds the published parts of exactly the lower CTAs that touched the tile, in
    K order; a CTA publishes at most one part and holds at most one tail."""
    units = w_tiles * k_tiles
    g = min(ctas, units)
    parts = {}  # tile -> [(first unit, cta)]
    finished = {}
    for cta in range(g):
        begin, end = cta * units // g, (cta + 1) * units // g
        u, published, tails = begin, 0, 0
        while u < end:
            tile = u // k_tiles
            tile_end = (tile + 1) * k_tiles
            seg_end = min(end, tile_end)
            parts.setdefault(tile, []).append((u, cta))
            if u == tile * k_tiles and seg_end == tile_end:
                finished[tile] = [cta]
            elif seg_end == tile_end:
                first = ((tile * k_tiles + 1) * g - 1) // units  # as in _fixup
                finished[tile] = list(range(first, cta + 1))
                tails += 1
            else:
                published += 1
            u = seg_end
        assert published <= 1 and tails <= 1
    assert sorted(parts) == list(range(w_tiles))
    for tile, segs in parts.items():
        assert [s for s, _ in segs] == sorted(s for s, _ in segs)
        assert finished[tile] == [c for _, c in segs]  # every part, K order, owner last


@pytest.mark.parametrize(
    "tiles,k_tiles,ctas",
    [(224, 336, 132), (448, 336, 132), (136, 4, 132), (264, 1, 132), (25, 33, 8), (40, 33, 8),
     (10, 33, 8), (5, 33, 8), (133, 56, 132), (150, 2, 132)],
)  # fmt: skip
def test_stream_k_tail_split_model(tiles, k_tiles, ctas):
    """CPU model of the tiled kernel's stream_k 2 schedule (the integer formulas of
    gemm_sm90.tiled.schedule._my_units and _next_unit, the fixup's first CTA, and _waves as the
    heuristic's _whole_waves states it):
    every (tile, stage) unit is computed once; whole tiles come in full waves, one per CTA;
    every CTA holds some of the stream-K units; each split tile is finished by the CTA
    holding its tail, from the parts of exactly the lower CTAs that touched it, each of
    which publishes one part."""

    units = tiles * k_tiles
    g = min(ctas, units)
    waves = gemm_select.whole_waves(tiles, k_tiles, ctas)  # the kernel's _waves, in Python
    whole_end = waves * g * k_tiles
    sk_units = units - whole_end
    owners = {}  # unit -> cta
    for cta in range(g):
        sk_start = whole_end + cta * sk_units // g
        stop = whole_end + (cta + 1) * sk_units // g
        assert stop > sk_start  # no CTA without stream-K units
        u = cta * k_tiles if waves * g > cta else sk_start
        tails = published = 0
        while u < stop:
            tile = u // k_tiles
            seg_end = min(stop, (tile + 1) * k_tiles)
            for x in range(u, seg_end):
                assert owners.setdefault(x, cta) == cta
            whole = u == tile * k_tiles and seg_end == (tile + 1) * k_tiles
            if seg_end <= whole_end:
                assert whole
            elif not whole and seg_end == (tile + 1) * k_tiles:
                tails += 1
                first = (((tile * k_tiles - whole_end) + 1) * g - 1) // sk_units  # as in _fixup
                assert owners[tile * k_tiles] == first
                lower = {owners[x] for x in range(tile * k_tiles, (tile + 1) * k_tiles)} - {cta}
                assert lower == set(range(first, cta))
            elif not whole:
                published += 1
            nxt = seg_end + (g - 1) * k_tiles  # as in _next_unit
            u = (nxt if nxt < whole_end else sk_start) if seg_end <= whole_end else seg_end
        assert tails <= 1 and published <= 1
    assert sorted(owners) == list(range(units))


def _finite_e4m3() -> torch.Tensor:
    codes = torch.arange(256, dtype=torch.int32)
    codes = codes[(codes & 0x7F) != 0x7F].to(torch.uint8)  # drop the two NaN encodings
    return codes.view(torch.float8_e4m3fn).double()


def test_fp16_window_of_the_tiled_kernel():
    """gemm_sm90.device.f16's premise: e4m3 * 2**d is an exact FP16 value for every finite E4M3 and
    d in [-15, 7] (the path uses [-14, 7]), and the window is tight on both sides."""
    from mxfp8_fusion.kernels.gemm_sm90.device.f16 import F16_ABOVE, F16_BELOW

    values = _finite_e4m3()

    def exact(d):
        scaled = values * 2.0**d
        return torch.equal(scaled.to(torch.float16).double(), scaled)

    assert all(exact(d) for d in range(-F16_BELOW, F16_ABOVE + 1))
    assert exact(-15)  # the smallest step, 2**-9, lands on FP16's 2**-24
    assert not exact(-16) and not exact(F16_ABOVE + 1)  # 2**-25 rounds; 448 * 2**8 overflows


def test_two_step_power_of_two_scaling():
    """The epilogue's ``times_pow2``: v * 2**(e >> 1) * 2**(e - (e >> 1)) in FP32 equals v *
    2**e rounded once, for |e| <= 250, whenever the result is a normal FP32 number."""
    gen = torch.Generator().manual_seed(0)
    v = (torch.rand(4096, generator=gen, dtype=torch.float64) + 0.5) * 2.0 ** torch.randint(
        -60, 61, (4096,), generator=gen
    )
    v = v.float()
    for e in range(-250, 251, 7):
        e1, e2 = e >> 1, e - (e >> 1)
        two_steps = (v * 2.0**e1) * 2.0**e2
        want = (v.double() * 2.0**e).float()
        normal = (want.abs() >= torch.finfo(torch.float32).tiny) & want.isfinite()
        assert torch.equal(two_steps[normal], want[normal]), e


@requires_cutlass
def test_k_split_tiles_need_stream_k():
    """The k-split hand-off goes through the stream-K workspace: whole 64-row tiles per CTA
    are refused before anything compiles."""
    from mxfp8_fusion.kernels.gemm_sm90.tiled.kernel import MXFP8TiledGemmSm90

    with pytest.raises(ValueError, match="stream_k"):
        MXFP8TiledGemmSm90(gemm_config.tiled_config(64, 128, 2), 256, 512, 256, None, None)


@requires_cutlass
@pytest.mark.parametrize(
    "schedule,ok",
    [
        (tiled(128, 128, 2, stages=(4, 2)), False),  # two 16-bit stages: a measured hang
        (tiled(128, 128, 2, 1, (5, 3)), True),
        (tiled(64, 128, 2, 1, (7, 3)), False),  # k-split: three measured a hang
        (tiled(64, 128, 2, 1, (6, 4)), True),
    ],
    ids=schedule_id,
)
def test_kernel_refuses_16_bit_stage_counts_that_deadlock(schedule, ok):
    """The converter commits an FP8 stage's two halves together, and consumers free a half
    only once they hold the next one they read: the tiled kernel needs three 16-bit stages,
    four with k-split consumers (every other half each), and refuses fewer before any
    compile."""
    from mxfp8_fusion.kernels.gemm_sm90.tiled.kernel import MXFP8TiledGemmSm90

    cfg = config_of(schedule, 64)
    if ok:
        MXFP8TiledGemmSm90(cfg, 7168, 43008, 7168, None, None)
    else:
        with pytest.raises(ValueError, match="stages16 must be at least"):
            MXFP8TiledGemmSm90(cfg, 7168, 43008, 7168, None, None)


@requires_cutlass
def test_swap_ab_kernel_refuses_too_few_stages_for_its_consumers():
    """Each consumer takes every C-th stage, and with bf16_tokens holds it until it has its
    next one: fewer stages than C (C + 1) would deadlock, so the constructor refuses them."""

    from mxfp8_fusion.kernels.gemm_sm90.swap_ab.kernel import MXFP8SwapABGemmSm90

    cfg = gemm_config.swap_ab_config(32, bf16_tokens=True)
    MXFP8SwapABGemmSm90(replace(cfg, stages=4), 7168, 43008, 7168, None, None)
    with pytest.raises(ValueError, match="stages must be at least"):
        MXFP8SwapABGemmSm90(replace(cfg, stages=3), 7168, 43008, 7168, None, None)
    MXFP8SwapABGemmSm90(replace(cfg, stages=3, bf16_tokens=False), 7168, 43008, 7168, None, None)


@requires_cutlass
def test_bf16_token_order_is_a_permutation_within_each_scale_group():
    """gemm_sm90.device.tokens.bf16_slot moves K only inside its 32-element group, so the BF16
    token buffer keeps a partial last stage inside K."""
    from mxfp8_fusion.kernels.gemm_sm90.device.tokens import bf16_slot

    slots = [bf16_slot(j) for j in range(128)]
    assert sorted(slots) == list(range(128))
    assert all(s // 32 == j // 32 for j, s in enumerate(slots))


def _predicate_operands(tokens=4, n=16, k=64):
    a = torch.zeros(tokens, k, dtype=torch.float8_e4m3fn)
    b = torch.zeros(n, k, dtype=torch.float8_e4m3fn)
    sa = torch.zeros(scale_bytes(tokens, k), dtype=torch.uint8)
    sb = torch.zeros(scale_bytes(n, k), dtype=torch.uint8)
    return a, sa, b, sb, torch.zeros(tokens, n, dtype=torch.bfloat16)


def test_refusal_names_unaligned_shapes():
    from mxfp8_fusion.kernels.gemm_sm90.host import gemm as g

    a, sa, b, sb, out = _predicate_operands()
    assert g.refusal(a, sa, b, sb, None, out) is None
    assert "out dtype" in g.refusal(a, sa, b, sb, None, out.float())
    odd = torch.zeros(4, 12, dtype=torch.bfloat16)[:, :12]
    b12 = torch.zeros(12, 64, dtype=torch.float8_e4m3fn)
    assert "16-byte aligned" in g.refusal(a, sa, b12, sb, None, odd)
    assert "K=48" in g.refusal(a[:, :48], sa, b[:, :48], sb, None, out)


def test_refusal_names_what_the_kernels_cannot_read():
    """Scale buffers not 16-byte aligned (TMA) and a bias the kernels do not read (not a
    contiguous BF16/FP16/FP32 vector) are refused by the predicate, with the reason the
    fallback warning gives; run() refuses them too, before any launch."""
    from mxfp8_fusion.kernels.gemm_sm90.host import gemm as g

    a, sa, b, sb, out = _predicate_operands()
    shifted = lambda t: torch.zeros(t.numel() + 16, dtype=torch.uint8)[4 : 4 + t.numel()]  # noqa: E731
    for bias in (None, torch.zeros(16), torch.zeros(16, dtype=torch.float16)):
        assert g.refusal(a, sa, b, sb, bias, out) is None
    refused = [
        ((a, shifted(sa), b, sb, None, out), "scale buffers"),
        ((a, sa, b, shifted(sb), None, out), "scale buffers"),
        ((a, sa, b, sb, torch.zeros(32, dtype=torch.bfloat16)[::2], out), "bias"),
        ((a, sa, b, sb, torch.zeros(16, dtype=torch.float64), out), "bias"),
    ]
    for args, reason in refused:
        assert g.refusal(*args).startswith(reason)
        assert g.run_if_served(*args).startswith(reason)
        with pytest.raises(ValueError, match=reason):
            g.run(*args)
