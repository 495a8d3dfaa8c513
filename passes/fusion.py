"""``FusionPass``: the Inductor post-grad pass, its options, and how to install it.

The pass is a :class:`torch._inductor.custom_graph_pass.CustomGraphPass`. Its ``uuid()``
hashes the pass's source files and its options, so Inductor's FX graph cache never serves a
graph compiled by another version of the pass or with other options (on a cache hit the
pass does not run at all).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

from .. import format as format_module
from . import pattern, rewrite
from .report import SiteReport

log = logging.getLogger("mxfp8_fusion.passes")

_PASS_DIR = os.path.dirname(os.path.abspath(__file__))
_SOURCES = (
    *(os.path.join(_PASS_DIR, name) for name in ("fusion.py", "pattern.py", "rewrite.py")),
    os.path.abspath(format_module.__file__),
)


@dataclass(frozen=True)
class FusionOptions:
    """What the pass rewrites.

    Attributes:
        enabled: rewrite qualifying sites; ``False`` only reports them (the graph is kept).
        max_slices: leave cats of more slices than this unchanged (``None``: no limit).
    """

    enabled: bool = True
    max_slices: int | None = None


class FusionPass(CustomGraphPass):
    """Rewrite ``cat(slices, -1) -> MXFP8 quantize -> MXFP8 GEMM`` into staged quantization.

    Put an instance in ``torch._inductor.config.post_grad_custom_post_pass`` (or use
    :func:`install`); the ``mxfp8_fusion`` backend does this for you. Counters: ``matches``
    (sites rewritten), ``skipped`` (candidate sites left unchanged) and ``graphs``, summed over
    every graph the instance has run on; ``reports`` lists each candidate site seen, with its
    outcome. Each decision is logged at DEBUG on the ``mxfp8_fusion`` logger.
    """

    def __init__(self, options: FusionOptions | None = None, **kwargs: Any):
        if options is not None and kwargs:
            raise TypeError("FusionPass: pass either options or keyword options, not both")
        self.options = options if options is not None else FusionOptions(**kwargs)
        self.matches = 0
        self.skipped = 0
        self.reports: list[SiteReport] = []
        self.graphs = 0
        """Graphs the pass has run on."""

    def __call__(self, graph: fx.Graph) -> None:
        self.graphs += 1
        # Sites are analyzed one at a time, after the previous rewrite: a later cat may read
        # the output of an earlier site's GEMM, which the rewrite replaced.
        cats = [n for n in graph.nodes if pattern.is_cat(n)]
        for cat in cats:
            site = pattern.analyze(cat, self.options.max_slices)
            if site is None:
                continue
            reason = site.reason
            if reason is None and not self.options.enabled:
                reason = "the pass is disabled (FusionOptions.enabled=False)"
            report = SiteReport.from_site(site, self.graphs, reason)
            if reason is None:
                try:
                    rewrite.rewrite(graph, site)
                except Exception as error:  # never fail a user's compile over an optimization
                    reason = f"internal error while rewriting ({type(error).__name__}: {error})"
                    log.warning("mxfp8_fusion pass: %s left unchanged: %s", cat.name, reason)
                    report = SiteReport.from_site(site, self.graphs, reason)
            if reason is None:
                self.matches += 1
                torch._dynamo.utils.counters["mxfp8_fusion"]["sites_rewritten"] += 1
            else:
                self.skipped += 1
                torch._dynamo.utils.counters["mxfp8_fusion"]["sites_skipped"] += 1
            self.reports.append(report)
            log.debug("mxfp8_fusion pass: %s", report)
        if self.matches:
            graph.lint()

    def uuid(self) -> bytes:
        options = repr(sorted(dataclasses.asdict(self.options).items()))
        return get_hash_for_files(_SOURCES, options)

    def __repr__(self) -> str:
        return f"FusionPass({self.options})"


GraphPass = Callable[[fx.Graph], None]


class ComposedPass(CustomGraphPass):
    """Run several post-grad passes in order; the uuid covers all of them.

    A plain callable (not a ``CustomGraphPass``) has no uuid: the composed uuid is then
    ``None`` and Inductor bypasses its FX graph cache, as it does for the callable alone.
    """

    def __init__(self, passes: Iterable[GraphPass]):
        self.passes: tuple[GraphPass, ...] = tuple(passes)

    def __call__(self, graph: fx.Graph) -> None:
        for p in self.passes:
            p(graph)

    def uuid(self) -> bytes | None:
        digest = hashlib.sha256(b"mxfp8_fusion.ComposedPass")
        for p in self.passes:
            uid = p.uuid() if isinstance(p, CustomGraphPass) else None
            if uid is None:
                return None
            digest.update(repr(uid).encode())
        return digest.digest()

    def __repr__(self) -> str:
        return f"ComposedPass({list(self.passes)!r})"


def _flatten(existing) -> list[GraphPass]:
    if existing is None:
        return []
    if isinstance(existing, (list, tuple)):
        return [p for item in existing for p in _flatten(item)]
    if isinstance(existing, ComposedPass):
        return list(existing.passes)
    return [existing]


def compose(existing, fusion: FusionPass) -> GraphPass:
    """``fusion`` alone, or a :class:`ComposedPass` running ``existing`` then ``fusion``.

    ``existing`` is whatever ``post_grad_custom_post_pass`` held: ``None``, one pass or a
    list. A ``FusionPass`` already there is replaced, so installing twice runs it once.
    """
    kept = [p for p in _flatten(existing) if not isinstance(p, FusionPass)]
    return ComposedPass([*kept, fusion]) if kept else fusion


def install(
    config: dict[str, Any] | None = None, fusion: FusionPass | None = None, **options: Any
) -> FusionPass:
    """Add the fusion pass to an Inductor configuration, keeping any post pass already set.

    Args:
        config: a dict of Inductor config patches (as given to ``compile_fx(...,
            config_patches=...)`` or ``torch.compile(options=...)``), updated in place; or
            ``None`` to set ``torch._inductor.config.post_grad_custom_post_pass`` globally.
        fusion: the pass to install; a new :class:`FusionPass` when omitted.
        **options: :class:`FusionOptions` fields for the new pass.

    Returns:
        The installed :class:`FusionPass` (read its ``matches`` and ``reports``).

    Raises:
        TypeError: when both ``fusion`` and ``options`` are given.
    """
    if fusion is not None and options:
        raise TypeError("install: pass either fusion or keyword options, not both")
    fusion = fusion if fusion is not None else FusionPass(**options)
    key = "post_grad_custom_post_pass"
    if config is None:
        from torch._inductor import config as inductor_config

        inductor_config.post_grad_custom_post_pass = compose(
            inductor_config.post_grad_custom_post_pass, fusion
        )
    else:
        if key in config:
            existing = config[key]
        else:
            from torch._inductor import config as inductor_config

            existing = inductor_config.post_grad_custom_post_pass
        config[key] = compose(existing, fusion)
    return fusion
