"""MXFP8 GEMM on Blackwell (compute capability 10.x, 12.x): cuBLAS, called through torch.

Blackwell's tensor cores multiply block-scaled MXFP8 natively, and cuBLASLt's MXFP8 GEMM
(scale mode ``VEC32_UE8M0``, CUDA 12.8 and later) reads E8M0 scales in the 128x4 blocked
layout this project stores. torch exposes it as ``aten::_scaled_mm`` with
``float8_e8m0fnu`` scales (``_scaled_mm_v2`` / ``torch.nn.functional.scaled_mm`` with the
``BlockWise1x32`` recipe and ``SWIZZLE_32_4_4`` where the first is missing). So the GEMM is
one torch call on the storage as it is, copying neither operand (:func:`plan`):

* ``mat_a``: the live rows ``values[:M]``, row-major ``[M, K]``;
* ``mat_b``: the weight ``[N, K]`` transposed, a column-major ``[K, N]`` view: cuBLAS's TN
  layout, the one its block-scaled kernels run on every Blackwell (12.x runs only TN);
* ``scale_a``: the first ``roundup(M, 128) * roundup(K / 32, 4)`` bytes of the scale buffer,
  i.e. the 512-byte chunks of the live rows' 128-row blocks. torch requires exactly that
  count, also when M is not a multiple of 128; the padding rows' bytes (127) feed no output;
* ``scale_b``: the weight's blocked scales (N padded to 128 rows the same way);
* the result: ``out[:M]`` itself, through the ``out=`` overload, where its rows are
  contiguous (row stride N) and 16-byte aligned: every output this library allocates, and
  any caller-owned ``[capacity, N]`` buffer. A strided ``out`` gets a fresh ``[M, N]``
  result of the same call, copied in: torch would otherwise pass cuBLAS another leading
  dimension (another call, perhaps another kernel) or clone.

Bias, as the SM90 kernels and the reference treat it: added to the FP32 accumulator, then
rounded once. cuBLAS's bias epilogue does exactly that for a contiguous, 16-byte aligned bias
of the output dtype (torch accepts no other: "Bias must be BFloat16 to compute BFloat16
output"). Any other bias (FP32, the other 16-bit type, strided) makes the GEMM write an FP32
``[M, N]`` result, and the bias is added in FP32 and rounded once into ``out[:M]``.

Staged and one-shot calls give bitwise-identical outputs: both come here with the same
bytes, shapes, strides, dtypes and allocator-aligned buffers, so they are the same cuBLAS
call. cuBLAS rejects what it has no kernel for (``CUBLAS_STATUS_NOT_SUPPORTED``, raised by
torch before anything runs); such a call, and every later one of the same shape, runs the
reference instead, with the reason in the fallback warning.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..format import scale_bytes

_OUT_DTYPES = (torch.bfloat16, torch.float16)
_ALIGN = 16  # bytes: cuBLASLt's FP8 operand, scale and output alignment
_MIN_CUDA = (12, 8)  # the first CUDA whose cuBLASLt has VEC32_UE8M0 block scaling


class Call(NamedTuple):
    """One planned GEMM: the arguments of the scaled_mm call, and what follows it.

    ``result`` is the tensor the call writes (``out=``), None for a fresh one; ``dest`` is
    ``out[:M]``; ``bias_after`` a bias added in FP32 after an FP32 GEMM (None when cuBLAS
    adds ``bias`` itself or there is none).
    """

    mat_a: torch.Tensor
    mat_b: torch.Tensor
    scale_a: torch.Tensor
    scale_b: torch.Tensor
    bias: torch.Tensor | None
    out_dtype: torch.dtype
    result: torch.Tensor | None
    dest: torch.Tensor
    bias_after: torch.Tensor | None

    def run(self, gemm) -> None:
        """Run the call with ``gemm`` (the resolved scaled_mm, see :func:`backend`) and
        finish ``dest``."""
        args = (self.mat_a, self.mat_b, self.scale_a, self.scale_b, self.bias, self.out_dtype)
        result = gemm(*args, self.result)
        if result is self.dest:
            return
        if self.bias_after is not None:
            # FP32 + FP32, rounded once on the store into dest's dtype
            torch.add(result, self.bias_after.float(), out=self.dest)
        else:
            self.dest.copy_(result)


def _aligned(t: torch.Tensor) -> bool:
    return t.data_ptr() % _ALIGN == 0


def _fused_bias(bias: torch.Tensor, out_dtype: torch.dtype) -> bool:
    # torch hands cuBLAS the bias pointer as a dense vector of the output dtype
    return bias.dtype == out_dtype and bias.dim() == 1 and bias.stride(0) == 1 and _aligned(bias)


def plan(a_values, a_scales, b_values, b_scales, bias, out) -> Call | str:
    """The scaled_mm call for ``out[:M] = A @ B.T (+ bias)``, or a sentence saying why cuBLAS
    does not serve it. Builds views only (no data is read: works on meta tensors).

    ``A`` is ``a_values`` ``[M, K]`` (the live rows) with the blocked scale buffer
    ``a_scales`` (at least the live rows' chunks); ``B`` the weight ``[N, K]`` and its
    scales; scale buffers as ``float8_e8m0fnu`` or raw ``uint8`` bytes.
    """
    m, k = a_values.shape
    n = b_values.shape[0]
    if a_values.dtype != torch.float8_e4m3fn or b_values.dtype != torch.float8_e4m3fn:
        return f"operands are {a_values.dtype} and {b_values.dtype}, not float8_e4m3fn"
    if n % 16 or k % 32:
        return f"N={n} and K={k} must be multiples of 16 and 32 for torch's scaled_mm"
    if out.dtype not in _OUT_DTYPES:
        return f"output dtype {out.dtype} is not bfloat16 or float16"
    if not (a_values.is_contiguous() and b_values.is_contiguous()):
        return "an operand's values are not contiguous"
    need_a, need_b = scale_bytes(m, k), scale_bytes(n, k)
    if a_scales.dim() != 1 or b_scales.dim() != 1 or not a_scales.is_contiguous():
        return "scale buffers are not flat contiguous blocked buffers"
    if a_scales.numel() < need_a or b_scales.numel() < need_b or not b_scales.is_contiguous():
        return "a scale buffer is shorter than the blocked layout of its rows"
    for t in (a_values, b_values, a_scales, b_scales):
        if not _aligned(t):
            return f"an operand is not {_ALIGN}-byte aligned"
    e8m0 = torch.float8_e8m0fnu
    scale_a = (a_scales if a_scales.numel() == need_a else a_scales[:need_a]).view(e8m0)
    scale_b = (b_scales if b_scales.numel() == need_b else b_scales[:need_b]).view(e8m0)
    dest = out if out.shape[0] == m else out[:m]
    fused = bias is None or _fused_bias(bias, out.dtype)
    # out= only where the result is laid out as a fresh one would be (row stride N): another
    # leading dimension would be another cuBLAS call, perhaps another kernel
    in_place = fused and dest.stride() == (n, 1) and _aligned(dest)
    return Call(
        mat_a=a_values,
        mat_b=b_values.t(),
        scale_a=scale_a,
        scale_b=scale_b,
        bias=bias if fused else None,
        out_dtype=out.dtype if fused else torch.float32,
        result=dest if in_place else None,
        dest=dest,
        bias_after=None if fused else bias,
    )


# --- which torch API ------------------------------------------------------------------------


def _cuda_version(text: str | None) -> tuple[int, int] | None:
    try:
        major, minor = text.split(".")[:2]
        return int(major), int(minor)
    except (AttributeError, ValueError):
        return None


def _overloads(aten, name: str) -> tuple[str, ...]:
    packet = getattr(aten, name, None)
    return tuple(packet.overloads()) if packet is not None else ()


def _v1(aten):
    """``aten::_scaled_mm``: the block-scaled recipe is read off the e8m0 scale dtype."""
    default, out_variant = aten._scaled_mm.default, aten._scaled_mm.out

    def gemm(mat_a, mat_b, scale_a, scale_b, bias, out_dtype, out):
        if out is None:
            return default(mat_a, mat_b, scale_a, scale_b, bias, None, out_dtype, False)
        return out_variant(mat_a, mat_b, scale_a, scale_b, bias, None, out_dtype, False, out=out)

    return gemm


def _v2(aten, blockwise_1x32: int, swizzle_32_4_4: int):
    """``aten::_scaled_mm_v2`` (behind ``torch.nn.functional.scaled_mm``): recipe and
    swizzle spelled out."""
    default, out_variant = aten._scaled_mm_v2.default, aten._scaled_mm_v2.out
    recipe, swizzle = [blockwise_1x32], [swizzle_32_4_4]

    def gemm(mat_a, mat_b, scale_a, scale_b, bias, out_dtype, out):
        args = (mat_a, mat_b, [scale_a], recipe, swizzle, [scale_b], recipe, swizzle, bias)
        if out is None:
            return default(*args, out_dtype, [], False)
        return out_variant(*args, out_dtype, [], False, out=out)

    return gemm


def resolve(aten, version: str, cuda: str | None, functional) -> tuple[object, str | None]:
    """``(gemm, None)`` where this torch (its ``aten`` op namespace, ``torch.version.cuda``
    and ``torch.nn.functional``) has an MXFP8 scaled_mm with an ``out=`` overload, else
    ``(None, reason)``. ``gemm(mat_a, mat_b, scale_a, scale_b, bias, out_dtype, out)``
    writes ``out`` (returned), or returns a fresh result for ``out=None``."""
    if not hasattr(torch, "float8_e8m0fnu"):
        return None, f"torch {version} has no float8_e8m0fnu dtype"
    cuda_version = _cuda_version(cuda)
    need = f"CUDA {_MIN_CUDA[0]}.{_MIN_CUDA[1]} or newer"
    if cuda_version is None:
        return None, f"torch {version} is not a CUDA build; cuBLAS's MXFP8 GEMM needs {need}"
    if cuda_version < _MIN_CUDA:
        return None, f"torch {version} is built with CUDA {cuda}; cuBLAS's MXFP8 GEMM needs {need}"
    if {"default", "out"} <= set(_overloads(aten, "_scaled_mm")):
        return _v1(aten), None
    scaling = getattr(functional, "ScalingType", None)
    swizzling = getattr(functional, "SwizzleType", None)
    if {"default", "out"} <= set(_overloads(aten, "_scaled_mm_v2")) and scaling and swizzling:
        return _v2(aten, scaling.BlockWise1x32.value, swizzling.SWIZZLE_32_4_4.value), None
    return None, f"torch {version} has neither aten._scaled_mm.out nor aten._scaled_mm_v2.out"


_backend: tuple[object, str | None] | None = None


def backend() -> tuple[object, str | None]:
    """:func:`resolve` for the installed torch, once."""
    global _backend
    if _backend is None:
        _backend = resolve(
            torch.ops.aten, torch.__version__, torch.version.cuda, torch.nn.functional
        )
    return _backend


# --- the ops' entry point -----------------------------------------------------------------

# Shapes cuBLAS has no kernel for, with its answer: (device, M, N, K, out dtype, GEMM dtype,
# bias dtype) -> reason. They run the reference without asking again.
_rejected: dict[tuple, str] = {}


def _call_key(call: Call) -> tuple:
    m, k = call.mat_a.shape
    bias = call.bias if call.bias is not None else call.bias_after
    return (
        call.mat_a.device, m, call.mat_b.shape[1], k, call.dest.dtype, call.out_dtype,
        bias.dtype if bias is not None else None,
    )  # fmt: skip


def run_if_served(a_values, a_scales, b_values, b_scales, bias, out) -> str | None:
    """``out[:M] = A @ B.T (+ bias)`` through cuBLAS where :func:`plan` and cuBLAS serve the
    call: None once launched, else a sentence saying why not (nothing written). Launches on
    the current stream; no host sync."""
    gemm, reason = backend()
    if gemm is None:
        return reason
    call = plan(a_values, a_scales, b_values, b_scales, bias, out)
    if isinstance(call, str):
        return call
    if _rejected:
        known = _rejected.get(_call_key(call))
        if known is not None:
            return known
    try:
        call.run(gemm)
    except RuntimeError as error:
        # cuBLAS's heuristic found no kernel: raised on the host before any launch, so
        # nothing was written and the reference can take the call
        if "CUBLAS_STATUS_NOT_SUPPORTED" not in str(error):
            raise
        key = _call_key(call)
        m, n, k = key[1], key[2], key[3]
        first_line = str(error).splitlines()[0]
        _rejected[key] = f"cuBLAS has no MXFP8 kernel for M={m} N={n} K={k} ({first_line})"
        return _rejected[key]
    return None
