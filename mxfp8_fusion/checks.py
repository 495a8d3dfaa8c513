"""Argument checks the eager API's functions share (every message names the argument, what
was expected and what was given: ``format.fail``). They run on every call of the hot eager
entry points (eight per staged projection), so a message is formatted only when a check
fails."""

from __future__ import annotations

import torch
from torch import Tensor

from .format import SOURCE_DTYPES, MXFP8Weight, fail


def live_rows(t: Tensor, tokens: int) -> Tensor:
    # t[:tokens]; the whole tensor itself when that is all of it (a view costs ~1 us a call)
    return t if tokens == t.shape[0] else t[:tokens]


def require(ok: bool, error: type[Exception], argument: str, expected: str, given) -> None:
    if not ok:
        fail(error, argument, expected, given)


def require_tensor(t, argument: str) -> None:
    if not isinstance(t, Tensor):
        fail(TypeError, argument, "a torch.Tensor", type(t).__name__)


def require_2d(t: Tensor, argument: str) -> None:
    if t.dim() != 2:
        fail(ValueError, argument, "a 2-D tensor", f"shape {tuple(t.shape)}")


def require_source_dtype(t: Tensor, argument: str) -> None:
    if t.dtype not in SOURCE_DTYPES:
        fail(TypeError, argument, "dtype bfloat16 or float16", t.dtype)


def require_same_device(t: Tensor, device: torch.device, argument: str) -> None:
    if t.device != device:
        fail(ValueError, argument, f"a tensor on {device}", t.device)


def require_int(v, argument: str) -> None:
    if type(v) is not int and (not isinstance(v, (int, torch.SymInt)) or isinstance(v, bool)):
        fail(TypeError, argument, "an int", type(v).__name__)


def check_tokens(tokens, capacity: int):
    if tokens is None:
        return capacity
    require_int(tokens, "tokens")
    if not 0 <= tokens <= capacity:
        fail(ValueError, "tokens", f"0 <= tokens <= {capacity}", tokens)
    return tokens


def check_bias(bias, weight: MXFP8Weight) -> None:
    if bias is None:
        return
    require_tensor(bias, "bias")
    n = weight.out_features
    if tuple(bias.shape) != (n,):
        fail(ValueError, "bias", f"shape ({n},)", tuple(bias.shape))
    require(bias.is_floating_point(), TypeError, "bias", "a floating-point dtype", bias.dtype)
    require_same_device(bias, weight.device, "bias")


def check_out(out, weight: MXFP8Weight, tokens: int, bias: Tensor | None) -> None:
    """``out`` is a 2-D BF16 or FP16 ``[>= tokens, out_features]`` tensor on ``weight``'s
    device whose elements lie in distinct memory, none of it ``bias``'s."""
    require_tensor(out, "out")
    require_2d(out, "out")
    if out.dtype not in SOURCE_DTYPES:
        fail(TypeError, "out", "dtype bfloat16 or float16", out.dtype)
    require_same_device(out, weight.device, "out")
    n = weight.out_features
    if out.shape[0] < tokens or out.shape[1] != n:
        fail(ValueError, "out", f"shape [>= {tokens}, {n}]", tuple(out.shape))
    if not out.is_contiguous() and overlaps(out):  # the common case costs one call
        fail(
            ValueError,
            "out",
            "elements in distinct memory (not expanded)",
            f"strides {out.stride()}",
        )
    if bias is not None and not torch.compiler.is_compiling() and share_memory(out, bias):
        # the kernel's CTAs write out while others still read bias: the result would race.
        # Not checked while tracing: a traced tensor has no storage to compare.
        fail(ValueError, "bias", "memory apart from out's", "a tensor that overlaps out")


def share_memory(a: Tensor, b: Tensor) -> bool:
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


def overlaps(t: Tensor) -> bool:
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
