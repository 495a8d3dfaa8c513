"""The plugin's switches (environment variables) and its per-process counters.

Imports neither vLLM nor torch: the plugin reads these before deciding to import anything.

- ``MXFP8_FUSION_VLLM``: ``1`` / ``true`` / ``on`` / ``yes`` (or unset) leave the plugin on;
  ``0`` / ``false`` / ``off`` / ``no`` turn it off. Any other value turns it off too, with a
  warning: a kill switch that is mistyped fails safe.
- ``MXFP8_FUSION_VLLM_DISABLE=kernel,pass,drafter`` turns off the parts named (any subset,
  comma-separated).
- ``MXFP8_FUSION_VLLM_GPU_KERNEL``: ``auto`` (default) puts this library's MXFP8 linear
  kernel ahead of vLLM's on a GPU arch only where it measured at least as fast as vLLM's
  own choice there (:mod:`.policy`); ``ours`` puts it ahead wherever it serves. An unknown
  value is read as ``auto``, with a warning.
- ``MXFP8_FUSION_VLLM_ACTIVATION``: what this library's kernel does with a layer's input.
  ``auto`` (default): vLLM's numerics where vLLM has an MXFP8 kernel (sm_90: W8A16, as
  Humming), W8A8 on the CPU, where it has none (:mod:`.policy`); ``bf16``: W8A16 (the input
  used as it is, times the exact weight); ``mxfp8``: W8A8 (the input quantized per call). An
  unknown value is read as ``auto``, with a warning.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

ENABLE_VARIABLE = "MXFP8_FUSION_VLLM"
DISABLE_VARIABLE = "MXFP8_FUSION_VLLM_DISABLE"
KERNEL_VARIABLE = "MXFP8_FUSION_VLLM_GPU_KERNEL"
ACTIVATION_VARIABLE = "MXFP8_FUSION_VLLM_ACTIVATION"
PARTS = ("kernel", "pass", "drafter")
"""The plugin's parts, in the order they are installed."""

ON = ("1", "true", "on", "yes")
OFF = ("0", "false", "off", "no")
KERNEL_CHOICES = ("auto", "ours")
ACTIVATION_CHOICES = ("auto", "bf16", "mxfp8")
CHOICES = {KERNEL_VARIABLE: KERNEL_CHOICES, ACTIVATION_VARIABLE: ACTIVATION_CHOICES}
"""The switches that take one of a few values, the first of them the default."""


def _get(environ, name: str) -> str:
    return (environ if environ is not None else os.environ).get(name, "").strip().lower()


def plugin_switch(environ=None) -> tuple[bool, str | None]:
    """Whether ``MXFP8_FUSION_VLLM`` leaves the plugin on (unset: on), and the value when it
    is none of the documented ones (then the plugin is off)."""
    value = _get(environ, ENABLE_VARIABLE)
    if value in ("", *ON):
        return True, None
    if value in OFF:
        return False, None
    return False, value


def plugin_enabled(environ=None) -> bool:
    """Whether ``MXFP8_FUSION_VLLM`` leaves the plugin on (unset: on)."""
    return plugin_switch(environ)[0]


def enabled_parts(environ=None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The parts left on by ``MXFP8_FUSION_VLLM_DISABLE``, and the unknown names it holds."""
    value = _get(environ, DISABLE_VARIABLE)
    named = {item.strip() for item in value.split(",") if item.strip()}
    unknown = tuple(sorted(named - set(PARTS)))
    return tuple(part for part in PARTS if part not in named), unknown


def choice(environ, name: str) -> tuple[str, str | None]:
    """The value of switch ``name`` (a key of :data:`CHOICES`), and the value set when it is
    none of the choices. Unset, or an unknown value, reads as the default: a mistyped switch
    fails safe, and the caller warns about it."""
    choices = CHOICES[name]
    value = _get(environ, name) or choices[0]
    if value in choices:
        return value, None
    return choices[0], value


def gpu_kernel(environ=None) -> tuple[str, str | None]:
    """``MXFP8_FUSION_VLLM_GPU_KERNEL`` (``auto`` or ``ours``), and the value when it is
    neither (then ``auto``)."""
    return choice(environ, KERNEL_VARIABLE)


def activation(environ=None) -> tuple[str, str | None]:
    """``MXFP8_FUSION_VLLM_ACTIVATION`` (``auto``, ``bf16`` or ``mxfp8``), and the value
    when it is none of them (then ``auto``)."""
    return choice(environ, ACTIVATION_VARIABLE)


@dataclass
class Stats:
    """What the plugin did in this process (read them in tests or a debugger)."""

    registered: bool = False
    """``register`` ran and installed at least one part."""
    parts: tuple[str, ...] = ()
    """The parts installed."""
    layers: list[str] = field(default_factory=list)
    """MXFP8 linear layers our kernel packed, by vLLM prefix."""
    w8a16_layers: list[str] = field(default_factory=list)
    """Those of them that run W8A16 (the others W8A8)."""
    linear_calls: int = 0
    """Eager ``apply_weights`` calls (calls inside compiled graphs are not counted)."""
    pass_graphs: int = 0
    """Graphs the fusion pass ran on."""
    pass_linear_nodes: int = 0
    """MXFP8 quantize / linear nodes in those graphs (our kernel's calls, as compiled)."""
    pass_rewrites: int = 0
    """``cat -> MXFP8 linear`` sites the pass rewrote."""
    staged_steps: int = 0
    """Drafter ``fc`` inputs staged slice by slice (eager steps and graph buffer fills)."""
    slice_steps: int = 0
    """Of the eager steps, those whose W8A16 ``fc`` read the auxiliary hidden states where
    they are (no MXFP8 copy)."""
    unstaged_concatenations: int = 0
    """Drafter concatenations left to vLLM (a drafter this plugin does not stage)."""


stats = Stats()
