"""MXFP8Linear and convert()."""

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
