"""The SM90 W8A16 GEMM on a CPU: every build the choice can make compiles for sm_90a
(CUTE_DSL_ARCH) without the DSL's warnings, the refusal names what it does not serve, and
the index maps the kernels use agree with each other (the fragment words a thread loads
from the slices are the K positions the other operand holds). The GPU tests are in
test_gemm_w8a16.py."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from helpers.gemm import requires_cutlass

from mxfp8_fusion.kernels.gemm_sm90 import config as gemm_config
from mxfp8_fusion.kernels.gemm_sm90.device.tokens import bf16_slot
from mxfp8_fusion.kernels.gemm_sm90.host import gemm as host
from mxfp8_fusion.kernels.gemm_sm90.host import w8a16
from mxfp8_fusion.kernels.gemm_sm90.tuning import select as gemm_select

SHAPES = [(4096, 12288), (7168, 14336), (7168, 43008), (2048, 7168), (11008, 4096), (4096, 11008)]
TOKENS = [1, 2, 4, 8, 16, 32, 48, 64, 128, 256, 512, 1024, 2048, 4096]


def chosen():
    """Every W8A16 config the choice makes on the sweep's shapes and token counts."""
    found = {}
    for n, k in SHAPES:
        for tokens in TOKENS:
            cfg = gemm_select.choose_config(tokens, n, k, activation="bf16")
            found.setdefault(cfg, (tokens, n, k))
    return found


def test_the_choice_makes_only_bf16_activation_configs_that_fit():
    for cfg, (tokens, _n, _k) in chosen().items():
        assert cfg.activation == "bf16"
        if isinstance(cfg, gemm_config.SwapABConfig):
            assert cfg.bf16_tokens and (cfg.token_tiles or tokens <= cfg.tokens_tile)
        else:
            assert not cfg.fp16_tiles
            assert gemm_config.tiled_smem_bytes(cfg) <= 227 * 1024


def test_configs_refuse_what_the_w8a16_kernels_cannot_build():
    with pytest.raises(ValueError, match="^fp16_tiles: "):
        gemm_config.TiledConfig(activation="bf16")
    with pytest.raises(ValueError, match="^stages: "):
        gemm_config.tiled_config(128, 128, 2, stages=(4, 4), activation="bf16")
    with pytest.raises(ValueError, match="^bf16_tokens: "):
        gemm_config.SwapABConfig(tokens_tile=8, stages=4, activation="bf16")
    with pytest.raises(ValueError, match="^activation: "):
        gemm_config.tiled_config(128, 128, 2, activation="fp8")


@pytest.mark.slow
@requires_cutlass
def test_compiles_for_sm90a_without_gpu():
    """CI proof: every W8A16 build the choice makes on the sweep's shapes (and 1, 3 and 8
    slices, each output and bias dtype) compiles for Hopper on a CPU-only machine, without
    the DSL's deprecation or optimization warnings."""
    code = textwrap.dedent(
        f"""
        import sys, torch, warnings
        warnings.filterwarnings("error", message=r"cutlass\\.", category=DeprecationWarning)
        warnings.filterwarnings("error", message="This static loop has")
        from mxfp8_fusion.kernels.gemm_sm90.host import gemm as host
        from mxfp8_fusion.kernels.gemm_sm90.tuning.select import choose_config
        assert "cutlass" not in sys.modules
        bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32
        seen = set()
        cases = []
        for n, k in {SHAPES!r}:
            for tokens in {TOKENS!r}:
                cfg = choose_config(tokens, n, k, activation="bf16")
                if cfg not in seen:
                    seen.add(cfg)
                    cases.append((cfg, n, (k // 3,) * 3 if k % 384 == 0 else (k,)))
        dtypes = [(bf16, None), (fp16, fp32), (bf16, bf16)]
        for i, (cfg, n, widths) in enumerate(cases):
            out, bias = dtypes[i % 3]
            host.compile_gemm(cfg, n, widths, n, out, bias)
        cfg = choose_config(4096, 4096, 1024, activation="bf16")
        host.compile_gemm(cfg, 4096, (128,) * 8, 4096, bf16, None)
        print("compiled", len(cases) + 1)
        """
    )
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", CUTE_DSL_ENABLE_OPTIMIZATION_WARNINGS="1")
    res = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=1200
    )
    assert res.returncode == 0, res.stderr[-4000:]
    assert "compiled" in res.stdout


def _meta(shape, dtype, stride=None):
    t = torch.empty(shape, dtype=dtype, device="meta")
    return t if stride is None else t.as_strided(shape, stride)


def _call(slices, n=256, out_dtype=torch.bfloat16, bias_dtype=None):
    k = sum(s.shape[1] for s in slices)
    values = _meta((n, k), torch.float8_e4m3fn)
    scales = _meta((n * k // 32,), torch.uint8)
    bias = None if bias_dtype is None else _meta((n,), bias_dtype)
    return slices, values, scales, bias, _meta((slices[0].shape[0], n), out_dtype)


@pytest.mark.parametrize(
    ("slices", "reason"),
    [
        ([_meta((4, 128), torch.float16)], "BF16"),
        ([_meta((4, 192), torch.bfloat16)], "multiples of 128"),
        ([_meta((4, 128), torch.bfloat16), _meta((5, 128), torch.bfloat16)], "one row count"),
        ([_meta((4, 128), torch.bfloat16, (129, 1))], "16-byte aligned and apart"),
        ([_meta((4, 128), torch.bfloat16, (1, 4))], "contiguous"),
        ([_meta((4, 128), torch.bfloat16)] * 9, "1 to 8"),
    ],
)
def test_refusal_names_what_the_kernels_do_not_read(slices, reason):
    assert reason in w8a16.refusal(*_call(slices))


def test_views_of_a_wider_buffer_are_served():
    # the first: a column range of a [4, 1024] buffer
    slices = [_meta((4, 256), torch.bfloat16, (1024, 1)), _meta((4, 128), torch.bfloat16)]
    assert w8a16.refusal(*_call(slices)) is None
    one_row = [_meta((1, 128), torch.bfloat16, (5, 1))]  # a lone row's stride is never read
    assert w8a16.refusal(*_call(one_row)) is None


def test_launches_name_one_build_per_config_and_widths():
    gpu = (132, "NVIDIA H200")
    plan = w8a16.launches(8, 4096, (4096,) * 3, 4096, torch.bfloat16, None, gpu)
    assert plan.before is None and plan.gemm.kind == "gemm w8a16"
    assert plan.gemm.facts[2] == (4096, 4096, 4096)
    assert w8a16.builds(8, 4096, (4096,) * 3, 4096, torch.bfloat16, None, gpu) == [plan.gemm]
    other = w8a16.launches(8, 4096, (12288,), 4096, torch.bfloat16, None, gpu)
    assert other.gemm != plan.gemm and other.config == plan.config


def test_the_tiled_fragment_loads_hold_the_k_slots_the_weight_tile_has():
    """Tiled W8A16: thread t's 16-byte load of group j (BF16 elements 8t..8t+7, natural
    order) fills fragment words rr + 2 (q % 2) + 4 (2j + q / 2); the weight tile holds
    natural element e at the K slot tokens.bf16_slot(e). Both must meet in each k16 slot."""
    for j in range(2):  # a K half's two groups
        for t in range(4):
            for q in range(4):
                for e in range(2):
                    natural = 32 * j + 8 * t + 2 * q + e
                    block, hi = 2 * j + q // 2, q % 2  # the fragment word's k16 block, half
                    slot = 16 * block + 2 * t + 8 * hi + e  # the wgmma's K for (t, word, e)
                    assert bf16_slot(natural) == slot


def test_the_swap_ab_natural_fragment_holds_the_k_the_tokens_have():
    """Swap-AB W8A16: the tokens lie in natural K order, so fragment word rr + 2 hi + 4 kb
    of thread t must hold the weight's bytes 16 kb + 2t + 8 hi (+0, +1): the half (t % 2)
    of word t / 2 + 2 hi of chunk kb that load_fragment_natural reads."""
    for kb in range(8):
        for t in range(4):
            for hi in range(2):
                word = t // 2 + 2 * hi
                byte = 16 * kb + 4 * word + 2 * (t % 2)
                assert byte == 16 * kb + 2 * t + 8 * hi


def test_each_host_path_refuses_the_other_activations_config():
    """Both activations share one plan (gemm_sm90.host.gemm.launches), which refuses a config
    of the other: a W8A16 config for a W8A8 call and the reverse."""
    from mxfp8_fusion.format import Activation

    gpu = (132, "NVIDIA H200")
    w8a16_cfg = gemm_select.choose_config(8, 4096, 4096, activation="bf16")
    w8a8_cfg = gemm_select.choose_config(8, 4096, 4096)
    with pytest.raises(ValueError, match=r"^config: expected a W8A8 \(activation 'mxfp8'\)"):
        host.launches(8, 4096, 4096, 4096, torch.bfloat16, None, gpu, w8a16_cfg)
    with pytest.raises(ValueError, match=r"^config: expected a W8A16 \(activation 'bf16'\)"):
        w8a16.launches(8, 4096, (4096,), 4096, torch.bfloat16, None, gpu, w8a8_cfg)
    plan = host.launches(8, 4096, (4096,), 4096, torch.bfloat16, None, gpu, None, Activation.W8A16)
    assert plan.gemm.kind == "gemm w8a16" and plan.before is None
