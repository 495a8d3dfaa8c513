"""The vLLM plugin entry point: ``register``, loaded from the ``vllm.general_plugins`` group.

vLLM calls it in every process it starts (front end, engine core, workers), possibly
several times; it installs each part once per process. Before changing anything it checks
the vLLM release and every name the enabled parts touch (:mod:`.hooks`); if one does not
fit, it logs one line and leaves vLLM as it was.
"""

from __future__ import annotations

import logging

from . import settings

log = logging.getLogger("mxfp8_fusion.vllm")


def _installers():
    # imported here: each part's module imports vLLM
    from . import compile, drafter, kernel

    return {"kernel": kernel.install, "pass": compile.install, "drafter": drafter.install}


def register() -> None:
    """Install the enabled parts of the plugin into the running vLLM (idempotent).

    Switches: ``MXFP8_FUSION_VLLM=0`` (the whole plugin off) and
    ``MXFP8_FUSION_VLLM_DISABLE=kernel,pass,drafter`` (some parts off).
    """
    if not settings.plugin_enabled():
        log.info("mxfp8_fusion vLLM plugin: off (%s=0)", settings.ENABLE_VARIABLE)
        return
    parts, unknown = settings.enabled_parts()
    if unknown:
        log.warning(
            "mxfp8_fusion vLLM plugin: %s names unknown parts %s (known: %s); ignored",
            settings.DISABLE_VARIABLE,
            ", ".join(unknown),
            ", ".join(settings.PARTS),
        )
    if not parts:
        log.info("mxfp8_fusion vLLM plugin: every part is off (%s)", settings.DISABLE_VARIABLE)
        return
    from . import hooks

    problem = hooks.check(parts)
    if problem is not None:
        log.warning("mxfp8_fusion vLLM plugin: not installed, nothing changed: %s", problem)
        return
    installers = _installers()
    newly = [part for part in parts if installers[part]()]
    settings.stats.registered = True
    settings.stats.parts = tuple(parts)
    if newly:
        log.info("mxfp8_fusion vLLM plugin: installed %s", ", ".join(newly))
