"""``MXFP8Linear`` and ``convert``: swap ``nn.Linear`` layers for MXFP8 ones."""

from __future__ import annotations

import logging
import warnings

import torch
from torch import Tensor, nn

from . import interop
from .api import pack_weight
from .checks import require, require_tensor
from .format import (
    GROUP,
    SCALE_DTYPE,
    SOURCE_DTYPES,
    VALUE_DTYPE,
    Activation,
    MXFP8Weight,
    check_activation,
    fail,
    scale_bytes,
)
from .project import project

log = logging.getLogger("mxfp8_fusion")

# The buffers that hold MXFP8 bytes, and their dtypes.
_PACKED = {"weight_values": VALUE_DTYPE, "weight_scales": SCALE_DTYPE}
# What forward takes: the kernels' dtypes, and FP32 as torchao's MX layers take it (quantized
# from FP32; no kernel here reads it, so it runs the plain-torch reference).
_INPUT_DTYPES = (*SOURCE_DTYPES, torch.float32)


class MXFP8Linear(nn.Module):
    """A linear layer whose weight is stored as MXFP8; its input is quantized to MXFP8 on the
    fly (``activation="mxfp8"``, W8A8: the one-shot ``mxfp8::linear``) or multiplied as it
    is (``activation="bf16"``, W8A16: ``mxfp8::linear_w8a16``).

    Args:
        weight_values: ``float8_e4m3fn`` ``[out_features, in_features]``, contiguous,
            ``in_features`` a multiple of 32.
        weight_scales: the flat blocked scale buffer of those values, ``float8_e8m0fnu`` or
            its ``uint8`` bytes, as :func:`pack_weight` returns it. Row-major
            ``[out_features, in_features / 32]`` checkpoint scales go through
            :meth:`from_checkpoint`.
        bias: optional ``[out_features]`` floating-point tensor on the values' device (copied).
        activation: ``"mxfp8"`` (the default, W8A8: the input quantized by the RCEIL rule,
            the numerics of MXFP8 on every arch) or ``"bf16"`` (W8A16: the input used as it
            is, times the weight's exact E4M3 x E8M0 values, summed in FP32; the numerics of
            a BF16 linear holding the dequantized weight, and of vLLM's MXFP8 kernel on
            Hopper). FP16 inputs are used as they are too. Under ``torch.compile`` with the
            ``mxfp8_fusion`` backend, a W8A16 layer reads a concatenated input's slices
            straight from where they are: no concatenation and no MXFP8 copy.

    Inputs are BF16, FP16 or FP32 ``[..., in_features]``; the output has the input's dtype
    and leading dims. Under ``torch.autocast`` the input is first cast to the autocast
    dtype, as ``nn.Linear``'s is. An FP32 input (a model cast with ``.float()``, say) is
    quantized from FP32, as torchao's ``to_mx`` does, and summed into an FP32 output by the
    plain-torch reference: the kernels read and write BF16/FP16 only (on CUDA a one-time
    warning says so). Other dtypes are a ``TypeError``.

    Casts such as ``.to(torch.bfloat16)``, ``.half()`` or ``.float()`` cast the bias only:
    the MXFP8 values and scales keep their bytes. Device moves (``.to(device)``, ``.cuda()``,
    ``.to("meta")``, ``to_empty``) move all of them. ``Module.type``, which would convert
    the MXFP8 bytes, raises ``TypeError``.

    ``state_dict`` holds ``bias``, ``weight_values`` and the blocked ``weight_scales``, for
    either ``activation`` (a setting of the layer, like ``nn.Linear``'s ``bias`` flag).
    ``load_state_dict`` also takes both as ``uint8`` bytes, reinterpreted, never converted;
    another dtype or shape is refused with a ``TypeError`` / ``ValueError`` naming the key.
    It also takes an ``nn.Linear`` checkpoint's BF16/FP16 ``weight`` and quantizes it as
    :func:`convert` does, so a BF16 checkpoint loads into a converted model.

    Raises:
        TypeError, ValueError: on a wrong type, dtype, shape, layout or device.
    """

    def __init__(
        self,
        weight_values: Tensor,
        weight_scales: Tensor,
        bias: Tensor | None = None,
        activation: Activation | str = Activation.W8A8,
    ):
        super().__init__()
        values, scales = _check_arguments(weight_values, weight_scales, bias)
        self.activation = check_activation(activation)
        self.out_features, self.in_features = values.shape
        self.register_buffer("weight_values", values)
        self.register_buffer("weight_scales", scales)
        self.bias = (
            nn.Parameter(bias.detach().clone(), requires_grad=False) if bias is not None else None
        )

    @classmethod
    def from_linear(
        cls, linear: nn.Linear, activation: Activation | str = Activation.W8A8
    ) -> MXFP8Linear:
        """Quantize an ``nn.Linear`` with a BF16/FP16 weight (in_features a multiple of 32);
        a torchao MXFP8 weight is taken as it is (:mod:`mxfp8_fusion.interop`)."""
        if not isinstance(linear, nn.Linear):
            fail(TypeError, "linear", "an nn.Linear", type(linear).__name__)
        activation = check_activation(activation)
        if interop.is_torchao_tensor(linear.weight):
            return cls(*interop.from_torchao(linear, activation), activation=activation)
        packed = pack_weight(linear.weight)
        return cls(packed.values, packed.scales, linear.bias, activation)

    @classmethod
    def from_checkpoint(
        cls,
        values: Tensor,
        scales: Tensor,
        bias: Tensor | None = None,
        activation: Activation | str = Activation.W8A8,
    ) -> MXFP8Linear:
        """Build from checkpoint tensors: E4M3 ``[N, K]`` and row-major ``[N, K/32]`` scales."""
        activation = check_activation(activation)
        packed = pack_weight(values, scales)
        return cls(packed.values, packed.scales, bias, activation)

    @property
    def weight(self) -> MXFP8Weight:
        """The packed weight, for the eager API (:func:`mm`, :func:`mm_quantized`)."""
        return MXFP8Weight(self.weight_values, self.weight_scales)

    def forward(self, x: Tensor) -> Tensor:
        require_tensor(x, "x")
        # The any-autocast test first: it costs ~0.2 us where the per-device one costs ~1 us.
        if torch._C._is_any_autocast_enabled() and x.is_floating_point():
            device = x.device.type
            if torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device):
                x = x.to(torch.get_autocast_dtype(device))  # as autocast casts nn.Linear's input
        if x.dtype not in _INPUT_DTYPES:
            raise TypeError(
                f"x: expected dtype bfloat16, float16 or float32 (or an input under "
                f"torch.autocast), got {x.dtype}"
            )
        if x.shape[-1] != self.in_features:
            raise ValueError(f"x: expected {self.in_features} features, got {x.shape[-1]}")
        flat = x.reshape(-1, self.in_features)
        weight = (self.weight_values, self.weight_scales)
        y = project(weight, self.activation, (flat,), bias=self.bias)
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
        if prefix + "weight" in state_dict:
            self._quantize_loaded_weight(state_dict, prefix)
        # Checkpoints carry MXFP8 tensors as uint8 bytes, and copy_ into a float8 buffer
        # would convert them as numbers: bytes are reinterpreted, any other dtype refused.
        for name, dtype in _PACKED.items():
            key = prefix + name
            if key not in state_dict:
                continue  # nn.Module reports the missing key
            t, argument, shape = state_dict[key], f"state_dict[{key!r}]", self._buffers[name].shape
            require_tensor(t, argument)
            require(
                t.dtype in (dtype, torch.uint8),
                TypeError,
                argument,
                f"dtype {dtype} or uint8 bytes",
                t.dtype,
            )
            require(
                t.shape == shape,
                ValueError,
                argument,
                f"shape {tuple(shape)}, as state_dict() gives it",
                tuple(t.shape),
            )
            state_dict[key] = t.contiguous().view(dtype)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _quantize_loaded_weight(self, state_dict, prefix: str) -> None:
        """A BF16/FP16 ``weight`` entry (the ``nn.Linear`` checkpoint of a converted model)
        becomes ``weight_values`` and ``weight_scales``, quantized as ``convert`` would."""
        key = prefix + "weight"
        packed_keys = [prefix + name for name in _PACKED]
        if any(k in state_dict for k in packed_keys):
            raise ValueError(
                f"state_dict: both {key!r} (a BF16/FP16 weight to quantize) and "
                f"{' / '.join(map(repr, packed_keys))} (MXFP8 bytes) are given; keep one"
            )
        weight, argument = state_dict.pop(key), f"state_dict[{key!r}]"
        require_tensor(weight, argument)
        require(
            weight.dtype in SOURCE_DTYPES,
            TypeError,
            argument,
            "dtype bfloat16 or float16 (an nn.Linear weight, quantized on load)",
            weight.dtype,
        )
        shape = (self.out_features, self.in_features)
        require(
            tuple(weight.shape) == shape,
            ValueError,
            argument,
            f"shape {shape}",
            tuple(weight.shape),
        )
        packed = pack_weight(weight.detach())
        state_dict[packed_keys[0]], state_dict[packed_keys[1]] = packed.values, packed.scales

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, activation={self.activation.value!r}"
        )


def _check_arguments(values, scales, bias) -> tuple[Tensor, Tensor]:
    """The constructor's checks (for the weight, those :func:`pack_weight` makes of tensors
    that are already packed). Returns values and scales detached, the scales as e8m0."""
    require_tensor(values, "weight_values")
    require(
        values.dtype == VALUE_DTYPE, TypeError, "weight_values", "dtype float8_e4m3fn", values.dtype
    )
    shape = tuple(values.shape)
    require(
        values.dim() == 2 and values.is_contiguous(),
        ValueError,
        "weight_values",
        "a contiguous 2-D tensor",
        f"shape {shape}, stride {values.stride()}",
    )
    n, k = shape
    require(
        n > 0 and k > 0 and k % GROUP == 0,
        ValueError,
        "weight_values",
        "[N > 0, K] with K a positive multiple of 32",
        f"shape {shape}",
    )
    require_tensor(scales, "weight_scales")
    require(
        scales.dtype in (SCALE_DTYPE, torch.uint8),
        TypeError,
        "weight_scales",
        "dtype float8_e8m0fnu or uint8",
        scales.dtype,
    )
    size = scale_bytes(n, k)
    if scales.dim() != 1 or scales.numel() != size or not scales.is_contiguous():
        fail(
            ValueError,
            "weight_scales",
            f"the contiguous flat blocked buffer of {size} scales for values of shape {shape} "
            "(for row-major [N, K/32] checkpoint scales use MXFP8Linear.from_checkpoint)",
            f"shape {tuple(scales.shape)}",
        )
    require(
        scales.device == values.device,
        ValueError,
        "weight_scales",
        f"a tensor on {values.device}",
        scales.device,
    )
    if bias is not None:
        require_tensor(bias, "bias")
        require(tuple(bias.shape) == (n,), ValueError, "bias", f"shape ({n},)", tuple(bias.shape))
        require(bias.is_floating_point(), TypeError, "bias", "a floating-point dtype", bias.dtype)
        require(
            bias.device == values.device,
            ValueError,
            "bias",
            f"a tensor on {values.device}",
            bias.device,
        )
    return values.detach(), scales.detach().view(SCALE_DTYPE)


def _skip_reason(linear: nn.Linear, activation: Activation = Activation.W8A8) -> str | None:
    if type(linear) is not nn.Linear:
        # a subclass's forward may do more than x @ W.T + b (LoRA, MultiheadAttention's out_proj)
        return f"{type(linear).__name__} is a subclass of nn.Linear; only nn.Linear is converted"
    if interop.is_torchao_tensor(linear.weight):
        return interop.skip_reason(linear.weight, activation)
    if linear.weight.dtype not in SOURCE_DTYPES:
        return (
            f"weight dtype {linear.weight.dtype} is not bfloat16 or float16 (cast the model "
            "first, e.g. model.to(torch.bfloat16))"
        )
    if linear.in_features % GROUP:
        return f"in_features {linear.in_features} is not a multiple of {GROUP}"
    if linear.weight.device.type == "meta":
        return "weight is on the meta device"
    return None


def convert(
    model: nn.Module, report: dict[str, str] | None = None, activation: str = "mxfp8"
) -> nn.Module:
    """Replace every eligible ``nn.Linear`` in ``model`` (in place) by an :class:`MXFP8Linear`
    with ``activation`` (``"mxfp8"``, the default: W8A8; ``"bf16"``: W8A16, see
    :class:`MXFP8Linear`). The weights are quantized alike either way.

    Eligible: an ``nn.Linear`` itself (not a subclass) with a BF16/FP16 weight and
    ``in_features`` a multiple of 32, or with a torchao MXFP8 weight (taken without
    requantizing, :mod:`mxfp8_fusion.interop`). A layer reachable under several names is
    converted once and stays shared. Other layers are left alone; each skipped layer is logged at INFO
    on the ``mxfp8_fusion`` logger and, when ``report`` is given, recorded there as
    ``{qualified name: reason}`` (converted layers map to ``"converted"``). When any layer
    is skipped, or the model has none, a ``UserWarning`` says which and why. Returns ``model``.

    Raises:
        TypeError: if ``model`` is not an ``nn.Module`` or is a bare ``nn.Linear``, or
            ``report`` is not a dict.
        TypeError, ValueError: ``activation`` is not one of them.
    """
    activation = check_activation(activation)
    if not isinstance(model, nn.Module):
        fail(TypeError, "model", "an nn.Module", type(model).__name__)
    if isinstance(model, nn.Linear):
        raise TypeError(
            "model: expected a module containing nn.Linear layers, got a bare nn.Linear; use MXFP8Linear.from_linear"
        )
    if report is not None and not isinstance(report, dict):
        fail(TypeError, "report", "a dict or None", type(report).__name__)
    converted: dict[nn.Linear, MXFP8Linear] = {}
    skipped: dict[str, str] = {}
    names = 0
    for module, child_name, qualified, child in _linears(model):
        reason = _skip_reason(child, activation)
        if reason is None:
            if child not in converted:
                converted[child] = MXFP8Linear.from_linear(child, activation)
            setattr(module, child_name, converted[child])
            reason = "converted"
            names += 1
        else:
            log.info("convert: skipped %s: %s", qualified, reason)
            skipped[qualified] = reason
        if report is not None:
            report[qualified] = reason
    if skipped or not names:
        message = _unconverted_message(names, skipped, model)
        warnings.warn(message, UserWarning, stacklevel=2)
    return model


def _linears(model: nn.Module):
    """``(parent, attribute, qualified name, layer)`` of every ``nn.Linear`` (subclasses
    too) in ``model``, once per name it is held under."""
    for name, module in list(model.named_modules()):
        # _modules, not named_children(): that lists a child held under two names only once
        for child_name, child in list(module._modules.items()):
            if isinstance(child, nn.Linear):
                yield module, child_name, f"{name}.{child_name}" if name else child_name, child


def _unconverted_message(converted: int, skipped: dict[str, str], model: nn.Module) -> str:
    if not skipped:
        done = sum(isinstance(m, MXFP8Linear) for m in model.modules())
        if done:  # convert ran before: its layers are kept as they are
            return (
                f"mxfp8_fusion.convert: the model is already converted ({done} MXFP8Linear "
                "layer(s), kept as they are); nothing was converted"
            )
        return "mxfp8_fusion.convert: the model has no nn.Linear layer; nothing was converted"
    total = converted + len(skipped)
    head = (
        f"mxfp8_fusion.convert: none of the model's {total} nn.Linear layer(s) was converted"
        if not converted
        else f"mxfp8_fusion.convert: converted {converted} of {total} nn.Linear layers"
    )
    return head + "; left unchanged:" + _grouped(skipped)


def _grouped(reasons: dict[str, str], shown: int = 3) -> str:
    """``reasons`` ({name: reason}) as one line per reason, naming a few layers each."""
    by_reason: dict[str, list[str]] = {}
    for name, reason in reasons.items():
        by_reason.setdefault(reason, []).append(name)
    lines = []
    for reason, names in by_reason.items():
        more = f" and {len(names) - shown} more" if len(names) > shown else ""
        lines.append(f"\n  - {', '.join(names[:shown])}{more}: {reason}")
    return "".join(lines)


def why_no_mxfp8(model: nn.Module) -> str | None:
    """Why ``model`` holds no :class:`MXFP8Linear` although convert was called, in a
    sentence; ``None`` when it holds one or convert would swap one (for
    :func:`mxfp8_fusion.explain`)."""
    if any(isinstance(m, MXFP8Linear) for m in model.modules()):
        return None
    if isinstance(model, nn.Linear):
        reason = _skip_reason(model)
        return "the model is a bare nn.Linear, which convert does not swap; " + (
            "MXFP8Linear.from_linear(model) makes it an MXFP8 layer"
            if reason is None
            else f"nor can it be an MXFP8 layer: {reason}"
        )
    reasons = {qualified: _skip_reason(child) for _, _, qualified, child in _linears(model)}
    if not reasons:
        return "the model has no MXFP8Linear and no nn.Linear layer that convert could swap"
    skipped = {name: r for name, r in reasons.items() if r is not None}
    if len(skipped) < len(reasons):
        return None  # convert would swap some: the report's own hint says to call it
    return (
        "the model has no MXFP8Linear, and convert would leave each of its nn.Linear layers "
        "unchanged:" + _grouped(skipped)
    )


__all__ = ["MXFP8Linear", "convert"]
