"""Drafter staging on vLLM's V2 model runner, run against the V2 speculators' own code.

vLLM's V2 runner needs a GPU (Triton kernels) and the GPU wheels pin a torch this machine
does not have, so the speculators cannot run here whole. What concatenates and combines
can: each test loads those steps from a release's sources (``helpers.vllm_sources``), runs
them on stand-in speculators holding CPU tensors, once as vLLM leaves them and once with
the plugin's wrappers, and asserts bitwise-equal ``fc`` outputs with no BF16 tensor of
``fc``'s input width allocated, for a W8A8 ``fc`` and a W8A16 one (which reads the slices,
or DFlash's graph buffer, where they are):

- EAGLE-3: ``TargetDependentARSpeculator.propose``'s ``combine_hidden_states(torch.cat(...))``
  and ``Eagle3LlamaForCausalLM.combine_hidden_states``;
- DFlash (0.33+): ``_store_hidden_states`` (the eager ``cat(..., out=_aux_staging[:n])`` and
  the rows past the graph's) and ``_prepare_graph_forward`` (the captured combine), with
  ``DFlashQwen3ForCausalLM.combine_hidden_states``; DFlash 0.32: ``propose``'s eager cat.

The same flow on the GPU, inside a captured CUDA graph, is the GPU test at the end.
"""

from __future__ import annotations

import types

import pytest
import torch
from helpers import vllm_drafters, vllm_sources
from helpers.vllm_drafters import HIDDEN, LAYERS

from mxfp8_fusion.vllm import drafter, hooks, settings, staging

_SPEC = "vllm.v1.worker.gpu.spec_decode"
_EAGLE3 = "vllm.model_executor.models.llama_eagle3"
_DFLASH = "vllm.model_executor.models.qwen3_dflash"
RELEASES = sorted(hooks.RELEASES, key=hooks._key)
WIDTH = LAYERS * HIDDEN


def _sources(release):
    wheel = vllm_sources.wheel_for(release)
    if wheel is None:
        pytest.skip(f"no vllm=={release}.* wheel (.ci/vllm downloads them)")
    return vllm_sources.Sources(wheel)


def _hook(release, name):
    return next(h for h in hooks.RELEASES[release]["drafter"] if h.name == name)


def _drafter(sources, module, name, kind):
    combine = vllm_sources.load_function(sources, module, name, {"torch": torch})
    return vllm_drafters.drafter_class(f"{kind}{id(sources)}", combine)


def _combine_block(sources, package, speculator):
    """``propose``'s ``if aux_hidden_states:`` step (the concatenation and its combine)."""
    return vllm_sources.load_block(
        sources,
        f"{_SPEC}.{package}.speculator",
        f"{speculator}.propose",
        "aux_hidden_states",
        ("self", "aux_hidden_states", "last_hidden_states"),
        {"torch": torch},
    )


def _aux(tokens, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(tokens, HIDDEN, generator=gen).to(torch.bfloat16) for _ in range(LAYERS)]


ACTIVATIONS = ["mxfp8", "bf16"]


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("release", RELEASES)
def test_eagle3_v2_propose_stages_fc(release, activation, monkeypatch):
    sources = _sources(release)
    model_cls = _drafter(sources, _EAGLE3, "Eagle3LlamaForCausalLM.combine_hidden_states", "E")
    block = _combine_block(sources, "target_dependent_ar", "TargetDependentARSpeculator")

    class Speculator:
        method = "eagle3"

        def __init__(self):
            fc = vllm_drafters.PackedFc("cpu", bias=True, activation=activation)
            self.model = model_cls(fc)
            self.max_num_tokens = 64

        def propose(self, batch, attn, slots, last_hidden_states, aux_hidden_states, *rest):
            return block(self, aux_hidden_states, last_hidden_states)["hidden_states"].clone()

    speculator = Speculator()
    steps = {t: _aux(t, seed=t) for t in (16, 3, 64)}
    expected = {t: speculator.propose(None, None, None, None, a) for t, a in steps.items()}
    make = drafter._wrap_propose(
        _hook(release, "TargetDependentARSpeculator.propose"), drafter._speculator_model
    )
    monkeypatch.setattr(Speculator, "propose", make(Speculator.propose))
    counts = vllm_drafters.count_concatenations(monkeypatch, WIDTH)
    before, slices_before = settings.stats.staged_steps, settings.stats.slice_steps
    for tokens, aux in steps.items():
        got = speculator.propose(None, None, None, None, aux)
        assert torch.equal(got.view(torch.int16), expected[tokens].view(torch.int16))
    assert settings.stats.staged_steps - before == len(steps)
    w8a16 = len(steps) if activation == "bf16" else 0  # fc read the slices where they are
    assert settings.stats.slice_steps - slices_before == w8a16
    assert counts["allocated"] == 0


class _DFlash:
    """A DFlash speculator: vLLM's methods (loaded per release) on these attributes."""

    num_speculative_steps = 3
    supports_decode_metadata_update = False

    def __init__(self, model, max_num_reqs=4, max_num_tokens=64):
        self.model = model
        self.max_num_reqs, self.max_num_tokens = max_num_reqs, max_num_tokens
        self.hidden_states = torch.zeros(max_num_tokens, HIDDEN, dtype=torch.bfloat16)
        rows = self._num_graph_context_tokens(max_num_reqs)
        self._aux_staging = torch.zeros(rows, WIDTH, dtype=torch.bfloat16)
        self._num_rejected = None
        self.target_input_buffers = types.SimpleNamespace(query_start_loc=None)
        self.stored = []

    def prepare_context_anchor(self, *args):
        pass

    def _precompute_context_kv(self, start, end, dummy_run=False):
        self.stored.append(self.hidden_states[start:end].clone())

    def capture(self):
        self._prepare_graph_forward(self.max_num_reqs, None)  # what the graph records

    def propose(self, batch, attn, slots, last_hidden_states, aux_hidden_states, *rest):
        """A FULL-graph step: the eager store (_prepare_graph_replay), then the replay."""
        num_reqs, num_tokens = batch
        num_context = self._num_graph_context_tokens(num_reqs)
        self._store_hidden_states(num_tokens, last_hidden_states, aux_hidden_states, num_context)
        self._prepare_graph_forward(num_reqs, None)
        return self.hidden_states[:num_tokens].clone()


def _dflash_class(sources):
    module = f"{_SPEC}.dflash.speculator"
    namespace = {"torch": torch}
    methods = {
        name: vllm_sources.load_function(sources, module, f"DFlashSpeculator.{name}", namespace)
        for name in ("_store_hidden_states", "_prepare_graph_forward", "_num_graph_context_tokens")
    }
    return type(f"DFlash{id(sources)}", (_DFlash,), methods)


def _install_dflash(cls, release, monkeypatch):
    hook = _hook(release, "DFlashSpeculator.propose")
    monkeypatch.setattr(
        cls, "propose", drafter._wrap_propose(hook, drafter._speculator_model)(cls.propose)
    )
    monkeypatch.setattr(cls, "capture", drafter._wrap_capture(cls.capture))
    read = (cls._store_hidden_states, cls._prepare_graph_forward)
    monkeypatch.setattr(cls, drafter._GRAPH_METHODS, read, raising=False)


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize(
    "release",
    [
        r
        for r in RELEASES
        if any(h.name.endswith("_store_hidden_states") for h in hooks.RELEASES[r]["drafter"])
    ],
)  # the releases with DFlash's full-graph buffer (0.33, 0.34; main has none)
def test_dflash_v2_graph_buffer_and_eager_rows_are_staged(release, activation, monkeypatch):
    """W8A8: the graph buffer becomes MXFP8 storage. W8A16: vLLM's BF16 buffer stays (the
    captured graph reads its address) and ``fc`` reads it as it is; the eager tail reads
    the slices."""
    sources = _sources(release)
    model_cls = _drafter(sources, _DFLASH, "DFlashQwen3ForCausalLM.combine_hidden_states", "D")
    cls = _dflash_class(sources)
    # (num_reqs, num_tokens): within the graph's rows, a prefill past them, one request
    batches = [((4, 10), 0), ((2, 20), 1), ((1, 4), 2), ((4, 16), 3)]
    plain = cls(model_cls(vllm_drafters.PackedFc("cpu", activation=activation)))
    expected = [plain.propose(b, None, None, None, _aux(b[1], s)) for b, s in batches]
    expected_kv = [t.clone() for t in plain.stored]

    _install_dflash(cls, release, monkeypatch)
    speculator = cls(model_cls(vllm_drafters.PackedFc("cpu", activation=activation)))
    buffer = speculator._aux_staging
    speculator.capture()
    if activation == "bf16":
        assert speculator._aux_staging is buffer
    else:
        assert isinstance(speculator._aux_staging, staging.Staged)  # the BF16 buffer is gone
    counts = vllm_drafters.count_concatenations(monkeypatch, WIDTH)
    speculator.stored.clear()
    before, slices_before = settings.stats.staged_steps, settings.stats.slice_steps
    got = [speculator.propose(b, None, None, None, _aux(b[1], s)) for b, s in batches]
    if activation == "bf16":  # vLLM fills its own buffer; the eager tail reads the slices
        assert settings.stats.staged_steps - before == 1
        assert settings.stats.slice_steps - slices_before == 1
    else:
        assert settings.stats.staged_steps - before == 5  # four buffer fills, one eager tail
    for g, e in zip(got, expected, strict=True):
        assert torch.equal(g.view(torch.int16), e.view(torch.int16))
    # the rows whose K/V the graph stores for live tokens (past them vLLM's rows are stale and
    # their K/V goes to padding slots)
    live = [min(b[1], speculator._num_graph_context_tokens(b[0])) for b, _ in batches]
    for g, e, n in zip(speculator.stored, expected_kv, live, strict=True):
        assert torch.equal(g[:n].view(torch.int16), e[:n].view(torch.int16))
    assert counts["allocated"] == 0


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_dflash_v032_propose_stages_fc(activation, monkeypatch):
    sources = _sources("0.32")
    model_cls = _drafter(sources, _DFLASH, "DFlashQwen3ForCausalLM.combine_hidden_states", "D")
    block = _combine_block(sources, "dflash", "DFlashSpeculator")

    class Speculator:
        def __init__(self):
            self.model = model_cls(vllm_drafters.PackedFc("cpu", activation=activation))
            self.max_num_tokens = 32

        def propose(self, batch, attn, slots, last_hidden_states, aux_hidden_states, *rest):
            return block(self, aux_hidden_states, last_hidden_states)["hidden_states"].clone()

    speculator = Speculator()
    aux = _aux(12)
    expected = speculator.propose(None, None, None, None, aux)
    make = drafter._wrap_propose(
        _hook("0.32", "DFlashSpeculator.propose"), drafter._speculator_model
    )
    monkeypatch.setattr(Speculator, "propose", make(Speculator.propose))
    counts = vllm_drafters.count_concatenations(monkeypatch, WIDTH)
    got = speculator.propose(None, None, None, None, aux)
    assert torch.equal(got.view(torch.int16), expected.view(torch.int16))
    assert counts["allocated"] == 0


def test_other_uses_of_the_graph_stand_in_fail_loudly():
    model = vllm_drafters.drafter_class("G", vllm_drafters.reduced_combine)(
        vllm_drafters.PackedFc("cpu")
    )
    graph = staging.GraphStaging(model, model.model.fc, 8, torch.bfloat16)
    stand_in = graph.stand_in()
    assert stand_in.shape == (8, WIDTH) and stand_in.dtype == torch.bfloat16
    with pytest.raises(RuntimeError, match="MXFP8_FUSION_VLLM_DISABLE=drafter"):
        stand_in.sum()
    with pytest.raises(RuntimeError, match="MXFP8_FUSION_VLLM_DISABLE=drafter"):
        model.combine_hidden_states(stand_in[2:5])


# --- the same flow on the GPU, the combine inside a captured CUDA graph ---------------------


class _GraphDFlash:
    """DFlash's FULL-graph flow as vLLM 0.33-0.34 has it (reduced): an eager
    ``cat(..., out=_aux_staging[:n])``, then a graph that combines ``_aux_staging[:rows]``."""

    def __init__(self, model, rows):
        self.model = model
        self.hidden_states = torch.zeros(rows, HIDDEN, dtype=torch.bfloat16, device="cuda")
        self._aux_staging = torch.zeros(rows, WIDTH, dtype=torch.bfloat16, device="cuda")
        self.rows = rows

    def store(self, aux, tokens):
        torch.cat([h[:tokens] for h in aux], dim=-1, out=self._aux_staging[:tokens])

    def graph_forward(self):
        combined = self.model.combine_hidden_states(self._aux_staging[: self.rows])
        self.hidden_states.copy_(combined)


def _graph_steps(speculator, steps):
    """Capture ``graph_forward`` once, then per step: eager store, replay; the outputs."""
    speculator.store(steps[0][0], steps[0][1])
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        speculator.graph_forward()  # warm-up: kernels compiled outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        speculator.graph_forward()
    outputs = []
    for aux, tokens in steps:
        speculator.store(aux, tokens)
        graph.replay()
        outputs.append(speculator.hidden_states.clone())
    torch.cuda.synchronize()
    return outputs


@pytest.mark.gpu
def test_dflash_graph_staging_replays_bitwise_on_the_gpu(monkeypatch):
    model_cls = vllm_drafters.drafter_class("GpuDFlash", vllm_drafters.reduced_combine)
    rows = 16
    steps = [
        ([t.cuda() for t in _aux(n, seed=n)], n) for n in (16, 5, 16, 1)
    ]  # full, partial (stale rows past it), full, one token
    plain = _GraphDFlash(model_cls(vllm_drafters.PackedFc("cuda", bias=True)), rows)
    expected = _graph_steps(plain, steps)

    staged = _GraphDFlash(model_cls(vllm_drafters.PackedFc("cuda", bias=True)), rows)
    fc = staged.model.model.fc
    graph = staging.GraphStaging(staged.model, fc, rows, torch.bfloat16)
    staged._aux_staging = graph.stand_in()
    counts = vllm_drafters.count_concatenations(monkeypatch, WIDTH)
    got = _graph_steps(staged, steps)
    for g, e, (_, tokens) in zip(got, expected, steps, strict=True):
        # the live rows; past them the GPU quantizer resets the padding rows' scales, so
        # stale rows (whose K/V vLLM writes to padding slots) need not match vLLM's stale rows
        assert torch.equal(g[:tokens].view(torch.int16), e[:tokens].view(torch.int16))
        assert torch.isfinite(g).all()
    assert counts["allocated"] == 0
