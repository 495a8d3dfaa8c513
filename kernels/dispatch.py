"""Which calls a kernel serves, and the entry points the custom ops call.

Each entry point checks the call's facts (device, dtype, shape, alignment: cheap, no
compile, no device sync) and launches the kernel where it serves them, in one pass; it
returns False where it does not, and the op runs the reference.

By compute capability:

* GEMM: 9.0 runs the CuTe DSL kernels (``gemm_sm90``); 10.x and 12.x, whose tensor cores
  take block-scaled MXFP8, run cuBLAS's MXFP8 GEMM through torch (``gemm_cublas``); every
  other device the reference.
* Slice quantizer: the CuTe DSL kernel, built for each capability in
  ``quantize_slice.ARCHS`` (9.0, 10.0, 10.3, 12.0, 12.1); elsewhere the reference.
"""

from __future__ import annotations

import functools
import importlib.util

import torch


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


# Majors whose GEMM is cuBLAS's block-scaled MXFP8 kernel (datacenter and RTX Blackwell).
_CUBLAS_MAJORS = (10, 12)


def unavailable_reason(device: torch.device, what: str = "") -> str:
    """A sentence saying why no kernel serves a call of ``what`` (``"GEMM"`` or ``"slice
    quantizer"``) on ``device``."""
    cap = _device_capability(device)
    if cap is None:
        return f"device {device} is not a CUDA device"
    gpu = f"GPU sm_{cap[0]}{cap[1]}"
    if what == "GEMM" and cap[0] in _CUBLAS_MAJORS:
        return f"{gpu}: {_gemm_cublas().last_refusal}"
    if not cute_dsl_installed():
        return "nvidia-cutlass-dsl is not installed"
    if what == "GEMM" and cap != (9, 0):
        return f"{gpu} has no MXFP8 GEMM kernel here (sm_90: CuTe DSL; 10.x, 12.x: cuBLAS)"
    if what == "GEMM":
        return f"{gpu}: {_gemm_sm90().last_refusal}"
    if what != "GEMM" and _quantizer_arch(cap) is None:
        return f"{gpu}: the slice quantizer is built for {', '.join(_quantizer_archs())}"
    return f"{gpu} with unsupported shape or dtype"


# The host modules below import torch only (cutlass loads at the first compile), but they are
# imported on first use, once: an import statement in a function costs ~1 us per call.


@functools.cache
def _quantize_slice():
    from . import quantize_slice

    return quantize_slice


@functools.cache
def _gemm_sm90():
    from . import gemm_sm90

    return gemm_sm90


@functools.cache
def _gemm_cublas():
    from . import gemm_cublas

    return gemm_cublas


@functools.cache
def _quantizer_arch(cap: tuple[int, int]) -> str | None:
    return _quantize_slice().arch_for(cap)


def _quantizer_archs() -> list[str]:
    return list(_quantize_slice().ARCHS.values())


def _device_quantizer_arch(device: torch.device) -> str | None:
    """The slice quantizer's build target for ``device``, None where none runs there."""
    cap = _device_capability(device)
    if cap is None or not cute_dsl_installed():
        return None
    return _quantizer_arch(cap)


def quantize_slice(source, values, scales, column) -> bool:
    """Run the slice-quantizer kernel where it serves the call; False (nothing launched)
    where it does not, and the caller runs the reference."""
    arch = _device_quantizer_arch(source.device)
    if arch is None:
        return False
    return _quantize_slice().run_if_supported(source, values, scales, column, arch)


def quantize_slices(sources, values, scales, columns) -> bool:
    """Quantize all ``sources`` in one kernel launch where that serves them (equal shapes,
    at most 8); False (nothing launched) otherwise."""
    arch = _device_quantizer_arch(sources[0].device) if sources else None
    if arch is None:
        return False
    return _quantize_slice().run_many_if_supported(sources, values, scales, columns, arch)


def mm_into(a_values, a_scales, b_values, b_scales, bias, out) -> bool:
    """Run the MXFP8 GEMM where a kernel serves the call (by capability: see the module
    docstring); False (nothing launched) where none does."""
    cap = _device_capability(a_values.device)
    if cap == (9, 0):  # wgmma: exactly sm_90
        if not cute_dsl_installed():
            return False
        return _gemm_sm90().run_if_supported(a_values, a_scales, b_values, b_scales, bias, out)
    if cap is not None and cap[0] in _CUBLAS_MAJORS:
        return _gemm_cublas().run_if_supported(a_values, a_scales, b_values, b_scales, bias, out)
    return False
