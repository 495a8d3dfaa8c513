"""benchmarks/vllm_linear.py's logic on the CPU: its layer is vLLM's layout, its contenders
compute one product, Humming's input schema is the one vLLM 0.34 settles on, and the rows,
verdicts and rule of the receipt say what the numbers decide."""

import sys

import humming_contender as hc
import pytest
import torch
import vllm_linear as bench

from mxfp8_fusion import reference
from mxfp8_fusion.vllm import linear

US = {"ours": 10.0, "humming": 12.5, "cublas_bf16": 20.0}
ERRORS = {
    "humming_err_vs_bf16_model": 1e-3,
    "ours_err_vs_w8a8_reference": 2e-3,
    "ours_err_vs_bf16_model": 3e-2,
    "cublas_bf16_err_vs_bf16_model": 1e-3,
}


def row(tokens=8, shape="drafter_fc_3x4096_to_4096", **us) -> bench.Row:
    n, k = bench.SHAPES[shape]
    first = {"ours": 1.0, "humming": 18.5, "cublas_bf16": 0.1}
    return bench.make_row(shape, tokens, n, k, 4, 52, {**US, **us}, ERRORS, first, True, "mma")


def test_receipt_contenders_compute_the_same_product_on_cpu():
    """Its layer is vLLM's layout, and its dequantize-then-BF16 contender computes what ours
    does, up to the input's quantization."""
    layer = bench.vllm_style_layer(256, 512, device="cpu")
    values, scales = layer.weight.data.clone(), layer.weight_scale.data.clone()
    w = bench.dequantize(values, scales)
    assert torch.equal(w.float(), reference.dequantize(values, reference.to_blocked(scales)))
    linear.process_weights(layer)
    x = torch.randn(8, 512).to(torch.bfloat16)
    got = linear.apply_weights(layer, x).float()
    dense = torch.nn.functional.linear(x, w).float()
    assert torch.allclose(got, dense, rtol=0.1, atol=0.1 * dense.abs().max().item())


def test_importing_the_humming_contender_does_not_import_humming():
    assert "humming" not in sys.modules


# --- Humming's input schema: vLLM 0.34's check_and_fallback_input_schema --------------------


def choose(sm, compatible=lambda c: True, request=None):
    request = request or hc.mxfp8_dynamic_request()
    return hc.vllm_input_choice(request, sm, 32, "float8e8m0", compatible)


def test_mxfp8_request_is_w8a16_on_sm90():
    """MXFP8 activations are kept only from SM120; on SM90 the compatible request turns into
    16-bit activations (the layer's BF16: W8A16)."""
    assert hc.mxfp8_dynamic_request() == hc.InputChoice(
        "float8e4m3", 32, "float8e8m0", "dynamic_group"
    )
    choice, why = choose(90)
    assert choice == hc.InputChoice() and choice.bits == 16
    assert "W8A16" in why


def test_mxfp8_request_is_kept_on_sm120():
    choice, _ = choose(120)
    assert choice == hc.mxfp8_dynamic_request()


def test_an_incompatible_request_walks_the_fallback_order():
    """On SM90 an E4M3 fallback gets per-token FP32 scales; where no 8-bit candidate fits,
    the layer's 16-bit dtype."""
    seen = []

    def only_per_token(c):
        seen.append(c)
        return c.mode == "dynamic_token"

    choice, why = choose(90, only_per_token)
    assert choice == hc.InputChoice("float8e4m3", 0, "float32", "dynamic_token")
    assert "fell back" in why and seen[0] == hc.mxfp8_dynamic_request()
    choice, _ = choose(90, lambda c: c.bits == 16)
    assert choice == hc.InputChoice("bfloat16", 0, None, "none")


def test_deprecated_fp8_falls_back_to_bf16_on_sm100():
    choice, _ = choose(100)
    assert choice == hc.InputChoice("bfloat16", 0, None, "none")
    assert hc.slow_on("float8e4m3", 100) and not hc.slow_on("float8e4m3", 90)
    assert hc.slow_on("int4", 90) and not hc.slow_on("bfloat16", 100)


def test_no_compatible_schema_raises():
    with pytest.raises(ValueError, match="no compatible Humming input schema"):
        choose(90, lambda c: False)


def test_dtype_bits():
    assert [hc.dtype_bits(n) for n in ("float8e4m3", "int4", "bfloat16", None)] == [8, 4, 16, 16]
    with pytest.raises(ValueError):
        hc.dtype_bits("e4m3")


def test_kernel_interval_lookup_follows_the_launcher():
    """Humming's launcher serves ``rows`` with the first interval where low < rows <= high."""
    intervals = [(0, 8, {"mma_type": "mma"}), (8, 64, {"mma_type": "wgmma"}), (64, 1 << 30, {})]
    assert [hc.interval_for(intervals, t)[2].get("mma_type") for t in (1, 8, 9, 64, 65)] == [
        "mma",
        "mma",
        "wgmma",
        "wgmma",
        None,
    ]
    with pytest.raises(LookupError):
        hc.interval_for(intervals, 0)
    label = hc.config_label({"mma_type": "wgmma", "block_shape": [64, 256, 64], "num_stages": 4})
    assert label == "wgmma 64x256x64 s4"


# --- what is measured -------------------------------------------------------------------------


@pytest.mark.parametrize("shape", list(bench.SHAPES))
def test_weight_copies_cover_the_rotation_bytes(shape):
    n, k = bench.SHAPES[shape]
    copies = bench.weight_copies(n, k)
    assert copies * n * k >= bench.L2_ROTATE_BYTES and (copies - 1) * n * k < bench.L2_ROTATE_BYTES
    for t in bench.TOKENS:
        calls = bench.calls_per_graph(t, n, k, copies)
        assert calls % copies == 0 and 1 <= calls < bench.MAX_CALLS + copies


def test_token_counts_and_regimes():
    assert bench.TOKENS == (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
    assert set(bench.TRIMMED_TOKENS) <= set(bench.TOKENS)
    assert bench.regime(512).startswith("decode") and bench.regime(1024).startswith("prefill")


# --- rows, verdicts, the rule ---------------------------------------------------------------


def test_row_fields_and_ratio_direction():
    r = row()
    assert r.ours_over_humming_time == pytest.approx(0.8)  # below 1: ours faster
    assert r.ours_over_cublas_bf16_time == pytest.approx(0.5)
    assert r.humming_over_cublas_bf16_time == pytest.approx(0.625)
    assert r.ours_at_least_as_fast_as_humming
    assert r.ours_tflops == pytest.approx(2 * 8 * 4096 * 12288 / 10e-6 / 1e12)
    assert r.regime.startswith("decode") and (r.n, r.k) == (4096, 12288)
    assert r.humming_err_vs_bf16_model == 1e-3 and r.ours_err_vs_w8a8_reference == 2e-3
    assert row(ours=12.5).ours_at_least_as_fast_as_humming  # a tie counts as fast as
    assert not row(ours=12.6).ours_at_least_as_fast_as_humming


def test_verdict_counts_points():
    rows = [row(1), row(8, ours=13.0), row(64, ours=25.0)]
    v = bench.verdict(rows)
    assert v["ours_at_least_as_fast_as_humming_at_every_point"] == "no"
    assert (v["points"], v["points_ours_at_least_as_fast"], v["points_ours_slower"]) == (3, 1, 2)
    assert v["ours_slower_at_tokens"] == [8, 64]
    assert v["ours_over_humming_min"] == pytest.approx(0.8)
    assert v["ours_over_humming_max"] == pytest.approx(2.0)
    assert bench.verdict([row(1), row(2)])["ours_at_least_as_fast_as_humming_at_every_point"] == (
        "yes"
    )
    assert bench.verdict([])["ours_at_least_as_fast_as_humming_at_every_point"] == "no"


def test_rule_needs_every_point_of_every_shape():
    fast = [row(t, shape) for shape in bench.SHAPES for t in (1, 4096)]
    yes = bench.rule(fast, "sm_90")
    assert yes["ours_may_go_ahead_of_vllm_choice"] and yes["answer"] == "yes"
    assert yes["points"] == 12 and yes["slower_points"] == []
    assert "Humming" in yes["vllm_choice"]
    one_slower = [*fast[:-1], row(4096, "o_proj_4096_to_4096", ours=12.51)]
    no = bench.rule(one_slower, "sm_90")
    assert not no["ours_may_go_ahead_of_vllm_choice"] and no["answer"] == "no"
    assert [(p["shape"], p["tokens"]) for p in no["slower_points"]] == [
        ("o_proj_4096_to_4096", 4096)
    ]
    assert not bench.rule([], "sm_90")["ours_may_go_ahead_of_vllm_choice"]
    missing = bench.rule(fast, "sm_90", ["moe_gate_up_7168_to_2048"])
    assert not missing["ours_may_go_ahead_of_vllm_choice"]


def test_receipt_names_sides_mode_machine_ratio_and_rule():
    rows = [row(1), row(8, ours=13.0)]
    shapes = {"drafter_fc_3x4096_to_4096": {"verdict": bench.verdict(rows)}}
    machine = {"gpu": "NVIDIA H200", "arch": "sm_90"}
    receipt = bench.build_receipt(rows, shapes, machine, 15, {"package": "humming-kernels x"})
    assert set(receipt["sides"]) == set(bench.CONTENDERS)
    assert "CUDA Graph replay" in receipt["mode"] and "median of 15" in receipt["mode"]
    assert "below 1" in receipt["ratio"] and receipt["machine"] == machine
    assert "prefill" in receipt["tokens"]["note"]
    assert receipt["rule"]["arch"] == "sm_90" and receipt["rule"]["answer"] == "no"
    fields = receipt["rows"][0]
    for name in ("tokens", "ours_us", "humming_us", "cublas_bf16_us", "ours_over_humming_time"):
        assert name in fields
    failed = {**shapes, "o_proj_4096_to_4096": {"error": "RuntimeError: x"}}
    fast = bench.build_receipt([row(1)], failed, machine, 15, {})
    assert fast["rule"]["shapes_not_measured"] == ["o_proj_4096_to_4096"]
    assert fast["rule"]["answer"] == "no"


@pytest.mark.gpu
def test_humming_contender_matches_the_bf16_model_on_gpu():
    """Humming as vLLM calls it computes BF16 x dequantized weight (W8A16) on a small shape."""
    pytest.importorskip("humming")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    layer = bench.vllm_style_layer(256, 512)
    values, scales = layer.weight.data, layer.weight_scale.data
    humming = hc.HummingLinear(values, scales)
    assert humming.decision["w8a16"]
    x = torch.randn(8, 512, device="cuda").to(torch.bfloat16)
    ref = x.double() @ bench.dequantize(values, scales).double().T
    assert bench.relative_error(humming(x), ref) < 1e-2
