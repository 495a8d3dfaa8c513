"""The W8A16 eager API: ``cat(slices, -1) @ weight.T`` straight from the slices, with no
concatenation and no activation quantization (``mxfp8::mm_slices(_into)``).

The activations are multiplied as they are by the weight's exact E4M3 x E8M0 values, summed
in FP32: the numerics of a BF16 linear holding the dequantized MXFP8 weight (and of vLLM's
MXFP8 kernel on Hopper). Arguments are checked as the rest of the eager API checks them.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import ops
from .checks import (
    check_bias,
    check_out,
    live_rows,
    require_2d,
    require_same_device,
    require_source_dtype,
    require_tensor,
    share_memory,
)
from .format import STAGE_ALIGN, MXFP8Weight, fail


def _check_slices(slices, weight) -> int:
    """``slices`` is a non-empty list or tuple of 2-D BF16 or FP16 tensors of one dtype and
    row count, on ``weight``'s device, whose widths are positive multiples of 128 and add up
    to ``weight.in_features``. Returns the row count."""
    if not isinstance(slices, (list, tuple)) or not slices:
        fail(TypeError, "slices", "a non-empty list or tuple of tensors", type(slices).__name__)
    if not isinstance(weight, MXFP8Weight):
        fail(TypeError, "weight", "an MXFP8Weight", type(weight).__name__)
    first = slices[0]
    require_tensor(first, "slices[0]")
    require_source_dtype(first, "slices[0]")
    device = weight.device
    width = 0
    for i, source in enumerate(slices):
        argument = f"slices[{i}]"
        require_tensor(source, argument)
        require_2d(source, argument)
        if source.dtype is not first.dtype:
            fail(TypeError, argument, f"dtype {first.dtype}, as slices[0]", source.dtype)
        require_same_device(source, device, argument)
        rows, columns = source.shape
        if rows != first.shape[0]:
            fail(ValueError, argument, f"{first.shape[0]} rows, as slices[0]", rows)
        if columns <= 0 or columns % STAGE_ALIGN:
            fail(
                ValueError, argument, f"a width that is a positive multiple of {STAGE_ALIGN}",
                columns,
            )  # fmt: skip
        width += columns
    if width != weight.in_features:
        fail(
            ValueError, "slices",
            f"widths adding up to weight.in_features = {weight.in_features}", width,
        )  # fmt: skip
    return first.shape[0]


def mm_slices(
    slices: list[Tensor] | tuple[Tensor, ...], weight: MXFP8Weight, *, bias: Tensor | None = None
) -> Tensor:
    """``cat(slices, -1) @ weight.T (+ bias)`` straight from the slices (W8A16): no
    concatenation and no activation quantization, into a new ``[tokens, out_features]``
    tensor of the slices' dtype.

    The activations are used as they are and multiplied by the weight's exact E4M3 x E8M0
    values, summed in FP32: the numerics of a BF16 linear whose weight is the dequantized
    MXFP8 weight. ``slices`` are BF16 or FP16 ``[tokens, width]`` tensors of one dtype and
    row count, on the weight's device (views are fine); each width a positive multiple of
    128, the widths adding up to ``weight.in_features``. On sm_90 the CuTe DSL kernels read
    up to 8 BF16 slices as they are; elsewhere (FP16 slices, more slices, other GPUs) the
    plain-torch reference runs, with a one-time warning on CUDA. ``bias`` is keyword-only,
    as in every GEMM of the eager API.

    Raises:
        TypeError, ValueError: naming ``slices[i]``, ``weight`` or ``bias``.
    """
    _check_slices(slices, weight)
    check_bias(bias, weight)
    return ops.call(ops.mm_slices, list(slices), weight.values, weight.raw_scales, bias)


def mm_slices_into(
    slices: list[Tensor] | tuple[Tensor, ...],
    weight: MXFP8Weight,
    out: Tensor,
    *,
    bias: Tensor | None = None,
) -> Tensor:
    """Write ``cat(slices, -1) @ weight.T (+ bias)`` into ``out[:tokens]`` straight from the
    slices (W8A16, as :func:`mm_slices`) and return that view (``out`` itself when it has
    ``tokens`` rows).

    ``out`` is caller-owned, ``[>= tokens, out_features]``, BF16 or FP16, on the weight's
    device, with no two elements in the same memory and none in ``bias``'s or a slice's; its
    rows past ``tokens`` are not touched. Nothing is allocated, so the call can be captured
    in a CUDA Graph. ``bias`` is keyword-only, as in every GEMM of the eager API.

    Raises:
        TypeError, ValueError: naming ``slices[i]``, ``weight``, ``out`` or ``bias``.
    """
    tokens = _check_slices(slices, weight)
    check_bias(bias, weight)
    check_out(out, weight, tokens, bias)
    if not torch.compiler.is_compiling():
        for i, source in enumerate(slices):
            if share_memory(out, source):
                fail(ValueError, f"slices[{i}]", "memory apart from out's", "a view of out")
    ops.call(ops.mm_slices_into, list(slices), weight.values, weight.raw_scales, bias, out)
    return live_rows(out, tokens)
