"""``torch.library`` custom ops in namespace ``mxfp8``.

Functional ops (``quantize``, ``mm``, ``linear``, and the W8A16 ``mm_slices`` and
``linear_w8a16``) allocate their outputs; mutating ops (``quantize_slice_``,
``quantize_slices_``, ``mm_into``, ``mm_slices_into``) write into buffers they are given
and allocate nothing, so they can be captured in CUDA Graphs. Every op has a fake
implementation for tracing.

Dispatch: a CUDA tensor runs the CuTe DSL kernel where ``mxfp8_fusion.kernels`` supports
the device and shape, and the plain-torch reference otherwise (with a one-time warning on
CUDA). The CPU always runs the reference. The ops do no argument validation: the eager API
in ``api.py`` and the graph pass check everything before an op is called.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor
from torch.nn import Parameter
from torch.utils import _python_dispatch

from . import grad, lowering, reference
from .format import SCALE_DTYPE, VALUE_DTYPE, scale_bytes
from .kernels import dispatch as kernels

_warned: set[str] = set()
_lib = torch.library.Library("mxfp8", "DEF")


def _define(name: str, body, mutates_args=()):
    """Define ``mxfp8::name`` with ``body``'s signature as schema and ``body`` as the kernel
    of every backend; returns the op (an OpOverload).

    A plain ``torch.library.Library`` definition instead of ``torch.library.custom_op``:
    the latter's Python dispatch layers cost ~14 us per call against ~4.5 us here (CPU
    micro-benchmark), and every call of an op in a compiled graph pays them.

    Autograd (``grad.autograd_kernel``): in grad mode, when an input the op reads requires
    grad, the op's outputs (a mutating op's written buffers) get a backward that raises;
    otherwise the op runs below autograd and records nothing.
    """
    _lib.define(name + torch.library.infer_schema(body, mutates_args=mutates_args))
    _lib.impl(name, body, "CompositeExplicitAutograd")
    op = getattr(torch.ops.mxfp8, name).default
    _lib.impl(name, grad.autograd_kernel(op), "Autograd")
    return op


def _fallback_warning(what: str, device: torch.device, reason: str) -> None:
    if device.type == "cuda" and what not in _warned:
        _warned.add(what)
        warnings.warn(
            f"mxfp8_fusion: no {what} kernel for this device or shape "
            f"({reason}); using the plain-torch reference",
            stacklevel=3,
        )


def _empty_storage(rows, k: int, device: torch.device) -> tuple[Tensor, Tensor]:
    values = torch.empty(rows, k, dtype=VALUE_DTYPE, device=device)
    scales = torch.empty(scale_bytes(rows, k), dtype=SCALE_DTYPE, device=device)
    return values, scales


def _out_shape(a_values: Tensor, b_values: Tensor) -> tuple:
    return (a_values.shape[0], b_values.shape[0])


# --- slice quantizer (mutating) --------------------------------------------------------


def _quantize_slice_body(source: Tensor, values: Tensor, scales: Tensor, column: int) -> None:
    """Quantize ``source`` ``[tokens, width]`` into columns ``[column, column+width)``."""
    if source.shape[0] == 0:
        return
    reason = kernels.quantize_slice(source, values, scales, column)
    if reason is None:
        return
    _fallback_warning("slice quantizer", source.device, reason)
    reference.quantize_slice_(source, values, scales, column)


quantize_slice_ = _define(
    "quantize_slice_", _quantize_slice_body, mutates_args=("values", "scales")
)


@torch.library.register_fake("mxfp8::quantize_slice_")
def _(source: Tensor, values: Tensor, scales: Tensor, column: int) -> None:
    lowering.register()  # before Inductor lowers any mxfp8:: op
    return None


def _quantize_slices_body(
    sources: list[Tensor], values: Tensor, scales: Tensor, columns: list[int]
) -> None:
    """Quantize each ``sources[i]`` into columns starting at ``columns[i]``: the bytes of
    calling :func:`quantize_slice_` per slice, in as few kernel launches as possible."""
    if not sources or sources[0].shape[0] == 0:
        return
    if kernels.quantize_slices(sources, values, scales, columns) is None:
        return
    for source, column in zip(sources, columns, strict=True):
        _quantize_slice_body(source, values, scales, column)


quantize_slices_ = _define(
    "quantize_slices_", _quantize_slices_body, mutates_args=("values", "scales")
)


@torch.library.register_fake("mxfp8::quantize_slices_")
def _(sources: list[Tensor], values: Tensor, scales: Tensor, columns: list[int]) -> None:
    lowering.register()  # before Inductor lowers any mxfp8:: op
    return None


# --- one-shot quantize (functional) ----------------------------------------------------


def _quantize_body(x: Tensor) -> tuple[Tensor, Tensor]:
    """Quantize ``x`` ``[rows, K]``: ``(values [rows, K] e4m3, blocked scales e8m0)``."""
    values, scales = _empty_storage(x.shape[0], x.shape[1], x.device)
    if x.shape[0] == 0:
        return values, scales
    reason = kernels.quantize_slice(x, values, scales, 0)
    if reason is None:
        return values, scales
    _fallback_warning("slice quantizer", x.device, reason)
    return reference.quantize(x)


quantize = _define("quantize", _quantize_body, mutates_args=())


@torch.library.register_fake("mxfp8::quantize")
def _(x: Tensor) -> tuple[Tensor, Tensor]:
    lowering.register()  # before Inductor lowers any mxfp8:: op
    return _empty_storage(x.shape[0], x.shape[1], x.device)


# --- GEMM ------------------------------------------------------------------------------


def _mm_into_body(
    a_values: Tensor,
    a_scales: Tensor,
    b_values: Tensor,
    b_scales: Tensor,
    bias: Tensor | None,
    out: Tensor,
) -> None:
    """``out[:M] = A @ B.T (+ bias)`` with ``A`` ``[M, K]`` and ``B`` ``[N, K]`` MXFP8."""
    if a_values.shape[0] == 0:
        return
    reason = kernels.mm_into(a_values, a_scales, b_values, b_scales, bias, out)
    if reason is None:
        return
    _fallback_warning("GEMM", a_values.device, reason)
    reference.mm_into(a_values, a_scales, b_values, b_scales, bias, out)


mm_into = _define("mm_into", _mm_into_body, mutates_args=("out",))


@torch.library.register_fake("mxfp8::mm_into")
def _(a_values, a_scales, b_values, b_scales, bias, out) -> None:
    lowering.register()  # before Inductor lowers any mxfp8:: op
    return None


def _mm_body(
    a_values: Tensor,
    a_scales: Tensor,
    b_values: Tensor,
    b_scales: Tensor,
    bias: Tensor | None,
    out_dtype: torch.dtype,
) -> Tensor:
    """``A @ B.T (+ bias)`` into a new ``[M, N]`` tensor of ``out_dtype``."""
    out = torch.empty(_out_shape(a_values, b_values), dtype=out_dtype, device=a_values.device)
    _mm_into_body(a_values, a_scales, b_values, b_scales, bias, out)
    return out


mm = _define("mm", _mm_body, mutates_args=())


@torch.library.register_fake("mxfp8::mm")
def _(a_values, a_scales, b_values, b_scales, bias, out_dtype):
    lowering.register()  # before Inductor lowers any mxfp8:: op
    return a_values.new_empty(_out_shape(a_values, b_values), dtype=out_dtype)


# --- one-shot linear (quantize + GEMM) -------------------------------------------------


def _linear_body(x: Tensor, b_values: Tensor, b_scales: Tensor, bias: Tensor | None) -> Tensor:
    """Quantize ``x`` ``[M, K]`` to MXFP8, then ``x_q @ B.T (+ bias)`` in ``x.dtype``."""
    a_values, a_scales = _quantize_body(x)
    return _mm_body(a_values, a_scales, b_values, b_scales, bias, x.dtype)


linear = _define("linear", _linear_body, mutates_args=())


@torch.library.register_fake("mxfp8::linear")
def _(x, b_values, b_scales, bias):
    lowering.register()  # before Inductor lowers any mxfp8:: op
    return x.new_empty(_out_shape(x, b_values))


# --- W8A16 GEMM from slices: no concatenation, no activation quantization ---------------


def _mm_slices_into_body(
    slices: list[Tensor],
    b_values: Tensor,
    b_scales: Tensor,
    bias: Tensor | None,
    out: Tensor,
) -> None:
    """``out[:M] = cat(slices, -1) @ dequant(B).T (+ bias)``, the slices as they are
    (16-bit activations, the weight's E4M3 values times their scales, FP32 accumulation)."""
    if slices[0].shape[0] == 0:
        return
    reason = kernels.mm_slices_into(slices, b_values, b_scales, bias, out)
    if reason is None:
        return
    _fallback_warning("W8A16 GEMM", slices[0].device, reason)
    reference.mm_slices_into(slices, b_values, b_scales, bias, out)


mm_slices_into = _define("mm_slices_into", _mm_slices_into_body, mutates_args=("out",))


@torch.library.register_fake("mxfp8::mm_slices_into")
def _(slices, b_values, b_scales, bias, out) -> None:
    lowering.register()  # before Inductor lowers any mxfp8:: op
    return None


def _mm_slices_body(
    slices: list[Tensor], b_values: Tensor, b_scales: Tensor, bias: Tensor | None
) -> Tensor:
    """``cat(slices, -1) @ dequant(B).T (+ bias)`` into a new ``[M, N]`` tensor of the
    slices' dtype."""
    out = slices[0].new_empty(_out_shape(slices[0], b_values))
    _mm_slices_into_body(slices, b_values, b_scales, bias, out)
    return out


mm_slices = _define("mm_slices", _mm_slices_body, mutates_args=())


@torch.library.register_fake("mxfp8::mm_slices")
def _(slices, b_values, b_scales, bias):
    lowering.register()  # before Inductor lowers any mxfp8:: op
    return slices[0].new_empty(_out_shape(slices[0], b_values))


def _linear_w8a16_body(
    x: Tensor, b_values: Tensor, b_scales: Tensor, bias: Tensor | None
) -> Tensor:
    """``x @ dequant(B).T (+ bias)`` with ``x`` ``[M, K]`` as it is (W8A16): what
    ``MXFP8Linear(activation="bf16")`` runs, and what the pass rewrites to
    :data:`mm_slices` when ``x`` is a concatenation."""
    return _mm_slices_body([x], b_values, b_scales, bias)


linear_w8a16 = _define("linear_w8a16", _linear_w8a16_body, mutates_args=())


@torch.library.register_fake("mxfp8::linear_w8a16")
def _(x, b_values, b_scales, bias):
    lowering.register()  # before Inductor lowers any mxfp8:: op
    return x.new_empty(_out_shape(x, b_values))


# --- eager calls -----------------------------------------------------------------------

_BODIES = {
    quantize_slice_: _quantize_slice_body,
    quantize_slices_: _quantize_slices_body,
    quantize: _quantize_body,
    mm_into: _mm_into_body,
    mm: _mm_body,
    linear: _linear_body,
    mm_slices_into: _mm_slices_into_body,
    mm_slices: _mm_slices_body,
    linear_w8a16: _linear_w8a16_body,
}


def call(op, *args):
    """Run custom op ``op`` from eager code.

    Even a plain dispatcher call (argument parsing, the Python kernel hop) costs host time
    that a slice quantization or a few-token GEMM does not have to spare: the staged path
    makes eight such calls per projection. The dispatcher is needed only while tracing
    (torch.compile, fake tensors, a dispatch mode), for tensor subclasses, or when autograd
    records; a plain inference call runs the op's body directly, with the same result.
    """
    if _needs_dispatcher(args):
        return op(*args)
    return _BODIES[op](*args)


def _needs_dispatcher(args) -> bool:
    if torch.compiler.is_compiling() or _python_dispatch._get_current_dispatch_mode() is not None:
        return True
    return _records_or_subclass(args, torch.is_grad_enabled())


def _records_or_subclass(args, grad_enabled: bool) -> bool:
    """Whether autograd would record on ``args`` or one is a tensor subclass (in lists too).
    Type tests, and in grad mode the history check: this runs on every eager op call."""
    for arg in args:
        kind = type(arg)
        if kind is Tensor or kind is Parameter:  # a Parameter dispatches as a plain Tensor
            if grad_enabled and grad.has_history(arg):
                return True
        elif kind is list or kind is tuple:
            if _records_or_subclass(arg, grad_enabled):
                return True
        elif isinstance(arg, Tensor):  # a subclass: its own dispatch must run
            return True
    return False
