"""torchao interop: linears quantized by torchao's MX inference config are converted
without requantizing, compiled with the backend, and checked against torchao's own
emulated output; other torchao formats are skipped with the reason."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers.passes import NO_CACHE, assert_bitwise, randn
from torch import nn

import mxfp8_fusion as mf
from mxfp8_fusion import interop, reference

pytest.importorskip("torchao")
from torchao.prototype.mx_formats import MXDynamicActivationMXWeightConfig
from torchao.prototype.mx_formats.config import ScaleCalculationMode
from torchao.prototype.mx_formats.mx_tensor import MXTensor, QuantizeTensorToMXKwargs
from torchao.quantization import quantize_
from torchao.quantization.quantize_.common import KernelPreference

EMULATED = KernelPreference.EMULATED  # torchao's path on CPU (and on Hopper)


class CatProjection(nn.Module):
    """``fc(cat(states, -1))`` followed by a second linear, as a drafter's head."""

    def __init__(self, k: int, n: int, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.fc = nn.Linear(k, n, dtype=torch.bfloat16)
        self.out = nn.Linear(n, 256, bias=False, dtype=torch.bfloat16)
        with torch.no_grad():
            for lin in (self.fc, self.out):
                lin.weight.copy_(torch.randn(lin.weight.shape, generator=gen) * k**-0.5)
            self.fc.bias.copy_(torch.randn(n, generator=gen) * 0.1)

    def forward(self, *states):
        return self.out(torch.relu(self.fc(torch.cat(states, dim=-1))))


def _torchao(model, **config):
    quantize_(model, MXDynamicActivationMXWeightConfig(kernel_preference=EMULATED, **config))
    return model


def _bf16_ulps(got: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """|got - expected| in units of the BF16 spacing at |expected|."""
    e = expected.float()
    spacing = torch.finfo(torch.bfloat16).eps * torch.exp2(
        torch.floor(torch.log2(e.abs().clamp_min(2.0**-126)))
    )
    return (got.float() - e).abs() / spacing


@pytest.mark.parametrize(("k", "n"), [(512, 128), (384, 96), (2304, 256)])
def test_convert_reuses_the_bytes(k, n):
    model = _torchao(CatProjection(k, n))
    weight = model.fc.weight
    qdata, scale = weight.qdata, weight.scale
    report: dict[str, str] = {}
    mf.convert(model, report=report)
    assert report == {"fc": "converted", "out": "converted"}
    fc = model.fc
    assert isinstance(fc, mf.MXFP8Linear)
    assert fc.weight_values.data_ptr() == qdata.data_ptr()  # the values: same storage
    rows = reference.from_blocked(scale.reshape(-1).view(torch.uint8), n, k // 32)
    ours = reference.from_blocked(fc.weight_scales.view(torch.uint8), n, k // 32)
    assert torch.equal(ours, rows)  # the scales: same bytes
    # torchao pads the blocked layout with zeros, this library with 127: the buffer is
    # shared where there is no padding (rows a multiple of 128, groups of 4), else re-laid
    unpadded = n % 128 == 0 and (k // 32) % 4 == 0
    assert (fc.weight_scales.data_ptr() == scale.data_ptr()) == unpadded


@pytest.mark.parametrize("k", [512, 2304])
def test_matches_torchao_emulated_output(k):
    """Against torchao's own emulated linear (dequantize both operands, BF16 addmm).

    Tolerance, and why: the activations quantize to the same bytes (both RCEIL) and the
    weights are the same bytes, so both sides sum the same exact products; torchao's CPU
    addmm and this library's reference accumulate in FP32 in different orders (ours in
    K-chunks of 1024) and each rounds once to BF16. So the outputs differ by at most one
    BF16 spacing, and almost all are bitwise equal.
    """
    model = _torchao(CatProjection(k, 128))
    torchao_model = copy.deepcopy(model)
    mf.convert(model)
    states = [randn(37, k // 2, seed=s) for s in (1, 2)]
    with torch.no_grad():
        expected = torchao_model.fc(torch.cat(states, dim=-1))
        got = model.fc(torch.cat(states, dim=-1))
    ulps = _bf16_ulps(got, expected)
    assert ulps.max() <= 1
    assert (ulps == 0).float().mean() > 0.99
    if k <= 1024:  # one K-chunk: the same summation as torchao's here
        assert_bitwise(got, expected)


@pytest.mark.slow
def test_compiled_site_is_staged_and_bitwise_equal_to_one_shot():
    model = _torchao(CatProjection(768, 128)).eval()
    mf.convert(model)
    states = [randn(40, 256, seed=s) for s in range(3)]
    for s in states:
        torch._dynamo.mark_dynamic(s, 0)
    torch._dynamo.reset()
    with torch.no_grad():
        report = mf.explain(model, *states)
        assert len(report.rewritten) == 1 and not report.skipped, str(report)
        one_shot = model(*states)  # eager: torch.cat + the one-shot mxfp8 linear
        with torch._inductor.config.patch(NO_CACHE):
            staged = torch.compile(model, backend="mxfp8_fusion", fullgraph=True)(*states)
        torch._dynamo.reset()
        plain = torch.compile(model, backend="inductor", fullgraph=True)(*states)
    torch._dynamo.reset()
    assert_bitwise(staged, one_shot)
    assert_bitwise(staged, plain)


def _mx_weight_linear(block_size=32, elem=torch.float8_e4m3fn, act=True, mode="RCEIL"):
    """A linear whose weight is an MXTensor built directly (formats the config refuses)."""
    lin = nn.Linear(256, 128, bias=False, dtype=torch.bfloat16)
    kwargs = (
        QuantizeTensorToMXKwargs(
            elem_dtype=elem,
            block_size=block_size,
            scaling_mode=ScaleCalculationMode[mode],
            kernel_preference=EMULATED,
        )
        if act
        else None
    )
    weight = MXTensor.to_mx(
        lin.weight.detach(),
        elem,
        block_size=block_size,
        scaling_mode=ScaleCalculationMode[mode],
        kernel_preference=EMULATED,
        act_quant_kwargs=kwargs,
    )
    lin.weight = nn.Parameter(weight, requires_grad=False)
    return lin


def test_row_major_scales_are_taken_too():
    lin = _mx_weight_linear()
    assert not lin.weight.is_swizzled_scales
    layer = mf.MXFP8Linear.from_linear(lin)
    assert layer.weight_values.data_ptr() == lin.weight.qdata.data_ptr()
    rows = reference.from_blocked(layer.weight_scales.view(torch.uint8), 128, 8)
    assert torch.equal(rows, lin.weight.scale.view(torch.uint8).reshape(128, 8))


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (
            lambda: _torchao(
                nn.Sequential(nn.Linear(256, 128, dtype=torch.bfloat16)),
                activation_dtype=torch.float4_e2m1fn_x2,
                weight_dtype=torch.float4_e2m1fn_x2,
            )[0],
            "elements are float4_e2m1fn_x2, not float8_e4m3fn",
        ),
        (
            lambda: _torchao(
                nn.Sequential(nn.Linear(256, 128, dtype=torch.bfloat16)),
                activation_dtype=torch.float8_e5m2,
                weight_dtype=torch.float8_e5m2,
            )[0],
            "elements are float8_e5m2",
        ),
        (
            lambda: _torchao(
                nn.Sequential(nn.Linear(256, 128, dtype=torch.bfloat16)),
                scaling_mode=ScaleCalculationMode.FLOOR,
            )[0],
            "by the FLOOR rule; this library quantizes activations by RCEIL only",
        ),
        (lambda: _mx_weight_linear(block_size=16), "block size is 16, not 32"),
        (lambda: _mx_weight_linear(act=False), "weight-only MX quantization"),
    ],
)
def test_other_formats_are_skipped_with_the_reason(make, reason):
    model = nn.Sequential(make())
    before = model[0].weight
    report: dict[str, str] = {}
    mf.convert(model, report=report)
    assert reason in report["0"]
    assert model[0].weight is before and type(model[0]) is nn.Linear
    with pytest.raises(TypeError, match="linear: "):
        interop.from_torchao(model[0])


def test_plain_weights_are_not_torchao():
    assert not interop.is_torchao_tensor(torch.zeros(2))
    assert not interop.is_torchao_tensor(nn.Parameter(torch.zeros(2)))
    assert not interop.is_torchao_tensor(None)
