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
from .format import (
    GROUP,
    SCALE_DTYPE,
    SCALE_NAN_BYTE,
    SOURCE_DTYPES,
    STAGE_ALIGN,
    VALUE_DTYPE,
    MXFP8Input,
    MXFP8Weight,
    scale_bytes,
)
from .format import fail as _fail

_MAX_BYTES = 2**63 - 1  # torch's storage sizes are int64


def _live_rows(t: Tensor, tokens: int) -> Tensor:
    # t[:tokens]; the whole tensor itself when that is all of it (a view costs ~1 us a call)
    return t if tokens == t.shape[0] else t[:tokens]


def _require(ok: bool, error: type[Exception], argument: str, expected: str, given) -> None:
    if not ok:
        _fail(error, argument, expected, given)


# The checks below run on every call of the hot eager entry points (eight per staged
# projection): messages are formatted only when a check fails.


def _require_tensor(t, argument: str) -> None:
    if not isinstance(t, Tensor):
        _fail(TypeError, argument, "a torch.Tensor", type(t).__name__)


def _require_2d(t: Tensor, argument: str) -> None:
    if t.dim() != 2:
        _fail(ValueError, argument, "a 2-D tensor", f"shape {tuple(t.shape)}")


def _require_source_dtype(t: Tensor, argument: str) -> None:
    if t.dtype not in SOURCE_DTYPES:
        _fail(TypeError, argument, "dtype bfloat16 or float16", t.dtype)


def _require_same_device(t: Tensor, device: torch.device, argument: str) -> None:
    if t.device != device:
        _fail(ValueError, argument, f"a tensor on {device}", t.device)


def _require_int(v, argument: str) -> None:
    if type(v) is not int and (not isinstance(v, (int, torch.SymInt)) or isinstance(v, bool)):
        _fail(TypeError, argument, "an int", type(v).__name__)


def _check_tokens(tokens, capacity: int):
    if tokens is None:
        return capacity
    _require_int(tokens, "tokens")
    if not 0 <= tokens <= capacity:
        _fail(ValueError, "tokens", f"0 <= tokens <= {capacity}", tokens)
    return tokens


def _check_bias(bias, weight: MXFP8Weight) -> None:
    if bias is None:
        return
    _require_tensor(bias, "bias")
    n = weight.out_features
    if tuple(bias.shape) != (n,):
        _fail(ValueError, "bias", f"shape ({n},)", tuple(bias.shape))
    _require(bias.is_floating_point(), TypeError, "bias", "a floating-point dtype", bias.dtype)
    _require_same_device(bias, weight.device, "bias")


def _check_operands(inp: MXFP8Input, weight: MXFP8Weight) -> None:
    if not isinstance(inp, MXFP8Input):
        _fail(TypeError, "inp", "an MXFP8Input", type(inp).__name__)
    if not isinstance(weight, MXFP8Weight):
        _fail(TypeError, "weight", "an MXFP8Weight", type(weight))
    if weight.in_features != inp.in_features:
        _fail(
            ValueError, "weight", f"in_features {inp.in_features} (the input's)", weight.in_features
        )
    _require_same_device(weight.values, inp.device, "weight")


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
    _require_tensor(weight, "weight")
    # The packed tensors never join autograd: a graph would keep the source Parameter alive
    # (no memory saved), and a non-leaf tensor cannot be deep-copied.
    weight = weight.detach()
    _require_2d(weight, "weight")
    n, k = weight.shape
    _require(n > 0, ValueError, "weight", "at least one output row", f"shape {(n, k)}")
    _require(k > 0 and k % GROUP == 0, ValueError, "weight", "in_features a multiple of 32", k)
    if scales is None:
        _require_source_dtype(weight, "weight")
        values, blocked = ops.call(ops.quantize, weight.contiguous())
        return MXFP8Weight(values, blocked)
    _require(weight.dtype == VALUE_DTYPE, TypeError, "weight", "float8_e4m3fn values", weight.dtype)
    _require_tensor(scales, "scales")
    scales = scales.detach()
    _require(
        scales.dtype in (SCALE_DTYPE, torch.uint8),
        TypeError,
        "scales",
        "dtype float8_e8m0fnu or uint8",
        scales.dtype,
    )
    expected = (n, k // GROUP)
    _require(
        tuple(scales.shape) == expected,
        ValueError,
        "scales",
        f"shape {expected}",
        tuple(scales.shape),
    )
    _require_same_device(scales, weight.device, "scales")
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
    _require_int(capacity, "capacity")
    _require_int(in_features, "in_features")
    _require(capacity >= 0, ValueError, "capacity", "a non-negative row count", capacity)
    _require(
        in_features > 0 and in_features % STAGE_ALIGN == 0,
        ValueError,
        "in_features",
        f"a positive multiple of {STAGE_ALIGN}",
        in_features,
    )
    if capacity * in_features > _MAX_BYTES:
        _fail(
            ValueError,
            "capacity",
            f"capacity * in_features at most 2**63 - 1 bytes (in_features {in_features})",
            capacity,
        )
    _require(dtype in SOURCE_DTYPES, TypeError, "dtype", "torch.bfloat16 or torch.float16", dtype)
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
        _fail(
            TypeError, "device", "a torch.device, a device string or an int", type(device).__name__
        )
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        expected = "a device such as 'cpu' or 'cuda:0'"
        if isinstance(device, int):  # an index with no accelerator to index
            expected = "a device that exists (torch sees no accelerator here)"
        _fail(ValueError, "device", expected, repr(device))
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
        _fail(ValueError, "device", f"a device of this machine ({have})", repr(device))
    count = torch.accelerator.device_count()
    if parsed.index is not None and parsed.index >= count:
        _fail(ValueError, "device", f"a {parsed.type} index below {count}", repr(device))
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
        _fail(TypeError, "sources", "a non-empty list or tuple of tensors", type(sources).__name__)
    _check_column(destination_column)
    columns = []
    column = destination_column
    for i, source in enumerate(sources):
        _check_slice(source, f"sources[{i}]", dest, column)
        if source.shape[0] != sources[0].shape[0]:
            _fail(
                ValueError, f"sources[{i}]", f"{sources[0].shape[0]} rows, as sources[0]",
                source.shape[0],
            )  # fmt: skip
        columns.append(column)
        column += source.shape[1]
    ops.call(ops.quantize_slices_, list(sources), dest.values, dest.raw_scales, columns)


def _check_dest(dest) -> None:
    if not isinstance(dest, MXFP8Input):
        _fail(TypeError, "dest", "an MXFP8Input", type(dest).__name__)


def _check_column(destination_column) -> None:
    _require_int(destination_column, "destination_column")
    if destination_column < 0 or destination_column % STAGE_ALIGN:
        _fail(
            ValueError,
            "destination_column",
            f"a non-negative multiple of {STAGE_ALIGN}",
            destination_column,
        )


def _check_slice(source, argument: str, dest: MXFP8Input, column: int) -> None:
    """``source`` is a 2-D tensor of ``dest.dtype`` on ``dest``'s device whose width is a
    multiple of 128 and whose columns from ``column`` and rows fit in ``dest``."""
    _require_tensor(source, argument)
    _require_2d(source, argument)
    if source.dtype is not dest.dtype:
        # also refuses the other 16-bit dtype: the staged GEMM would return dest.dtype where
        # the concatenated path returns the source's
        _fail(
            TypeError,
            argument,
            f"dtype {dest.dtype} (dest.dtype, set by empty_input(..., dtype=))",
            source.dtype,
        )
    _require_same_device(source, dest.device, argument)
    tokens, width = source.shape
    if width <= 0 or width % STAGE_ALIGN:
        _fail(ValueError, argument, f"a width that is a positive multiple of {STAGE_ALIGN}", width)
    if column + width > dest.in_features:
        _fail(
            ValueError,
            argument,
            f"columns [{column}, {column + width}) within in_features {dest.in_features}",
            f"width {width}",
        )
    if tokens > dest.capacity:
        _fail(ValueError, argument, f"at most {dest.capacity} rows (dest.capacity)", tokens)


def mm_quantized(
    inp: MXFP8Input,
    weight: MXFP8Weight,
    tokens: int | None = None,
    bias: Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> Tensor:
    """``inp[:tokens] @ weight.T (+ bias)`` into a new ``[tokens, out_features]`` tensor.

    ``tokens`` defaults to ``inp.capacity``; ``out_dtype`` to ``inp.dtype``.

    Raises:
        TypeError, ValueError: on mismatched operands, tokens above capacity or a bad bias.
    """
    _check_operands(inp, weight)
    tokens = _check_tokens(tokens, inp.capacity)
    _check_bias(bias, weight)
    out_dtype = inp.dtype if out_dtype is None else out_dtype
    _require(out_dtype in SOURCE_DTYPES, TypeError, "out_dtype", "bfloat16 or float16", out_dtype)
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
    tokens: int | None = None,
    bias: Tensor | None = None,
) -> Tensor:
    """Write ``inp[:tokens] @ weight.T (+ bias)`` into ``out[:tokens]`` and return that view
    (``out`` itself when it has ``tokens`` rows).

    ``out`` is caller-owned, ``[>= tokens, out_features]``, BF16 or FP16, on the operands'
    device, with no two elements in the same memory (not expanded) and none in ``bias``'s;
    its rows past ``tokens`` are not touched. Nothing is allocated, so the call can be captured in a CUDA Graph.

    Raises:
        TypeError, ValueError: on a bad ``out``, mismatched operands, tokens above capacity,
        or a ``bias`` that overlaps ``out``.
    """
    _check_operands(inp, weight)
    tokens = _check_tokens(tokens, inp.capacity)
    _check_bias(bias, weight)
    _check_out(out, weight, tokens, bias)
    ops.call(
        ops.mm_into,
        grad.live_rows(inp.values, tokens),
        inp.raw_scales,
        weight.values,
        weight.raw_scales,
        bias,
        out,
    )
    return _live_rows(out, tokens)


def _check_out(out, weight: MXFP8Weight, tokens: int, bias: Tensor | None) -> None:
    """``out`` is a 2-D BF16 or FP16 ``[>= tokens, out_features]`` tensor on ``weight``'s
    device whose elements lie in distinct memory, none of it ``bias``'s."""
    _require_tensor(out, "out")
    _require_2d(out, "out")
    if out.dtype not in SOURCE_DTYPES:
        _fail(TypeError, "out", "dtype bfloat16 or float16", out.dtype)
    _require_same_device(out, weight.device, "out")
    n = weight.out_features
    if out.shape[0] < tokens or out.shape[1] != n:
        _fail(ValueError, "out", f"shape [>= {tokens}, {n}]", tuple(out.shape))
    if not out.is_contiguous() and _overlaps(out):  # the common case costs one call
        _fail(
            ValueError,
            "out",
            "elements in distinct memory (not expanded)",
            f"strides {out.stride()}",
        )
    if bias is not None and not torch.compiler.is_compiling() and _share_memory(out, bias):
        # the kernel's CTAs write out while others still read bias: the result would race.
        # Not checked while tracing: a traced tensor has no storage to compare.
        _fail(ValueError, "bias", "memory apart from out's", "a tensor that overlaps out")


def _check_slices(slices, weight) -> int:
    """``slices`` is a non-empty list or tuple of 2-D BF16 or FP16 tensors of one dtype and
    row count, on ``weight``'s device, whose widths are positive multiples of 128 and add up
    to ``weight.in_features``. Returns the row count."""
    if not isinstance(slices, (list, tuple)) or not slices:
        _fail(TypeError, "slices", "a non-empty list or tuple of tensors", type(slices).__name__)
    if not isinstance(weight, MXFP8Weight):
        _fail(TypeError, "weight", "an MXFP8Weight", type(weight).__name__)
    first = slices[0]
    _require_tensor(first, "slices[0]")
    _require_source_dtype(first, "slices[0]")
    device = weight.device
    width = 0
    for i, source in enumerate(slices):
        argument = f"slices[{i}]"
        _require_tensor(source, argument)
        _require_2d(source, argument)
        if source.dtype is not first.dtype:
            _fail(TypeError, argument, f"dtype {first.dtype}, as slices[0]", source.dtype)
        _require_same_device(source, device, argument)
        rows, columns = source.shape
        if rows != first.shape[0]:
            _fail(ValueError, argument, f"{first.shape[0]} rows, as slices[0]", rows)
        if columns <= 0 or columns % STAGE_ALIGN:
            _fail(
                ValueError, argument, f"a width that is a positive multiple of {STAGE_ALIGN}",
                columns,
            )  # fmt: skip
        width += columns
    if width != weight.in_features:
        _fail(
            ValueError, "slices",
            f"widths adding up to weight.in_features = {weight.in_features}", width,
        )  # fmt: skip
    return first.shape[0]


def mm_slices(
    slices: list[Tensor] | tuple[Tensor, ...], weight: MXFP8Weight, bias: Tensor | None = None
) -> Tensor:
    """``cat(slices, -1) @ weight.T (+ bias)`` straight from the slices (W8A16): no
    concatenation and no activation quantization, into a new ``[tokens, out_features]``
    tensor of the slices' dtype.

    The activations are used as they are and multiplied by the weight's exact E4M3 x E8M0
    values, summed in FP32: the numerics of a BF16 linear whose weight is the dequantized
    MXFP8 weight. ``slices`` are BF16 or FP16 ``[tokens, width]`` tensors of one dtype and
    row count, on the weight's device (views are fine); each width a positive multiple of
    128, the widths adding up to ``weight.in_features``. On sm_90 the CuTe DSL kernels read
    up to 8 slices as they are; elsewhere (and for more slices) the plain-torch reference
    runs, with a one-time warning on CUDA.

    Raises:
        TypeError, ValueError: naming ``slices[i]``, ``weight`` or ``bias``.
    """
    _check_slices(slices, weight)
    _check_bias(bias, weight)
    return ops.call(ops.mm_slices, list(slices), weight.values, weight.raw_scales, bias)


def mm_slices_into(
    slices: list[Tensor] | tuple[Tensor, ...],
    weight: MXFP8Weight,
    out: Tensor,
    bias: Tensor | None = None,
) -> Tensor:
    """Write ``cat(slices, -1) @ weight.T (+ bias)`` into ``out[:tokens]`` straight from the
    slices (W8A16, as :func:`mm_slices`) and return that view (``out`` itself when it has
    ``tokens`` rows).

    ``out`` is caller-owned, ``[>= tokens, out_features]``, BF16 or FP16, on the weight's
    device, with no two elements in the same memory and none in ``bias``'s or a slice's; its
    rows past ``tokens`` are not touched. Nothing is allocated, so the call can be captured
    in a CUDA Graph.

    Raises:
        TypeError, ValueError: naming ``slices[i]``, ``weight``, ``out`` or ``bias``.
    """
    tokens = _check_slices(slices, weight)
    _check_bias(bias, weight)
    _check_out(out, weight, tokens, bias)
    if not torch.compiler.is_compiling():
        for i, source in enumerate(slices):
            if _share_memory(out, source):
                _fail(ValueError, f"slices[{i}]", "memory apart from out's", "a view of out")
    ops.call(ops.mm_slices_into, list(slices), weight.values, weight.raw_scales, bias, out)
    return _live_rows(out, tokens)


def _share_memory(a: Tensor, b: Tensor) -> bool:
    """Whether ``a`` and ``b`` are views of one storage whose byte spans intersect (spans,
    not elements: two interleaved views count as sharing). Storages and offsets, not
    addresses, so meta and fake tensors (no memory) share nothing unless they are views."""
    if a.numel() == 0 or b.numel() == 0:
        return False
    if a.untyped_storage()._cdata != b.untyped_storage()._cdata:
        return False

    def span(t: Tensor) -> tuple[int, int]:
        last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))
        return t.storage_offset() * t.element_size(), (
            t.storage_offset() + last + 1
        ) * t.element_size()

    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1


def _overlaps(t: Tensor) -> bool:
    """Whether two elements of 2-D ``t`` share memory (an expanded or as_strided view): the
    inner dimension's extent must fit within one step of the outer one."""
    (rows, cols), (row_stride, col_stride) = t.shape, t.stride()
    if rows > 1 and cols > 1:
        if row_stride >= col_stride:
            return col_stride == 0 or col_stride * cols > row_stride
        return row_stride == 0 or row_stride * rows > col_stride
    if rows > 1:
        return row_stride == 0
    return cols > 1 and col_stride == 0


def quantize(x: Tensor) -> MXFP8Input:
    """Quantize ``x`` ``[rows, K]`` (BF16/FP16, K a multiple of 32) to a new MXFP8Input.

    Raises:
        TypeError, ValueError: on a wrong type, dtype or shape.
    """
    _require_tensor(x, "x")
    _require_2d(x, "x")
    _require_source_dtype(x, "x")
    _require(
        x.shape[1] > 0 and x.shape[1] % GROUP == 0,
        ValueError,
        "x",
        "a width that is a multiple of 32",
        x.shape[1],
    )
    values, scales = ops.call(ops.quantize, x)
    return MXFP8Input._of(values, scales.view(torch.uint8), x.dtype)


def mm(x: Tensor, weight: MXFP8Weight, bias: Tensor | None = None) -> Tensor:
    """One-shot MXFP8 linear: quantize ``x`` ``[tokens, K]`` and return ``x_q @ weight.T
    (+ bias)`` in ``x.dtype``.

    Raises:
        TypeError, ValueError: on a wrong type, dtype, shape or device.
    """
    _require_tensor(x, "x")
    _require(
        isinstance(weight, MXFP8Weight),
        TypeError,
        "weight",
        "an MXFP8Weight",
        type(weight).__name__,
    )
    _require_2d(x, "x")
    _require_source_dtype(x, "x")
    _require_same_device(x, weight.device, "x")
    _require(
        x.shape[1] == weight.in_features,
        ValueError,
        "x",
        f"{weight.in_features} columns (weight.in_features)",
        x.shape[1],
    )
    _check_bias(bias, weight)
    return ops.call(ops.linear, x, weight.values, weight.raw_scales, bias)
