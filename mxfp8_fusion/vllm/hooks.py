"""Every vLLM name the plugin reads or patches, and the checks made before touching any.

The plugin supports the vLLM releases in :data:`SUPPORTED_VERSIONS` (major.minor). For
each part it resolves the names it needs and, for the functions it wraps, checks their
parameters; on any mismatch the plugin changes nothing and logs one line saying what did
not fit.
"""

from __future__ import annotations

import importlib
import inspect
import re
from dataclasses import dataclass

SUPPORTED_VERSIONS = ("0.32",)
"""vLLM releases (major.minor) whose hook points were read and tested."""


@dataclass(frozen=True)
class Hook:
    """One vLLM name: ``module`` and a dotted ``name`` inside it.

    ``parameters``: for a function the plugin wraps, the leading parameter names it relies
    on (checked against the installed function's signature).
    """

    module: str
    name: str
    parameters: tuple[str, ...] = ()

    @property
    def qualified(self) -> str:
        return f"{self.module}.{self.name}"

    def resolve(self):
        """The object, or raise ``LookupError`` saying what is missing or different."""
        try:
            obj = importlib.import_module(self.module)
        except Exception as error:  # any import failure means: this hook does not fit
            raise LookupError(f"cannot import {self.module} ({error})") from error
        for part in self.name.split("."):
            if not hasattr(obj, part):
                raise LookupError(f"{self.qualified} does not exist")
            obj = getattr(obj, part)
        if self.parameters:
            got = tuple(inspect.signature(obj).parameters)[: len(self.parameters)]
            if got != self.parameters:
                raise LookupError(f"{self.qualified} takes {got}, expected {self.parameters} first")
        return obj


_LINEAR = "vllm.model_executor.kernels.linear"
_PASSES = "vllm.compilation.passes"

HOOKS: dict[str, tuple[Hook, ...]] = {
    "kernel": (
        Hook(_LINEAR, "Mxfp8LinearKernel"),
        Hook(_LINEAR, "_POSSIBLE_MXFP8_KERNELS"),
        Hook(_LINEAR, "init_mxfp8_linear_kernel", ("weight_shape", "bmm_batch_size")),
        Hook("vllm.platforms", "PlatformEnum"),
        Hook("vllm.platforms", "current_platform"),
    ),
    "pass": (
        Hook(f"{_PASSES}.inductor_pass", "InductorPass"),
        Hook(f"{_PASSES}.pass_manager", "PostGradPassManager.configure", ("self", "config")),
        Hook(f"{_PASSES}.pass_manager", "PostGradPassManager.add", ("self", "pass_")),
        Hook(
            "vllm.config.compilation",
            "CompilationConfig.init_backend",
            ("self", "vllm_config", "prefix", "is_encoder"),
        ),
    ),
    "drafter": (
        Hook(
            "vllm.v1.worker.gpu_model_runner",
            "GPUModelRunner.propose_draft_token_ids",
            (
                "self",
                "scheduler_output",
                "sampled_token_ids",
                "sampling_metadata",
                "hidden_states",
                "sample_hidden_states",
                "aux_hidden_states",
            ),
        ),
        Hook(
            "vllm.model_executor.models.llama_eagle3",
            "Eagle3LlamaForCausalLM.combine_hidden_states",
            ("self", "hidden_states"),
        ),
        Hook(
            "vllm.model_executor.models.qwen3_dflash",
            "DFlashQwen3ForCausalLM.combine_hidden_states",
            ("self", "hidden_states"),
        ),
    ),
}
"""The names each part touches (see docs/serving.md for what each is used for)."""


def version_fits(version: str) -> bool:
    """Whether ``version`` (such as ``"0.32.0"`` or ``"0.32.1+cpu"``) is a supported release."""
    match = re.match(r"(\d+)\.(\d+)", version or "")
    return bool(match) and f"{match[1]}.{match[2]}" in SUPPORTED_VERSIONS


def check(parts) -> str | None:
    """``None`` when the installed vLLM fits every part in ``parts``; else why not, in one
    line."""
    try:
        import vllm
    except Exception as error:
        return f"vLLM cannot be imported ({error})"
    version = getattr(vllm, "__version__", "unknown")
    if not version_fits(version):
        supported = ", ".join(f"{v}.x" for v in SUPPORTED_VERSIONS)
        return f"vLLM {version} is not a supported release ({supported})"
    for part in parts:
        for hook in HOOKS[part]:
            try:
                hook.resolve()
            except LookupError as error:
                return f"vLLM {version}: {error} (needed by the {part} part)"
    return None


WRAPPED = "__mxfp8_fusion_wrapped__"
"""Set on every function the plugin put in vLLM's place: a second load leaves it alone."""


def wrap(hook: Hook, make) -> bool:
    """Replace the method ``hook`` names by ``make(original)``, once.

    Returns ``False`` when it is already wrapped (the plugin loaded before in this process).
    """
    owner_name, attribute = hook.name.rsplit(".", 1)
    owner = Hook(hook.module, owner_name).resolve()
    original = owner.__dict__[attribute]
    if getattr(original, WRAPPED, False):
        return False
    replacement = make(original)
    setattr(replacement, WRAPPED, True)
    replacement.__wrapped__ = original
    setattr(owner, attribute, replacement)
    return True


def hook(part: str, name: str) -> Hook:
    """The hook of ``part`` whose name is ``name``."""
    return next(h for h in HOOKS[part] if h.name == name)
