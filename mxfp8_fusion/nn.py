"""``MXFP8Linear`` and ``convert``: swap ``nn.Linear`` layers for MXFP8 ones."""

from __future__ import annotations

import logging

from torch import Tensor, nn

from . import ops
from .api import pack_weight
from .format import GROUP, SOURCE_DTYPES

log = logging.getLogger("mxfp8_fusion")


class MXFP8Linear(nn.Module):
    """A linear layer whose weight is stored as MXFP8 and whose input is quantized to MXFP8
    on the fly (one-shot ``mxfp8::linear``). Inputs are BF16/FP16 ``[..., in_features]``;
    the output has the input's dtype and leading dims.
    """

    def __init__(self, weight_values: Tensor, weight_scales: Tensor, bias: Tensor | None = None):
        super().__init__()
        self.out_features, self.in_features = weight_values.shape
        self.register_buffer("weight_values", weight_values)
        self.register_buffer("weight_scales", weight_scales)
        self.bias = (
            nn.Parameter(bias.detach().clone(), requires_grad=False) if bias is not None else None
        )

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> MXFP8Linear:
        """Quantize an ``nn.Linear`` with a BF16/FP16 weight (in_features a multiple of 32)."""
        packed = pack_weight(linear.weight.detach())
        return cls(packed.values, packed.scales, linear.bias)

    @classmethod
    def from_checkpoint(
        cls, values: Tensor, scales: Tensor, bias: Tensor | None = None
    ) -> MXFP8Linear:
        """Build from checkpoint tensors: E4M3 ``[N, K]`` and row-major ``[N, K/32]`` scales."""
        packed = pack_weight(values, scales)
        return cls(packed.values, packed.scales, bias)

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype not in SOURCE_DTYPES:
            raise TypeError(f"x: expected dtype bfloat16 or float16, got {x.dtype}")
        if x.shape[-1] != self.in_features:
            raise ValueError(f"x: expected {self.in_features} features, got {x.shape[-1]}")
        flat = x.reshape(-1, self.in_features)
        y = ops.call(ops.linear, flat, self.weight_values, self.weight_scales, self.bias)
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def _skip_reason(linear: nn.Linear) -> str | None:
    if linear.weight.dtype not in SOURCE_DTYPES:
        return f"weight dtype {linear.weight.dtype} is not bfloat16 or float16"
    if linear.in_features % GROUP:
        return f"in_features {linear.in_features} is not a multiple of {GROUP}"
    if linear.weight.device.type == "meta":
        return "weight is on the meta device"
    return None


def convert(model: nn.Module, report: dict[str, str] | None = None) -> nn.Module:
    """Replace every eligible ``nn.Linear`` in ``model`` (in place) by an :class:`MXFP8Linear`.

    Eligible: BF16/FP16 weight, ``in_features`` a multiple of 32. Other layers are left alone;
    each skipped layer is logged at INFO on the ``mxfp8_fusion`` logger and, when ``report``
    is given, recorded there as ``{qualified name: reason}`` (converted layers map to
    ``"converted"``). Returns ``model``.
    """
    if isinstance(model, nn.Linear) and not isinstance(model, MXFP8Linear):
        raise TypeError(
            "model: expected a module containing nn.Linear layers, got a bare nn.Linear; use MXFP8Linear.from_linear"
        )
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if type(child) is not nn.Linear:
                continue
            qualified = f"{name}.{child_name}" if name else child_name
            reason = _skip_reason(child)
            if reason is None:
                setattr(module, child_name, MXFP8Linear.from_linear(child))
                reason = "converted"
            else:
                log.info("convert: skipped %s: %s", qualified, reason)
            if report is not None:
                report[qualified] = reason
    return model


__all__ = ["MXFP8Linear", "convert"]
