"""The plugin's switches (environment variables) and its per-process counters.

Imports neither vLLM nor torch: the plugin reads these before deciding to import anything.

- ``MXFP8_FUSION_VLLM=0`` turns the whole plugin off (also ``false``, ``off``, ``no``).
- ``MXFP8_FUSION_VLLM_DISABLE=kernel,pass,drafter`` turns off the parts named (any subset,
  comma-separated).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

ENABLE_VARIABLE = "MXFP8_FUSION_VLLM"
DISABLE_VARIABLE = "MXFP8_FUSION_VLLM_DISABLE"
PARTS = ("kernel", "pass", "drafter")
"""The plugin's parts, in the order they are installed."""

_OFF = {"0", "false", "off", "no"}


def plugin_enabled(environ=None) -> bool:
    """Whether ``MXFP8_FUSION_VLLM`` leaves the plugin on (unset: on)."""
    value = (environ if environ is not None else os.environ).get(ENABLE_VARIABLE, "")
    return value.strip().lower() not in _OFF


def enabled_parts(environ=None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The parts left on by ``MXFP8_FUSION_VLLM_DISABLE``, and the unknown names it holds."""
    value = (environ if environ is not None else os.environ).get(DISABLE_VARIABLE, "")
    named = {item.strip().lower() for item in value.split(",") if item.strip()}
    unknown = tuple(sorted(named - set(PARTS)))
    return tuple(part for part in PARTS if part not in named), unknown


@dataclass
class Stats:
    """What the plugin did in this process (read them in tests or a debugger)."""

    registered: bool = False
    """``register`` ran and installed at least one part."""
    parts: tuple[str, ...] = ()
    """The parts installed."""
    layers: list[str] = field(default_factory=list)
    """MXFP8 linear layers our kernel packed, by vLLM prefix."""
    linear_calls: int = 0
    """Eager ``apply_weights`` calls (calls inside compiled graphs are not counted)."""
    pass_graphs: int = 0
    """Graphs the fusion pass ran on."""
    pass_linear_nodes: int = 0
    """MXFP8 quantize / linear nodes in those graphs (our kernel's calls, as compiled)."""
    pass_rewrites: int = 0
    """``cat -> MXFP8 linear`` sites the pass rewrote."""
    staged_steps: int = 0
    """Drafter ``fc`` projections staged slice by slice."""
    unstaged_concatenations: int = 0
    """Drafter concatenations left to vLLM (a drafter this plugin does not stage)."""


stats = Stats()
