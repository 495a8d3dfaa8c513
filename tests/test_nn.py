"""MXFP8Linear and convert()."""

import copy
import gc
import weakref

import torch
from torch import nn

import mxfp8_fusion as mf
from mxfp8_fusion import reference


def test_linear_matches_functional_mm_with_leading_dims():
    linear = nn.Linear(256, 64, dtype=torch.bfloat16)
    layer = mf.MXFP8Linear.from_linear(linear)
    x = torch.randn(2, 3, 256, dtype=torch.bfloat16)
    y = layer(x)
    assert y.shape == (2, 3, 64) and y.dtype == torch.bfloat16
    weight = mf.pack_weight(linear.weight.detach())
    expected = mf.mm(x.reshape(6, 256), weight, linear.bias.detach())
    assert torch.equal(y.reshape(6, 64), expected)
    # MXFP8 of weight and input: close to the BF16 linear (E4M3: ~2**-4 per element).
    ref = linear(x).float()
    assert (y.float() - ref).norm() / ref.norm() < 0.05


def test_from_checkpoint_equals_from_linear():
    linear = nn.Linear(128, 32, bias=False, dtype=torch.float16)
    values, scales = reference.quantize_rows(linear.weight.detach())
    a = mf.MXFP8Linear.from_checkpoint(values, scales)
    b = mf.MXFP8Linear.from_linear(linear)
    x = torch.randn(5, 128, dtype=torch.float16)
    assert torch.equal(a(x), b(x))


def test_convert_swaps_eligible_layers_and_reports_the_rest():
    model = nn.Sequential(
        nn.Linear(256, 128, dtype=torch.bfloat16),
        nn.ReLU(),
        nn.Sequential(
            nn.Linear(128, 100, dtype=torch.bfloat16), nn.Linear(100, 64, dtype=torch.bfloat16)
        ),
        nn.Linear(64, 64),  # float32: not converted
    )
    report = {}
    assert mf.convert(model, report=report) is model
    assert isinstance(model[0], mf.MXFP8Linear)
    assert isinstance(model[2][0], mf.MXFP8Linear)
    assert type(model[2][1]) is nn.Linear and "100" in report["2.1"]
    assert type(model[3]) is nn.Linear and "float32" in report["3"]
    assert report["0"] == report["2.0"] == "converted"


def _layer(k: int = 256, n: int = 64, bias: bool = True, seed: int = 0) -> mf.MXFP8Linear:
    torch.manual_seed(seed)
    return mf.MXFP8Linear.from_linear(nn.Linear(k, n, bias=bias, dtype=torch.bfloat16))


def _packed_bytes(m: mf.MXFP8Linear) -> tuple[torch.Tensor, torch.Tensor]:
    return m.weight_values.view(torch.uint8).clone(), m.weight_scales.view(torch.uint8).clone()


def _same_weight(m: mf.MXFP8Linear, expected: tuple[torch.Tensor, torch.Tensor]) -> bool:
    return (
        m.weight_values.dtype == torch.float8_e4m3fn
        and m.weight_scales.dtype == torch.float8_e8m0fnu
        and torch.equal(m.weight_values.view(torch.uint8), expected[0])
        and torch.equal(m.weight_scales.view(torch.uint8), expected[1])
    )


# --- pack_weight and autograd ---------------------------------------------------------


def test_pack_weight_of_a_parameter_leaves_autograd_and_the_parameter():
    linear = nn.Linear(256, 64, dtype=torch.bfloat16)
    packed = mf.pack_weight(linear.weight)
    assert packed.values.grad_fn is None and not packed.values.requires_grad
    assert packed.scales.grad_fn is None and not packed.scales.requires_grad
    parameter = weakref.ref(linear.weight)
    del linear
    gc.collect()
    assert parameter() is None  # the BF16 weight is freed: the memory saving is real
    layer = mf.MXFP8Linear(packed.values, packed.scales)
    clone = copy.deepcopy(layer)
    x = torch.randn(2, 256, dtype=torch.bfloat16)
    assert torch.equal(clone(x), layer(x))


def test_pack_weight_of_checkpoint_parameters_returns_plain_tensors():
    values, rows = reference.quantize_rows(torch.randn(64, 256, dtype=torch.bfloat16))
    packed = mf.pack_weight(nn.Parameter(values, requires_grad=False), rows)
    assert type(packed.values) is torch.Tensor and type(packed.scales) is torch.Tensor


def test_deepcopy_of_a_converted_model():
    model = mf.convert(nn.Sequential(nn.Linear(256, 64, dtype=torch.bfloat16)))
    clone = copy.deepcopy(model)
    x = torch.randn(2, 256, dtype=torch.bfloat16)
    assert torch.equal(clone(x), model(x))
    assert clone[0].weight_values.data_ptr() != model[0].weight_values.data_ptr()
