"""Buffers and launches around the SM90 GEMM kernels (host side, no cutlass import until a
compile): the per-stream workspaces kept across calls, and the small launches that run
before a GEMM (the tiled kernel's per-row FP16 reference scan, the swap-AB kernel's token
conversion)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import torch

from ....format import padded_rows
from ...capability import CUTE_GEMM_TARGET
from ...runtime import launcher
from ...runtime.launcher import int32, pointer, raw_stream
from .. import workspace

if TYPE_CHECKING:
    from ..config import GemmConfig

ARCH = CUTE_GEMM_TARGET  # the GEMM and the launches before it (the capability table)


def compile_tokens(k: int):
    """The swap-AB kernel's token conversion (gemm_sm90.device.tokens) for K: arguments A values,
    A scales, the BF16 tokens, M."""
    from ..device.tokens import TokensToBF16Sm90

    args = (pointer("Float8E4M3FN"), pointer("Uint8"), pointer("BFloat16"), int32())
    return launcher.compile_kernel(TokensToBF16Sm90(k), args, ARCH)


def compile_refs(k: int):
    """The per-row FP16 reference scan (gemm_sm90.device.refs) for K: arguments A scales, B scales,
    the references, M, N."""
    from ..device.refs import RowReferencesSm90

    args = (pointer("Uint8"), pointer("Uint8"), pointer("Int32"), int32(), int32())
    return launcher.compile_kernel(RowReferencesSm90(k), args, ARCH)


def tokens_build(k: int) -> launcher.Build:
    """The token conversion's binary for K (see launcher.Build)."""
    return launcher.Build("gemm tokens", (k,), ARCH, compile_tokens)


def refs_build(k: int) -> launcher.Build:
    """The reference scan's binary for K (see launcher.Build)."""
    return launcher.Build("gemm refs", (k,), ARCH, compile_refs)


# Buffers of the kernels per (device, stream), kept across calls: the stream-K workspaces
# (FP32 partial sums, and zeroed flags that the kernel re-arms after use; their geometry is
# gemm_sm90.workspace's) and the tiled kernel's per-row FP16 references (rewritten by the
# scan launch before each GEMM). Launches on one stream never overlap, so one set serves
# every later launch there. Under CUDA Graph capture each launch gets its own from the
# graph's pool instead (zeroing too).
kept_buffers: dict[tuple, tuple[int, tuple[torch.Tensor, ...]]] = {}


def stream_buffers(name: str, device: torch.device, index: int, stream: int, size: int, make):
    """``make(size)``'s tensors for ``stream`` (the current one), grown (at least 2x) when a
    call needs more than the kept ones hold."""
    if torch.cuda.is_current_stream_capturing():
        return make(size)
    key = (name, index, stream)
    kept = kept_buffers.get(key)
    if kept is None or kept[0] < size:
        if kept is not None:
            size = max(size, 2 * kept[0])
            for t in kept[1]:  # made on another thread's stream, used on this one
                t.record_stream(torch.cuda.current_stream(index))
        kept = kept_buffers[key] = (size, made_outside_graph_pools(lambda: make(size), device))
    return kept[1]


def fresh_workspace(device: torch.device, floats: int):
    """A stream-K workspace of ``floats`` FP32 partial sums and its zeroed flags."""
    partials = torch.empty(floats, device=device)
    return partials, torch.zeros(workspace.flags(floats), dtype=torch.int32, device=device)


def stream_workspace(cfg: GemmConfig, device: torch.device, index: int, stream: int) -> tuple:
    """(partial sums, flags) addresses of the stream-K workspace kept for ``cfg``'s kernel on
    ``stream``; (None, None) where the launch has none (a tiled launch without stream-K)."""
    floats = workspace.floats(cfg)
    if floats is None:
        return None, None
    name = f"{cfg.kernel} stream-K"
    make = lambda size: fresh_workspace(device, size)  # noqa: E731
    partials, flags = stream_buffers(name, device, index, stream, floats, make)
    return partials.data_ptr(), flags.data_ptr()


def made_outside_graph_pools(make, device: torch.device):
    """Run ``make``, an allocation kept across calls, on a fresh thread. While cudagraph
    trees warm a function up, every allocation of the calling thread goes to the graph's
    private pool, and a buffer that stays alive there fails the pool's liveness check
    ("tensors in the cudagraph pool not tracked as outputs"). The memory belongs to that
    thread's stream, so the device is synchronized once: no earlier work there still uses
    it, and any zeroing is done, before another stream's kernel touches it. Runs once per
    buffer size, never while capturing."""
    made = []
    worker = threading.Thread(target=lambda: made.append(make()))
    worker.start()
    worker.join()
    torch.cuda.synchronize(device)
    return made[0]


def row_references(a_scales, b_scales, m: int, n: int, k: int) -> torch.Tensor:
    """Launch the scan for the tiled kernel's FP16 path (gemm_sm90.device.refs) on the current
    stream: one int32 per row of A (padded to 128 rows), then per row of B, holding the
    row's reference byte or -1 if the row must take the BF16 path. No sync."""
    device = a_scales.device
    dev = device.index if device.index is not None else 0
    a_ptr, b_ptr = a_scales.data_ptr(), b_scales.data_ptr()
    return launch_row_references(refs_build(k), a_ptr, b_ptr, m, n, device, dev, raw_stream(dev))


def convert_tokens(build, a_ptr, a_scales_ptr, m, k, device, dev, stream) -> torch.Tensor:
    """Launch the token conversion of ``bf16_tokens`` configs (``build``: tokens_build(k)) into a
    buffer kept per stream (at least ``m * k`` BF16, row-major), and return it."""
    (tokens,) = stream_buffers(
        "BF16 tokens", device, dev, stream, m * k,
        lambda size: (torch.empty(size, dtype=torch.bfloat16, device=device),),
    )  # fmt: skip
    convert = (a_ptr, a_scales_ptr, tokens.data_ptr(), m, stream)
    launcher.launch(build, convert)
    return tokens


def bf16_references(m, n, device, dev, stream) -> torch.Tensor:
    """References that send every row to the BF16 path (-1), kept per stream like the
    scan's: ``f16=0`` configs read these instead of launching the scan."""
    (refs,) = stream_buffers(
        "BF16 references", device, dev, stream, padded_rows(m) + padded_rows(n),
        lambda size: (torch.full((size,), -1, dtype=torch.int32, device=device),),
    )  # fmt: skip
    return refs


def launch_row_references(
    build, a_scales_ptr, b_scales_ptr, m, n, device, dev, stream
) -> torch.Tensor:
    """Launch the reference scan ``build`` (refs_build(k)) into references kept per stream."""
    (refs,) = stream_buffers(
        "references", device, dev, stream, padded_rows(m) + padded_rows(n),
        lambda size: (torch.empty(size, dtype=torch.int32, device=device),),
    )  # fmt: skip
    scan = (a_scales_ptr, b_scales_ptr, refs.data_ptr(), m, n, stream)
    launcher.launch(build, scan)
    return refs
