"""Humming, vLLM's MXFP8 linear kernel on SM90, called as vLLM 0.34 calls it.

vLLM 0.34's ``HummingMxfp8LinearKernel`` (``kernels/linear/mxfp8/humming.py``) and its helpers
(``layers/quantization/utils/humming/linear.py``, ``schema.py``) do, per MXFP8 linear:

1. the E4M3 weight ``[N, K]`` viewed as int32 ``[N, K/4]``, the E8M0 scales ``[N, K/32]``
   viewed as ``float8_e8m0fnu``;
2. the weight schema from :data:`WEIGHT_CONFIG`, converted to Humming's standard;
3. the input schema of ``kMxfp8Dynamic`` (:func:`mxfp8_dynamic_request`), then
   ``check_and_fallback_input_schema`` (:func:`vllm_input_choice` makes the same decision);
4. ``prepare_and_transform_humming_tensors`` padding N to 256 and K to 128;
5. per call, ``humming_forward`` with :data:`COMPUTE_CONFIG` and locks ``zeros(SMs * 8)``.

:class:`HummingLinear` runs those steps on the ``humming`` package (``humming-kernels``,
imported on first use: it needs a CUDA device); the schema decision and the kernel-interval
lookup are plain functions, testable on a CPU.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import torch

WEIGHT_CONFIG = {
    "quant_method": "humming",
    "dtype": "float8e4m3",
    "scale_dtype": "float8e8m0",
    "group_size": 32,
    "weight_scale_type": "group",
}
# VLLM_BATCH_INVARIANT and VLLM_HUMMING_USE_F16_ACCUM at their defaults
COMPUTE_CONFIG = {"use_batch_invariant": False, "use_f16_accum": False, "gemm_type": "dense"}
PAD_N, PAD_K = 256, 128
LOCKS_PER_SM = 8
PARAM_DTYPE = "bfloat16"


@dataclass(frozen=True)
class InputChoice:
    """A Humming input schema as plain values. ``a_dtype`` None: the layer's 16-bit dtype
    (no input quantization); ``mode`` is Humming's ``InputQuantizationMode`` value."""

    a_dtype: str | None = None
    group_size: int = 0
    scale_dtype: str | None = None
    mode: str | None = None

    @property
    def bits(self) -> int:
        return dtype_bits(self.a_dtype)


def dtype_bits(name: str | None) -> int:
    """Bits of a Humming dtype name (``float8e4m3`` 8, ``int4`` 4, ``bfloat16`` 16); None 16."""
    if name is None:
        return 16
    found = re.search(r"(?:int|float)(\d+)", name)
    if found is None:
        raise ValueError(f"not a Humming dtype name: {name!r}")
    return int(found.group(1))


def mxfp8_dynamic_request() -> InputChoice:
    """What vLLM's ``quant_key_to_input_schema(kMxfp8Dynamic)`` asks for: E4M3 activations,
    one E8M0 scale per 32 along K, computed per call (dynamic group)."""
    return InputChoice("float8e4m3", 32, "float8e8m0", "dynamic_group")


# vLLM 0.34 schema.py: the activation dtypes tried after the requested one, in order.
FALLBACK_ORDER = {
    "float8e5m2": ("float8e4m3", "float8e3m4", "int8"),
    "float8e4m3": ("float8e3m4", "int8"),
    "float8e3m4": ("float8e4m3", "int8"),
    "float4e2m1": ("float8e4m3", "float8e3m4", "int8"),
    "float4e0m3": ("int4", "float8e4m3", "float8e3m4", "int8"),
    "int8": ("float8e4m3", "float8e3m4"),
    "int4": ("int8", "float8e4m3", "float8e3m4"),
}


def slow_on(name: str | None, sm: int) -> bool:
    """Whether vLLM 0.34 treats an activation dtype as deprecated (slow) on ``sm``: int4 from
    SM90, int8 on SM103-109, any sub-16-bit dtype on SM100-119."""
    bits = dtype_bits(name)
    if bits == 16:
        return False
    return (
        (name == "int4" and sm >= 90)
        or (name == "int8" and 103 <= sm < 110)
        or (bits < 16 and 100 <= sm < 120)
    )


def _fallback_candidate(name: str, sm: int, weight_group: int, weight_scale: str) -> InputChoice:
    if dtype_bits(name) == 16:
        return InputChoice(name, 0, None, "none")
    mx_weight = weight_group == 32 and weight_scale == "float8e8m0"
    if name in ("float8e4m3", "float8e3m4") and sm >= 120 and (weight_group == 0 or mx_weight):
        return InputChoice(name, 32, "float8e8m0", "dynamic_group")
    return InputChoice(name, 0, "float32", "dynamic_token")


def vllm_input_choice(
    requested: InputChoice,
    sm: int,
    weight_group: int,
    weight_scale: str,
    compatible: Callable[[InputChoice], bool],
) -> tuple[InputChoice, str]:
    """(the input schema, why) vLLM 0.34's ``check_and_fallback_input_schema`` settles on,
    fallback allowed, for a weight of ``weight_group`` / ``weight_scale`` on SM ``sm`` with
    BF16 parameters. ``compatible(choice)`` is Humming's schema compatibility check.

    A compatible 8-bit request with group scales (on the input or the weight) becomes 16-bit
    activations (W8A16) unless it is MXFP8 on SM120+; an incompatible or deprecated one walks
    :data:`FALLBACK_ORDER`, then the 16-bit dtype.

    Raises:
        ValueError: no candidate is compatible (vLLM raises too).
    """
    if requested.a_dtype in ("float6e2m3", "float6e3m2"):
        requested = replace(requested, a_dtype="float8e4m3")  # vLLM maps FP6 onto E4M3
    if compatible(requested):
        if requested.bits == 16:
            return requested, "requested 16-bit activations: kept"
        if not slow_on(requested.a_dtype, sm):
            mxfp8 = (
                requested.a_dtype is not None
                and requested.a_dtype.startswith("float")
                and requested.bits == 8
                and requested.group_size == 32
                and requested.scale_dtype == "float8e8m0"
                and sm >= 120
            )
            if requested.bits == 8 and (requested.group_size > 0 or weight_group > 0) and not mxfp8:
                return InputChoice(), (
                    f"8-bit group-scaled activations on SM{sm} (MXFP8 activations only from "
                    "SM120): 16-bit activations preferred (W8A16)"
                )
            return requested, "requested schema compatible: kept"
    names = (requested.a_dtype, *FALLBACK_ORDER.get(requested.a_dtype or "", ()), PARAM_DTYPE)
    for name in names:
        if name is None or slow_on(name, sm):
            continue
        candidate = _fallback_candidate(name, sm, weight_group, weight_scale)
        if compatible(candidate):
            return candidate, f"requested schema not usable on SM{sm}: fell back to {name}"
    raise ValueError(f"no compatible Humming input schema for {requested} on SM{sm}")


def interval_for(intervals, tokens: int):
    """The entry ``(low, high, config)`` of Humming's kernel intervals that serves ``tokens``
    rows: its launcher picks the first with ``low < tokens <= high``.

    Raises:
        LookupError: no interval holds ``tokens``.
    """
    for entry in intervals:
        if entry[0] < tokens <= entry[1]:
            return entry
    raise LookupError(f"no Humming kernel interval holds {tokens} rows")


def config_label(config: dict) -> str:
    """A short name for one Humming kernel config: MMA type, block shape, stages."""
    block = "x".join(str(v) for v in config.get("block_shape", ()))
    parts = [str(config.get("mma_type", "?")), block]
    if "num_stages" in config:
        parts.append(f"s{config['num_stages']}")
    return " ".join(p for p in parts if p)


def _plain(value):
    """``value`` as JSON-friendly data (enums by their value, unknown objects by str)."""
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(getattr(value, "value", value))


def _to_schema(choice: InputChoice):
    from humming.schema import HummingInputSchema

    return HummingInputSchema(
        a_dtype=choice.a_dtype,
        input_scale_group_size=choice.group_size,
        input_scale_dtype=choice.scale_dtype,
        input_quant_mode=choice.mode,
    )


class HummingLinear:
    """One MXFP8 linear as vLLM 0.34 runs it on Humming: prepared once from the checkpoint's
    E4M3 ``values`` ``[N, K]`` and uint8 E8M0 ``scales`` ``[N, K/32]`` (both copied first, so
    the caller's tensors stay as they are), then ``self(x)`` for BF16 ``x`` ``[M, K]``.

    ``decision`` records the input-schema choice; ``intervals`` Humming's kernel per row
    range (``(low, high, config)``, the heuristics its first call compiles).
    """

    def __init__(self, values: torch.Tensor, scales: torch.Tensor):
        from humming import dtypes
        from humming.schema import BaseWeightSchema
        from humming.transform import prepare_and_transform_humming_tensors

        n, k = values.shape
        device, bf16 = values.device, torch.bfloat16
        tensors = {
            "weight": values.contiguous().clone().view(torch.int32),  # [N, K/4]
            "weight_scale": scales.contiguous().clone().view(torch.float8_e8m0fnu),
        }
        weight_schema, tensors = BaseWeightSchema.from_config(WEIGHT_CONFIG).convert_humming(
            tensors=tensors, shape_n_stacks=[n], shape_k_stacks=[k], param_dtype=bf16
        )
        requested, input_tensors = _to_schema(mxfp8_dynamic_request()).convert_humming(
            tensors=tensors, shape_n_stacks=[n], shape_k_stacks=[k], param_dtype=bf16
        )
        major, minor = torch.cuda.get_device_capability(device)
        sm = major * 10 + minor
        bs = weight_schema.bs_dtype
        choice, why = vllm_input_choice(
            mxfp8_dynamic_request(),
            sm,
            weight_schema.weight_scale_group_size,
            bs.dtype_str if bs is not None else PARAM_DTYPE,
            lambda c: _to_schema(c).is_compatible_with(weight_schema, bf16),
        )
        tensors.update(input_tensors)
        self.config, self.tensors = prepare_and_transform_humming_tensors(
            tensors=tensors,
            shape_n=n,
            shape_k=k,
            weight_schema=weight_schema,
            input_schema=_to_schema(choice),
            pad_n_to_multiple=PAD_N,
            pad_k_to_multiple=PAD_K,
            has_bias=False,
            torch_dtype=bf16,
            device=device,
        )
        self.hadamard_block_size = weight_schema.hadamard_block_size
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        self.locks = torch.zeros(sms * LOCKS_PER_SM, dtype=torch.int32, device=device)
        self.compute_config = json.dumps(COMPUTE_CONFIG)
        self.decision = {
            "sm": sm,
            "requested": asdict(mxfp8_dynamic_request()),
            "requested_compatible": bool(requested.is_compatible_with(weight_schema, bf16)),
            "chosen": asdict(choice),
            "why": why,
            "layer_a_dtype": self.config.a_dtype.dtype_str,
            "layer_b_dtype": self.config.b_dtype.dtype_str,
            "layer_input_quant_mode": _plain(self.config.input_quant_mode),
            "w8a16": self.config.a_dtype == dtypes.bfloat16,
        }
        self._intervals = None

    @property
    def intervals(self) -> list:
        if self._intervals is None:
            from humming.tune import get_heuristics_config

            found = get_heuristics_config(self.config, **COMPUTE_CONFIG, device=self.locks.device)
            self._intervals = [(int(lo), int(hi), _plain(cfg)) for lo, hi, cfg in found]
        return self._intervals

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        from humming.forward import humming_forward

        t = self.tensors
        out = humming_forward(
            self.config,
            inputs=x.reshape(-1, x.size(-1)),
            weight=t["weight"],
            weight_scale=t.get("weight_scale"),
            zero_point=t.get("zero_point"),
            bias=t.get("bias"),
            weight_scale_2=t.get("weight_scale_2"),
            input_scale=None,  # no static input scale: vLLM passes none either
            input_scale_2=None,
            hadamard_block_size=self.hadamard_block_size,
            locks=self.locks,
            compute_config=self.compute_config,
        )
        return out.view(*x.shape[:-1], out.size(-1))
