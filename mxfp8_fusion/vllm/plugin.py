"""The vLLM plugin entry point: ``register``, loaded from the ``vllm.general_plugins`` group.

vLLM calls it in every process it starts (front end, engine core, workers), possibly
several times; it installs each part once per process. Before changing anything it checks
the vLLM release and, part by part, every name the part touches (:mod:`.hooks`): a part
that does not fit is left out with one line saying why, and the others install. One INFO
line per process then says what is on (:func:`status`); ``python -m mxfp8_fusion vllm``
prints the same without starting an engine.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

from . import policy, settings

log = logging.getLogger("mxfp8_fusion.vllm")
_PREFIX = "mxfp8_fusion vLLM plugin"
_reported = False  # the status line is logged once per process


@dataclass
class Status:
    """What the plugin does (or would do) in this process."""

    version: str = "none"
    release: str | None = None
    tested: bool = False
    parts: tuple[str, ...] = ()
    """The parts that are on and fit this vLLM."""
    off: dict[str, str] = field(default_factory=dict)
    """Part -> why it is not installed."""
    warnings: list[str] = field(default_factory=list)
    """Switch values that were not understood."""
    kernel_setting: str = "auto"
    activation_setting: str = "auto"
    switched_off: str = ""
    """The ``MXFP8_FUSION_VLLM`` value that turned the whole plugin off."""

    def line(self) -> str:
        """The one-line summary: release, parts, the kernel decision per arch."""
        if self.switched_off:
            return f"{_PREFIX}: off ({settings.ENABLE_VARIABLE}={self.switched_off})"
        if self.release is None:
            why = next(iter(self.off.values()), "no vLLM")
            return f"{_PREFIX}: not installed, nothing changed: {why}"
        from . import hooks

        if not self.tested:
            tested = f"untested, newer than {self.release}"
        elif self.release in hooks.UNRELEASED:  # no wheel of it yet: read from vLLM main
            tested = f"read from {hooks.UNRELEASED[self.release]}, unreleased"
        else:
            tested = "tested"
        text = f"{_PREFIX}: vLLM {self.version} ({tested}); on: {', '.join(self.parts) or 'none'}"
        if self.off:
            text += "; off: " + "; ".join(f"{p} ({why})" for p, why in self.off.items())
        if "kernel" in self.parts:
            text += f"; kernel: {policy.summary(self.kernel_setting, self.activation_setting)}"
        return text


def status(environ=None, version: str | None = None) -> tuple[Status, object | None]:
    """What :func:`register` would install here, without installing anything; and the
    :class:`~.hooks.Fit` it is based on (``None`` when the plugin is switched off)."""
    state = Status()
    enabled, bad = settings.plugin_switch(environ)
    if bad is not None:
        state.warnings.append(
            f"{settings.ENABLE_VARIABLE}={bad!r} is none of {'/'.join(settings.ON)} (on) or "
            f"{'/'.join(settings.OFF)} (off): the plugin stays off"
        )
    if not enabled:
        state.switched_off = (environ if environ is not None else os.environ)[
            settings.ENABLE_VARIABLE
        ]
        return state, None
    parts, unknown = settings.enabled_parts(environ)
    if unknown:
        state.warnings.append(
            f"{settings.DISABLE_VARIABLE} names unknown parts {', '.join(unknown)} (known: "
            f"{', '.join(settings.PARTS)}); ignored"
        )
    state.kernel_setting = _choice(state, environ, settings.KERNEL_VARIABLE)
    state.activation_setting = _choice(state, environ, settings.ACTIVATION_VARIABLE)
    off = f"turned off by {settings.DISABLE_VARIABLE}"
    state.off = {p: off for p in settings.PARTS if p not in parts}
    from . import hooks

    fit = hooks.check(parts, version)
    state.version, state.release, state.tested = fit.version, fit.release, fit.tested
    state.parts = tuple(p for p in parts if fit.fits(p))
    state.off.update(fit.problems)
    return state, fit


def _choice(state: Status, environ, name: str) -> str:
    """Switch ``name``'s value; a warning on ``state`` when it was none of the choices."""
    value, bad = settings.choice(environ, name)
    if bad is not None:
        choices = settings.CHOICES[name]
        state.warnings.append(f"{name}={bad!r} is none of {', '.join(choices)}: read as auto")
    return value


def _installers():
    # imported here: each part's module imports vLLM
    from . import compile, drafter, kernel

    return {"kernel": kernel.install, "pass": compile.install, "drafter": drafter.install}


def _install(part: str, fit) -> bool:
    install = _installers()[part]
    if part == "drafter":
        return install(fit.hooks(part), graph_staging=fit.tested)
    if part == "pass":
        return install(fit.hooks(part))
    return install()


def register() -> None:
    """Install the enabled parts of the plugin that fit the running vLLM (idempotent).

    Switches: ``MXFP8_FUSION_VLLM=0`` (the whole plugin off),
    ``MXFP8_FUSION_VLLM_DISABLE=kernel,pass,drafter`` (some parts off),
    ``MXFP8_FUSION_VLLM_GPU_KERNEL=ours`` (our kernel ahead of vLLM's on GPUs),
    ``MXFP8_FUSION_VLLM_ACTIVATION=bf16|mxfp8`` (what our kernel does with the input).
    """
    global _reported
    state, fit = status()
    if not _reported:
        for warning in state.warnings:
            log.warning("%s: %s", _PREFIX, warning)
    newly = [part for part in state.parts if _install(part, fit)]
    if state.parts:
        settings.stats.registered = True
        settings.stats.parts = state.parts
    if not _reported or newly:
        log.info("%s", state.line())
    _reported = True


def _paths(fit) -> str:
    names = fit.hooks("drafter")
    paths = [
        label
        for label, name in (
            ("V1 runner", "GPUModelRunner.propose_draft_token_ids"),
            ("V2 EAGLE-3", "TargetDependentARSpeculator.propose"),
            ("V2 DFlash", "DFlashSpeculator.propose"),
        )
        if name in names
    ]
    if fit.tested and "DFlashSpeculator._store_hidden_states" in names:
        paths.append("DFlash full-graph buffer")
    return ", ".join(paths)


def describe(environ=None) -> tuple[str, bool]:
    """``python -m mxfp8_fusion vllm``: the status line and, part by part, what is on and
    why, without starting an engine; and whether any part is on."""
    state, fit = status(environ)
    env = environ if environ is not None else os.environ
    lines = [state.line(), *(f"warning: {w}" for w in state.warnings)]
    for name in (
        settings.ENABLE_VARIABLE,
        settings.DISABLE_VARIABLE,
        settings.KERNEL_VARIABLE,
        settings.ACTIVATION_VARIABLE,
    ):
        lines.append(f"  {name}={env.get(name, '')!r}" if name in env else f"  {name} unset")
    for part in settings.PARTS:
        if part in state.parts:
            detail = {
                "kernel": "vLLM's MXFP8 linear kernel list (see below)",
                "pass": "vLLM's compile pipeline",
                "drafter": f"{_paths(fit)} (where our kernel packed fc)",
            }[part]
            lines.append(f"  {part}: on: {detail}")
        elif not state.switched_off and state.release is not None:
            lines.append(f"  {part}: off: {state.off.get(part, '')}")
    if "kernel" in state.parts:
        for arch in (*policy.ARCHS, "other GPUs"):
            decision = policy.decide(arch, state.kernel_setting, state.activation_setting)
            lines.append(f"  kernel on {arch}: {decision.reason}")
    return "\n".join(lines), bool(state.parts)
