"""Which MXFP8 linear kernel serves vLLM's layers, per device: this library's or vLLM's own.

The rule: on a GPU arch, this library's kernel goes ahead of the one vLLM would choose only
where it measured at least as fast at every layer shape and token count measured, side by
side in one run (``benchmarks/vllm_linear.py``), and so keeps vLLM's speed; otherwise it
yields, and vLLM's numerics stay too. ``MXFP8_FUSION_VLLM_GPU_KERNEL=ours`` puts it ahead
wherever it serves. On the CPU vLLM has no MXFP8 kernel, so this library's serves.

Imports no vLLM (the capability table it reads imports nothing itself).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..kernels.capability import name as capability_name
from ..kernels.capability import with_gemm


@dataclass(frozen=True)
class Arch:
    """What runs vLLM's MXFP8 linears on one kind of device."""

    vllm_kernel: str
    """The kernel vLLM chooses there, and its numerics."""
    ours_at_least_as_fast: bool
    """Measured at least as fast as ``vllm_kernel`` at every point (False: not measured,
    or slower somewhere)."""
    measured: str
    """What the measurement found, for the log line."""


ARCHS: dict[str, Arch] = {
    "cpu": Arch("none (vLLM has no CPU MXFP8 kernel)", True, "the only MXFP8 kernel there"),
    # Humming is W8A16 there (BF16 activations, exact E4M3 x E8M0 weights, FP32
    # accumulation), closer to the BF16 model than our W8A8; measured side by side on an
    # H200 (docs/serving.md has the numbers), it was faster nearly everywhere.
    "sm_90": Arch(
        "Humming (W8A16)",
        False,
        "faster than ours at 76 of 78 points measured on an H200 (6 shapes, 1-4096 tokens)",
    ),
}
OTHER_GPU = Arch("vLLM's own choice", False, "not measured")
"""Any other GPU arch (sm_100, sm_120, ...): vLLM's own kernels (FlashInfer, CUTLASS)."""


SERVED = [capability_name(cap) for cap in with_gemm("cute")]
"""The GPU archs this library's kernel class serves at all: those where its own GEMM runs
(the capability table); on the cuBLAS archs vLLM's own kernels are left alone, unmeasured."""


@dataclass(frozen=True)
class Decision:
    """Whether this library's kernel goes ahead of vLLM's on a device, and why."""

    arch: str
    ours: bool
    reason: str


def arch_name(capability) -> str:
    """``"sm_90"`` for capability ``(9, 0)`` (or ``90``); ``"cpu"`` for ``None``."""
    if capability is None:
        return "cpu"
    if isinstance(capability, int):
        capability = divmod(capability, 10)
    return capability_name(capability)


def decide(arch: str, setting: str = "auto") -> Decision:
    """The kernel decision on ``arch`` (``"cpu"``, ``"sm_90"``, ...) under ``setting``
    (``MXFP8_FUSION_VLLM_GPU_KERNEL``: ``"auto"`` or ``"ours"``)."""
    info = ARCHS.get(arch, OTHER_GPU)
    if arch == "cpu":
        return Decision(arch, True, "ours: vLLM has no MXFP8 kernel on the CPU")
    if arch not in SERVED:
        served = " and ".join(SERVED)
        return Decision(arch, False, f"{info.vllm_kernel}: ours serves {served} and the CPU only")
    if setting == "ours":
        return Decision(arch, True, "ours (W8A8): MXFP8_FUSION_VLLM_GPU_KERNEL=ours")
    if info.ours_at_least_as_fast:
        return Decision(arch, True, f"ours: at least as fast as {info.vllm_kernel}")
    return Decision(
        arch,
        False,
        f"{info.vllm_kernel}: {info.measured}; MXFP8_FUSION_VLLM_GPU_KERNEL=ours for ours (W8A8)",
    )


def summary(setting: str = "auto") -> str:
    """The decision on every arch named in :data:`ARCHS` and elsewhere, in one phrase."""
    parts = [f"{arch} {decide(arch, setting).reason}" for arch in ARCHS]
    other = decide("other", setting)
    parts.append(f"other GPUs {other.reason}")
    return "; ".join(parts)
