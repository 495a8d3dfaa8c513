"""CuTe DSL MXFP8 GEMM for sm_90a: ``out[:M] = dequant(A) @ dequant(B).T (+ bias)``.

Hopper's wgmma has no block scales. An E4M3 value times its power-of-two E8M0 scale is
exactly a BF16 value, so both kernels scale the FP8 operands into BF16 and run BF16 wgmma
with FP32 accumulation: the result differs from the exact-FP32 reference only by summation
order (gemm_sm90.device.common). (FP8 wgmma per 32-K group plus an FP32 promotion ``acc += tmp *
sa * sb`` was slower and its FP8 tensor-core group sums truncate small products;
docs/gemm_log.md.)

* gemm_sm90.tiled: 128 x 128, 128 x 64, 192 x 128 or 64 x 128 output tiles, whole tiles
  per persistent CTA or (stream-K) the (tile, K stage) units split evenly over the CTAs;
  consumer warpgroups convert their A rows straight into RS-wgmma register fragments,
  converter warpgroups turn the weight tile into 16-bit shared memory. Tiles whose rows'
  scales span at most 21 binades take FP16 wgmma with per-row reference exponents (half
  the conversion work, gemm_sm90.device.f16), found by a scan launch before the GEMM
  (gemm_sm90.device.refs); the others BF16.
* gemm_sm90.swap_ab (up to 64 tokens): the operands swap, the weight is the wgmma M operand
  converted into register fragments, the tokens the N operand; the (64-row weight tile, K
  stage) units are split evenly over all SMs (stream-K, a small per-stream workspace for
  the partial sums). The GEMM then streams the weight once, at half of BF16's bytes. With
  ``bf16_tokens`` (measured faster at 32 tokens on most shapes: docs/gemm_log.md; the
  heuristic takes it from 17 tokens on) a launch before it converts the tokens to BF16 once
  (gemm_sm90.device.tokens), so that no CTA converts all of them; with ``tile_w`` 128 two
  consumer warpgroups share each stage's token tile, on 64 weight rows each; with
  ``cluster`` 2 CTA pairs share it through TMA multicast.

This module is the host side of one call: :func:`refusal` (a call it refuses is the
caller's to serve: the ops run the reference, with a one-time warning naming the reason),
:func:`launches` (what the call launches; :func:`builds` lists it for warm-up),
the config (``gemm_sm90.tuning.select.choose_config``: the measured table, else a heuristic; the config
classes are in ``gemm_sm90.config``), the compile cache :func:`compile_gemm` (keyed on
compile-time facts; the token count M is a runtime value) and the launch (integer arguments
through a reusable buffer: see runtime/launcher.py). buffers.py holds the per-stream
workspaces and the small launches that run before a GEMM.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import replace
from typing import NamedTuple

import torch

from ....format import CHUNK_BYTES, GROUP, Activation, padded_rows
from ...runtime import launcher
from ...runtime.launcher import int32, pointer, raw_stream
from ..config import GemmConfig, SwapABConfig
from ..constants import MAX_SLICES
from ..tuning.select import choose_config
from ..workspace import floats as workspace_floats
from . import buffers

_PACKAGE = __package__.rpartition(".")[0]  # gemm_sm90: the kernel modules are named under it

CUTLASS_TYPES = {
    torch.bfloat16: "BFloat16",
    torch.float16: "Float16",
    torch.float32: "Float32",
}
"""The ``cutlass`` numeric type's name of each output and bias dtype the kernels take."""


def _served(a_values, a_scales, b_values, b_scales, bias, out):
    """``(M, N, K)`` where this kernel serves the call, else a sentence saying why not
    (cheap: no compile, no sync; one read of each tensor fact). The kernels read every
    tensor through 16-byte aligned loads (TMA for the values and the scale chunks) and the
    bias as a contiguous vector of a dtype they are compiled for; other calls are left to
    the caller's fallback."""
    if a_values.dim() != 2 or b_values.dim() != 2 or out.dim() != 2:
        return "values and out must be 2-D"
    m, k = a_values.shape
    n = b_values.shape[0]
    if a_values.dtype != torch.float8_e4m3fn or b_values.dtype != torch.float8_e4m3fn:
        return "values must be float8_e4m3fn"
    if out.dtype not in (torch.bfloat16, torch.float16):
        return f"out dtype {out.dtype} is neither BF16 nor FP16"
    if k % GROUP != 0 or k == 0 or n == 0 or b_values.shape[1] != k:
        return f"K={k} must be a positive multiple of {GROUP} in both operands, N={n} positive"
    if a_values.stride(1) != 1 or a_values.stride(0) != k:
        return "A's rows must be K contiguous bytes"
    if not b_values.is_contiguous() or out.stride(1) != 1 or out.shape[1] != n:
        return "B must be contiguous, out N contiguous columns"
    if (out.stride(0) * out.element_size()) % 16 != 0 or out.shape[0] < m:
        return "out's rows must start 16-byte aligned and be at least M"
    if a_values.data_ptr() % 16 or b_values.data_ptr() % 16 or out.data_ptr() % 16:
        return "values and out must be 16-byte aligned"
    if a_scales.data_ptr() % 16 or b_scales.data_ptr() % 16:
        return "scale buffers must be 16-byte aligned"
    if bias is not None and (bias.dtype not in CUTLASS_TYPES or bias.stride(-1) != 1):
        return "bias must be a contiguous BF16, FP16 or FP32 vector"
    return m, n, k


def refusal(a_values, a_scales, b_values, b_scales, bias, out) -> str | None:
    """Why these kernels do not serve the call, None where they do (cheap: no compile, no
    sync)."""
    shape = _served(a_values, a_scales, b_values, b_scales, bias, out)
    return shape if isinstance(shape, str) else None


# The kernel class of each (kernel, activation), by module (under gemm_sm90) and name: the
# one place a kernel variant is named. A variant composes a base kernel with what differs
# (the W8A16 entries: gemm_sm90.device.slices.SlicesEntry over the W8A8 kernels).
KERNELS = {
    ("tiled", Activation.W8A8): ("tiled.kernel", "MXFP8TiledGemmSm90"),
    ("swap-ab", Activation.W8A8): ("swap_ab.kernel", "MXFP8SwapABGemmSm90"),
    ("tiled", Activation.W8A16): ("tiled.w8a16", "W8A16TiledGemmSm90"),
    ("swap-ab", Activation.W8A16): ("swap_ab.w8a16", "W8A16SwapABGemmSm90"),
}
# What names a build of each activation (launcher.Build.kind): in the disk cache's entries
# and the warm-up's notices.
_BUILD_KINDS = {Activation.W8A8: "gemm", Activation.W8A16: "gemm w8a16"}


def kernel_class(cfg: GemmConfig):
    """The kernel class that ``cfg`` builds (imports cutlass)."""
    module, name = KERNELS[(cfg.kernel, cfg.activation)]
    return getattr(importlib.import_module(f"{_PACKAGE}.{module}"), name)


def compile_args(cfg: GemmConfig, a, out_dtype, bias_dtype) -> tuple:
    """Compile-time placeholders of ``cfg``'s kernel arguments (see launcher.compile_kernel).
    First A: W8A8, its values and scales; W8A16 (``a`` the slices' widths), the slices and
    their row strides (``MAX_SLICES`` each, None past the build's). Then B's values and
    scales, bias (None in a build without bias), out, M, and for W8A8 the A scale chunk
    count; then the swap-AB kernel's stream-K workspace (partial sums, flags; None with
    whole ``token_tiles``), or the tiled
    kernel's per-row FP16 references of A and of B (gemm_sm90.device.refs) and its stream-K
    workspace (None in a build without stream-K)."""
    fp8, scales = pointer("Float8E4M3FN"), pointer("Int32")
    bias = pointer(CUTLASS_TYPES[bias_dtype]) if bias_dtype else None
    out = pointer(CUTLASS_TYPES[out_dtype])
    if cfg.activation.quantized:
        args = (fp8, scales, fp8, scales, bias, out, int32(), int32())
    else:
        unused = (None,) * (MAX_SLICES - len(a))
        slices = (*(pointer("BFloat16") for _ in a), *unused)
        strides = (*(int32() for _ in a), *unused)
        args = (*slices, *strides, fp8, scales, bias, out, int32())
    workspace = (pointer("Float32"), pointer("Int32"))
    if isinstance(cfg, SwapABConfig):  # whole token tiles: no stream-K, no workspace
        return (*args, *(workspace if workspace_floats(cfg) else (None, None)))
    refs = (pointer("Int32", 4), pointer("Int32", 4))
    return (*args, *refs, *(workspace if cfg.stream_k else (None, None)))


def compiled_config(cfg: GemmConfig) -> GemmConfig:
    """The config ``cfg``'s kernel is compiled for: ``fp16_tiles`` only decides what the host
    runs before a W8A8 launch, so both values share one compile (no new config on the common
    path). W8A16 configs have every tile on the BF16 path."""
    if isinstance(cfg, SwapABConfig) or cfg.fp16_tiles or not cfg.activation.quantized:
        return cfg
    return replace(cfg, fp16_tiles=True)


def compile_gemm(cfg: GemmConfig, n: int, a, ld_out: int, out_dtype, bias_dtype):
    """Compile ``cfg``'s kernel for the compile-time facts: N, A's (W8A8: K; W8A16: the
    slices' widths), the output's row stride, its dtype and the bias dtype or None; the
    token count M stays a runtime value. Works on a CPU under ``CUTE_DSL_ARCH``."""
    import cutlass

    out_ty = getattr(cutlass, CUTLASS_TYPES[out_dtype])
    bias_ty = getattr(cutlass, CUTLASS_TYPES[bias_dtype]) if bias_dtype else None
    kernel = kernel_class(cfg)(cfg, n, a, ld_out, bias_ty, out_ty)
    args = compile_args(cfg, a, out_dtype, bias_dtype)
    return launcher.compile_kernel(kernel, args, buffers.ARCH)


def gemm_build(cfg: GemmConfig, n: int, a, ld_out: int, out_dtype, bias_dtype):
    """The kernel binary of a call (see launcher.Build): ``cfg`` as compiled
    (:func:`compiled_config`) and the compile-time facts of :func:`compile_gemm` (``a``: K,
    or the W8A16 slices' widths)."""
    a = a if cfg.activation.quantized else tuple(a)
    facts = (compiled_config(cfg), n, a, ld_out, out_dtype, bias_dtype)
    return launcher.Build(_BUILD_KINDS[cfg.activation], facts, buffers.ARCH, compile_gemm)


class Launches(NamedTuple):
    """What one call launches: the GEMM ``config``, the launch before it (``before``: the
    swap-AB token conversion of ``bf16_tokens`` W8A8 configs, the tiled kernel's reference
    scan of ``fp16_tiles`` configs, else None) and the GEMM's build."""

    config: GemmConfig
    before: launcher.Build | None
    gemm: launcher.Build


def launches(
    m: int, n: int, a, ld_out: int, out_dtype, bias_dtype, gpu, config=None,
    activation: Activation = Activation.W8A8,
) -> Launches:  # fmt: skip
    """The :class:`Launches` of a call of ``m`` tokens on ``gpu`` ((SM count, device name):
    :func:`gpu_of`) with ``activation``; ``a`` is K (W8A8) or the slices' widths (W8A16);
    ``config`` overrides the choice (it must be of ``activation``). The call runs exactly
    these; warm-up compiles them (:func:`builds`, through ``kernels.dispatch.builds``)."""
    k = a if activation.quantized else sum(a)
    cfg = config or choose_config(m, n, k, *gpu, activation=activation)
    check_config(cfg, activation)
    before = None
    if isinstance(cfg, SwapABConfig):
        if cfg.bf16_tokens and activation.quantized:  # W8A16 tokens arrive BF16
            before = buffers.tokens_build(k)
    elif cfg.fp16_tiles:
        before = buffers.refs_build(k)
    return Launches(cfg, before, gemm_build(cfg, n, a, ld_out, out_dtype, bias_dtype))


def builds(m: int, n: int, a, ld_out: int, out_dtype, bias_dtype, gpu, activation=Activation.W8A8):
    """The kernel builds a call of ``m`` tokens launches on ``gpu`` (see :func:`launches`)."""
    plan = launches(m, n, a, ld_out, out_dtype, bias_dtype, gpu, None, activation)
    return [plan.gemm] if plan.before is None else [plan.before, plan.gemm]


def check_config(cfg: GemmConfig, activation: Activation) -> None:
    """Refuse a config of the other activation (each kernel variant reads its own A).

    Raises:
        ValueError: naming the config and the activation it should have.
    """
    if cfg.activation is not activation:
        raise ValueError(
            f"config: expected a {activation.name} (activation {activation.value!r}) config, "
            f"got {cfg}"
        )


@functools.cache
def gpu_of(index: int) -> tuple[int, str]:
    """(SM count, name) of CUDA device ``index``: what the config choice keys on."""
    properties = torch.cuda.get_device_properties(index)
    return properties.multi_processor_count, properties.name


def run(a_values, a_scales, b_values, b_scales, bias, out, config: GemmConfig | None = None):
    """``out[:M] = dequant(A) @ dequant(B).T (+ bias)`` on the current stream; no sync.

    ``config`` overrides the heuristic (tests, benchmarks). Compiles once per (config, N, K,
    out row stride, out dtype, bias dtype).

    Raises:
        ValueError: where :func:`refusal` gives a reason (saying it), or ``config`` is not
            a W8A8 config (a W8A16 one reads BF16 slices: ``gemm_sm90.host.w8a16.run``) or is a
            swap-AB config whose token tile is below M; nothing is launched.
    """
    shape = _served(a_values, a_scales, b_values, b_scales, bias, out)
    if isinstance(shape, str):
        raise ValueError(f"the SM90 GEMM does not serve this call: {shape}")
    _run(*shape, a_values, a_scales, b_values, b_scales, bias, out, config)


def run_if_served(a_values, a_scales, b_values, b_scales, bias, out) -> str | None:
    """:func:`run` where :func:`refusal` has no reason: None once launched, else the reason
    (nothing launched). The ops' one entry point: checks and launches in one pass over the
    call's facts."""
    shape = _served(a_values, a_scales, b_values, b_scales, bias, out)
    if isinstance(shape, str):
        return shape
    _run(*shape, a_values, a_scales, b_values, b_scales, bias, out, None)
    return None


def _run(m, n, k, a_values, a_scales, b_values, b_scales, bias, out, config) -> None:
    if m == 0:
        return
    device = a_values.device
    dev = device.index if device.index is not None else 0
    bias_dtype = bias.dtype if bias is not None else None
    plan = launches(m, n, k, out.stride(0), out.dtype, bias_dtype, gpu_of(dev), config)
    cfg = plan.config
    swap_ab = isinstance(cfg, SwapABConfig)
    if swap_ab and m > cfg.tokens_tile:
        raise ValueError(f"config tokens_tile={cfg.tokens_tile} is below the {m} tokens")
    out_ptr = out.data_ptr()
    a_scales_ptr, b_scales_ptr = a_scales.data_ptr(), b_scales.data_ptr()
    args = (
        a_values.data_ptr(),
        a_scales_ptr,
        b_values.data_ptr(),
        b_scales_ptr,
        bias.data_ptr() if bias is not None else None,
        out_ptr,
        m,
        a_scales.numel() // CHUNK_BYTES,
    )
    stream = raw_stream(dev)
    if swap_ab:
        if plan.before is not None:
            tokens = buffers.convert_tokens(
                plan.before, args[0], a_scales_ptr, m, k, device, dev, stream
            )
            args = (tokens.data_ptr(), *args[1:])
    else:
        if plan.before is not None:
            refs = buffers.launch_row_references(
                plan.before, a_scales_ptr, b_scales_ptr, m, n, device, dev, stream
            )
        else:
            refs = buffers.bf16_references(m, n, device, dev, stream)
        refs_ptr = refs.data_ptr()
        args += (refs_ptr, refs_ptr + 4 * padded_rows(m))
    # None, None for a tiled build without stream-K, which has no workspace
    args += buffers.stream_workspace(cfg, device, dev, stream)
    launcher.launch(plan.gemm, (*args, stream))
