"""Host side of the W8A16 GEMM for sm_90a: ``out[:M] = cat(slices, -1) @ dequant(B).T
(+ bias)``, the BF16 activation read straight from up to eight slices (no concatenation, no
quantization), the weight converted exactly as in the W8A8 kernels (no cutlass import until
a compile).

The same two kernels serve it as the W8A8 GEMM (gemm_sm90.host.gemm), built with BF16 A: the
swap-AB kernel reads each stage's token tile from the slice holding it through TMA, as its
``bf16_tokens`` schedule reads converted tokens; the tiled kernel TMAs BF16 A stages from
the slices and moves them into its register fragments unconverted (gemm_sm90.device.slices). The
config comes from ``select.choose_config(..., activation=Activation.W8A16)``. A build is compiled per
(config, N, the slices' widths, out's row stride, out and bias dtypes); the token count and
the slices' addresses and row strides are runtime values. The compile, the build and the
plan are gemm_sm90.host.gemm's, for both activations; this module holds what only a W8A16 call
has: its refusal and its launch arguments.

:func:`refusal` says why a call is not served (FP16 slices among others: their FP16 values
times the weight are exact only on the FP16 path, whose per-row references BF16 tiles
would break; they run the reference), :func:`launches` / :func:`builds` what a call
launches, :func:`run_if_served` the ops' entry point.
"""

from __future__ import annotations

import torch

from ....format import Activation, padded_rows
from ...runtime import launcher
from ...runtime.launcher import raw_stream
from ..config import GemmConfig, SwapABConfig
from ..constants import MAX_SLICES
from . import buffers
from . import gemm as host
from .gemm import CUTLASS_TYPES, Launches, gpu_of

_STAGE = 128  # the K of one stage: a slice's width must hold whole stages


def _served(slices, b_values, b_scales, bias, out):
    """``(M, N, widths, row strides)`` where these kernels serve the call, else why not
    (cheap: no compile, no sync; one read of each tensor fact)."""
    count = len(slices)
    if not 1 <= count <= MAX_SLICES:
        return f"{count} slices; the W8A16 kernels read 1 to {MAX_SLICES}"
    if b_values.dim() != 2 or out.dim() != 2:
        return "the weight and out must be 2-D"
    n, k = b_values.shape
    m = slices[0].shape[0] if slices[0].dim() == 2 else -1
    widths, strides = [], []
    for source in slices:
        if source.dim() != 2 or source.dtype != torch.bfloat16:
            return "the slices must be 2-D BF16 (FP16 slices run the reference)"
        rows, width = source.shape
        stride = source.stride(0) if rows > 1 else width  # one row: its stride is never read
        if rows != m or width % _STAGE:
            return f"the slices must have one row count and widths multiples of {_STAGE}"
        if source.stride(1) != 1 or stride % 8 or stride < width or stride >= 2**31:
            return "each slice's rows must be contiguous, 16-byte aligned and apart"
        if source.data_ptr() % 16:
            return "each slice must start 16-byte aligned"
        widths.append(width)
        strides.append(stride)
    if b_values.dtype != torch.float8_e4m3fn or not b_values.is_contiguous():
        return "the weight must be contiguous float8_e4m3fn values"
    if sum(widths) != k or n == 0:
        return f"the slices' widths add up to {sum(widths)}, the weight's K is {k}"
    if out.dtype not in (torch.bfloat16, torch.float16) or out.stride(1) != 1:
        return f"out must be BF16 or FP16 with contiguous rows, got {out.dtype}"
    if out.shape[1] != n or out.shape[0] < m or (out.stride(0) * out.element_size()) % 16:
        return "out's rows must start 16-byte aligned and be at least M"
    if b_values.data_ptr() % 16 or b_scales.data_ptr() % 16 or out.data_ptr() % 16:
        return "the weight, its scales and out must be 16-byte aligned"
    if bias is not None and (bias.dtype not in CUTLASS_TYPES or bias.stride(-1) != 1):
        return "bias must be a contiguous BF16, FP16 or FP32 vector"
    return m, n, tuple(widths), tuple(strides)


def refusal(slices, b_values, b_scales, bias, out) -> str | None:
    """Why these kernels do not serve the call, None where they do (cheap)."""
    served = _served(slices, b_values, b_scales, bias, out)
    return served if isinstance(served, str) else None


def launches(m, n, widths, ld_out, out_dtype, bias_dtype, gpu, config=None) -> Launches:
    """What a W8A16 call of ``m`` tokens launches on ``gpu`` (gemm_sm90.host.gemm.launches with
    W8A16): the GEMM alone (nothing runs before it)."""
    return host.launches(
        m, n, tuple(widths), ld_out, out_dtype, bias_dtype, gpu, config, Activation.W8A16
    )


def builds(m, n, widths, ld_out, out_dtype, bias_dtype, gpu) -> list:
    """The kernel builds a W8A16 call of ``m`` tokens launches on ``gpu`` (for warm-up)."""
    return host.builds(m, n, tuple(widths), ld_out, out_dtype, bias_dtype, gpu, Activation.W8A16)


def run(slices, b_values, b_scales, bias, out, config: GemmConfig | None = None) -> None:
    """``out[:M] = cat(slices, -1) @ dequant(B).T (+ bias)`` on the current stream; no sync.

    Raises:
        ValueError: where :func:`refusal` gives a reason, or ``config`` is not a W8A16
            config or is a swap-AB one whose token tile is below M; nothing is launched.
    """
    served = _served(slices, b_values, b_scales, bias, out)
    if isinstance(served, str):
        raise ValueError(f"the SM90 W8A16 GEMM does not serve this call: {served}")
    _run(*served, slices, b_values, b_scales, bias, out, config)


def run_if_served(slices, b_values, b_scales, bias, out) -> str | None:
    """:func:`run` where :func:`refusal` has no reason: None once launched, else the reason
    (nothing launched)."""
    served = _served(slices, b_values, b_scales, bias, out)
    if isinstance(served, str):
        return served
    _run(*served, slices, b_values, b_scales, bias, out, None)
    return None


def _run(m, n, widths, strides, slices, b_values, b_scales, bias, out, config) -> None:
    if m == 0:
        return
    device = b_values.device
    dev = device.index if device.index is not None else 0
    bias_dtype = bias.dtype if bias is not None else None
    plan = launches(m, n, widths, out.stride(0), out.dtype, bias_dtype, gpu_of(dev), config)
    cfg = plan.config
    if isinstance(cfg, SwapABConfig) and m > cfg.tokens_tile and not cfg.token_tiles:
        raise ValueError(f"config tokens_tile={cfg.tokens_tile} is below the {m} tokens")
    unused = (None,) * (MAX_SLICES - len(widths))
    args = (
        *(s.data_ptr() for s in slices), *unused, *strides, *unused,
        b_values.data_ptr(), b_scales.data_ptr(),
        bias.data_ptr() if bias is not None else None, out.data_ptr(), m,
    )  # fmt: skip
    stream = raw_stream(dev)
    if not isinstance(cfg, SwapABConfig):  # every row on the BF16 path
        refs = buffers.bf16_references(m, n, device, dev, stream).data_ptr()
        args += (refs, refs + 4 * padded_rows(m))
    # None, None for a tiled build without stream-K, which has no workspace
    args += buffers.stream_workspace(cfg, device, dev, stream)
    launcher.launch(plan.gemm, (*args, stream))
