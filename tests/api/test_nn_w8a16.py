"""``MXFP8Linear(activation="bf16")`` (W8A16) beside the default W8A8: the same weight bytes
and state_dict, the input used as it is, and a user's next steps (cast, save and load,
compile, grad mode, a typo in the option)."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from torch import nn

import mxfp8_fusion as mf
from mxfp8_fusion import reference


class Drafter(nn.Module):
    def __init__(self, hidden: int = 128, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.fc = nn.Linear(3 * hidden, hidden, dtype=torch.bfloat16)
        with torch.no_grad():
            self.fc.weight.copy_(torch.randn(self.fc.weight.shape, generator=gen) * 0.05)
            self.fc.bias.copy_(torch.randn(hidden, generator=gen) * 0.1)

    def forward(self, *hidden):
        return self.fc(torch.cat(hidden, dim=-1))


def _hidden(tokens=16, hidden=128, dtype=torch.bfloat16, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(2, tokens, hidden, generator=gen).to(dtype) for _ in range(3)]


def test_w8a8_stays_the_default():
    model = mf.convert(Drafter())
    assert model.fc.activation == "mxfp8"
    assert "activation='mxfp8'" in repr(model.fc)


def test_w8a16_multiplies_the_input_as_it_is():
    model = mf.convert(Drafter(), activation="bf16")
    assert model.fc.activation == "bf16" and "activation='bf16'" in repr(model.fc)
    hidden = _hidden()
    x = torch.cat(hidden, -1).reshape(-1, 384)
    expected = mf.mm_slices([x], model.fc.weight, bias=model.fc.bias).view(2, 16, 128)
    assert torch.equal(model(*hidden), expected)
    w8a8 = mf.mm(x, model.fc.weight, bias=model.fc.bias).view(2, 16, 128)
    assert not torch.equal(expected, w8a8)


def test_state_dict_is_the_same_for_both_activations():
    w8a8 = mf.convert(Drafter())
    w8a16 = mf.convert(Drafter(), activation="bf16")
    a, b = w8a8.state_dict(), w8a16.state_dict()
    assert list(a) == list(b)
    for key in a:
        assert torch.equal(a[key].view(torch.uint8), b[key].view(torch.uint8)), key
    buffer = io.BytesIO()
    torch.save(a, buffer)
    buffer.seek(0)
    other = mf.convert(Drafter(seed=5), activation="bf16")
    other.load_state_dict(torch.load(buffer))
    assert other.fc.activation == "bf16"
    hidden = _hidden()
    assert torch.equal(other(*hidden), w8a16(*hidden))


def test_a_bf16_checkpoint_loads_into_a_w8a16_model():
    plain = Drafter(seed=3)
    model = mf.convert(Drafter(), activation="bf16")
    model.load_state_dict(plain.state_dict())
    expected = mf.convert(copy.deepcopy(plain), activation="bf16")
    hidden = _hidden()
    assert torch.equal(model(*hidden), expected(*hidden))


def test_casts_keep_the_setting_and_fp32_is_served():
    model = mf.convert(Drafter(), activation="bf16")
    hidden = [h.float() for h in _hidden()]
    model.float()
    assert model.fc.activation == "bf16" and model.fc.bias.dtype == torch.float32
    y = model(*hidden)
    assert y.dtype == torch.float32
    x = torch.cat(hidden, -1).reshape(-1, 384).double()
    w = reference.dequantize(model.fc.weight_values, model.fc.weight_scales).double()
    exact = (x @ w.t() + model.fc.bias.double()).view(2, 16, 128)
    assert (y.double() - exact).abs().max() < 1e-4
    half = copy.deepcopy(model).half()
    assert half(*[h.half() for h in hidden]).dtype == torch.float16


@pytest.mark.parametrize(
    ("activation", "error", "message"),
    [
        ("bf61", ValueError, "did you mean 'bf16'"),
        ("W8A16", ValueError, "'mxfp8' \\(W8A8\\) or 'bf16' \\(W8A16\\)"),
        ("MXFP8", ValueError, "did you mean 'mxfp8'"),
        (torch.bfloat16, TypeError, "expected 'mxfp8' or 'bf16', got dtype"),
    ],
)
def test_a_wrong_activation_is_named(activation, error, message):
    weight = mf.pack_weight(Drafter().fc.weight)
    for make in (
        lambda: mf.convert(Drafter(), activation=activation),
        lambda: mf.MXFP8Linear.from_linear(Drafter().fc, activation=activation),
        lambda: mf.MXFP8Linear(weight.values, weight.scales, activation=activation),
    ):
        with pytest.raises(error, match=f"^activation: .*{message}"):
            make()


def test_from_checkpoint_takes_the_activation():
    fc = Drafter().fc
    values, scales = reference.quantize_rows(fc.weight.detach())
    layer = mf.MXFP8Linear.from_checkpoint(values, scales, fc.bias, activation="bf16")
    assert layer.activation == "bf16"


def test_compiled_and_eager_agree_in_grad_mode_too():
    model = mf.convert(Drafter(), activation="bf16")
    hidden = _hidden()
    compiled = torch.compile(model, backend="inductor")
    with torch.no_grad():
        assert torch.equal(compiled(*hidden), model(*hidden))
    leaves = [h.clone().requires_grad_() for h in hidden]
    y = model(*leaves)
    assert torch.equal(y.detach(), model(*hidden))
    with pytest.raises(RuntimeError, match="MXFP8Linear\\(activation='bf16'\\)"):
        y.sum().backward()


def test_torchao_weight_only_mx_is_taken_as_w8a16():
    pytest.importorskip("torchao")
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.mx_tensor import MXTensor

    model = Drafter()
    weight = MXTensor.to_mx(
        model.fc.weight.detach(), torch.float8_e4m3fn, block_size=32,
        scaling_mode=ScaleCalculationMode.RCEIL, act_quant_kwargs=None,
    )  # fmt: skip
    model.fc.weight = nn.Parameter(weight, requires_grad=False)
    report: dict[str, str] = {}
    with pytest.warns(UserWarning, match="activation='bf16'"):
        mf.convert(copy.deepcopy(model), report=report)
    assert "activation='bf16'" in report["fc"]
    converted = mf.convert(model, report=report, activation="bf16")
    assert report["fc"] == "converted" and converted.fc.activation == "bf16"
    assert converted.fc.weight_values.data_ptr() == weight.qdata.data_ptr()
