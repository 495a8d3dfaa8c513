"""``MXFP8Linear`` and ``convert``: swap ``nn.Linear`` layers for MXFP8 ones."""

from __future__ import annotations

import logging

import torch
from torch import Tensor, nn

from . import interop, ops
from .api import _fail, _require, _require_tensor, pack_weight
from .format import GROUP, SCALE_DTYPE, SOURCE_DTYPES, VALUE_DTYPE, MXFP8Weight, scale_bytes

log = logging.getLogger("mxfp8_fusion")

# The buffers that hold MXFP8 bytes, and their dtypes.
_PACKED = {"weight_values": VALUE_DTYPE, "weight_scales": SCALE_DTYPE}


class MXFP8Linear(nn.Module):
    """A linear layer whose weight is stored as MXFP8 and whose input is quantized to MXFP8
    on the fly (one-shot ``mxfp8::linear``).

    Args:
        weight_values: ``float8_e4m3fn`` ``[out_features, in_features]``, contiguous,
            ``in_features`` a multiple of 32.
        weight_scales: the flat blocked scale buffer of those values, ``float8_e8m0fnu`` or
            its ``uint8`` bytes, as :func:`pack_weight` returns it. Row-major
            ``[out_features, in_features / 32]`` checkpoint scales go through
            :meth:`from_checkpoint`.
        bias: optional ``[out_features]`` floating-point tensor on the values' device (copied).

    Inputs are BF16/FP16 ``[..., in_features]``; the output has the input's dtype and
    leading dims. Under ``torch.autocast`` the input is first cast to the autocast dtype, as
    ``nn.Linear``'s is; an FP32 input outside autocast is a ``TypeError``.

    Casts such as ``.to(torch.bfloat16)``, ``.half()`` or ``.float()`` cast the bias only:
    the MXFP8 values and scales keep their bytes. Device moves (``.to(device)``, ``.cuda()``,
    ``.to("meta")``, ``to_empty``) move all of them. ``Module.type``, which would convert
    the MXFP8 bytes, raises ``TypeError``.

    ``state_dict`` holds ``bias``, ``weight_values`` and the blocked ``weight_scales``.
    ``load_state_dict`` also takes both as ``uint8`` bytes, reinterpreted, never converted;
    another dtype or shape is refused with a ``TypeError`` / ``ValueError`` naming the key.

    Raises:
        TypeError, ValueError: on a wrong type, dtype, shape, layout or device.
    """

    def __init__(self, weight_values: Tensor, weight_scales: Tensor, bias: Tensor | None = None):
        super().__init__()
        values, scales = _check_arguments(weight_values, weight_scales, bias)
        self.out_features, self.in_features = values.shape
        self.register_buffer("weight_values", values)
        self.register_buffer("weight_scales", scales)
        self.bias = (
            nn.Parameter(bias.detach().clone(), requires_grad=False) if bias is not None else None
        )

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> MXFP8Linear:
        """Quantize an ``nn.Linear`` with a BF16/FP16 weight (in_features a multiple of 32);
        a torchao MXFP8 weight is taken as it is (:mod:`mxfp8_fusion.interop`)."""
        if not isinstance(linear, nn.Linear):
            _fail(TypeError, "linear", "an nn.Linear", type(linear).__name__)
        if interop.is_torchao_tensor(linear.weight):
            return cls(*interop.from_torchao(linear))
        packed = pack_weight(linear.weight)
        return cls(packed.values, packed.scales, linear.bias)

    @classmethod
    def from_checkpoint(
        cls, values: Tensor, scales: Tensor, bias: Tensor | None = None
    ) -> MXFP8Linear:
        """Build from checkpoint tensors: E4M3 ``[N, K]`` and row-major ``[N, K/32]`` scales."""
        packed = pack_weight(values, scales)
        return cls(packed.values, packed.scales, bias)

    @property
    def weight(self) -> MXFP8Weight:
        """The packed weight, for the eager API (:func:`mm`, :func:`mm_quantized`)."""
        return MXFP8Weight(self.weight_values, self.weight_scales)

    def forward(self, x: Tensor) -> Tensor:
        # The any-autocast test first: it costs ~0.2 us where the per-device one costs ~1 us.
        if torch._C._is_any_autocast_enabled() and x.is_floating_point():
            device = x.device.type
            if torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device):
                x = x.to(torch.get_autocast_dtype(device))  # as autocast casts nn.Linear's input
        if x.dtype not in SOURCE_DTYPES:
            raise TypeError(
                f"x: expected dtype bfloat16 or float16 (or an input under torch.autocast), got {x.dtype}"
            )
        if x.shape[-1] != self.in_features:
            raise ValueError(f"x: expected {self.in_features} features, got {x.shape[-1]}")
        flat = x.reshape(-1, self.in_features)
        y = ops.call(ops.linear, flat, self.weight_values, self.weight_scales, self.bias)
        return y.view(*x.shape[:-1], self.out_features)

    def _apply(self, fn, recurse=True):
        # nn.Module._apply casts every floating-point tensor, and float8 counts as one: under
        # .to(dtype) or .half() the MXFP8 bytes would be converted as numbers. They go through
        # fn as uint8 instead, which dtype casts leave alone and device moves still move.
        packed = {name: self._buffers[name] for name in _PACKED}
        applied = {name: fn(t.view(torch.uint8)) for name, t in packed.items()}
        if any(t.dtype != torch.uint8 for t in applied.values()):
            raise TypeError(
                "MXFP8Linear: this conversion (Module.type) would convert the MXFP8 weight's "
                "bytes; use .to(dtype), which casts the bias and leaves the weight alone"
            )
        self._buffers.update(dict.fromkeys(packed))  # nn.Module._apply skips None buffers
        try:
            super()._apply(fn, recurse)
        except BaseException:
            self._buffers.update(packed)
            raise
        self._buffers.update({name: t.view(_PACKED[name]) for name, t in applied.items()})
        return self

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # Checkpoints carry MXFP8 tensors as uint8 bytes, and copy_ into a float8 buffer
        # would convert them as numbers: bytes are reinterpreted, any other dtype refused.
        for name, dtype in _PACKED.items():
            key = prefix + name
            if key not in state_dict:
                continue  # nn.Module reports the missing key
            t, argument, shape = state_dict[key], f"state_dict[{key!r}]", self._buffers[name].shape
            _require_tensor(t, argument)
            _require(
                t.dtype in (dtype, torch.uint8),
                TypeError,
                argument,
                f"dtype {dtype} or uint8 bytes",
                t.dtype,
            )
            _require(
                t.shape == shape,
                ValueError,
                argument,
                f"shape {tuple(shape)}, as state_dict() gives it",
                tuple(t.shape),
            )
            state_dict[key] = t.contiguous().view(dtype)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def _check_arguments(values, scales, bias) -> tuple[Tensor, Tensor]:
    """The constructor's checks (for the weight, those :func:`pack_weight` makes of tensors
    that are already packed). Returns values and scales detached, the scales as e8m0."""
    _require_tensor(values, "weight_values")
    _require(
        values.dtype == VALUE_DTYPE, TypeError, "weight_values", "dtype float8_e4m3fn", values.dtype
    )
    shape = tuple(values.shape)
    _require(
        values.dim() == 2 and values.is_contiguous(),
        ValueError,
        "weight_values",
        "a contiguous 2-D tensor",
        f"shape {shape}, stride {values.stride()}",
    )
    n, k = shape
    _require(
        n > 0 and k > 0 and k % GROUP == 0,
        ValueError,
        "weight_values",
        "[N > 0, K] with K a positive multiple of 32",
        f"shape {shape}",
    )
    _require_tensor(scales, "weight_scales")
    _require(
        scales.dtype in (SCALE_DTYPE, torch.uint8),
        TypeError,
        "weight_scales",
        "dtype float8_e8m0fnu or uint8",
        scales.dtype,
    )
    size = scale_bytes(n, k)
    if scales.dim() != 1 or scales.numel() != size or not scales.is_contiguous():
        _fail(
            ValueError,
            "weight_scales",
            f"the contiguous flat blocked buffer of {size} scales for values of shape {shape} "
            "(for row-major [N, K/32] checkpoint scales use MXFP8Linear.from_checkpoint)",
            f"shape {tuple(scales.shape)}",
        )
    _require(
        scales.device == values.device,
        ValueError,
        "weight_scales",
        f"a tensor on {values.device}",
        scales.device,
    )
    if bias is not None:
        _require_tensor(bias, "bias")
        _require(tuple(bias.shape) == (n,), ValueError, "bias", f"shape ({n},)", tuple(bias.shape))
        _require(bias.is_floating_point(), TypeError, "bias", "a floating-point dtype", bias.dtype)
        _require(
            bias.device == values.device,
            ValueError,
            "bias",
            f"a tensor on {values.device}",
            bias.device,
        )
    return values.detach(), scales.detach().view(SCALE_DTYPE)


def _skip_reason(linear: nn.Linear) -> str | None:
    if type(linear) is not nn.Linear:
        # a subclass's forward may do more than x @ W.T + b (LoRA, MultiheadAttention's out_proj)
        return f"{type(linear).__name__} is a subclass of nn.Linear; only nn.Linear is converted"
    if interop.is_torchao_tensor(linear.weight):
        return interop.skip_reason(linear.weight)
    if linear.weight.dtype not in SOURCE_DTYPES:
        return f"weight dtype {linear.weight.dtype} is not bfloat16 or float16"
    if linear.in_features % GROUP:
        return f"in_features {linear.in_features} is not a multiple of {GROUP}"
    if linear.weight.device.type == "meta":
        return "weight is on the meta device"
    return None


def convert(model: nn.Module, report: dict[str, str] | None = None) -> nn.Module:
    """Replace every eligible ``nn.Linear`` in ``model`` (in place) by an :class:`MXFP8Linear`.

    Eligible: an ``nn.Linear`` itself (not a subclass) with a BF16/FP16 weight and
    ``in_features`` a multiple of 32, or with a torchao MXFP8 weight (taken without
    requantizing, :mod:`mxfp8_fusion.interop`). A layer reachable under several names is
    converted once and stays shared. Other layers are left alone; each skipped layer is logged at INFO
    on the ``mxfp8_fusion`` logger and, when ``report`` is given, recorded there as
    ``{qualified name: reason}`` (converted layers map to ``"converted"``). Returns ``model``.

    Raises:
        TypeError: if ``model`` is not an ``nn.Module`` or is a bare ``nn.Linear``, or
            ``report`` is not a dict.
    """
    if not isinstance(model, nn.Module):
        _fail(TypeError, "model", "an nn.Module", type(model).__name__)
    if isinstance(model, nn.Linear):
        raise TypeError(
            "model: expected a module containing nn.Linear layers, got a bare nn.Linear; use MXFP8Linear.from_linear"
        )
    if report is not None and not isinstance(report, dict):
        _fail(TypeError, "report", "a dict or None", type(report).__name__)
    converted: dict[nn.Linear, MXFP8Linear] = {}
    for name, module in list(model.named_modules()):
        # _modules, not named_children(): that lists a child held under two names only once
        for child_name, child in list(module._modules.items()):
            if not isinstance(child, nn.Linear):
                continue
            qualified = f"{name}.{child_name}" if name else child_name
            reason = _skip_reason(child)
            if reason is None:
                if child not in converted:
                    converted[child] = MXFP8Linear.from_linear(child)
                setattr(module, child_name, converted[child])
                reason = "converted"
            else:
                log.info("convert: skipped %s: %s", qualified, reason)
            if report is not None:
                report[qualified] = reason
    return model


__all__ = ["MXFP8Linear", "convert"]
