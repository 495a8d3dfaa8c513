"""The MXFP8 linear kernel's work, in vLLM's call shapes, without importing vLLM.

vLLM's MXFP8 linear methods load a weight as E4M3 ``weight`` ``[N, K]`` and uint8 E8M0
``weight_scale`` ``[N, K/32]`` (row-major, not swizzled). :func:`process_weights` turns those
parameters into this library's packed weight once, at load: the values keep their bytes and
stay ``layer.weight``, the scales are rewritten in the 128x4 blocked layout as
``layer.weight_scale``, and the layer records what its calls do with their input (the
activation, :data:`ACTIVATION_ATTRIBUTE`). :func:`apply_weights` then runs one op, the op
the fusion pass matches, so that a compiled ``cat -> linear`` of vLLM's layers is staged:

- W8A16 (``"bf16"``): ``mxfp8::linear_w8a16``, the input used as it is, times the weight's
  exact E4M3 x E8M0 values, FP32 accumulation (vLLM's numerics on Hopper);
- W8A8 (``"mxfp8"``): ``mxfp8::linear``, the input quantized with RCEIL, then the MXFP8 GEMM.

Both through :func:`mxfp8_fusion.project.project`, as ``MXFP8Linear`` runs them.

The vLLM kernel class (:mod:`mxfp8_fusion.vllm.kernel`) only forwards to these functions,
so they can be tested, and run on a GPU, where vLLM is not installed.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .. import api
from ..format import GROUP, SCALE_DTYPE, VALUE_DTYPE, Activation, MXFP8Weight, fail
from ..project import project

PACKED_ATTRIBUTE = "mxfp8_fusion_packed"
"""Set to ``True`` on a layer whose weight :func:`process_weights` packed."""
ACTIVATION_ATTRIBUTE = "mxfp8_fusion_activation"
"""Set on a packed layer: its :class:`~mxfp8_fusion.format.Activation`, what its calls run."""

WEIGHT = "weight"
WEIGHT_SCALE = "weight_scale"


def check_layout(weight, weight_scale, name: str = "layer") -> None:
    """Refuse a layer this kernel cannot serve, naming the layer and the parameter.

    Expected: ``weight`` float8_e4m3fn ``[N, K]`` with K a positive multiple of 32,
    ``weight_scale`` uint8 or float8_e8m0fnu ``[N, K/32]`` on the same device.

    Raises:
        TypeError, ValueError: on any other dtype, rank, shape or device.
    """
    w, s = f"{name}.{WEIGHT}", f"{name}.{WEIGHT_SCALE}"
    for tensor, argument in ((weight, w), (weight_scale, s)):
        if not isinstance(tensor, Tensor):
            fail(TypeError, argument, "a torch.Tensor", type(tensor).__name__)
    if weight.dtype != VALUE_DTYPE:
        fail(TypeError, w, "dtype float8_e4m3fn (an MXFP8 checkpoint's values)", weight.dtype)
    if weight.dim() != 2:
        fail(ValueError, w, "a 2-D [N, K] tensor", f"shape {tuple(weight.shape)}")
    n, k = weight.shape
    if n <= 0 or k <= 0 or k % GROUP:
        fail(ValueError, w, "[N, K] with N > 0 and K a positive multiple of 32", (n, k))
    if weight_scale.dtype not in (torch.uint8, SCALE_DTYPE):
        fail(TypeError, s, "dtype uint8 or float8_e8m0fnu (E8M0 bytes)", weight_scale.dtype)
    if tuple(weight_scale.shape) != (n, k // GROUP):
        fail(
            ValueError,
            s,
            f"shape {(n, k // GROUP)}: one row-major E8M0 byte per 32 values (not swizzled)",
            tuple(weight_scale.shape),
        )
    if weight_scale.device != weight.device:
        fail(ValueError, s, f"a tensor on {weight.device}", weight_scale.device)


def process_weights(
    layer: nn.Module, name: str = "layer", activation: Activation | str = Activation.W8A8
) -> MXFP8Weight:
    """Pack ``layer.weight`` / ``layer.weight_scale`` (vLLM's layout) in place, once, for
    calls that run ``activation`` (``"mxfp8"``: W8A8, the default; ``"bf16"``: W8A16).

    ``layer.weight`` keeps its E4M3 bytes (made contiguous); ``layer.weight_scale`` becomes
    the flat blocked uint8 buffer of :class:`~mxfp8_fusion.MXFP8Weight` (the same packing
    for either activation). Calling it again on a packed layer changes nothing, its
    activation included. Returns the packed weight.

    Raises:
        TypeError, ValueError: naming ``<name>.weight`` or ``<name>.weight_scale`` when the
        layout is not vLLM's MXFP8 layout (see :func:`check_layout`), or ``activation``
        when it is not one of ``"mxfp8"`` and ``"bf16"``.
    """
    activation = Activation.of(activation)  # a typo is an error on a packed layer too
    if getattr(layer, PACKED_ATTRIBUTE, False):
        return packed_weight(layer)
    weight, weight_scale = getattr(layer, WEIGHT, None), getattr(layer, WEIGHT_SCALE, None)
    check_layout(weight, weight_scale, name)
    packed = api.pack_weight(weight.data, weight_scale.data)
    _replace(layer, WEIGHT, packed.values)
    _replace(layer, WEIGHT_SCALE, packed.raw_scales)
    setattr(layer, ACTIVATION_ATTRIBUTE, activation)
    setattr(layer, PACKED_ATTRIBUTE, True)
    return packed


def _replace(layer: nn.Module, attribute: str, tensor: Tensor) -> None:
    # A frozen Parameter: vLLM moves, shares and inspects a layer's parameters by name
    # (weight loading, tied weights), and its kernels keep their weights as Parameters.
    param = nn.Parameter(tensor, requires_grad=False)
    if attribute in layer._parameters:
        layer._parameters[attribute] = param
    else:
        setattr(layer, attribute, param)


def packed_weight(layer: nn.Module) -> MXFP8Weight:
    """The :class:`~mxfp8_fusion.MXFP8Weight` of a layer :func:`process_weights` packed.

    Raises:
        ValueError: when the layer was not packed.
    """
    if not getattr(layer, PACKED_ATTRIBUTE, False):
        fail(ValueError, "layer", "a layer packed by process_weights", type(layer).__name__)
    return MXFP8Weight(getattr(layer, WEIGHT), getattr(layer, WEIGHT_SCALE))


def activation_of(layer: nn.Module) -> Activation | None:
    """The :class:`~mxfp8_fusion.format.Activation` of a layer :func:`process_weights`
    packed; ``None`` for any other layer."""
    if not getattr(layer, PACKED_ATTRIBUTE, False):
        return None
    return getattr(layer, ACTIVATION_ATTRIBUTE)


def apply_weights(layer: nn.Module, x: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ W.T (+ bias)`` for a packed layer, with ``x`` BF16/FP16 ``[..., K]``.

    Runs the layer's activation (:func:`process_weights`): ``mxfp8::linear_w8a16`` for
    W8A16 (``x`` as it is, times the exact weight, FP32 accumulation), ``mxfp8::linear`` for
    W8A8 (``x`` quantized to MXFP8 with RCEIL, then the MXFP8 GEMM). Under torch.compile the
    op is in the graph, where the fusion pass finds it.

    Raises:
        TypeError, ValueError: on an input of the wrong dtype or width, or a bad bias.
    """
    values, scales = getattr(layer, WEIGHT), getattr(layer, WEIGHT_SCALE)
    k = values.shape[1]
    if x.shape[-1] != k:
        fail(ValueError, "x", f"{k} features (the layer's in_features)", x.shape[-1])
    if x.dtype not in (torch.bfloat16, torch.float16):
        fail(TypeError, "x", "dtype bfloat16 or float16", x.dtype)
    if bias is not None and bias.dtype != x.dtype:
        bias = bias.to(x.dtype)
    flat = x.reshape(-1, k)
    y = project((values, scales), activation_of(layer), (flat,), bias=bias)
    return y.view(*x.shape[:-1], values.shape[0])


__all__ = [
    "ACTIVATION_ATTRIBUTE",
    "PACKED_ATTRIBUTE",
    "activation_of",
    "apply_weights",
    "check_layout",
    "packed_weight",
    "process_weights",
]
