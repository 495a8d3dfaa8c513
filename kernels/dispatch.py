"""Which calls a CuTe DSL kernel serves, and the entry points the custom ops call.

Each entry point checks the call's facts (device, dtype, shape, alignment: cheap, no
compile, no device sync) and launches the kernel where it serves them, in one pass; it
returns False where it does not, and the op runs the reference.
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


def unavailable_reason(device: torch.device) -> str:
    """A sentence saying why no kernel runs on ``device`` (or which one would)."""
    if not cute_dsl_installed():
        return "nvidia-cutlass-dsl is not installed"
    cap = _device_capability(device)
    if cap is None:
        return f"device {device} is not a CUDA device"
    if cap < (9, 0):
        return f"GPU sm_{cap[0]}{cap[1]} is older than sm_90"
    return f"GPU sm_{cap[0]}{cap[1]} with unsupported shape or dtype"


def _sm90_or_newer(device: torch.device) -> bool:
    cap = _device_capability(device)
    return cap is not None and cap >= (9, 0) and cute_dsl_installed()


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


def quantize_slice(source, values, scales, column) -> bool:
    """Run the slice-quantizer kernel where it serves the call; False (nothing launched)
    where it does not, and the caller runs the reference."""
    if not _sm90_or_newer(source.device):
        return False
    return _quantize_slice().run_if_supported(source, values, scales, column)


def quantize_slices(sources, values, scales, columns) -> bool:
    """Quantize all ``sources`` in one kernel launch where that serves them (equal shapes,
    at most 8); False (nothing launched) otherwise."""
    if not sources or not _sm90_or_newer(sources[0].device):
        return False
    return _quantize_slice().run_many_if_supported(sources, values, scales, columns)


def mm_into(a_values, a_scales, b_values, b_scales, bias, out) -> bool:
    """Run the MXFP8 GEMM kernel (wgmma: exactly sm_90) where it serves the call; False
    (nothing launched) where it does not."""
    if _device_capability(a_values.device) != (9, 0) or not cute_dsl_installed():
        return False
    return _gemm_sm90().run_if_supported(a_values, a_scales, b_values, b_scales, bias, out)
