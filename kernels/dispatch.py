"""Which kernel serves a call, and the entry points the custom ops call.

Each entry point checks the call's facts (device, dtype, shape, alignment: cheap, no
compile, no device sync) and launches the kernel where it serves them, in one pass. It
returns None once a kernel is launched, else a sentence saying why none serves the call
(nothing launched): the op then runs the reference and names that reason in its one-time
warning. Every kernel module answers the same way (``refusal``, ``run_if_served``).

By compute capability, as the capability table (``capability.py``) says:

* GEMM: 9.0 runs the CuTe DSL kernels (``gemm_sm90``); 10.x and 12.x, whose tensor cores
  take block-scaled MXFP8, run cuBLAS's MXFP8 GEMM through torch (``gemm_cublas``); every
  other device the reference.
* W8A16 GEMM (16-bit activations read from their slices): 9.0 runs the CuTe DSL kernels
  (``gemm_sm90``); every other device the reference.
* Slice quantizer: the CuTe DSL kernel, built for each capability with a target there
  (9.0, 10.0, 10.3, 12.0, 12.1); elsewhere the reference.

:func:`builds` answers, from the same routing and each kernel's own refusal and plan, what a
call of a given geometry launches (:class:`Call`): the call path runs exactly those builds,
and warm-up compiles them. Nothing else decides it.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from ..format import SCALE_DTYPE, VALUE_DTYPE, Activation, scale_bytes
from . import capability


@functools.cache
def cute_dsl_installed() -> bool:
    """True when nvidia-cutlass-dsl can be imported."""
    return importlib.util.find_spec("cutlass") is not None


@functools.cache
def _capability(index: int) -> tuple[int, int] | None:
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability(index)


def _device_capability(device: torch.device) -> tuple[int, int] | None:
    # Runs on every kernel call: a CUDA tensor's device carries its index, so the answer is
    # one cached lookup (torch.cuda.is_available() alone costs a few us per call).
    if device.type != "cuda":
        return None
    if device.index is not None:
        return _capability(device.index)
    if not torch.cuda.is_available():
        return None
    return _capability(torch.cuda.current_device())


def _no_device_kernel(device: torch.device, cap: tuple[int, int] | None) -> str:
    """Why no kernel of this library runs on ``device`` at all."""
    if cap is None:
        return f"device {device} is not a CUDA device"
    return "nvidia-cutlass-dsl is not installed"


# The host modules below import torch only (cutlass loads at the first compile), but they are
# imported on first use, once: an import statement in a function costs ~1 us per call.


@functools.cache
def _quantize_slice():
    from .quantize import host as quantize_slice

    return quantize_slice


@functools.cache
def _gemm_sm90():
    from .gemm_sm90.host import gemm as gemm_sm90

    return gemm_sm90


@functools.cache
def _gemm_sm90_w8a16():
    from .gemm_sm90.host import w8a16

    return w8a16


@functools.cache
def _gemm_cublas():
    from . import gemm_cublas

    return gemm_cublas


@functools.cache
def _gemm_kernel(cap: tuple[int, int]) -> str | None:
    return capability.kernels_of(cap).gemm


@functools.cache
def _w8a16_kernel(cap: tuple[int, int]) -> str | None:
    return capability.kernels_of(cap).w8a16


@functools.cache
def _quantizer_arch(cap: tuple[int, int]) -> str | None:
    return _quantize_slice().arch_for(cap)


def _quantizer_archs() -> list[str]:
    return list(_quantize_slice().ARCHS.values())


def _quantizer_arch_or_reason(device: torch.device) -> tuple[str | None, str]:
    """(the slice quantizer's build target for ``device``, "") or (None, why none runs)."""
    cap = _device_capability(device)
    if cap is None or not cute_dsl_installed():
        return None, _no_device_kernel(device, cap)
    arch = _quantizer_arch(cap)
    if arch is None:
        built = ", ".join(_quantizer_archs())
        return None, f"GPU sm_{cap[0]}{cap[1]}: the slice quantizer is built for {built}"
    return arch, ""


def quantize_slice(source, values, scales, column) -> str | None:
    """Run the slice-quantizer kernel where it serves the call: None once launched, else why
    not (nothing launched; the caller runs the reference)."""
    arch, reason = _quantizer_arch_or_reason(source.device)
    if arch is None:
        return reason
    return _quantize_slice().run_if_served(source, values, scales, column, arch)


def quantize_slices(sources, values, scales, columns) -> str | None:
    """Quantize all ``sources`` in one kernel launch where that serves them (equal shapes,
    at most 8): None once launched, else why not (nothing launched)."""
    if not sources:
        return "no slices"
    arch, reason = _quantizer_arch_or_reason(sources[0].device)
    if arch is None:
        return reason
    return _quantize_slice().run_many_if_served(sources, values, scales, columns, arch)


def mm_slices_into(slices, b_values, b_scales, bias, out) -> str | None:
    """Run the W8A16 GEMM from 16-bit slices where a kernel serves the call (sm_90: the
    CuTe DSL kernels read the slices as they are): None once launched, else why none does
    (nothing launched)."""
    device = slices[0].device
    cap = _device_capability(device)
    if cap is None:
        return _no_device_kernel(device, cap)
    if _w8a16_kernel(cap) != "cute":
        # 10.x / 12.x take MXFP8 activations in their tensor cores: W8A8 through cuBLAS
        return f"GPU sm_{cap[0]}{cap[1]} has no W8A16 GEMM kernel here (sm_90: CuTe DSL)"
    if not cute_dsl_installed():
        return _no_device_kernel(device, cap)
    reason = _gemm_sm90_w8a16().run_if_served(slices, b_values, b_scales, bias, out)
    return None if reason is None else f"GPU sm_{cap[0]}{cap[1]}: {reason}"


def mm_into(a_values, a_scales, b_values, b_scales, bias, out) -> str | None:
    """Run the MXFP8 GEMM where a kernel serves the call (by capability: see the module
    docstring): None once launched, else why none does (nothing launched)."""
    cap = _device_capability(a_values.device)
    if cap is None:
        return _no_device_kernel(a_values.device, cap)
    gemm = _gemm_kernel(cap)
    if gemm == "cute":
        if not cute_dsl_installed():
            return _no_device_kernel(a_values.device, cap)
        reason = _gemm_sm90().run_if_served(a_values, a_scales, b_values, b_scales, bias, out)
    elif gemm == "cublas":
        reason = _gemm_cublas().run_if_served(a_values, a_scales, b_values, b_scales, bias, out)
    else:
        gpu = f"GPU sm_{cap[0]}{cap[1]}"
        return f"{gpu} has no MXFP8 GEMM kernel here (sm_90: CuTe DSL; 10.x, 12.x: cuBLAS)"
    return None if reason is None else f"GPU sm_{cap[0]}{cap[1]}: {reason}"


# --- what a call launches -----------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """The geometry of one projection call, all that decides the builds it launches besides
    the token count and the device: ``out_features`` (N), the input's slice ``widths`` side
    by side (one for a plain input), the activations' ``dtype`` (also the output's), the
    bias dtype (None: no bias) and the :class:`~mxfp8_fusion.format.Activation` (W8A8: the
    slices quantized into storage, then the MXFP8 GEMM; W8A16: the GEMM reads the slices).

    The tensors are taken as the calls make them: contiguous slices, a new output.
    """

    out_features: int
    widths: tuple[int, ...]
    dtype: torch.dtype = torch.bfloat16
    bias_dtype: torch.dtype | None = None
    activation: Activation = Activation.W8A8

    @property
    def in_features(self) -> int:
        return sum(self.widths)


def builds(call: Call, tokens: Iterable[int], cap: tuple[int, int], gpu: tuple[int, str]) -> list:
    """The kernel builds ``call`` launches at each of ``tokens`` on a GPU of compute
    capability ``cap`` and ``gpu`` (SM count, name as CUDA reports it), in launch order,
    each once: the routing of the entry points above, each kernel's own refusal (asked
    about tensors shaped like the call's, on the meta device) and its own ``builds``. A call
    no kernel serves runs the reference and needs no build. Runs on any machine (no compile,
    no GPU)."""
    tokens = list(tokens)
    found: dict = {}
    n, widths, activation = call.out_features, call.widths, Activation.of(call.activation)
    if activation.quantized:
        arch = _quantizer_arch(cap)
        if arch is not None and _quantizer_serves(call, max(tokens, default=1)):
            fp16 = call.dtype == torch.float16
            found.update(dict.fromkeys(_quantize_slice().builds(fp16, widths, arch)))
        # cuBLAS or the reference: nothing to build
        gemm, refusal, a = _gemm_kernel(cap), _gemm_sm90().refusal, call.in_features
    else:
        gemm, refusal, a = _w8a16_kernel(cap), _gemm_sm90_w8a16().refusal, widths
    if gemm != "cute":
        return list(found)
    for m in tokens:
        if refusal(*_operands(call, m)) is None:
            found.update(dict.fromkeys(_gemm_sm90().builds(
                m, n, a, n, call.dtype, call.bias_dtype, gpu, activation)))  # fmt: skip
    return list(found)


def _meta(shape, dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


def _quantizer_serves(call: Call, tokens: int) -> bool:
    """Whether the slice quantizer serves every slice of ``call`` at ``tokens``."""
    values = _meta((tokens, call.in_features), VALUE_DTYPE)
    column = 0
    for width in call.widths:
        if _quantize_slice().refusal(_meta((tokens, width), call.dtype), values, column):
            return False
        column += width
    return True


def _operands(call: Call, tokens: int) -> tuple:
    """The GEMM's arguments for ``call`` at ``tokens``, as meta tensors: A (W8A8: its MXFP8
    values and scales; W8A16: the slices), the weight, the bias and a new output."""
    n, k = call.out_features, call.in_features
    weight = _meta((n, k), VALUE_DTYPE), _meta((scale_bytes(n, k),), SCALE_DTYPE)
    bias = None if call.bias_dtype is None else _meta((n,), call.bias_dtype)
    out = _meta((tokens, n), call.dtype)
    if Activation.of(call.activation).quantized:
        a = _meta((tokens, k), VALUE_DTYPE), _meta((scale_bytes(tokens, k),), SCALE_DTYPE)
    else:
        a = ([_meta((tokens, width), call.dtype) for width in call.widths],)
    return (*a, *weight, bias, out)
