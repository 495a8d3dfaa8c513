"""The fusion pass in vLLM's compile pipeline.

- ``VLLM_COMPILE`` (GPU): vLLM runs its post-grad passes through a ``PostGradPassManager``
  that owns Inductor's ``post_grad_custom_post_pass`` slot. After the manager is configured
  the fusion pass is added to it (after vLLM's own passes and any pass a user configured
  there, before its clean-ups); the manager's uuid then covers it.
- Plain Inductor (vLLM's CPU compile, and ``STOCK_TORCH_COMPILE``): the backend is the
  ``"inductor"`` string and ``CompilationConfig.inductor_compile_config`` is its options
  dict. When ``init_backend`` returns, the fusion pass is composed into that dict's
  ``post_grad_custom_post_pass`` slot, after whatever pass already holds it (the slot's own
  entry, or the global Inductor setting).

Either way the pass's uuid hashes the pass's sources and options (:class:`FusionPass`) and
this file, so no compile cache serves a graph compiled without it.
"""

from __future__ import annotations

import functools
import hashlib

from vllm.compilation.passes.inductor_pass import InductorPass

from ..passes.fusion import ComposedPass, FusionPass, compose
from . import hooks, settings

_SLOT = "post_grad_custom_post_pass"
with open(__file__, "rb") as _source:
    _WIRING = hashlib.sha256(_source.read()).hexdigest()


def _run_counted(fusion: FusionPass, run, graph) -> None:
    before = fusion.matches
    run(graph)
    settings.stats.pass_graphs += 1
    settings.stats.pass_linear_nodes += fusion.contents[-1][1] if fusion.contents else 0
    settings.stats.pass_rewrites += fusion.matches - before


class VllmFusionPass(InductorPass):
    """:class:`~mxfp8_fusion.FusionPass` as a vLLM ``InductorPass`` (what the pass manager
    accepts). Its uuid is a string, as the manager's JSON hash needs."""

    def __init__(self, fusion: FusionPass | None = None):
        self.fusion = fusion if fusion is not None else FusionPass()

    def __call__(self, graph) -> None:
        _run_counted(self.fusion, self.fusion, graph)

    def uuid(self) -> str:
        return InductorPass.hash_dict({"fusion": self.fusion.uuid().hex(), "wiring": _WIRING})


class CountingFusionPass(FusionPass):
    """:class:`FusionPass` that also adds to the plugin's counters (plain Inductor slot).

    Its uuid is a hex string: vLLM hashes its compilation config, this slot included, as
    JSON.
    """

    def __call__(self, graph) -> None:
        _run_counted(self, super().__call__, graph)

    def uuid(self) -> str:
        return hashlib.sha256(super().uuid() + _WIRING.encode()).hexdigest()


class SlotPasses(ComposedPass):
    """The slot's earlier pass(es), then the fusion pass; a hex-string uuid (or ``None``
    when an earlier pass has none, which makes Inductor skip its cache, as it would)."""

    def uuid(self) -> str | None:
        uid = super().uuid()
        return uid.hex() if uid is not None else None


def install_into(options: dict) -> None:
    """Compose the fusion pass into the options' ``post_grad_custom_post_pass`` slot, after
    whatever holds it there (or, when the key is absent, in Inductor's global config)."""
    if _SLOT in options:
        existing = options[_SLOT]
    else:
        from torch._inductor import config as inductor_config

        existing = getattr(inductor_config, _SLOT)
    composed = compose(existing, CountingFusionPass())
    if isinstance(composed, ComposedPass):
        composed = SlotPasses(composed.passes)
    options[_SLOT] = composed


def _wrap_configure(original):
    @functools.wraps(original)
    def configure(self, config, *args, **kwargs):
        result = original(self, config, *args, **kwargs)
        if not any(isinstance(p, VllmFusionPass) for p in self.passes):
            self.add(VllmFusionPass())
        return result

    return configure


def _wrap_init_backend(original):
    @functools.wraps(original)
    def init_backend(self, *args, **kwargs):
        backend = original(self, *args, **kwargs)
        if backend == "inductor":  # a string: the options dict is what Inductor gets
            install_into(self.inductor_compile_config)
        return backend

    return init_backend


def install(table: dict[str, hooks.Hook]) -> bool:
    """Wrap the pass manager's ``configure`` and ``CompilationConfig.init_backend`` named in
    ``table`` (this release's pass hooks), once."""
    configure = hooks.wrap(table["PostGradPassManager.configure"], _wrap_configure)
    backend = hooks.wrap(table["CompilationConfig.init_backend"], _wrap_init_backend)
    return configure or backend
