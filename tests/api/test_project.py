"""One layer, one activation, one result: ``MXFP8Linear``, the one slices-to-output entry
(``mxfp8_fusion.project``), ``InputStager``, the tensor-parallel staging and the vLLM linear
give the same bits for the same layer and input slices, W8A8 and W8A16 (CPU here; the GPU
suite runs the same on the kernels)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import mxfp8_fusion as mf
from mxfp8_fusion import project, tensor_parallel
from mxfp8_fusion.format import Activation
from mxfp8_fusion.vllm import linear as vllm_linear

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _layer(activation: str, k: int, n: int, device: str) -> mf.MXFP8Linear:
    gen = torch.Generator().manual_seed(0)
    lin = nn.Linear(k, n, dtype=torch.bfloat16)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n, k, generator=gen) * k**-0.5)
        lin.bias.copy_(torch.randn(n, generator=gen))
    return mf.MXFP8Linear.from_linear(lin, activation=activation).to(device)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("activation", ["mxfp8", "bf16"])
def test_every_caller_gives_the_layers_bits(activation, device):
    widths, tokens = (256, 128, 384), 24
    layer = _layer(activation, sum(widths), 256, device)
    gen = torch.Generator().manual_seed(1)
    slices = [(torch.randn(tokens, w, generator=gen) * 3).bfloat16().to(device) for w in widths]
    expected = _bits(layer(torch.cat(slices, dim=-1)))

    out = torch.empty(tokens, layer.out_features, dtype=torch.bfloat16, device=device)
    results = {
        "project": project.project(layer.weight, layer.activation, slices, bias=layer.bias),
        "project into out": project.project(
            layer.weight, activation, slices, bias=layer.bias, out=out
        ),
        "tensor parallel staging": tensor_parallel._staged_gemm(layer, slices, (tokens, 768)),
    }
    stager = mf.InputStager(layer, capacity=tokens)
    stager.append(*slices)
    results["InputStager"] = stager.finish(torch.empty_like(out)).clone()

    vllm_layer = nn.Module()
    vllm_layer.weight = nn.Parameter(layer.weight_values.clone(), requires_grad=False)
    # the checkpoint's row-major scales, which process_weights packs as pack_weight does
    vllm_layer.weight_scale = nn.Parameter(_row_major(layer), requires_grad=False)
    vllm_linear.process_weights(vllm_layer, activation=activation)
    assert vllm_linear.activation_of(vllm_layer) is Activation.of(activation)
    results["vLLM linear"] = vllm_linear.apply_weights(
        vllm_layer, torch.cat(slices, dim=-1), layer.bias
    )
    for who, y in results.items():
        assert torch.equal(_bits(y), expected), who


def _row_major(layer: mf.MXFP8Linear) -> torch.Tensor:
    """``layer``'s scales as a checkpoint holds them: ``[N, K/32]`` row-major bytes."""
    from mxfp8_fusion.format import scale_offset

    n, k = layer.out_features, layer.in_features
    rows = torch.arange(n).view(-1, 1)
    groups = torch.arange(k // 32).view(1, -1)
    flat = layer.weight_scales.view(torch.uint8).cpu()
    return flat[scale_offset(rows, groups, k)].to(layer.weight_values.device)


def test_the_entry_takes_the_strings_and_says_a_typo():
    layer = _layer("mxfp8", 256, 128, "cpu")
    x = torch.randn(4, 256).bfloat16()
    assert torch.equal(project.project(layer.weight, "bf16", [x]), mf.mm_slices([x], layer.weight))
    with pytest.raises(ValueError, match="did you mean 'bf16'"):
        project.project(layer.weight, "bf61", [x])
