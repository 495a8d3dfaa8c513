"""MXFP8 format facts shared by every piece of the project.

Values are ``torch.float8_e4m3fn``, row-major ``[rows, K]``. Every 32 consecutive elements
of a row share one E8M0 scale (``torch.float8_e8m0fnu``, byte = exponent + 127) chosen by
the RCEIL rule, bit for bit as torchao's ``to_mx(..., ScaleCalculationMode.RCEIL)`` from
torchao 0.18 on (a block holding a NaN is NaN throughout; torchao 0.17 scaled its other values
by 2**-128): docs/quantize_log.md, "The RCEIL contract".

GEMM operands keep their scales in the 128x4 blocked layout of cuBLAS / CUTLASS / torchao
``to_blocked``: one 512-byte chunk per 128-row x 4-group tile, stored as a flat byte buffer.
Rows are padded to a multiple of 128 and groups to a multiple of 4; padding holds scale
byte 127 (a scale of 1.0) and zero values.
"""

from __future__ import annotations

import difflib
import enum
from dataclasses import dataclass

import torch

GROUP = 32
"""Elements of one row that share one scale."""

E4M3_MAX = 448.0
"""Largest finite ``float8_e4m3fn`` magnitude."""

SCALE_BIAS = 127
"""E8M0 exponent bias: scale byte ``b`` means ``2 ** (b - 127)``."""

SCALE_PAD = 127
"""Scale byte written into padding rows and groups (a scale of exactly 1.0)."""

SCALE_INF_BYTE = 254
"""Scale byte of a group holding an infinity (and no NaN): ``2 ** 127``."""

SCALE_NAN_BYTE = 255
"""Scale byte of a group holding a NaN: E8M0's NaN, so every value of the group reads NaN."""

ROW_BLOCK = 128
"""Rows covered by one 512-byte chunk of the blocked scale layout."""

GROUP_BLOCK = 4
"""Groups (of 32 columns) covered by one 512-byte chunk."""

CHUNK_BYTES = 512

STAGE_ALIGN = ROW_BLOCK
"""Staged slice widths and destination columns must be multiples of this: then a slice's
scales are a strided sub-view of the destination and no 512-byte chunk is shared."""

VALUE_DTYPE = torch.float8_e4m3fn
SCALE_DTYPE = torch.float8_e8m0fnu
SOURCE_DTYPES = (torch.bfloat16, torch.float16)


def ceil_div(a, b):
    """``ceil(a / b)`` for non-negative ints; also works on SymInts under tracing."""
    return (a + b - 1) // b


def row_blocks(rows):
    """128-row blocks of the scale layout that hold ``rows`` rows."""
    return ceil_div(rows, ROW_BLOCK)


def padded_rows(rows):
    """Rows of the scale layout: ``rows`` rounded up to a multiple of 128."""
    return row_blocks(rows) * ROW_BLOCK


def scale_groups(k: int) -> int:
    """Scale groups of one row of ``k`` columns (``k`` must be a multiple of 32)."""
    return k // GROUP


def group_blocks(groups: int) -> int:
    """512-byte chunks side by side in one 128-row block of ``groups`` scale groups: the
    groups rounded up to a multiple of 4, over 4 (``G4`` in :func:`scale_offset`)."""
    return (groups + GROUP_BLOCK - 1) // GROUP_BLOCK


def padded_groups(groups: int) -> int:
    """Groups of the scale layout: ``groups`` rounded up to a multiple of 4."""
    return group_blocks(groups) * GROUP_BLOCK


def blocked_view(flat: torch.Tensor, groups: int) -> torch.Tensor:
    """View a flat blocked buffer as ``[row_block, group_block, r%32, (r//32)%4, g%4]``."""
    return flat.view(torch.uint8).view(-1, group_blocks(groups), 32, 4, 4)


def from_blocked(flat: torch.Tensor, rows: int, groups: int) -> torch.Tensor:
    """Flat blocked scale buffer -> row-major ``[rows, groups]`` ``uint8`` scale bytes."""
    view = blocked_view(flat, groups)
    row_major = view.permute(0, 3, 2, 1, 4).reshape(view.shape[0] * ROW_BLOCK, -1)
    return row_major[:rows, :groups]


def dequantize(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """MXFP8 ``[rows, K]`` values and their blocked scales -> FP32 ``[rows, K]``.

    A scale byte of 0xFF (a NaN block) reads back as NaN.
    """
    rows, k = values.shape
    factors = from_blocked(scales, rows, k // GROUP).view(SCALE_DTYPE).float()
    grouped = values.float().view(rows, k // GROUP, GROUP) * factors.unsqueeze(-1)
    return grouped.view(rows, k)


def row_block_bytes(k: int) -> int:
    """Bytes of the blocked scales of one 128-row block of ``k`` columns."""
    return group_blocks(scale_groups(k)) * CHUNK_BYTES


def scale_bytes(rows, k: int):
    """Bytes of the blocked scale buffer for ``rows`` x ``k`` values, padding included."""
    return row_blocks(rows) * row_block_bytes(k)


def scale_offset(row, group, k: int):
    """Byte offset of (row, group) in the blocked layout; works on ints and int tensors.

    ``(r%32)*16 + ((r//32)%4)*4 + (g%4) + (g//4)*512 + (r//128)*G4*512``, ``G4 = ceil(G/4)``.
    """
    g4 = group_blocks(scale_groups(k))
    return (
        (row % 32) * 16
        + ((row // 32) % 4) * 4
        + (group % 4)
        + (group // 4) * CHUNK_BYTES
        + (row // ROW_BLOCK) * g4 * CHUNK_BYTES
    )


def fail(error: type[Exception], argument: str, expected: str, given):
    """Raise ``error("argument: expected ..., got ...")``: the one message form of every
    argument check in the package."""
    raise error(f"{argument}: expected {expected}, got {given}")


class Activation(str, enum.Enum):
    """What an MXFP8 projection does with its input: the one choice a layer, a stager, a
    shard, a warm-up plan and a kernel config carry, as this type (never as a bare string).

    ``W8A8`` (``"mxfp8"``, the default) quantizes the input by the RCEIL rule into MXFP8
    storage, then runs the MXFP8 GEMM; ``W8A16`` (``"bf16"``) multiplies the 16-bit input
    as it is (FP32 ones as FP32) by the weight's exact E4M3 x E8M0 values. The public
    surface takes the strings too (:meth:`of`); a member compares equal to its string.
    """

    W8A8 = "mxfp8"
    W8A16 = "bf16"

    @classmethod
    def of(cls, value) -> Activation:
        """``value`` as an :class:`Activation`: a member, or its string ``"mxfp8"`` /
        ``"bf16"``.

        Raises:
            TypeError: neither. ValueError: another string (naming a close one).
        """
        if isinstance(value, cls):
            return value
        if not isinstance(value, str):
            fail(TypeError, "activation", "'mxfp8' or 'bf16'", type(value).__name__)
        try:
            return cls(value)
        except ValueError:
            close = difflib.get_close_matches(value.lower(), ACTIVATIONS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            fail(ValueError, "activation", "'mxfp8' (W8A8) or 'bf16' (W8A16)", f"{value!r}{hint}")

    @property
    def quantized(self) -> bool:
        """Whether the input is quantized into MXFP8 storage before the GEMM (W8A8): what a
        stager allocates for it and what warm-up plans the slice quantizer for."""
        return self is Activation.W8A8

    @property
    def linear_op(self) -> str:
        """The name of the one-shot ``mxfp8::`` op a layer of this activation runs on one
        input (the op the fusion pass finds behind a cat)."""
        return "linear" if self.quantized else "linear_w8a16"

    @property
    def input_bytes(self) -> int:
        """Bytes of one input element as the GEMM reads it: MXFP8 (1) or BF16 (2)."""
        return 1 if self.quantized else 2

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


ACTIVATIONS = tuple(a.value for a in Activation)
"""The strings :meth:`Activation.of` takes: ``"mxfp8"`` (W8A8), ``"bf16"`` (W8A16)."""


def check_activation(activation) -> Activation:
    """``activation`` (an :class:`Activation` or its string) as an :class:`Activation`.

    Raises:
        TypeError: not a string. ValueError: another string (naming a close one).
    """
    return Activation.of(activation)


def _scale_buffer(values, scales) -> torch.Tensor:
    """Check a hand-built operand's tensors; return ``scales`` as its raw uint8 bytes.

    O(1): dtype, rank, strides, size and device only. Operands are usually built once per
    packed weight or staging buffer, but code may build one per call (an ``MXFP8Weight``
    around a module's buffers), so each tensor attribute is read once.
    """
    if not isinstance(values, torch.Tensor):
        fail(TypeError, "values", "a torch.Tensor", type(values).__name__)
    if values.dtype is not VALUE_DTYPE:
        fail(TypeError, "values", "dtype float8_e4m3fn", values.dtype)
    shape = values.shape
    if len(shape) != 2:
        fail(ValueError, "values", "a 2-D tensor [rows, K]", f"shape {tuple(shape)}")
    rows, k = shape
    if k <= 0 or k % GROUP:
        fail(ValueError, "values", f"K (shape[1]) a positive multiple of {GROUP}", k)
    strides = values.stride()
    # the kernels and the reference address a row as K consecutive bytes
    if strides[1] != 1 or (rows > 1 and strides[0] < k):
        fail(ValueError, "values", "K contiguous, rows not overlapping", f"strides {strides}")
    if not isinstance(scales, torch.Tensor):
        fail(TypeError, "scales", "a torch.Tensor", type(scales).__name__)
    dtype = scales.dtype
    if dtype is not torch.uint8 and dtype is not SCALE_DTYPE:
        fail(TypeError, "scales", "dtype float8_e8m0fnu (or its uint8 bytes)", dtype)
    size = scale_bytes(rows, k)
    if scales.shape != (size,):
        fail(
            ValueError,
            "scales",
            f"a 1-D blocked buffer of scale_bytes({rows}, {k}) = {size} bytes",
            f"shape {tuple(scales.shape)}",
        )
    if size and scales.stride() != (1,):
        fail(ValueError, "scales", "a contiguous buffer", f"stride {scales.stride()}")
    if scales.device != values.device:
        fail(ValueError, "scales", f"a tensor on {values.device} (values' device)", scales.device)
    return scales if dtype is torch.uint8 else scales.view(torch.uint8)


# Both operands keep their scales as raw uint8 bytes and show them as float8_e8m0fnu through
# a view. The mxfp8:: ops take the bytes: Inductor cannot compile a float8_e8m0fnu argument
# of a mutating custom op, nor the copy back into a float8_e8m0fnu graph input that a
# mutation through a uint8 view of it needs (KeyError in the CPU code generator). Holding the
# bytes makes the tensor that torch.compile lifts from an operand passed in uint8, so staging
# into storage allocated outside the compiled function mutates it in place.


@dataclass(frozen=True, init=False)
class _Operand:
    """What both GEMM operands hold, and what they read from it."""

    values: torch.Tensor
    raw_scales: torch.Tensor
    """The blocked scale buffer as raw ``uint8`` bytes (what the ``mxfp8::`` ops take)."""

    @property
    def scales(self) -> torch.Tensor:
        """The blocked scale buffer as ``float8_e8m0fnu`` (a view of :attr:`raw_scales`)."""
        return self.raw_scales.view(SCALE_DTYPE)

    @property
    def in_features(self) -> int:
        """K: the columns of ``values``."""
        return self.values.shape[1]

    @property
    def device(self) -> torch.device:
        """The device of ``values`` (and of the scales)."""
        return self.values.device

    @property
    def shape(self) -> torch.Size:
        """``values``' shape: ``[N, K]`` for a weight, ``[capacity, K]`` for storage."""
        return self.values.shape

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The values times their E8M0 scales, ``[rows, K]`` in ``dtype``: a new tensor.

        In FP32 (the default) every product of an E4M3 value and an E8M0 scale is exact
        unless it passes FP32's range; a block with the NaN scale byte reads back as NaN.

        Raises:
            TypeError: ``dtype`` is not a floating-point dtype.
        """
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype: expected a floating-point torch.dtype, got {dtype!r}")
        return dequantize(self.values, self.raw_scales).to(dtype)


@dataclass(frozen=True, init=False)
class MXFP8Input(_Operand):
    """MXFP8 storage for the left GEMM operand (activations), ``capacity`` rows.

    ``MXFP8Input(values, scales, dtype=torch.bfloat16)``: ``values`` is ``[capacity, K]``
    ``float8_e4m3fn`` with K contiguous and a multiple of 32; ``scales`` is the flat blocked
    scale buffer of ``scale_bytes(capacity, K)`` bytes, ``float8_e8m0fnu`` or its ``uint8``
    bytes (contiguous, on ``values``' device). The tensors are used, not copied. Rows past
    the live token count are never read by the GEMM. ``dtype`` (BF16 or FP16) is the dtype
    of the sources staged into it and of what the GEMM returns by default.
    :func:`~mxfp8_fusion.empty_input` allocates one.

    Raises:
        TypeError, ValueError: naming ``values``, ``scales`` or ``dtype``.
    """

    dtype: torch.dtype

    def __init__(
        self, values: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.bfloat16
    ):
        raw = _scale_buffer(values, scales)
        if dtype is not torch.bfloat16 and dtype is not torch.float16:
            fail(TypeError, "dtype", "torch.bfloat16 or torch.float16", dtype)
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "raw_scales", raw)
        object.__setattr__(self, "dtype", dtype)

    @classmethod
    def _of(cls, values: torch.Tensor, raw_scales: torch.Tensor, dtype: torch.dtype):
        """An MXFP8Input of tensors an ``mxfp8::`` op made (right by construction), without
        the checks: the one-shot :func:`~mxfp8_fusion.quantize` builds one per call."""
        self = object.__new__(cls)
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "raw_scales", raw_scales)
        object.__setattr__(self, "dtype", dtype)
        return self

    @property
    def capacity(self) -> int:
        """The rows of ``values``: the most tokens one staging holds."""
        return self.values.shape[0]

    def __repr__(self) -> str:
        # the facts, not the bytes: fresh storage holds uninitialised memory (NaNs, say)
        return (
            f"MXFP8Input(capacity={self.capacity}, in_features={self.in_features}, "
            f"dtype={self.dtype}, device={self.device})"
        )


@dataclass(frozen=True, init=False)
class MXFP8Weight(_Operand):
    """A packed MXFP8 weight ``[out_features, in_features]`` (the right GEMM operand).

    ``MXFP8Weight(values, scales)``: ``values`` is ``[N, K]`` ``float8_e4m3fn`` (K contiguous,
    a multiple of 32); ``scales`` is the flat blocked scale buffer for N rows and K/32
    groups, ``scale_bytes(N, K)`` bytes, ``float8_e8m0fnu`` or its ``uint8`` bytes. To pack
    a BF16 weight or a checkpoint's row-major scales use :func:`~mxfp8_fusion.pack_weight`.

    Raises:
        TypeError, ValueError: naming ``values`` or ``scales``.
    """

    def __init__(self, values: torch.Tensor, scales: torch.Tensor):
        raw = _scale_buffer(values, scales)
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "raw_scales", raw)

    @property
    def out_features(self) -> int:
        """N: the rows of ``values``."""
        return self.values.shape[0]

    def __repr__(self) -> str:
        return (
            f"MXFP8Weight(out_features={self.out_features}, in_features={self.in_features}, "
            f"device={self.device})"
        )
