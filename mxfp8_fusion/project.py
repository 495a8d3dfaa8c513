"""The one entry that turns a projection's input slices into its output.

``cat(slices, -1) @ W.T (+ bias)`` for a layer of either :class:`~mxfp8_fusion.format.
Activation`, never concatenated: W8A8 quantizes the slices into MXFP8 storage and runs the
MXFP8 GEMM from it; W8A16 runs the GEMM from the slices as they are. ``MXFP8Linear``,
``InputStager``, the tensor-parallel layers and the vLLM linear and drafter all call this
module, so one layer gives one result for one activation whichever of them runs it.

:func:`project` is the whole call. A caller that produces the slices over time (the
stager) calls its two halves: :func:`stage` as each slice exists, :func:`finish` once.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from . import api, ops
from .format import Activation, MXFP8Input, MXFP8Weight
from .w8a16 import mm_slices, mm_slices_into

# The one-shot op of each activation, on one whole input: what the fusion pass finds
# behind a cat in a compiled graph (and the op that takes FP32 inputs and any K).
_LINEAR = {a: getattr(ops, a.linear_op) for a in Activation}

Weight = MXFP8Weight | tuple[Tensor, Tensor]
"""A layer's weight: an :class:`MXFP8Weight`, or its ``(values, scales)`` tensors as a
module holds them (no per-call wrapper: a layer's forward is a hot path)."""


def project(
    weight: Weight,
    activation: Activation,
    slices: Sequence[Tensor],
    *,
    bias: Tensor | None = None,
    out: Tensor | None = None,
    storage: MXFP8Input | None = None,
) -> Tensor:
    """``cat(slices, -1) @ weight.T (+ bias)`` as a layer of ``activation`` computes it.

    One slice with neither ``out`` nor ``storage``: the activation's one-shot op
    (``mxfp8::linear`` / ``mxfp8::linear_w8a16``, any width, FP32 too). Otherwise W8A8
    quantizes the slices side by side into ``storage`` (an :class:`MXFP8Input` of at least
    their rows, allocated when None; one launch where they share a shape) and runs the MXFP8
    GEMM; W8A16 runs the GEMM from the slices. The result goes into ``out[:tokens]`` when
    ``out`` is given (caller-owned, nothing allocated), else into a new tensor.

    Raises:
        TypeError, ValueError: naming the argument at fault, before anything is launched.
    """
    activation = Activation.of(activation)
    if len(slices) == 1 and out is None and storage is None:
        values, scales = _tensors(weight)
        return ops.call(_LINEAR[activation], slices[0], values, scales, bias)
    weight, tokens = _packed(weight), slices[0].shape[0]
    if activation.quantized and storage is None:
        if len(slices) == 1:  # any width: the one-shot quantizer
            return finish(
                weight, activation, [], api.quantize(slices[0]), tokens, out=out, bias=bias
            )
        first = slices[0]
        storage = api.empty_input(tokens, weight.in_features, first.device, first.dtype)
    kept = stage(activation, slices, storage)
    return finish(weight, activation, kept, storage, tokens, out=out, bias=bias)


def stage(
    activation: Activation,
    slices: Sequence[Tensor],
    storage: MXFP8Input | None,
    column: int = 0,
) -> list[Tensor]:
    """The first half of :func:`project`, for slices that exist before the others: W8A8
    quantizes ``slices`` into ``storage``'s columns from ``column`` now (one launch where
    they share a shape) and keeps nothing; W8A16 launches nothing and returns the slices,
    which :func:`finish` reads (they must keep their values until then).

    Raises:
        TypeError, ValueError: as :func:`~mxfp8_fusion.quantize_input_slices` (W8A8).
    """
    if not Activation.of(activation).quantized:
        return list(slices)
    if len(slices) == 1:
        api.quantize_input_slice(slices[0], storage, column)
    else:
        api.quantize_input_slices(list(slices), storage, column)
    return []


def finish(
    weight: Weight,
    activation: Activation,
    kept: Sequence[Tensor],
    storage: MXFP8Input | None,
    tokens: int,
    *,
    out: Tensor | None = None,
    bias: Tensor | None = None,
) -> Tensor:
    """The second half of :func:`project`: the GEMM of ``tokens`` rows, W8A8 from
    ``storage`` (every column staged), W8A16 from the slices :func:`stage` ``kept``; into
    ``out[:tokens]`` when given, else a new tensor.

    Raises:
        TypeError, ValueError: as :func:`~mxfp8_fusion.mm_quantized_into` (W8A8) or
        :func:`~mxfp8_fusion.mm_slices_into` (W8A16).
    """
    weight = _packed(weight)
    if not Activation.of(activation).quantized:
        if out is None:
            return mm_slices(kept, weight, bias=bias)
        return mm_slices_into(kept, weight, out, bias=bias)
    if out is None:
        return api.mm_quantized(storage, weight, tokens=tokens, bias=bias)
    return api.mm_quantized_into(storage, weight, out, tokens=tokens, bias=bias)


def _tensors(weight: Weight) -> tuple[Tensor, Tensor]:
    if isinstance(weight, tuple):
        return weight
    return weight.values, weight.raw_scales


def _packed(weight: Weight) -> MXFP8Weight:
    return MXFP8Weight(*weight) if isinstance(weight, tuple) else weight


__all__ = ["finish", "project", "stage"]
