"""The vLLM MXFP8 linear kernel's work through vLLM's call shapes, without vLLM installed.

The layer is built as vLLM's MXFP8 linear methods build it (``weight`` E4M3 ``[N, K]`` and
``weight_scale`` uint8 ``[N, K/32]`` Parameters, filled by copying the checkpoint's bytes in),
then ``process_weights`` and ``apply_weights`` run as the kernel class calls them, for each
activation the kernel runs. The result must equal, bit for bit, the library's own call on
the same bytes: ``mf.mm`` for W8A8 (``"mxfp8"``), ``mf.mm_slices`` for W8A16 (``"bf16"``).
CPU always; the same cases on CUDA are marked ``gpu``.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import mxfp8_fusion as mf
from mxfp8_fusion.vllm import linear

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
ACTIVATIONS = ["mxfp8", "bf16"]
OPS = {"mxfp8": "mxfp8.linear.default", "bf16": "mxfp8.linear_w8a16.default"}


def _checkpoint(n: int, k: int, device: str, seed: int = 0):
    """An MXFP8 checkpoint's tensors: E4M3 values and row-major uint8 E8M0 scales."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) * k**-0.5
    scales = torch.randint(118, 128, (n, k // 32), generator=gen, dtype=torch.uint8)
    values = (w * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
    return values.to(device), scales.to(device)


def _vllm_layer(values: torch.Tensor, scales: torch.Tensor, bias: bool) -> nn.Module:
    """A layer as vLLM's loader leaves it: empty Parameters created, then the bytes copied in."""
    layer = nn.Module()
    n, k = values.shape
    layer.weight = nn.Parameter(
        torch.empty(n, k, dtype=torch.float8_e4m3fn, device=values.device), requires_grad=False
    )
    layer.weight_scale = nn.Parameter(
        torch.empty(n, k // 32, dtype=torch.uint8, device=values.device), requires_grad=False
    )
    layer.weight.data.copy_(values)
    layer.weight_scale.data.copy_(scales)
    layer.bias = (
        nn.Parameter(torch.randn(n, device=values.device).to(torch.bfloat16), requires_grad=False)
        if bias
        else None
    )
    return layer


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16)


def _expected(activation: str, x, values, scales, bias=None) -> torch.Tensor:
    """The library's own call on the same bytes: ``mf.mm`` (W8A8) or ``mf.mm_slices``
    (W8A16, ``x`` one slice)."""
    weight = mf.pack_weight(values, scales)
    if activation == "bf16":
        return mf.mm_slices([x], weight, bias=bias)
    return mf.mm(x, weight, bias=bias)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize(
    ("tokens", "n", "k", "bias"),
    [(1, 256, 768, False), (7, 384, 256, True), (129, 256, 1024, True), (0, 128, 256, False)],
)
def test_apply_weights_equals_mm_bitwise(device, activation, tokens, n, k, bias):
    values, scales = _checkpoint(n, k, device)
    layer = _vllm_layer(values, scales, bias)
    packed = linear.process_weights(layer, "model.layers.0.mlp.down_proj", activation)
    assert linear.activation_of(layer) == activation
    assert torch.equal(layer.weight.view(torch.uint8), values.view(torch.uint8))
    assert isinstance(layer.weight, nn.Parameter) and isinstance(layer.weight_scale, nn.Parameter)
    x = torch.randn(tokens, k, device=device).to(torch.bfloat16)
    got = linear.apply_weights(layer, x, layer.bias)
    expected = _expected(activation, x, values, scales, layer.bias)
    assert torch.equal(_bits(got), _bits(expected))
    assert torch.equal(packed.raw_scales, layer.weight_scale)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_apply_weights_keeps_leading_dims_and_fp16(device, activation):
    values, scales = _checkpoint(256, 512, device)
    layer = _vllm_layer(values, scales, bias=True)
    linear.process_weights(layer, activation=activation)
    x = torch.randn(2, 3, 512, device=device).to(torch.float16)
    got = linear.apply_weights(layer, x, layer.bias)
    expected = _expected(activation, x.reshape(6, 512), values, scales, layer.bias.half())
    assert got.shape == (2, 3, 256) and got.dtype == torch.float16
    assert torch.equal(_bits(got.reshape(6, 256)), _bits(expected))


def test_w8a16_is_the_bf16_input_times_the_exact_weight():
    """W8A16 does not quantize the input: the result is the BF16 product of the input and
    the dequantized weight, summed in FP32 (compared in FP64 within BF16 rounding), while
    W8A8 of the same layer differs by the input's quantization."""
    values, scales = _checkpoint(256, 512, "cpu")
    layer = _vllm_layer(values, scales, bias=False)
    linear.process_weights(layer, activation="bf16")
    x = torch.randn(9, 512).to(torch.bfloat16)
    got = linear.apply_weights(layer, x).double()
    factors = torch.exp2(scales.double() - 127).repeat_interleave(32, dim=1)
    exact = x.double() @ (values.double() * factors).T
    assert torch.allclose(got, exact, rtol=2**-8, atol=1e-6 * exact.abs().max().item())
    w8a8 = _expected("mxfp8", x, values, scales).double()
    assert not torch.allclose(w8a8, exact, rtol=2**-8, atol=1e-6 * exact.abs().max().item())


def test_process_weights_refuses_an_unknown_activation_before_packing():
    values, scales = _checkpoint(128, 256, "cpu")
    layer = _vllm_layer(values, scales, bias=False)
    with pytest.raises(ValueError, match="activation"):
        linear.process_weights(layer, activation="fp8")
    assert layer.weight_scale.shape == (128, 8) and linear.activation_of(layer) is None


def test_process_weights_refuses_an_unknown_activation_on_a_packed_layer_too():
    values, scales = _checkpoint(128, 256, "cpu")
    layer = _vllm_layer(values, scales, bias=False)
    linear.process_weights(layer)
    with pytest.raises(ValueError, match="activation"):
        linear.process_weights(layer, activation="typo")
    assert linear.activation_of(layer) == "mxfp8"


def test_process_weights_twice_changes_nothing():
    values, scales = _checkpoint(128, 256, "cpu")
    layer = _vllm_layer(values, scales, bias=False)
    linear.process_weights(layer)
    first = layer.weight_scale.clone()
    linear.process_weights(layer)
    assert torch.equal(layer.weight_scale, first)


@pytest.mark.parametrize(
    ("weight", "scale", "error", "match"),
    [
        (torch.zeros(128, 256), torch.zeros(128, 8, dtype=torch.uint8), TypeError, "float8_e4m3fn"),
        (
            torch.zeros(128, 48, dtype=torch.float8_e4m3fn),
            torch.zeros(128, 1, dtype=torch.uint8),
            ValueError,
            "multiple of 32",
        ),
        (
            torch.zeros(128, 256, dtype=torch.float8_e4m3fn),
            torch.zeros(128, 256 // 16, dtype=torch.uint8),
            ValueError,
            r"\(128, 8\)",
        ),
        (
            torch.zeros(128, 256, dtype=torch.float8_e4m3fn),
            torch.zeros(128, 8, dtype=torch.float32),
            TypeError,
            "uint8",
        ),
        (
            torch.zeros(2, 128, 256, dtype=torch.float8_e4m3fn),
            torch.zeros(2, 128, 8, dtype=torch.uint8),
            ValueError,
            "2-D",
        ),
    ],
)
def test_bad_layout_is_refused_at_load_naming_the_layer(weight, scale, error, match):
    layer = nn.Module()
    layer.weight = nn.Parameter(weight, requires_grad=False)
    layer.weight_scale = nn.Parameter(scale, requires_grad=False)
    with pytest.raises(error, match=match) as info:
        linear.process_weights(layer, "model.layers.3.self_attn.qkv_proj")
    assert "model.layers.3.self_attn.qkv_proj.weight" in str(info.value)


def test_apply_weights_refuses_wrong_width():
    values, scales = _checkpoint(128, 256, "cpu")
    layer = _vllm_layer(values, scales, bias=False)
    linear.process_weights(layer)
    with pytest.raises(ValueError, match="x"):
        linear.apply_weights(layer, torch.zeros(4, 128, dtype=torch.bfloat16))


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_compiled_apply_weights_puts_the_linear_op_in_the_graph(activation):
    values, scales = _checkpoint(128, 256, "cpu")
    layer = _vllm_layer(values, scales, bias=False)
    linear.process_weights(layer, activation=activation)
    seen = []

    def backend(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm

    x = torch.randn(5, 256).to(torch.bfloat16)
    compiled = torch.compile(lambda t: linear.apply_weights(layer, t), backend=backend)
    assert torch.equal(_bits(compiled(x)), _bits(linear.apply_weights(layer, x)))
    other = OPS["bf16" if activation == "mxfp8" else "mxfp8"]
    assert OPS[activation] in seen and other not in seen


@pytest.mark.gpu
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("tokens", [1, 16, 128, 1024, 16384])
def test_gpu_apply_weights_equals_mm_bitwise_across_tokens(activation, tokens):
    values, scales = _checkpoint(1024, 3072, "cuda", seed=tokens)
    layer = _vllm_layer(values, scales, bias=False)
    linear.process_weights(layer, "model.fc", activation)
    x = torch.randn(tokens, 3072, device="cuda").to(torch.bfloat16)
    got = linear.apply_weights(layer, x)
    assert torch.equal(_bits(got), _bits(_expected(activation, x, values, scales)))


@pytest.mark.gpu
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_gpu_apply_weights_replays_in_a_cuda_graph(activation):
    values, scales = _checkpoint(768, 1024, "cuda")
    layer = _vllm_layer(values, scales, bias=True)
    linear.process_weights(layer, activation=activation)
    x = torch.randn(64, 1024, device="cuda").to(torch.bfloat16)
    expected = linear.apply_weights(layer, x, layer.bias)  # warm-up: kernels compiled
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = linear.apply_weights(layer, x, layer.bias)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(_bits(out), _bits(linear.apply_weights(layer, x, layer.bias)))
    assert not torch.equal(_bits(out), _bits(expected))
