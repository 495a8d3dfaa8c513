"""InputStager: staged bytes and outputs equal the one-shot path's, the API's validation;
on a GPU also no allocation after construction and CUDA Graph capture and replay."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import mxfp8_fusion as mf
from mxfp8_fusion import InputStager, reference


def _weight(k: int, n: int = 192, device="cpu", seed: int = 0) -> mf.MXFP8Linear:
    gen = torch.Generator().manual_seed(seed)
    lin = nn.Linear(k, n, dtype=torch.bfloat16)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n, k, generator=gen) * k**-0.5)
        lin.bias.copy_(torch.randn(n, generator=gen))
    return mf.MXFP8Linear.from_linear(lin.to(device))


def _slices(tokens: int, widths, device="cpu", dtype=torch.bfloat16, seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(tokens, w, generator=gen) * 4).to(device, dtype) for w in widths]


def _bits(t):
    return t.view(torch.int16)


def _one_shot(layer, slices):
    return layer(torch.cat(slices, dim=-1))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_steps_equal_one_shot_bitwise(dtype):
    widths = (256, 128, 384)
    layer = _weight(sum(widths))
    stager = InputStager(layer, capacity=64, dtype=dtype)
    out = torch.full((64, layer.out_features), 7.0, dtype=dtype)
    for tokens, seed in ((64, 1), (17, 2), (1, 3)):
        slices = _slices(tokens, widths, dtype=dtype, seed=seed)
        stager.append(slices[0])
        stager.append(*slices[1:])  # two at once: one launch
        y = stager.finish(out)
        assert y.shape == (tokens, layer.out_features)
        assert y.data_ptr() == out.data_ptr()
        assert torch.equal(_bits(y), _bits(_one_shot(layer, slices)))
        # the staged storage holds exactly the concatenation's quantized bytes
        values, scales = reference.quantize_rows(torch.cat(slices, dim=-1))
        assert torch.equal(
            stager.storage.values[:tokens].view(torch.uint8), values.view(torch.uint8)
        )
        staged_rows = reference.from_blocked(
            stager.storage.scales.view(torch.uint8), stager.capacity, sum(widths) // 32
        )[:tokens]
        assert torch.equal(staged_rows, scales)
    assert stager.staged_columns == 0 and stager.tokens is None


def test_rows_past_tokens_untouched_and_views_as_slices():
    layer = _weight(512)
    stager = InputStager(layer, capacity=32)
    wide = _slices(10, (1024,))[0]
    parts = [wide[:, 0:256], wide[:, 512:768]]  # strided views of a wider tensor
    out = torch.full((32, layer.out_features), 3.0, dtype=torch.bfloat16)
    stager.append(*parts)
    y = stager.finish(out)
    assert torch.equal(_bits(y), _bits(_one_shot(layer, parts)))
    assert torch.all(out[10:] == 3.0)


def test_weight_and_explicit_bias():
    layer = _weight(256)
    weight = layer.weight
    slices = _slices(5, (128, 128))
    plain = InputStager(weight, capacity=8)
    plain.append(*slices)
    y = plain.finish(torch.empty(5, layer.out_features, dtype=torch.bfloat16))
    assert torch.equal(_bits(y), _bits(mf.mm(torch.cat(slices, -1), weight)))
    biased = InputStager(weight, capacity=8, bias=layer.bias)
    biased.append(*slices)
    y = biased.finish(torch.empty(5, layer.out_features, dtype=torch.bfloat16))
    assert torch.equal(_bits(y), _bits(_one_shot(layer, slices)))


def test_empty_step():
    layer = _weight(256)
    stager = InputStager(layer, capacity=8)
    stager.append(*_slices(0, (128, 128)))
    out = torch.full((8, layer.out_features), 1.0, dtype=torch.bfloat16)
    assert stager.finish(out).shape == (0, layer.out_features)
    assert torch.all(out == 1.0)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"weight": nn.Linear(256, 64)}, TypeError, "weight: .*nn.Linear"),
        ({"weight": "w"}, TypeError, "weight: expected an MXFP8Weight"),
        ({"capacity": -1}, ValueError, "capacity"),
        ({"capacity": 2.0}, TypeError, "capacity"),
        ({"dtype": torch.float32}, TypeError, "dtype"),
        ({"bias": torch.zeros(3)}, ValueError, "bias"),
    ],
)
def test_construction_validation(kwargs, error, match):
    args = {"weight": _weight(256), "capacity": 8, **kwargs}
    weight, capacity = args.pop("weight"), args.pop("capacity")
    with pytest.raises(error, match=match):
        InputStager(weight, capacity, **args)


def test_misaligned_in_features_rejected():
    with pytest.raises(ValueError, match="in_features"):
        InputStager(_weight(96), capacity=8)


def _raises_and_keeps_step(stager, error, match, *sources):
    values = stager.storage.values.clone()
    scales = stager.storage.scales.clone()
    column, tokens = stager.staged_columns, stager.tokens
    with pytest.raises(error, match=match):
        stager.append(*sources)
    assert torch.equal(stager.storage.values.view(torch.uint8), values.view(torch.uint8))
    assert torch.equal(stager.storage.scales.view(torch.uint8), scales.view(torch.uint8))
    assert (stager.staged_columns, stager.tokens) == (column, tokens)


def test_append_validation_writes_nothing():
    layer = _weight(512)
    stager = InputStager(layer, capacity=8)
    stager.storage.values.zero_()
    stager.storage.scales.view(torch.uint8).zero_()
    a, b = _slices(6, (128, 128))
    _raises_and_keeps_step(stager, TypeError, "sources: expected at least one")
    _raises_and_keeps_step(stager, TypeError, "source: .*bfloat16", a.float())
    _raises_and_keeps_step(stager, ValueError, "source: .*multiple of 128", a[:, :96])
    _raises_and_keeps_step(stager, ValueError, "source: .*at most 8 rows", _slices(9, (128,))[0])
    _raises_and_keeps_step(
        stager, ValueError, r"sources\[1\]: .*within in_features", a, _slices(6, (512,))[0]
    )
    stager.append(a)
    _raises_and_keeps_step(stager, ValueError, "source: expected 6 rows", b[:5])
    _raises_and_keeps_step(stager, ValueError, r"sources\[1\]: expected 6 rows", b, b[:4])
    stager.append(b)
    with pytest.raises(ValueError, match="expected all 512 input columns staged .* got 256"):
        stager.finish(torch.empty(6, layer.out_features, dtype=torch.bfloat16))
    assert stager.staged_columns == 256  # kept: the step can still be completed
    stager.append(*_slices(6, (256,), seed=5))
    with pytest.raises(ValueError, match="out: "):
        stager.finish(torch.empty(5, layer.out_features, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="out: "):
        stager.finish(torch.empty(6, layer.out_features, dtype=torch.float32))
    y = stager.finish(torch.empty(6, layer.out_features, dtype=torch.bfloat16))
    assert y.shape == (6, layer.out_features)


def test_reset_abandons_a_partial_step():
    layer = _weight(256)
    stager = InputStager(layer, capacity=8)
    stager.append(*_slices(3, (128,)))
    stager.reset()
    slices = _slices(4, (128, 128), seed=9)
    stager.append(*slices)
    y = stager.finish(torch.empty(4, layer.out_features, dtype=torch.bfloat16))
    assert torch.equal(_bits(y), _bits(_one_shot(layer, slices)))


def test_proposer_pattern_of_the_serving_doc():
    """docs/serving.md's vLLM-style combine_hidden_states: rows of the live tokens, staged."""
    hidden, capacity = 128, 32

    class Drafter(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3 * hidden, hidden, bias=False, dtype=torch.bfloat16)

    drafter = Drafter()
    mf.convert(drafter)
    stager = InputStager(drafter.fc, capacity=capacity)
    fc_out = torch.empty(capacity, hidden, dtype=torch.bfloat16)
    aux = _slices(capacity, (hidden,) * 3)  # the runner's padded per-layer buffers
    for num_tokens in (capacity, 9):
        stager.append(*(h[:num_tokens] for h in aux))
        got = stager.finish(fc_out)
        expected = drafter.fc(torch.cat([h[:num_tokens] for h in aux], dim=-1))
        assert torch.equal(_bits(got), _bits(expected))


@pytest.mark.parametrize("activation", ["mxfp8", "bf16"])
def test_a_layers_stager_gives_the_layers_own_bits(activation):
    """The stager runs the layer's activation: W8A16 reads the kept slices as they are (it
    once quantized them, W8A8, and differed from the layer's forward by 0.047)."""
    widths = (256, 128, 384)
    layer = _weight(sum(widths))
    layer.activation = mf.format.Activation.of(activation)
    stager = InputStager(layer, capacity=64)
    assert stager.activation == activation
    assert (stager.storage is None) == (activation == "bf16")
    out = torch.full((64, layer.out_features), 7.0, dtype=torch.bfloat16)
    for tokens, seed in ((64, 1), (5, 2)):
        slices = _slices(tokens, widths, seed=seed)
        stager.append(slices[0])
        stager.append(*slices[1:])
        y = stager.finish(out)
        assert torch.equal(_bits(y), _bits(_one_shot(layer, slices)))
    assert "activation='bf16'" in repr(stager) or activation == "mxfp8"


def test_activation_argument_overrides_the_layers():
    widths = (128, 128)
    layer = _weight(sum(widths))  # W8A8
    slices = _slices(3, widths)
    stager = InputStager(layer.weight, capacity=8, bias=layer.bias, activation="bf16")
    stager.append(*slices)
    y = stager.finish(torch.empty(8, layer.out_features, dtype=torch.bfloat16))
    expected = mf.mm_slices(slices, layer.weight, bias=layer.bias)
    assert torch.equal(_bits(y), _bits(expected))
    with pytest.raises(ValueError, match="did you mean 'bf16'"):
        InputStager(layer, capacity=8, activation="bf61")


def test_w8a16_append_validation_keeps_nothing():
    layer = _weight(256)
    stager = InputStager(layer, capacity=4, activation="bf16")
    with pytest.raises(ValueError, match=r"sources\[1\]: expected a width"):
        stager.append(*_slices(2, (128, 96)))
    with pytest.raises(ValueError, match="at most 4 rows"):
        stager.append(*_slices(5, (128,)))
    with pytest.raises(TypeError, match="dtype torch.bfloat16"):
        stager.append(*_slices(2, (128,), dtype=torch.float16))
    assert stager.staged_columns == 0 and stager.tokens is None
    with pytest.raises(ValueError, match="all 256 input columns"):
        stager.finish(torch.empty(4, layer.out_features, dtype=torch.bfloat16))


# --- GPU ------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 200, 1000])
def test_gpu_steps_equal_one_shot_bitwise(tokens):
    widths = (1024, 1024, 1024)
    layer = _weight(sum(widths), n=1024, device="cuda")
    stager = InputStager(layer, capacity=1024)
    out = torch.empty(1024, layer.out_features, device="cuda", dtype=torch.bfloat16)
    slices = _slices(tokens, widths, device="cuda")
    for s in slices:
        stager.append(s)
    y = stager.finish(out)
    assert torch.equal(_bits(y), _bits(_one_shot(layer, slices)))


@pytest.mark.gpu
def test_gpu_no_allocation_after_construction():
    layer = _weight(768, n=512, device="cuda")
    stager = InputStager(layer, capacity=256)
    out = torch.empty(256, layer.out_features, device="cuda", dtype=torch.bfloat16)
    slices = _slices(256, (256, 512), device="cuda")
    stager.append(*slices)  # warm-up: kernels compiled
    stager.finish(out)
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    stager.append(slices[0])
    stager.append(slices[1])
    stager.finish(out)
    torch.cuda.synchronize()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == before


@pytest.mark.gpu
def test_gpu_cuda_graph_capture_and_replay():
    widths = (512, 512, 512)
    layer = _weight(sum(widths), n=768, device="cuda")
    capacity, tokens = 512, 300
    stager = InputStager(layer, capacity=capacity)
    static = _slices(tokens, widths, device="cuda")
    out = torch.zeros(capacity, layer.out_features, device="cuda", dtype=torch.bfloat16)
    stager.append(static[0])  # warm-up outside the capture: kernels compiled
    stager.append(*static[1:])
    stager.finish(out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        stager.append(static[0])
        stager.append(*static[1:])
        y = stager.finish(out)
    for seed in (11, 12):
        fresh = _slices(tokens, widths, device="cuda", seed=seed)
        for s, f in zip(static, fresh, strict=True):
            s.copy_(f)
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(_bits(y), _bits(_one_shot(layer, fresh)))
        assert torch.all(out[tokens:] == 0)


@pytest.mark.gpu
@pytest.mark.parametrize("activation", ["mxfp8", "bf16"])
def test_gpu_a_layers_stager_gives_the_layers_own_bits(activation):
    widths = (1024, 1024, 1024)
    layer = _weight(sum(widths), n=1024, device="cuda")
    layer.activation = mf.format.Activation.of(activation)
    stager = InputStager(layer, capacity=256)
    out = torch.empty(256, layer.out_features, device="cuda", dtype=torch.bfloat16)
    for tokens in (1, 64, 256):
        slices = _slices(tokens, widths, device="cuda", seed=tokens)
        stager.append(*slices)
        y = stager.finish(out)
        assert torch.equal(_bits(y), _bits(_one_shot(layer, slices)))
