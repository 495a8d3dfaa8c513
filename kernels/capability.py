"""Which of this library's kernels runs on which GPU: the one table that dispatch, warm-up,
the kernel builds and the vLLM plugin read. A new GPU arch is one row here (and, for a new
kernel, its module). Imports nothing: the vLLM plugin's policy reads it without torch.

* Slice quantizer: plain SIMT code, built for each row's ``target`` (the PTX test compiles
  every one on a CPU and checks it for arch-specific instructions).
* W8A16 GEMM (16-bit activations read from their slices): ``"cute"``, the same kernels built
  with BF16 A (``gemm_sm90.host.w8a16``); None: the reference.
* GEMM: ``"cute"`` is the CuTe DSL kernel of ``gemm_sm90`` (wgmma: exactly sm_90, built for
  its row's target); ``"cublas"`` is cuBLAS's block-scaled MXFP8 GEMM through torch
  (``gemm_cublas``: the tensor cores of 10.x and 12.x take MXFP8 directly, so a capability
  of those majors gets it even without a row); None: the plain-torch reference.
"""

from __future__ import annotations

from typing import NamedTuple


class ArchKernels(NamedTuple):
    """The kernels of one compute capability."""

    target: str | None
    """The build target of this library's CuTe DSL kernels there (``"sm_90a"``); None: none
    is built for it."""
    gemm: str | None
    """``"cute"``, ``"cublas"`` or None (see the module docstring)."""
    w8a16: str | None = None
    """The W8A16 GEMM from 16-bit slices: ``"cute"`` (``gemm_sm90.host.w8a16``) or None (the
    reference: the tensor cores of 10.x and 12.x take MXFP8 activations, W8A8)."""


ARCHS: dict[tuple[int, int], ArchKernels] = {
    (9, 0): ArchKernels("sm_90a", "cute", "cute"),  # H100 / H200
    (10, 0): ArchKernels("sm_100a", "cublas"),  # B200 / GB200
    (10, 3): ArchKernels("sm_103a", "cublas"),  # B300 / GB300
    (12, 0): ArchKernels("sm_120a", "cublas"),  # RTX PRO 6000, RTX 50 series
    (12, 1): ArchKernels("sm_121a", "cublas"),  # DGX Spark (GB10)
}
CUBLAS_MAJORS = (10, 12)
"""Majors whose GEMM is cuBLAS's MXFP8 kernel where no row names the capability."""

_NONE = ArchKernels(None, None)


def kernels_of(capability: tuple[int, int]) -> ArchKernels:
    """The kernels of compute ``capability`` (major, minor)."""
    capability = tuple(capability)
    found = ARCHS.get(capability)
    if found is not None:
        return found
    return ArchKernels(None, "cublas") if capability[0] in CUBLAS_MAJORS else _NONE


def name(capability: tuple[int, int]) -> str:
    """``"sm_90"`` for ``(9, 0)``."""
    return f"sm_{capability[0]}{capability[1]}"


def with_gemm(gemm: str) -> list[tuple[int, int]]:
    """The capabilities whose row names ``gemm`` (``"cute"``, ``"cublas"``)."""
    return [cap for cap, kernels in ARCHS.items() if kernels.gemm == gemm]


QUANTIZER_TARGETS: dict[tuple[int, int], str] = {
    cap: kernels.target for cap, kernels in ARCHS.items() if kernels.target
}
"""Build target of the slice quantizer per compute capability."""

(CUTE_GEMM,) = with_gemm("cute")
"""The one capability of the CuTe DSL GEMM."""
CUTE_GEMM_TARGET: str = ARCHS[CUTE_GEMM].target
"""Its build target, and that of the launches that run before it."""
