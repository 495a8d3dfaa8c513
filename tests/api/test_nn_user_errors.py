"""What a user sees when convert converts less than the model has, when a layer gets a
wrong input, and when a BF16 checkpoint is loaded into a converted model."""

import warnings

import pytest
import torch
from torch import nn

import mxfp8_fusion as mf


def _convert_warnings(model: nn.Module) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mf.convert(model)
    return [str(w.message) for w in caught if w.category is UserWarning]


def test_convert_of_an_fp32_model_warns_with_the_reason():
    model = nn.Sequential(nn.Linear(256, 64), nn.ReLU(), nn.Linear(64, 32))
    (message,) = _convert_warnings(model)
    assert message.startswith("mxfp8_fusion.convert: none of the model's 2 nn.Linear layer(s)")
    assert "0, 2: weight dtype torch.float32 is not bfloat16 or float16" in message
    assert "model.to(torch.bfloat16)" in message


def test_convert_of_a_model_without_linears_warns():
    (message,) = _convert_warnings(nn.Sequential(nn.LayerNorm(8)))
    assert message == (
        "mxfp8_fusion.convert: the model has no nn.Linear layer; nothing was converted"
    )


def test_convert_run_twice_says_already_converted():
    model = nn.Sequential(nn.Linear(256, 64, dtype=torch.bfloat16), nn.ReLU())
    assert _convert_warnings(model) == []
    (message,) = _convert_warnings(model)
    assert message == (
        "mxfp8_fusion.convert: the model is already converted (1 MXFP8Linear layer(s), kept "
        "as they are); nothing was converted"
    )


def test_convert_that_skips_some_layers_says_which():
    model = nn.Sequential(
        nn.Linear(256, 128, dtype=torch.bfloat16), nn.Linear(128, 100, dtype=torch.bfloat16),
        nn.Linear(100, 8, dtype=torch.bfloat16),
    )  # fmt: skip
    (message,) = _convert_warnings(model)
    assert message.startswith("mxfp8_fusion.convert: converted 2 of 3 nn.Linear layers")
    assert "\n  - 2: in_features 100 is not a multiple of 32" in message


def test_convert_of_an_eligible_model_is_silent():
    assert _convert_warnings(nn.Sequential(nn.Linear(256, 64, dtype=torch.bfloat16))) == []


def test_explain_says_why_nothing_is_mxfp8():
    x = torch.randn(4, 256)
    report = mf.explain(nn.Sequential(nn.Linear(256, 64)), x)
    text = str(report)
    assert "convert would leave each of its nn.Linear layers unchanged" in text
    assert "- 0: weight dtype torch.float32 is not bfloat16 or float16" in text
    report = mf.explain(nn.Sequential(nn.ReLU()), x)
    assert "no MXFP8Linear and no nn.Linear layer" in str(report)


@pytest.mark.parametrize("x", [[[1.0] * 256], (1.0,), None, 3.0])
def test_linear_called_with_a_non_tensor_names_x(x):
    layer = mf.MXFP8Linear.from_linear(nn.Linear(256, 64, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match=r"^x: expected a torch\.Tensor, got "):
        layer(x)


def _pair():
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(256, 64, dtype=torch.bfloat16))
    converted = mf.convert(nn.Sequential(nn.Linear(256, 64, dtype=torch.bfloat16)))
    return plain, converted


def test_bf16_checkpoint_loads_into_a_converted_model():
    plain, converted = _pair()
    converted.load_state_dict(plain.state_dict())  # strict: no missing or unexpected keys
    expected = mf.convert(plain)[0]
    for name in ("weight_values", "weight_scales", "bias"):
        got, want = getattr(converted[0], name), getattr(expected, name)
        assert got.dtype == want.dtype
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


def test_bf16_checkpoint_entry_is_checked_before_anything_loads():
    plain, converted = _pair()
    before = converted[0].weight_values.clone()
    state = plain.state_dict()
    with pytest.raises(TypeError, match=r"^state_dict\['0.weight'\]: expected dtype bfloat16"):
        converted.load_state_dict({**state, "0.weight": state["0.weight"].float()})
    with pytest.raises(ValueError, match=r"^state_dict\['0.weight'\]: expected shape \(64, 256\)"):
        converted.load_state_dict({**state, "0.weight": state["0.weight"][:, :128]})
    with pytest.raises(ValueError, match="both '0.weight'"):
        converted.load_state_dict({**state, **converted.state_dict()})
    assert torch.equal(converted[0].weight_values.view(torch.uint8), before.view(torch.uint8))
