"""The vLLM plugin's pieces that run without vLLM: switches, version gate, refusal without
vLLM, and the drafter staging on stand-ins shaped like vLLM's runner and drafter.

The stand-ins do what vLLM 0.32's code does at the hooked points (read from its source):
the runner concatenates ``[h[:tokens] for h in aux_hidden_states]`` and hands the result to
the drafter's ``combine_hidden_states``, which applies ``self.model.fc``.
"""

from __future__ import annotations

import logging
import sys

import pytest
import torch
from torch import nn

import mxfp8_fusion as mf
from mxfp8_fusion.vllm import drafter, hooks, linear, plugin, settings

HIDDEN = 256


def test_switches():
    assert settings.plugin_enabled({})
    assert not settings.plugin_enabled({"MXFP8_FUSION_VLLM": "0"})
    assert not settings.plugin_enabled({"MXFP8_FUSION_VLLM": "Off"})
    parts, unknown = settings.enabled_parts({"MXFP8_FUSION_VLLM_DISABLE": "pass, Drafter,x"})
    assert parts == ("kernel",) and unknown == ("x",)
    assert settings.enabled_parts({}) == (settings.PARTS, ())


@pytest.mark.parametrize(
    ("version", "fits"),
    [("0.32.0", True), ("0.32.3+cpu", True), ("0.33.0", False), ("0.3.2", False), ("", False)],
)
def test_version_gate(version, fits):
    assert hooks.version_fits(version) is fits


def test_without_vllm_register_logs_one_line_and_changes_nothing(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm fails, as where it is absent
    monkeypatch.delenv("MXFP8_FUSION_VLLM", raising=False)
    before = dict(vars(settings.stats))
    with caplog.at_level(logging.INFO, logger="mxfp8_fusion.vllm"):
        plugin.register()
        plugin.register()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and all("not installed, nothing changed" in m for m in lines)
    assert "vLLM cannot be imported" in lines[0]
    assert vars(settings.stats) == before


def test_plugin_off_imports_nothing(monkeypatch, caplog):
    monkeypatch.setenv("MXFP8_FUSION_VLLM", "0")
    monkeypatch.setitem(sys.modules, "vllm", None)
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


class _Inner(nn.Module):
    def __init__(self, fc: nn.Module):
        super().__init__()
        self.fc = fc
        self.use_aux_hidden_state = True
        self.norm_before_fc = False
        self.fc_norm = None


class _Drafter(nn.Module):
    """vLLM's ``Eagle3LlamaForCausalLM.combine_hidden_states``, reduced to what it does here."""

    def __init__(self, fc: nn.Module):
        super().__init__()
        self.model = _Inner(fc)

    def combine_hidden_states(self, hidden_states):
        return self.model.fc(hidden_states)


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


class _VllmFc(nn.Module):
    """A ``ReplicatedLinear`` whose MXFP8 weight our kernel packed."""

    def __init__(self, device, hidden=HIDDEN):
        super().__init__()
        gen = torch.Generator().manual_seed(3)
        w = (torch.randn(hidden, 3 * hidden, generator=gen) * 0.05).to(torch.bfloat16)
        values, scales = mf.reference.quantize_rows(w)
        self.weight = nn.Parameter(values.to(device), requires_grad=False)
        self.weight_scale = nn.Parameter(scales.to(device), requires_grad=False)
        self.bias = None
        self.return_bias = False
        self.skip_bias_add = False
        linear.process_weights(self, "model.fc")

    def forward(self, x):
        return linear.apply_weights(self, x, self.bias)


def _patched(monkeypatch):
    monkeypatch.setattr(
        _Runner, "propose_draft_token_ids", drafter._wrap_propose(_Runner.propose_draft_token_ids)
    )
    monkeypatch.setattr(
        _Drafter, "combine_hidden_states", drafter._wrap_combine(_Drafter.combine_hidden_states)
    )


def _count_cats(monkeypatch, width):
    counts = {"allocated": 0}
    original = torch.cat

    def cat(*args, **kwargs):
        out = original(*args, **kwargs)
        if (
            out.dim() == 2
            and out.shape[1] == width
            and out.untyped_storage().nbytes() >= out.numel() * 2
        ):
            counts["allocated"] += 1
        return out

    monkeypatch.setattr(torch, "cat", cat)
    return counts


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", DEVICES)
def test_drafter_fc_staged_bitwise_without_concatenation(monkeypatch, device):
    fc = _VllmFc(device)
    runner = _Runner(_Drafter(fc), max_num_tokens=64)
    aux = [torch.randn(64, HIDDEN, device=device).to(torch.bfloat16) for _ in range(3)]
    expected = {t: runner.propose_draft_token_ids(t, None, None, None, None, aux) for t in (1, 37)}
    _patched(monkeypatch)
    counts = _count_cats(monkeypatch, 3 * HIDDEN)
    before = settings.stats.staged_steps
    for tokens in (37, 1, 37):
        got = runner.propose_draft_token_ids(tokens, None, None, None, None, aux)
        assert torch.equal(got.view(torch.int16), expected[tokens].view(torch.int16))
    assert settings.stats.staged_steps - before == 3
    assert counts["allocated"] == 0


def test_drafter_whose_fc_is_not_ours_is_unchanged(monkeypatch):
    fc = nn.Linear(3 * HIDDEN, HIDDEN, bias=False, dtype=torch.bfloat16)
    runner = _Runner(_Drafter(fc), max_num_tokens=16)
    aux = [torch.randn(16, HIDDEN).to(torch.bfloat16) for _ in range(3)]
    _patched(monkeypatch)
    counts = _count_cats(monkeypatch, 3 * HIDDEN)
    got = runner.propose_draft_token_ids(8, None, None, None, None, aux)
    assert torch.equal(got, fc(torch.cat([h[:8] for h in aux], -1)))
    assert counts["allocated"] == 2  # vLLM's own and the check's
    assert not hasattr(runner.drafter.model, drafter._STAGING)


def test_drafter_fc_with_unaligned_slices_is_left_to_vllm(monkeypatch):
    fc = _VllmFc("cpu", hidden=96)  # 96-wide slices: not a multiple of 128
    runner = _Runner(_Drafter(fc), max_num_tokens=16)
    aux = [torch.randn(16, 96).to(torch.bfloat16) for _ in range(3)]
    expected = runner.propose_draft_token_ids(5, None, None, None, None, aux)
    _patched(monkeypatch)
    got = runner.propose_draft_token_ids(5, None, None, None, None, aux)
    assert torch.equal(got.view(torch.int16), expected.view(torch.int16))
    assert not hasattr(runner.drafter.model, drafter._STAGING)


def test_drafter_step_over_capacity_falls_back_to_the_concatenation(monkeypatch):
    fc = _VllmFc("cpu")
    runner = _Runner(_Drafter(fc), max_num_tokens=8)
    aux = [torch.randn(32, HIDDEN).to(torch.bfloat16) for _ in range(3)]
    expected = runner.propose_draft_token_ids(20, None, None, None, None, aux)
    _patched(monkeypatch)
    before = settings.stats.unstaged_concatenations
    got = runner.propose_draft_token_ids(20, None, None, None, None, aux)
    assert torch.equal(got.view(torch.int16), expected.view(torch.int16))
    assert settings.stats.unstaged_concatenations == before + 1


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
