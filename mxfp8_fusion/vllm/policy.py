"""Which MXFP8 linear kernel serves vLLM's layers, per device, and what ours does with the
layer's input there.

Numerics: where vLLM has an MXFP8 kernel, this library's runs vLLM's numerics by default.
On sm_90 vLLM's is Humming, W8A16 (BF16 activations, the weight's exact E4M3 x E8M0 values,
FP32 accumulation), and so is ours there (``mxfp8::linear_w8a16``). On the CPU vLLM has
none; ours runs W8A8 there (the input quantized to MXFP8 per call, ``mxfp8::linear``).
``MXFP8_FUSION_VLLM_ACTIVATION`` chooses otherwise (:mod:`.settings`).

Kernel: on a GPU arch, ours goes ahead of the one vLLM would choose only where, running the
activation it would run there, it measured at least as fast at every layer shape and token
count measured, side by side in one run (``benchmarks/vllm_linear.py``), and so keeps
vLLM's speed; otherwise it yields, and vLLM's numerics stay. :data:`MEASURED` holds those
measurements. ``MXFP8_FUSION_VLLM_GPU_KERNEL=ours`` puts it ahead wherever it serves. On
the CPU vLLM has no MXFP8 kernel, so this library's serves.

Imports no vLLM (through the package it does import torch; the capability table it reads
imports nothing itself).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..format import Activation
from ..kernels.capability import name as capability_name
from ..kernels.capability import with_gemm


@dataclass(frozen=True)
class Measurement:
    """Our kernel against vLLM's on one arch, running one activation."""

    at_least_as_fast: bool
    """At least as fast at every point measured, side by side in one run (False: slower
    somewhere, or not measured)."""
    found: str
    """What was found, for the log line (where ours is at least as fast, it says so, against
    which kernel)."""


# The one place a receipt of benchmarks/vllm_linear.py changes (a new arch or activation
# measured: its entry here); the decision, the log line and `python -m mxfp8_fusion vllm`
# follow. Keyed by (arch, activation of ours); an absent key is not measured.
MEASURED: dict[tuple[str, Activation], Measurement] = {
    # receipt benchmarks/results/vllm_linear.json (H200, 2026-12-04); numbers in
    # docs/serving.md. Ours W8A8 quantizes the input per call; Humming does not.
    ("sm_90", Activation.W8A8): Measurement(
        False,
        "faster than ours (W8A8) at 76 of 78 points measured on an H200 (6 shapes, 1-4096 tokens)",
    ),
    # receipts benchmarks/results/w8a16.json (H100, 2026-12-08, its retuned table) and
    # w8a16_h200.json (H200, 2026-12-06, no W8A16 table there): ours W8A16 from the slices
    # against Humming on the concatenation, numbers in docs/serving.md. Slower at 35 of 78
    # points on the H100 and 52 of 78 on the H200, so Humming keeps serving on both.
    ("sm_90", Activation.W8A16): Measurement(
        False,
        "faster than ours (W8A16) at 35 of 78 points measured on an H100 and 52 of 78 on an "
        "H200 (6 shapes, 1-4096 tokens; ours faster at 1024-4096 tokens on most)",
    ),
}


@dataclass(frozen=True)
class Arch:
    """What runs vLLM's MXFP8 linears on one kind of device."""

    vllm_kernel: str
    """The kernel vLLM chooses there, and its numerics."""
    activation: Activation
    """What our kernel does with the input there by default: vLLM's numerics where vLLM has
    a kernel."""


ARCHS: dict[str, Arch] = {
    # vLLM has no MXFP8 kernel to match; W8A8 is what this library's layers do by default
    "cpu": Arch("none (vLLM has no CPU MXFP8 kernel)", Activation.W8A8),
    # Humming keeps MXFP8 activations only on SM120+: on sm_90 it is W8A16
    "sm_90": Arch("Humming (W8A16)", Activation.W8A16),
}
OTHER_GPU = Arch("vLLM's own choice", Activation.W8A8)
"""Any other GPU arch (sm_100, sm_120, ...): vLLM's own kernels (FlashInfer, CUTLASS). Ours
does not serve there; its activation is the library's default, W8A8, for completeness."""


SERVED = [capability_name(cap) for cap in with_gemm("cute")]
"""The GPU archs this library's kernel class serves at all: those where its own GEMM runs
(the capability table); on the cuBLAS archs vLLM's own kernels are left alone, unmeasured."""


@dataclass(frozen=True)
class Decision:
    """Whether this library's kernel goes ahead of vLLM's on a device, what it runs when it
    does, and why."""

    arch: str
    ours: bool
    activation: Activation
    """What our kernel runs there."""
    reason: str


def arch_name(capability) -> str:
    """``"sm_90"`` for capability ``(9, 0)`` (or ``90``); ``"cpu"`` for ``None``."""
    if capability is None:
        return "cpu"
    if isinstance(capability, int):
        capability = divmod(capability, 10)
    return capability_name(capability)


def decide(arch: str, setting: str = "auto", activation: str = "auto") -> Decision:
    """The kernel decision on ``arch`` (``"cpu"``, ``"sm_90"``, ...) under ``setting``
    (``MXFP8_FUSION_VLLM_GPU_KERNEL``: ``"auto"`` or ``"ours"``) and ``activation``
    (``MXFP8_FUSION_VLLM_ACTIVATION``: ``"auto"``, ``"bf16"`` or ``"mxfp8"``)."""
    info = ARCHS.get(arch, OTHER_GPU)
    chosen = info.activation if activation == "auto" else Activation.of(activation)
    numerics = chosen.name
    if arch == "cpu":
        return Decision(
            arch, True, chosen, f"ours: vLLM has no MXFP8 kernel on the CPU ({numerics})"
        )
    if arch not in SERVED:
        served = " and ".join(SERVED)
        reason = f"{info.vllm_kernel}: ours serves {served} and the CPU only"
        return Decision(arch, False, chosen, reason)
    if setting == "ours":
        return Decision(arch, True, chosen, f"ours ({numerics}): MXFP8_FUSION_VLLM_GPU_KERNEL=ours")
    measured = MEASURED.get((arch, chosen), Measurement(False, f"ours ({numerics}) not measured"))
    if measured.at_least_as_fast:
        return Decision(arch, True, chosen, f"ours ({numerics}): {measured.found}")
    reason = (
        f"{info.vllm_kernel}: {measured.found}; MXFP8_FUSION_VLLM_GPU_KERNEL=ours for ours "
        f"({numerics})"
    )
    return Decision(arch, False, chosen, reason)


def summary(setting: str = "auto", activation: str = "auto") -> str:
    """The decision on every arch named in :data:`ARCHS` and elsewhere, in one phrase."""
    parts = [f"{arch} {decide(arch, setting, activation).reason}" for arch in ARCHS]
    other = decide("other", setting, activation)
    parts.append(f"other GPUs {other.reason}")
    return "; ".join(parts)
