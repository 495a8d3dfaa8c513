"""The eager API: pack weights, stage inputs slice by slice, run the MXFP8 GEMM.

Every function validates its arguments before any kernel runs and raises ``TypeError`` or
``ValueError`` naming the argument, what was expected and what was given; a failed call
writes nothing. Static facts (dtypes, alignment, layout) are checked once, when a weight is
packed or storage is allocated; per call only what can change per call is checked.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import grad, ops, reference
from .checks import (
    check_bias,
    check_out,
    check_tokens,
    live_rows,
    require,
    require_2d,
    require_int,
    require_same_device,
    require_source_dtype,
    require_tensor,
)
from .format import (
    GROUP,
    SCALE_DTYPE,
    SCALE_NAN_BYTE,
    SOURCE_DTYPES,
    STAGE_ALIGN,
    VALUE_DTYPE,
    MXFP8Input,
    MXFP8Weight,
    fail,
    scale_bytes,
)

_MAX_BYTES = 2**63 - 1  # torch's storage sizes are int64


def _check_operands(inp: MXFP8Input, weight: MXFP8Weight) -> None:
    if not isinstance(inp, MXFP8Input):
        fail(TypeError, "inp", "an MXFP8Input", type(inp).__name__)
    if not isinstance(weight, MXFP8Weight):
        fail(TypeError, "weight", "an MXFP8Weight", type(weight))
    if weight.in_features != inp.in_features:
        fail(
            ValueError, "weight", f"in_features {inp.in_features} (the input's)", weight.in_features
        )
    require_same_device(weight.values, inp.device, "weight")


def pack_weight(weight: Tensor, scales: Tensor | None = None) -> MXFP8Weight:
    """Pack a linear layer's weight ``[out_features, in_features]`` as MXFP8.

    Args:
        weight: BF16/FP16 weight to quantize, or (with ``scales``) the E4M3 values of an
            MXFP8 checkpoint. ``in_features`` must be a multiple of 32.
        scales: the checkpoint's row-major ``[out_features, in_features / 32]`` scales,
            ``float8_e8m0fnu`` or ``uint8`` bytes; ``None`` to quantize ``weight``. A
            checkpoint block holding a NaN value gets the NaN scale (byte 255), as the
            quantizer gives such a block: the output column of that weight row is NaN for
            every token either way, and the GPU GEMM's 16-bit conversions propagate NaN
            through the scale.

    Returns:
        An :class:`MXFP8Weight` with contiguous values and blocked scales.

    Raises:
        TypeError, ValueError: on a wrong type, dtype, shape or device.
    """
    require_tensor(weight, "weight")
    # The packed tensors never join autograd: a graph would keep the source Parameter alive
    # (no memory saved), and a non-leaf tensor cannot be deep-copied.
    weight = weight.detach()
    require_2d(weight, "weight")
    n, k = weight.shape
    require(n > 0, ValueError, "weight", "at least one output row", f"shape {(n, k)}")
    require(k > 0 and k % GROUP == 0, ValueError, "weight", "in_features a multiple of 32", k)
    if scales is None:
        require_source_dtype(weight, "weight")
        values, blocked = ops.call(ops.quantize, weight.contiguous())
        return MXFP8Weight(values, blocked)
    require(weight.dtype == VALUE_DTYPE, TypeError, "weight", "float8_e4m3fn values", weight.dtype)
    require_tensor(scales, "scales")
    scales = scales.detach()
    require(
        scales.dtype in (SCALE_DTYPE, torch.uint8),
        TypeError,
        "scales",
        "dtype float8_e8m0fnu or uint8",
        scales.dtype,
    )
    expected = (n, k // GROUP)
    require(
        tuple(scales.shape) == expected,
        ValueError,
        "scales",
        f"shape {expected}",
        tuple(scales.shape),
    )
    require_same_device(scales, weight.device, "scales")
    rows = scales.contiguous().view(torch.uint8)
    # E4M3 NaN is 0x7F / 0xFF; a NaN value makes its output column NaN for every token, and
    # a NaN scale says so in the one place the GEMM kernels' conversions read NaN from
    values = weight.contiguous()
    nan_block = ((values.view(torch.uint8) & 0x7F) == 0x7F).view(n, k // GROUP, GROUP).any(-1)
    rows = torch.where(nan_block, torch.full_like(rows, SCALE_NAN_BYTE), rows)
    blocked = reference.to_blocked(rows).view(SCALE_DTYPE)
    return MXFP8Weight(values, blocked)


def empty_input(
    capacity: int,
    in_features: int,
    device: torch.device | str | int | None = None,
    dtype: torch.dtype = torch.bfloat16,
) -> MXFP8Input:
    """Allocate MXFP8 storage for up to ``capacity`` rows of ``in_features`` columns.

    Fill it with :func:`quantize_input_slice`, one slice per column range, then run
    :func:`mm_quantized` or :func:`mm_quantized_into`. ``in_features`` must be a multiple of
    128. ``dtype`` (BF16 or FP16) is the dtype of the sources that may be staged into it
    (a source of the other dtype is refused) and the dtype :func:`mm_quantized` returns by
    default. ``device`` is a ``torch.device``, a device string or an accelerator index;
    ``None`` means the default device.

    Raises:
        TypeError, ValueError: on a non-int, negative or too large size, misaligned
        in_features, a bad dtype, or a device that is malformed or not available here.
    """
    require_int(capacity, "capacity")
    require_int(in_features, "in_features")
    require(capacity >= 0, ValueError, "capacity", "a non-negative row count", capacity)
    require(
        in_features > 0 and in_features % STAGE_ALIGN == 0,
        ValueError,
        "in_features",
        f"a positive multiple of {STAGE_ALIGN}",
        in_features,
    )
    if capacity * in_features > _MAX_BYTES:
        fail(
            ValueError,
            "capacity",
            f"capacity * in_features at most 2**63 - 1 bytes (in_features {in_features})",
            capacity,
        )
    require(dtype in SOURCE_DTYPES, TypeError, "dtype", "torch.bfloat16 or torch.float16", dtype)
    device = _check_device(device)
    values = torch.empty(capacity, in_features, dtype=VALUE_DTYPE, device=device)
    # uint8: the storage keeps the raw scale bytes (see format.MXFP8Input)
    scales = torch.empty(scale_bytes(capacity, in_features), dtype=torch.uint8, device=device)
    return MXFP8Input(values, scales, dtype)


def _check_device(device) -> torch.device | None:
    """``device`` as a ``torch.device`` that exists here: the CPU, ``meta``, or an index
    below the device count of this machine's accelerator (CUDA on a GPU build). None stays
    None: torch's default device (``torch.get_default_device()`` does not trace)."""
    if device is None:
        return None
    if isinstance(device, bool) or not isinstance(device, (torch.device, str, int)):
        fail(
            TypeError, "device", "a torch.device, a device string or an int", type(device).__name__
        )
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        expected = "a device such as 'cpu' or 'cuda:0'"
        if isinstance(device, int):  # an index with no accelerator to index
            expected = "a device that exists (torch sees no accelerator here)"
        fail(ValueError, "device", expected, repr(device))
    if parsed.type in ("cpu", "meta") or torch.compiler.is_compiling():
        # traced code: torch.empty on the device fails at compile time where it is missing
        return parsed
    accelerator = torch.accelerator.current_accelerator(check_available=True)
    if accelerator is None or parsed.type != accelerator.type:
        have = (
            f"its accelerator is {accelerator.type}"
            if accelerator
            else "torch sees no accelerator on it"
        )
        fail(ValueError, "device", f"a device of this machine ({have})", repr(device))
    count = torch.accelerator.device_count()
    if parsed.index is not None and parsed.index >= count:
        fail(ValueError, "device", f"a {parsed.type} index below {count}", repr(device))
    return parsed


def quantize_input_slice(source: Tensor, dest: MXFP8Input, destination_column: int) -> None:
    """Quantize ``source`` ``[tokens, width]`` into ``dest``'s columns starting at
    ``destination_column``; only those columns (and their scales) are written.

    ``source`` may be a strided view (for example a column slice of a wider tensor). Its
    dtype must be ``dest.dtype`` (BF16 or FP16, chosen at :func:`empty_input`), so the staged
    GEMM returns the dtype the concatenated path returns. ``width`` and ``destination_column``
    must be multiples of 128, the slice must fit in ``dest.in_features`` and
    ``tokens <= dest.capacity``.

    Raises:
        TypeError, ValueError: before anything is written.
    """
    _check_dest(dest)
    _check_column(destination_column)
    _check_slice(source, "source", dest, destination_column)
    ops.call(ops.quantize_slice_, source, dest.values, dest.raw_scales, destination_column)


def quantize_input_slices(
    sources: list[Tensor] | tuple[Tensor, ...], dest: MXFP8Input, destination_column: int = 0
) -> None:
    """Quantize ``sources`` side by side into ``dest``, the first at ``destination_column``:
    the bytes of one :func:`quantize_input_slice` per slice, in one kernel launch where the
    slices share dtype and shape (up to 8 of them), as the compiled path does.

    Every slice must have the same token count and ``dest.dtype``; each is checked as
    :func:`quantize_input_slice` checks its ``source``.

    The slices may cover part of ``dest`` (staging over several calls, as ``destination_column``
    allows and :class:`~mxfp8_fusion.InputStager` checks). Columns no call covers keep what
    ``dest`` held (uninitialised after :func:`empty_input`) and the GEMM reads them all.

    Raises:
        TypeError, ValueError: naming ``sources[i]`` where a slice is at fault, before
        anything is written.
    """
    _check_dest(dest)
    if not isinstance(sources, (list, tuple)) or not sources:
        fail(TypeError, "sources", "a non-empty list or tuple of tensors", type(sources).__name__)
    _check_column(destination_column)
    columns = []
    column = destination_column
    for i, source in enumerate(sources):
        _check_slice(source, f"sources[{i}]", dest, column)
        if source.shape[0] != sources[0].shape[0]:
            fail(
                ValueError, f"sources[{i}]", f"{sources[0].shape[0]} rows, as sources[0]",
                source.shape[0],
            )  # fmt: skip
        columns.append(column)
        column += source.shape[1]
    ops.call(ops.quantize_slices_, list(sources), dest.values, dest.raw_scales, columns)


def _check_dest(dest) -> None:
    if not isinstance(dest, MXFP8Input):
        fail(TypeError, "dest", "an MXFP8Input", type(dest).__name__)


def _check_column(destination_column) -> None:
    require_int(destination_column, "destination_column")
    if destination_column < 0 or destination_column % STAGE_ALIGN:
        fail(
            ValueError,
            "destination_column",
            f"a non-negative multiple of {STAGE_ALIGN}",
            destination_column,
        )


def _check_slice(source, argument: str, dest: MXFP8Input, column: int) -> None:
    """``source`` is a 2-D tensor of ``dest.dtype`` on ``dest``'s device whose width is a
    multiple of 128 and whose columns from ``column`` and rows fit in ``dest``."""
    require_tensor(source, argument)
    require_2d(source, argument)
    if source.dtype is not dest.dtype:
        # also refuses the other 16-bit dtype: the staged GEMM would return dest.dtype where
        # the concatenated path returns the source's
        fail(
            TypeError,
            argument,
            f"dtype {dest.dtype} (dest.dtype, set by empty_input(..., dtype=))",
            source.dtype,
        )
    require_same_device(source, dest.device, argument)
    tokens, width = source.shape
    if width <= 0 or width % STAGE_ALIGN:
        fail(ValueError, argument, f"a width that is a positive multiple of {STAGE_ALIGN}", width)
    if column + width > dest.in_features:
        fail(
            ValueError,
            argument,
            f"columns [{column}, {column + width}) within in_features {dest.in_features}",
            f"width {width}",
        )
    if tokens > dest.capacity:
        fail(ValueError, argument, f"at most {dest.capacity} rows (dest.capacity)", tokens)


def mm_quantized(
    inp: MXFP8Input,
    weight: MXFP8Weight,
    *,
    tokens: int | None = None,
    bias: Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> Tensor:
    """``inp[:tokens] @ weight.T (+ bias)`` into a new ``[tokens, out_features]`` tensor.

    The optional arguments are keyword-only. ``tokens``: the rows of ``inp`` to multiply,
    the ones quantized into; ``None`` (the default) means all ``inp.capacity`` rows, which is
    right only when every row was written (rows of :func:`empty_input` that nothing wrote
    hold arbitrary bytes, and so do their products). ``out_dtype`` defaults to
    ``inp.dtype``.

    Raises:
        TypeError, ValueError: on mismatched operands, tokens above capacity or a bad bias.
    """
    _check_operands(inp, weight)
    tokens = check_tokens(tokens, inp.capacity)
    check_bias(bias, weight)
    out_dtype = inp.dtype if out_dtype is None else out_dtype
    require(out_dtype in SOURCE_DTYPES, TypeError, "out_dtype", "bfloat16 or float16", out_dtype)
    return ops.call(
        ops.mm,
        grad.live_rows(inp.values, tokens),
        inp.raw_scales,
        weight.values,
        weight.raw_scales,
        bias,
        out_dtype,
    )


def mm_quantized_into(
    inp: MXFP8Input,
    weight: MXFP8Weight,
    out: Tensor,
    *,
    tokens: int | None = None,
    bias: Tensor | None = None,
) -> Tensor:
    """Write ``inp[:tokens] @ weight.T (+ bias)`` into ``out[:tokens]`` and return that view
    (``out`` itself when it has ``tokens`` rows).

    The optional arguments are keyword-only. ``tokens``: the rows of ``inp`` to multiply,
    the ones quantized into; ``None`` (the default) means all ``inp.capacity`` rows, which is
    right only when every row was written (rows of :func:`empty_input` that nothing wrote
    hold arbitrary bytes, and so do their products): pass the count a step staged.

    ``out`` is caller-owned, ``[>= tokens, out_features]``, BF16 or FP16, on the operands'
    device, with no two elements in the same memory (not expanded) and none in ``bias``'s;
    its rows past ``tokens`` are not touched. Nothing is allocated, so the call can be
    captured in a CUDA Graph.

    Raises:
        TypeError, ValueError: on a bad ``out``, mismatched operands, tokens above capacity,
        or a ``bias`` that overlaps ``out``.
    """
    _check_operands(inp, weight)
    tokens = check_tokens(tokens, inp.capacity)
    check_bias(bias, weight)
    check_out(out, weight, tokens, bias)
    ops.call(
        ops.mm_into,
        grad.live_rows(inp.values, tokens),
        inp.raw_scales,
        weight.values,
        weight.raw_scales,
        bias,
        out,
    )
    return live_rows(out, tokens)


def quantize(x: Tensor) -> MXFP8Input:
    """Quantize ``x`` ``[rows, K]`` (BF16/FP16, K a multiple of 32) to a new MXFP8Input.

    Raises:
        TypeError, ValueError: on a wrong type, dtype or shape.
    """
    require_tensor(x, "x")
    require_2d(x, "x")
    require_source_dtype(x, "x")
    require(
        x.shape[1] > 0 and x.shape[1] % GROUP == 0,
        ValueError,
        "x",
        "a width that is a multiple of 32",
        x.shape[1],
    )
    values, scales = ops.call(ops.quantize, x)
    return MXFP8Input._of(values, scales.view(torch.uint8), x.dtype)


def mm(x: Tensor, weight: MXFP8Weight, *, bias: Tensor | None = None) -> Tensor:
    """One-shot MXFP8 linear: quantize ``x`` ``[tokens, K]`` and return ``x_q @ weight.T
    (+ bias)`` in ``x.dtype``. ``bias`` is keyword-only, as in every GEMM of the eager API.

    Raises:
        TypeError, ValueError: on a wrong type, dtype, shape or device.
    """
    require_tensor(x, "x")
    require(
        isinstance(weight, MXFP8Weight),
        TypeError,
        "weight",
        "an MXFP8Weight",
        type(weight).__name__,
    )
    require_2d(x, "x")
    require_source_dtype(x, "x")
    require_same_device(x, weight.device, "x")
    require(
        x.shape[1] == weight.in_features,
        ValueError,
        "x",
        f"{weight.in_features} columns (weight.in_features)",
        x.shape[1],
    )
    check_bias(bias, weight)
    return ops.call(ops.linear, x, weight.values, weight.raw_scales, bias)
