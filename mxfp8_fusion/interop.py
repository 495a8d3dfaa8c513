"""torchao interop: linears whose weight torchao quantized to MXFP8, converted as they are.

torchao's MX inference (``MXDynamicActivationMXWeightConfig``) replaces a linear's weight by
an ``MXTensor``: E4M3 ``qdata`` ``[out_features, in_features]``, E8M0 ``scale`` per 32
elements of a row (``is_swizzled_scales``: already in the 128x4 blocked layout, padded with
zeros; else row-major), and ``act_quant_kwargs`` saying how the activations are quantized.
Such a weight is an MXFP8 weight of this library's format, so :func:`mxfp8_fusion.convert`
reuses its bytes: the values as they are (same storage), the scales as they are when their
blocked bytes equal this library's layout, else re-laid into it (only the padding differs:
this library pads with scale byte 127). Nothing is requantized.

Only what computes what torchao's model computes is taken: E4M3 values, blocks of 32, and
activations quantized to E4M3 in blocks of 32 by the RCEIL rule (the rule this library
quantizes activations with, bit for bit). Other element types (MXFP4, MXFP6, E5M2), block
sizes, scale rules (FLOOR, CEIL, EVEN), weight-only quantization and other torchao tensor
types are left alone, with the reason in ``convert``'s report. With ``activation="bf16"``
(W8A16: activations never quantized) any E4M3 block-32 weight is taken, weight-only ones
included.

torchao need not be installed: a torchao tensor is recognized by its type's module, and the
``MXTensor`` class is looked up only where torchao is already imported.
"""

from __future__ import annotations

import sys

import torch
from torch import nn

from . import api, reference
from .format import GROUP, SCALE_DTYPE, VALUE_DTYPE, Activation

_MX_TENSOR_MODULE = "torchao.prototype.mx_formats.mx_tensor"


def is_torchao_tensor(t) -> bool:
    """Whether ``t`` is a torchao tensor subclass (``MXTensor``, ``NVFP4Tensor``, ...)."""
    return isinstance(t, torch.Tensor) and type(t).__module__.startswith("torchao.")


def _mx_tensor_type():
    module = sys.modules.get(_MX_TENSOR_MODULE)
    return getattr(module, "MXTensor", None)


def _name(value) -> str:
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    return str(getattr(value, "name", value))


def skip_reason(weight: torch.Tensor, activation: str = "mxfp8") -> str | None:
    """Why a torchao-quantized weight cannot be taken as this library's MXFP8 weight of a
    layer with ``activation`` (``"mxfp8"``: the activations quantized as torchao quantizes
    them; ``"bf16"``: W8A16, any torchao activation setting), or ``None`` when it can."""
    kind = type(weight).__name__
    mx_tensor = _mx_tensor_type()
    if mx_tensor is None or not isinstance(weight, mx_tensor):
        return f"weight is a torchao {kind}, not an MXFP8 MXTensor"
    if weight.elem_dtype != VALUE_DTYPE:
        return f"torchao MXTensor elements are {_name(weight.elem_dtype)}, not float8_e4m3fn"
    if weight.block_size != GROUP:
        return f"torchao MXTensor block size is {weight.block_size}, not {GROUP}"
    values = weight.qdata
    if values.dim() != 2 or values.stride(-1) != 1:
        return (
            "torchao MXTensor values are not a row-major [out_features, in_features] matrix "
            f"(shape {tuple(values.shape)}, strides {values.stride()})"
        )
    if values.device.type == "meta":
        return "weight is on the meta device"
    act = weight.act_quant_kwargs
    if not Activation.of(activation).quantized:
        return None  # W8A16: the activations are not quantized, whatever torchao would do
    if act is None:
        return (
            "torchao weight-only MX quantization: its activations stay in high precision "
            "(convert(..., activation='bf16') keeps them so, W8A16)"
        )
    if act.elem_dtype != VALUE_DTYPE or act.block_size != GROUP:
        return (
            f"torchao quantizes the activations to {_name(act.elem_dtype)} in blocks of "
            f"{act.block_size}; this library to float8_e4m3fn in blocks of {GROUP}"
        )
    if _name(act.scaling_mode).upper() != "RCEIL":
        return (
            f"torchao scales the activations by the {_name(act.scaling_mode)} rule; this "
            "library quantizes activations by RCEIL only"
        )
    return None


def from_torchao(
    linear: nn.Linear, activation: str = "mxfp8"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(values, scales, bias)`` of ``linear``'s torchao MXFP8 weight, in this library's
    format: what :meth:`~mxfp8_fusion.MXFP8Linear.from_linear` builds the layer from.

    The values tensor is the ``MXTensor``'s own ``qdata``; the scales are its ``scale``
    buffer when that already is this library's blocked layout byte for byte, else the
    same bytes re-laid into it.

    Raises:
        TypeError: when the weight does not qualify (:func:`skip_reason` says why).
    """
    weight = linear.weight
    reason = skip_reason(weight, activation)
    if reason is not None:
        raise TypeError(f"linear: {reason}")
    values = weight.qdata.detach()
    n, k = values.shape
    groups = k // GROUP
    torchao_scales = weight.scale.detach().contiguous()
    if weight.is_swizzled_scales:
        flat = torchao_scales.reshape(-1).view(torch.uint8)
        rows = reference.from_blocked(flat, n, groups)
    else:
        flat = None
        rows = torchao_scales.reshape(n, groups).view(torch.uint8)
    # pack_weight checks the checkpoint and lays out the scales (padding 127, and the NaN
    # scale for a block holding a NaN value, which torchao's own quantizer already gives)
    packed = api.pack_weight(values, rows)
    scales = packed.scales
    if flat is not None and torch.equal(scales.view(torch.uint8), flat):
        scales = flat.view(SCALE_DTYPE)  # already this library's layout: the same storage
    bias = linear.bias.detach() if linear.bias is not None else None
    return packed.values, scales, bias


__all__ = ["from_torchao", "is_torchao_tensor", "skip_reason"]
