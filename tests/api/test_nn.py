"""MXFP8Linear and convert()."""

import copy
import gc
import weakref

import pytest
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
    expected = mf.mm(x.reshape(6, 256), weight, bias=linear.bias.detach())
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


# --- construction ---------------------------------------------------------------------


def _weight_parts(n: int = 64, k: int = 256):
    w = mf.pack_weight(torch.randn(n, k, dtype=torch.bfloat16))
    return w.values, w.scales, torch.randn(n, dtype=torch.bfloat16)


@pytest.mark.parametrize(
    ("make", "error", "argument"),
    [
        (lambda v, s, b: ([[1.0] * 32], s, None), TypeError, "weight_values"),
        (lambda v, s, b: (v.to(torch.bfloat16), s, b), TypeError, "weight_values"),
        (lambda v, s, b: (v.view(torch.uint8), s, b), TypeError, "weight_values"),
        (lambda v, s, b: (v.flatten(), s, b), ValueError, "weight_values"),
        (lambda v, s, b: (v[:, :48].contiguous(), s, b), ValueError, "weight_values"),
        (lambda v, s, b: (torch.cat([v, v], 1)[:, :256], s, b), ValueError, "weight_values"),
        (lambda v, s, b: (v, s.tolist(), b), TypeError, "weight_scales"),
        (
            lambda v, s, b: (v, s.view(torch.uint8).to(torch.bfloat16), b),
            TypeError,
            "weight_scales",
        ),
        (lambda v, s, b: (v, s[:512], b), ValueError, "weight_scales"),
        (lambda v, s, b: (v, s.to("meta"), b), ValueError, "weight_scales"),
        (lambda v, s, b: (v, s, b[:10]), ValueError, "bias"),
        (lambda v, s, b: (v, s, b.to(torch.int32)), TypeError, "bias"),
        (lambda v, s, b: (v, s, b.to("meta")), ValueError, "bias"),
        (lambda v, s, b: (v, s, [0.0] * 64), TypeError, "bias"),
    ],
    ids=[
        "values_list",
        "values_bf16",
        "values_uint8",
        "values_1d",
        "values_k48",
        "values_strided",
        "scales_list",
        "scales_bf16",
        "scales_size",
        "scales_device",
        "bias_shape",
        "bias_int",
        "bias_device",
        "bias_list",
    ],
)
def test_constructor_validates_its_arguments(make, error, argument):
    with pytest.raises(error, match=f"^{argument}: expected"):
        mf.MXFP8Linear(*make(*_weight_parts()))


def test_constructor_refuses_row_major_scales_even_of_the_blocked_size():
    # [128, 4] row-major scales hold 512 bytes, exactly the blocked buffer's size
    values, rows = reference.quantize_rows(torch.randn(128, 128, dtype=torch.bfloat16))
    assert rows.numel() == mf.pack_weight(values, rows).scales.numel()
    with pytest.raises(ValueError, match="^weight_scales: .*from_checkpoint"):
        mf.MXFP8Linear(values, rows)
    with pytest.raises(ValueError, match="^weight_scales: .*from_checkpoint"):
        mf.MXFP8Linear(values, rows.flatten()[:300])


def test_constructor_takes_uint8_scale_bytes():
    values, scales, bias = _weight_parts()
    a = mf.MXFP8Linear(values, scales, bias)
    b = mf.MXFP8Linear(values, scales.view(torch.uint8), bias)
    assert b.weight_scales.dtype == torch.float8_e8m0fnu
    x = torch.randn(3, 256, dtype=torch.bfloat16)
    assert torch.equal(a(x), b(x))


def test_weight_property_is_the_packed_weight():
    layer = _layer()
    weight = layer.weight
    assert isinstance(weight, mf.MXFP8Weight)
    assert weight.values is layer.weight_values
    # the same scale buffer, not a copy (MXFP8Weight shows it through an e8m0 view of its bytes)
    assert weight.scales.dtype == layer.weight_scales.dtype
    assert weight.scales.data_ptr() == layer.weight_scales.data_ptr()
    x = torch.randn(3, 256, dtype=torch.bfloat16)
    assert torch.equal(layer(x), mf.mm(x, weight, bias=layer.bias))


# --- forward --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_autocast_casts_an_fp32_input_as_for_nn_linear(dtype, compiled):
    layer = _layer()
    run = torch.compile(layer, backend="mxfp8_fusion") if compiled else layer
    x = torch.randn(2, 3, 256)
    with torch.autocast("cpu", dtype=dtype):
        y = run(x)
        assert nn.Linear(256, 64)(x).dtype == dtype  # what nn.Linear gives
    assert y.dtype == dtype and y.shape == (2, 3, 64)
    assert torch.equal(y, layer(x.to(dtype)))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_after_float_an_fp32_input_is_served_as_nn_linear_serves_it(compiled):
    """``.float()`` then FP32 inputs, as with an ``nn.Linear``: FP32 out, the input quantized
    from FP32 (torchao's to_mx rule: tests/api/test_format.py), summed with the FP32 bias.
    Every forward raised 'expected dtype bfloat16 or float16'."""
    layer = _layer().float()
    run = torch.compile(layer, backend="mxfp8_fusion") if compiled else layer
    x = torch.randn(2, 3, 256)
    y = run(x)
    assert y.dtype == torch.float32 and y.shape == (2, 3, 64)
    values, scales = reference.quantize(x.reshape(6, 256))
    weight = (layer.weight_values, layer.weight_scales)
    expected = reference.mm(values, scales, *weight, layer.bias, torch.float32)
    assert torch.equal(y.reshape(6, 64), expected)


def test_an_input_of_another_dtype_is_refused():
    with pytest.raises(
        TypeError, match="^x: expected dtype bfloat16, float16 or float32.*autocast"
    ):
        _layer().double()(torch.randn(2, 256, dtype=torch.float64))


# --- casts and devices (nn.Module._apply) ---------------------------------------------


@pytest.mark.parametrize(
    ("cast", "bias_dtype"),
    [
        (lambda m: m.to(torch.bfloat16), torch.bfloat16),
        (lambda m: m.to(torch.float16), torch.float16),
        (lambda m: m.to("cpu", torch.float16), torch.float16),
        (lambda m: m.to(dtype=torch.float32), torch.float32),
        (lambda m: m.half(), torch.float16),
        (lambda m: m.bfloat16(), torch.bfloat16),
        (lambda m: m.float(), torch.float32),
        (lambda m: m.double(), torch.float64),
        (lambda m: m.cpu(), torch.bfloat16),
    ],
    ids=[
        "to_bf16",
        "to_fp16",
        "to_cpu_fp16",
        "to_fp32",
        "half",
        "bfloat16",
        "float",
        "double",
        "cpu",
    ],
)
def test_casts_leave_the_mxfp8_weight_bytes_alone_and_cast_the_bias(cast, bias_dtype):
    layer = _layer()
    before = _packed_bytes(layer)
    x = torch.randn(5, 256, dtype=torch.bfloat16)
    expected = layer(x)
    assert cast(layer) is layer
    assert _same_weight(layer, before)
    assert layer.bias.dtype == bias_dtype and not layer.bias.requires_grad
    # the output keeps the input's dtype; the cast bias is exact for these values
    assert torch.equal(layer(x), expected)


def test_a_cast_inside_a_model_leaves_the_weight_alone():
    model = mf.convert(nn.Sequential(nn.Linear(256, 64, dtype=torch.bfloat16), nn.LayerNorm(64)))
    before = _packed_bytes(model[0])
    model.half()
    assert _same_weight(model[0], before)
    assert model[1].weight.dtype == torch.float16


def test_device_moves_move_the_weight_bytes():
    layer = _layer()
    before = _packed_bytes(layer)
    meta = copy.deepcopy(layer).to("meta")
    assert meta.weight_values.device.type == meta.weight_scales.device.type == "meta"
    assert meta.weight_values.dtype == torch.float8_e4m3fn
    assert meta.weight_scales.dtype == torch.float8_e8m0fnu
    assert meta.weight_scales.shape == layer.weight_scales.shape
    empty = meta.to_empty(device="cpu")
    assert empty.weight_values.device.type == "cpu"
    assert empty.weight_scales.dtype == torch.float8_e8m0fnu
    assert empty.bias.device.type == "cpu"
    layer.share_memory()
    assert layer.weight_values.is_shared() and layer.weight_scales.is_shared()
    assert _same_weight(layer, before)


def test_module_type_cast_is_refused_before_anything_changes():
    layer = _layer()
    before = _packed_bytes(layer)
    with pytest.raises(TypeError, match="MXFP8Linear"):
        layer.type(torch.float16)
    assert _same_weight(layer, before) and layer.bias.dtype == torch.bfloat16


# --- state_dict -----------------------------------------------------------------------


def test_state_dict_round_trip_and_assign_from_meta():
    layer = _layer()
    x = torch.randn(3, 256, dtype=torch.bfloat16)
    state = layer.state_dict()
    assert list(state) == ["bias", "weight_values", "weight_scales"]
    other = _layer(seed=1)
    other.load_state_dict(state)
    assert torch.equal(other(x), layer(x))
    on_meta = copy.deepcopy(layer).to("meta")
    on_meta.load_state_dict(state, assign=True)
    assert on_meta.weight_values.device.type == "cpu"
    assert torch.equal(on_meta(x), layer(x))


@pytest.mark.parametrize("assign", [False, True])
def test_load_state_dict_takes_uint8_bytes_as_bytes(assign):
    layer = _layer()
    model = nn.Sequential(_layer(seed=1))
    state = {f"0.{k}": v for k, v in layer.state_dict().items()}
    state["0.weight_values"] = state["0.weight_values"].view(torch.uint8)
    state["0.weight_scales"] = state["0.weight_scales"].view(torch.uint8)
    model.load_state_dict(state, assign=assign)
    assert _same_weight(model[0], _packed_bytes(layer))
    x = torch.randn(4, 256, dtype=torch.bfloat16)
    assert torch.equal(model(x), layer(x))


@pytest.mark.parametrize(
    ("key", "bad", "error"),
    [
        ("weight_values", lambda v: v.to(torch.bfloat16), TypeError),
        ("weight_values", lambda v: v[:, :128].contiguous(), ValueError),
        ("weight_scales", lambda s: s.to(torch.bfloat16), TypeError),
        ("weight_scales", lambda s: s.view(torch.uint8)[:100], ValueError),
        ("weight_scales", lambda s: s.view(torch.uint8).view(-1, 8), ValueError),
    ],
    ids=["values_bf16", "values_shape", "scales_bf16", "scales_size", "scales_2d"],
)
def test_load_state_dict_refuses_a_wrong_weight_entry(key, bad, error):
    layer = _layer()
    before = _packed_bytes(layer)
    state = _layer(seed=1).state_dict()
    state[key] = bad(state[key])
    with pytest.raises(error, match=rf"state_dict\['{key}'\]"):
        layer.load_state_dict(state)
    assert _same_weight(layer, before)


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


# --- convert --------------------------------------------------------------------------


def test_convert_keeps_a_shared_linear_shared():
    shared = nn.Linear(256, 64, dtype=torch.bfloat16)
    model = nn.Module()
    model.a = nn.Sequential(shared)
    model.b = nn.Sequential(shared)
    model.c = shared  # the same layer twice under one parent too
    model.d = shared
    report = {}
    mf.convert(model, report=report)
    assert isinstance(model.a[0], mf.MXFP8Linear)
    assert model.a[0] is model.b[0] is model.c is model.d
    assert report == dict.fromkeys(["c", "d", "a.0", "b.0"], "converted")


def test_convert_reports_linear_subclasses():
    class LoRALinear(nn.Linear):
        pass

    model = nn.Sequential(
        LoRALinear(256, 64, dtype=torch.bfloat16),
        nn.MultiheadAttention(256, 4, dtype=torch.bfloat16),
    )
    report = {}
    mf.convert(model, report=report)
    assert type(model[0]) is LoRALinear and type(model[1].out_proj) is not mf.MXFP8Linear
    assert "LoRALinear" in report["0"] and "subclass" in report["0"]
    assert "NonDynamicallyQuantizableLinear" in report["1.out_proj"]


def test_convert_and_from_linear_name_a_wrong_argument():
    with pytest.raises(TypeError, match="^model: expected an nn.Module, got function"):
        mf.convert(lambda x: x)
    with pytest.raises(TypeError, match="^report: expected a dict"):
        mf.convert(nn.Sequential(), report=[])
    with pytest.raises(TypeError, match="^linear: expected an nn.Linear"):
        mf.MXFP8Linear.from_linear(torch.randn(4, 32))
