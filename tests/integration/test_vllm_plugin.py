"""The vLLM plugin's pieces that run without vLLM: switches, version gate, refusal without
vLLM, and the drafter staging on stand-ins shaped like vLLM's runner and drafter.

The stand-ins do what vLLM 0.32's code does at the hooked points (read from its source):
the runner concatenates ``[h[:tokens] for h in aux_hidden_states]`` and hands the result to
the drafter's ``combine_hidden_states``, which applies ``self.model.fc``.
"""

from __future__ import annotations

import logging
import os
import sys

import pytest
import torch
from helpers import vllm_drafters
from torch import nn

from mxfp8_fusion.vllm import drafter, hooks, plugin, policy, settings

HIDDEN = 256


def test_switches():
    assert settings.plugin_enabled({})
    assert not settings.plugin_enabled({"MXFP8_FUSION_VLLM": "0"})
    assert not settings.plugin_enabled({"MXFP8_FUSION_VLLM": "Off"})
    parts, unknown = settings.enabled_parts({"MXFP8_FUSION_VLLM_DISABLE": "pass, Drafter,x"})
    assert parts == ("kernel",) and unknown == ("x",)
    assert settings.enabled_parts({}) == (settings.PARTS, ())
    assert settings.gpu_kernel({}) == ("auto", None)
    assert settings.gpu_kernel({"MXFP8_FUSION_VLLM_GPU_KERNEL": "Ours"}) == ("ours", None)
    assert settings.gpu_kernel({"MXFP8_FUSION_VLLM_GPU_KERNEL": "fast"}) == ("auto", "fast")
    assert settings.activation({}) == ("auto", None)
    assert settings.activation({"MXFP8_FUSION_VLLM_ACTIVATION": " BF16 "}) == ("bf16", None)
    assert settings.activation({"MXFP8_FUSION_VLLM_ACTIVATION": "mxfp8"}) == ("mxfp8", None)
    assert settings.activation({"MXFP8_FUSION_VLLM_ACTIVATION": "fp8"}) == ("auto", "fp8")


@pytest.mark.parametrize("value", ["1", "true", "ON", " yes ", ""])
def test_kill_switch_on_values(value):
    assert settings.plugin_switch({"MXFP8_FUSION_VLLM": value}) == (True, None)


@pytest.mark.parametrize("value", ["disable", "disabled", "fasle", "n", "2"])
def test_kill_switch_typo_fails_safe_with_one_warning(monkeypatch, caplog, value):
    """An unknown value turns the plugin off (a kill switch fails safe) and says so once,
    naming the value and the accepted ones."""
    assert settings.plugin_switch({"MXFP8_FUSION_VLLM": value}) == (False, value)
    monkeypatch.setenv("MXFP8_FUSION_VLLM", value)
    monkeypatch.setitem(sys.modules, "vllm", None)
    monkeypatch.setattr(plugin, "_reported", False)
    with caplog.at_level(logging.INFO, logger="mxfp8_fusion.vllm"):
        plugin.register()
        plugin.register()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert repr(value) in warnings[0] and "1/true/on/yes" in warnings[0]
    assert "stays off" in warnings[0]
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert infos == [f"mxfp8_fusion vLLM plugin: off (MXFP8_FUSION_VLLM={value})"]


def test_without_vllm_register_logs_one_line_and_changes_nothing(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm fails, as where it is absent
    monkeypatch.delenv("MXFP8_FUSION_VLLM", raising=False)
    monkeypatch.setattr(plugin, "_reported", False)
    before = dict(vars(settings.stats))
    with caplog.at_level(logging.INFO, logger="mxfp8_fusion.vllm"):
        plugin.register()
        plugin.register()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "not installed, nothing changed" in lines[0]
    assert "vLLM cannot be imported" in lines[0]
    assert vars(settings.stats) == before


def test_plugin_off_imports_nothing(monkeypatch, caplog):
    monkeypatch.setenv("MXFP8_FUSION_VLLM", "0")
    monkeypatch.setitem(sys.modules, "vllm", None)
    monkeypatch.setattr(plugin, "_reported", False)
    with caplog.at_level(logging.INFO, logger="mxfp8_fusion.vllm"):
        plugin.register()
    assert [r.getMessage() for r in caplog.records] == [
        "mxfp8_fusion vLLM plugin: off (MXFP8_FUSION_VLLM=0)"
    ]


def test_import_mxfp8_fusion_does_not_import_vllm():
    code = "import sys, mxfp8_fusion, mxfp8_fusion.passes; assert 'vllm' not in sys.modules"
    import subprocess

    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


# --- drafter staging on stand-ins ----------------------------------------------------------


_V1_PROPOSE = next(
    h for h in hooks.RELEASES["0.32"]["drafter"] if h.name.endswith("propose_draft_token_ids")
)
_Drafter = vllm_drafters.drafter_class("V1Drafter", vllm_drafters.reduced_combine)
_PlainDrafter = vllm_drafters.drafter_class(
    "PlainDrafter", vllm_drafters.reduced_combine, wrapped=False
)


class _Runner:
    """vLLM's ``propose_draft_token_ids``, reduced to its concatenation and the proposer."""

    def __init__(self, model, max_num_tokens):
        self.drafter = type("Proposer", (), {"model": model})()
        self.max_num_tokens = max_num_tokens

    def propose_draft_token_ids(
        self, scheduler_output, sampled, metadata, hidden, sample_hidden, aux_hidden_states
    ):
        tokens = scheduler_output
        target_hidden_states = torch.cat([h[:tokens] for h in aux_hidden_states], dim=-1)
        return self.drafter.model.combine_hidden_states(target_hidden_states).clone()


_VllmFc = vllm_drafters.PackedFc


def _patched(monkeypatch):
    make = drafter._wrap_propose(_V1_PROPOSE, drafter._runner_drafter)
    monkeypatch.setattr(_Runner, "propose_draft_token_ids", make(_Runner.propose_draft_token_ids))


def _count_cats(monkeypatch, width):
    return vllm_drafters.count_concatenations(monkeypatch, width)


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("activation", ["mxfp8", "bf16"])
def test_drafter_fc_staged_bitwise_without_concatenation(monkeypatch, device, activation):
    """vLLM's path (the concatenation, then ``fc``) and the staged one give the same bits.
    A W8A16 ``fc`` reads the auxiliary hidden states where they are: no MXFP8 storage."""
    fc = _VllmFc(device, activation=activation)
    runner = _Runner(_Drafter(fc), max_num_tokens=64)
    aux = [torch.randn(64, HIDDEN, device=device).to(torch.bfloat16) for _ in range(3)]
    expected = {t: runner.propose_draft_token_ids(t, None, None, None, None, aux) for t in (1, 37)}
    _patched(monkeypatch)
    counts = _count_cats(monkeypatch, 3 * HIDDEN)
    before, slices_before = settings.stats.staged_steps, settings.stats.slice_steps
    for tokens in (37, 1, 37):
        got = runner.propose_draft_token_ids(tokens, None, None, None, None, aux)
        assert torch.equal(got.view(torch.int16), expected[tokens].view(torch.int16))
    assert settings.stats.staged_steps - before == 3
    assert counts["allocated"] == 0
    step = getattr(runner.drafter.model, drafter._STEP)
    assert (step.storage is None) == (activation == "bf16")
    assert settings.stats.slice_steps - slices_before == (3 if activation == "bf16" else 0)


def test_drafter_whose_fc_is_not_ours_is_unchanged(monkeypatch):
    fc = nn.Linear(3 * HIDDEN, HIDDEN, bias=False, dtype=torch.bfloat16)
    runner = _Runner(_Drafter(fc), max_num_tokens=16)
    aux = [torch.randn(16, HIDDEN).to(torch.bfloat16) for _ in range(3)]
    _patched(monkeypatch)
    counts = _count_cats(monkeypatch, 3 * HIDDEN)
    got = runner.propose_draft_token_ids(8, None, None, None, None, aux)
    assert torch.equal(got, fc(torch.cat([h[:8] for h in aux], -1)))
    assert counts["allocated"] == 2  # vLLM's own and the check's
    assert not hasattr(runner.drafter.model, drafter._STEP)


def test_drafter_fc_with_unaligned_slices_is_left_to_vllm(monkeypatch):
    fc = _VllmFc("cpu", hidden=96)  # 96-wide slices: not a multiple of 128
    runner = _Runner(_Drafter(fc), max_num_tokens=16)
    aux = [torch.randn(16, 96).to(torch.bfloat16) for _ in range(3)]
    expected = runner.propose_draft_token_ids(5, None, None, None, None, aux)
    _patched(monkeypatch)
    got = runner.propose_draft_token_ids(5, None, None, None, None, aux)
    assert torch.equal(got.view(torch.int16), expected.view(torch.int16))
    assert not hasattr(runner.drafter.model, drafter._STEP)


@pytest.mark.parametrize(
    ("model_cls", "capacity", "tokens", "counter", "added"),
    [
        (_Drafter, 8, 20, "unstaged_concatenations", 1),  # a step over the capacity
        # a drafter class of its own (Qwen3 or DeepSeek EAGLE-3, say) with our fc: its
        # combine step is not one the plugin read
        (_PlainDrafter, 16, 9, "staged_steps", 0),
    ],
    ids=["over-capacity", "combine-not-wrapped"],
)
def test_drafter_falls_back_to_vllms_concatenation(
    monkeypatch, model_cls, capacity, tokens, counter, added
):
    runner = _Runner(model_cls(_VllmFc("cpu")), max_num_tokens=capacity)
    aux = [torch.randn(32, HIDDEN).to(torch.bfloat16) for _ in range(3)]
    expected = runner.propose_draft_token_ids(tokens, None, None, None, None, aux)
    _patched(monkeypatch)
    before = getattr(settings.stats, counter)
    got = runner.propose_draft_token_ids(tokens, None, None, None, None, aux)
    assert torch.equal(got.view(torch.int16), expected.view(torch.int16))
    assert getattr(settings.stats, counter) == before + added


def test_wrap_is_idempotent():
    class Owner:
        def method(self, x):
            return x

    hook = hooks.Hook(__name__, "Owner.method")
    globals()["Owner"] = Owner
    try:
        assert hooks.wrap(hook, drafter._wrap_combine)
        wrapped = Owner.method
        assert not hooks.wrap(hook, drafter._wrap_combine)
        assert Owner.method is wrapped
    finally:
        del globals()["Owner"]


# --- parts are checked and installed independently ---------------------------------------


def _fake_vllm(monkeypatch, version: str) -> None:
    """A vLLM of ``version`` to import, no switches set, a fresh process's plugin state."""
    fake = type(sys)("vllm")
    fake.__version__ = version
    monkeypatch.setitem(sys.modules, "vllm", fake)
    for name in (settings.ENABLE_VARIABLE, settings.DISABLE_VARIABLE, *settings.CHOICES):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(plugin, "_reported", False)
    monkeypatch.setattr(settings, "stats", settings.Stats())


@pytest.mark.parametrize("broken", settings.PARTS)
def test_a_hook_that_does_not_fit_turns_off_its_part_only(monkeypatch, caplog, broken):
    _fake_vllm(monkeypatch, "0.34.0")
    missing = hooks.RELEASES["0.34"][broken][-1]

    def resolve(hook):
        if hook == missing:
            raise LookupError(f"{hook.qualified} does not exist")
        return object()

    monkeypatch.setattr(hooks.Hook, "resolve", resolve)
    installed = []
    installers = {p: (lambda *a, p=p, **k: installed.append(p) or True) for p in settings.PARTS}
    monkeypatch.setattr(plugin, "_installers", lambda: installers)
    with caplog.at_level(logging.INFO, logger="mxfp8_fusion.vllm"):
        plugin.register()
    assert installed == [p for p in settings.PARTS if p != broken]
    assert settings.stats.parts == tuple(installed)
    (line,) = [r.getMessage() for r in caplog.records]
    assert "vLLM 0.34.0 (tested)" in line
    assert f"{broken} ({missing.qualified} does not exist)" in line


def test_a_newer_release_installs_what_fits_and_says_untested(monkeypatch, caplog):
    _fake_vllm(monkeypatch, "0.36.1")
    monkeypatch.setattr(hooks.Hook, "resolve", lambda hook: object())
    calls = {}
    installers = {p: (lambda *a, p=p, **k: calls.setdefault(p, k) or True) for p in settings.PARTS}
    monkeypatch.setattr(plugin, "_installers", lambda: installers)
    with caplog.at_level(logging.INFO, logger="mxfp8_fusion.vllm"):
        plugin.register()
    assert list(calls) == list(settings.PARTS)
    assert calls["drafter"] == {"graph_staging": False}  # stand-ins only where code was read
    (line,) = [r.getMessage() for r in caplog.records]
    assert "vLLM 0.36.1 (untested, newer than 0.35)" in line


def test_a_build_of_vllm_main_uses_its_table_and_says_unreleased(monkeypatch, caplog):
    """A 0.35 built from main before the wheel: main's table (dp_sync, no DFlash graph
    buffer), the drafter part on, the status line saying where the table was read."""
    _fake_vllm(monkeypatch, "0.35.0rc1.dev42+g1234abcd")
    resolved = []
    monkeypatch.setattr(hooks.Hook, "resolve", lambda hook: resolved.append(hook) or object())
    installers = {p: (lambda *a, **k: True) for p in settings.PARTS}
    monkeypatch.setattr(plugin, "_installers", lambda: installers)
    with caplog.at_level(logging.INFO, logger="mxfp8_fusion.vllm"):
        plugin.register()
    (line,) = [r.getMessage() for r in caplog.records]
    assert "(read from vLLM main, unreleased); on: kernel, pass, drafter" in line
    propose = next(h for h in resolved if h.name == "TargetDependentARSpeculator.propose")
    assert "dp_sync" in propose.parameters and "dp_sync_state" not in propose.parameters
    assert not [h for h in resolved if h.name == "DFlashSpeculator._store_hidden_states"]


def test_status_line_names_the_kernel_decision_per_arch(monkeypatch):
    monkeypatch.setattr(hooks.Hook, "resolve", lambda hook: object())
    state, _ = plugin.status({}, version="0.34.0")
    line = state.line()
    assert "sm_90 Humming (W8A16)" in line and "MXFP8_FUSION_VLLM_GPU_KERNEL=ours" in line
    assert "cpu ours: vLLM has no MXFP8 kernel on the CPU" in line
    assert "cpu ours: vLLM has no MXFP8 kernel on the CPU (W8A8)" in line
    assert (
        "sm_90 Humming (W8A16): faster than ours (W8A16) at 35 of 78 points measured on an H100"
        " and 52 of 78 on an H200" in line
    )
    state, _ = plugin.status({"MXFP8_FUSION_VLLM_GPU_KERNEL": "ours"}, version="0.34.0")
    assert "sm_90 ours (W8A16)" in state.line()  # vLLM's numerics there
    environ = {"MXFP8_FUSION_VLLM_GPU_KERNEL": "ours", "MXFP8_FUSION_VLLM_ACTIVATION": "mxfp8"}
    state, _ = plugin.status(environ, version="0.34.0")
    assert "sm_90 ours (W8A8)" in state.line()


@pytest.mark.parametrize(
    ("arch", "kernel", "activation", "ours", "runs"),
    [
        ("cpu", "auto", "auto", True, "mxfp8"),  # vLLM has no CPU kernel: W8A8, as before
        ("cpu", "auto", "bf16", True, "bf16"),
        ("sm_90", "auto", "auto", False, "bf16"),  # W8A16 slower than Humming somewhere
        ("sm_90", "auto", "mxfp8", False, "mxfp8"),  # W8A8 measured slower
        ("sm_90", "ours", "auto", True, "bf16"),
        ("sm_90", "ours", "mxfp8", True, "mxfp8"),
        ("sm_100", "ours", "auto", False, "mxfp8"),  # not served: vLLM's own kernels
        ("sm_120", "auto", "bf16", False, "bf16"),
    ],
)
def test_policy_per_arch_and_switch(arch, kernel, activation, ours, runs):
    decision = policy.decide(arch, kernel, activation)
    assert (decision.arch, decision.ours, decision.activation) == (arch, ours, runs)


def test_a_receipt_flips_one_entry_to_put_ours_ahead_on_sm90(monkeypatch):
    """The W8A16 measurement against Humming is one entry of ``policy.MEASURED``: once it
    says at least as fast, ours serves sm_90 by default, as W8A16, and the line says so."""
    assert not policy.MEASURED[("sm_90", "bf16")].at_least_as_fast
    found = "at least as fast as Humming at every point measured"
    monkeypatch.setitem(policy.MEASURED, ("sm_90", "bf16"), policy.Measurement(True, found))
    decision = policy.decide("sm_90")
    assert decision.ours and decision.activation == "bf16"
    assert f"sm_90 ours (W8A16): {found}" in policy.summary()
    assert not policy.decide("sm_90", activation="mxfp8").ours  # W8A8's entry is its own


@pytest.mark.parametrize("value", ["bf61", "w8a16", "fp8"])
def test_activation_typo_reads_as_auto_with_one_warning(monkeypatch, caplog, value):
    _fake_vllm(monkeypatch, "0.34.0")
    monkeypatch.setenv("MXFP8_FUSION_VLLM_ACTIVATION", value)
    monkeypatch.setattr(hooks.Hook, "resolve", lambda hook: object())
    installers = {p: (lambda *a, **k: True) for p in settings.PARTS}
    monkeypatch.setattr(plugin, "_installers", lambda: installers)
    with caplog.at_level(logging.INFO, logger="mxfp8_fusion.vllm"):
        plugin.register()
        plugin.register()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert f"MXFP8_FUSION_VLLM_ACTIVATION={value!r}" in warnings[0]
    assert "auto, bf16, mxfp8" in warnings[0] and "read as auto" in warnings[0]
    state, _ = plugin.status(version="0.34.0")
    assert state.activation_setting == "auto"
    assert "sm_90 Humming (W8A16)" in state.line()


def test_command_says_whether_it_is_on_without_vllm():
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith("MXFP8_FUSION_VLLM")}
    env["MXFP8_FUSION_VLLM_GPU_KERNEL"] = "fastest"
    result = subprocess.run(
        [sys.executable, "-m", "mxfp8_fusion", "vllm"],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    if "vllm" in sys.modules or result.returncode == 0:
        pytest.skip("vLLM is installed here: the engine test checks the command there")
    assert result.returncode == 1
    first = result.stdout.splitlines()[0]
    assert first.startswith("mxfp8_fusion vLLM plugin: not installed, nothing changed")
    assert "MXFP8_FUSION_VLLM_GPU_KERNEL='fastest'" in result.stdout
