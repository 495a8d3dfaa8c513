"""``Mxfp8FusionLinearKernel``: vLLM's MXFP8 linear layers served by this library.

Every MXFP8 linear method of vLLM (ModelOpt ``modelopt_mxfp8``, online
``quantization="mxfp8"``, compressed-tensors W8A8 MXFP8, and the others built on
``init_mxfp8_linear_kernel``) picks its kernel from a per-platform list. The plugin puts
this class first on CUDA and into the CPU list, where vLLM has no MXFP8 kernel and this
library's plain-torch reference runs. On a GPU it serves only where :mod:`.policy` says so:
by default where it measured at least as fast as vLLM's own choice. On sm_90 vLLM's choice
is Humming, W8A16 (BF16 activations); ours runs W8A16 there too, measured on an H100 slower
than Humming at some shapes and token counts, so this class yields unless
``MXFP8_FUSION_VLLM_GPU_KERNEL=ours``.
``VLLM_DISABLED_KERNELS=Mxfp8FusionLinearKernel`` leaves the choice to vLLM everywhere.

What its calls do with the input, per :func:`.policy.decide`: W8A16 on sm_90
(``mxfp8::linear_w8a16``), W8A8 on the CPU (``mxfp8::linear``), unless
``MXFP8_FUSION_VLLM_ACTIVATION`` says otherwise.

The work itself is in :mod:`.linear`, which does not import vLLM.
"""

from __future__ import annotations

import importlib.util
import logging

import torch
from vllm.model_executor.kernels import linear as vllm_linear
from vllm.platforms import PlatformEnum, current_platform

from ..format import GROUP
from . import linear, policy, settings

log = logging.getLogger("mxfp8_fusion.vllm")


def _decision() -> policy.Decision:
    """The policy's decision for this process's device, under the switches."""
    if current_platform.is_cpu():
        arch = "cpu"
    else:
        capability = current_platform.get_device_capability()
        if capability is not None:
            capability = (capability[0], capability[1])
        arch = policy.arch_name(capability)
    return policy.decide(arch, settings.gpu_kernel()[0], settings.activation()[0])


def _cuda_reason() -> str | None:
    """Why this kernel does not serve this CUDA device (``None``: it does)."""
    decision = _decision()
    if not decision.ours:
        return f"mxfp8_fusion yields on {decision.arch}: {decision.reason}"
    if importlib.util.find_spec("cutlass") is None:
        return "mxfp8_fusion needs nvidia-cutlass-dsl for its sm_90 kernels (not installed)"
    return None


class Mxfp8FusionLinearKernel(vllm_linear.Mxfp8LinearKernel):
    """MXFP8-weight linear from mxfp8_fusion: E4M3 weights with E8M0 block-32 scales, packed
    once at load. W8A16 on sm_90 (vLLM's numerics there): the BF16 input as it is, times the
    exact weight, FP32 accumulation (``mxfp8::linear_w8a16``). W8A8 on the CPU: the input
    quantized per call (RCEIL), then the MXFP8 GEMM (``mxfp8::linear``). The CuTe DSL
    kernels on sm_90, the plain-torch reference on the CPU; ``MXFP8_FUSION_VLLM_ACTIVATION``
    chooses the other activation."""

    supports_pre_processed_weights = False  # the scales are rewritten in the blocked layout

    @classmethod
    def is_supported(cls, compute_capability: int | None = None) -> tuple[bool, str | None]:
        if current_platform.is_cpu():
            return True, None
        if current_platform.is_cuda():
            reason = _cuda_reason()
            return reason is None, reason
        return False, f"mxfp8_fusion serves CUDA {', '.join(policy.SERVED)} and CPU"

    @classmethod
    def can_implement(cls, c) -> tuple[bool, str | None]:
        if c.bmm_batch_size is not None:
            return False, "batched (bmm) MXFP8 layers are not served by mxfp8_fusion"
        n, k = c.weight_shape
        if n <= 0 or k <= 0 or k % GROUP:
            return False, f"weight shape {(n, k)}: in_features must be a multiple of {GROUP}"
        return True, None

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        name = getattr(layer, "prefix", None) or type(layer).__name__
        activation = _decision().activation
        linear.process_weights(layer, name, activation)
        settings.stats.layers.append(name)
        if not activation.quantized:
            settings.stats.w8a16_layers.append(name)

    def apply_weights(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        if not torch.compiler.is_compiling():
            settings.stats.linear_calls += 1
        return linear.apply_weights(layer, x, bias)


def install() -> bool:
    """Put the kernel first on CUDA and into the CPU list (once); ``True`` when added now."""
    table = vllm_linear._POSSIBLE_MXFP8_KERNELS
    added = False
    for platform, first in ((PlatformEnum.CUDA, True), (PlatformEnum.CPU, False)):
        kernels = table.setdefault(platform, [])
        if any(k.__name__ == Mxfp8FusionLinearKernel.__name__ for k in kernels):
            continue
        # CUDA: ahead of vLLM's choices; is_supported yields to them where the policy says.
        # CPU: vLLM has none there, so the place does not matter; appended after any a
        # user added.
        if first:
            kernels.insert(0, Mxfp8FusionLinearKernel)
        else:
            kernels.append(Mxfp8FusionLinearKernel)
        added = True
    return added
