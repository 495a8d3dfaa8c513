"""``FusionPass``: the Inductor post-grad pass, its options, and how to install it.

The pass is a :class:`torch._inductor.custom_graph_pass.CustomGraphPass`. Its ``uuid()``
hashes the pass's source files and its options, so Inductor's FX graph cache never serves a
graph compiled by another version of the pass or with other options (on a cache hit the
pass does not run at all).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import glob
import hashlib
import logging
import numbers
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

from .. import format as format_module
from . import pattern, rewrite, widths
from .report import SiteReport, warn_skipped

log = logging.getLogger("mxfp8_fusion.passes")

_PASS_DIR = os.path.dirname(os.path.abspath(__file__))
_PACKAGE_DIR = os.path.dirname(os.path.abspath(format_module.__file__))
# The pass's whole package (a new pattern file cannot escape it), and the files that define
# the ops it emits (their schemas and autograd): a change to any of them must not be served
# a graph compiled before it.
_SOURCES = (
    *sorted(glob.glob(os.path.join(_PASS_DIR, "**", "*.py"), recursive=True)),
    *(
        os.path.join(_PACKAGE_DIR, name)
        for name in ("format.py", "ops.py", "grad.py", "lowering.py")
    ),
)


PREFIX = "mxfp8_fusion."
"""How pass options are spelled among Inductor's in ``torch.compile(options=...)``."""


def _check_bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        # a string such as "false" would be truthy: only a real bool says what is meant
        raise TypeError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")
    return value


def _check_max_slices(value: Any, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(
            f"{name} must be None or an int >= 1, got {value!r} ({type(value).__name__})"
        )
    if value < 1:
        raise ValueError(
            f"{name} must be None or an int >= 1, got {value} (to leave every site unchanged, "
            "set enabled to False)"
        )
    return int(value)  # a plain int: numpy's repr would change the uuid


_CHECKS: dict[str, Callable[[Any, str], Any]] = {
    "enabled": _check_bool,
    "max_slices": _check_max_slices,
    "warn_skipped": _check_bool,
}

# Options that change what the pass reports, never the graph it produces: left out of the
# uuid, so that changing them does not miss Inductor's cache.
_REPORT_ONLY = ("warn_skipped",)


@dataclass(frozen=True)
class FusionOptions:
    """What the pass rewrites; checked when built.

    Attributes:
        enabled: rewrite qualifying sites; ``False`` only reports them (the graph is kept).
        max_slices: leave cats of more slices than this unchanged (``None``: no limit).
        warn_skipped: issue a :class:`FusionSkippedWarning` for each candidate site left
            unchanged (once per site and reason in a process; not when ``enabled`` is False),
            and the backend's notice that a compiled graph holds no MXFP8 layer at all.

    Raises:
        TypeError: ``enabled`` or ``warn_skipped`` is not a bool, or ``max_slices`` is not
            ``None`` or an int.
        ValueError: ``max_slices`` is below 1.
    """

    enabled: bool = True
    max_slices: int | None = None
    warn_skipped: bool = True

    def __post_init__(self) -> None:
        for name, check in _CHECKS.items():
            object.__setattr__(self, name, check(getattr(self, name), name))

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any], argument: str = "options") -> FusionOptions:
        """Options from a dict whose keys are field names, with or without ``"mxfp8_fusion."``.

        Errors name each option as its key spells it (``mxfp8_fusion.max_slices``).

        Raises:
            TypeError: ``options`` is not a mapping; a key is not a field, or names one twice;
                a value of the wrong type.
            ValueError: a value out of range.
        """
        if not isinstance(options, Mapping):
            raise TypeError(f"{argument} must be a dict, got {type(options).__name__}")
        values: dict[str, Any] = {}
        spelled: dict[str, str] = {}
        for key, value in options.items():
            name = key.removeprefix(PREFIX) if isinstance(key, str) else None
            if name not in _CHECKS:
                known = [PREFIX + field for field in _CHECKS]
                close = difflib.get_close_matches(str(key), known, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise TypeError(
                    f"{argument}: unknown pass option {key!r}{hint}; the pass options are "
                    + ", ".join(known)
                )
            if name in values:
                raise TypeError(f"{argument}: {spelled[name]!r} and {key!r} set the same option")
            values[name] = _CHECKS[name](value, key)
            spelled[name] = key
        return cls(**values)


def as_options(options: Any, argument: str = "options") -> FusionOptions:
    """``options`` as :class:`FusionOptions`: ``None`` (the defaults), a ``FusionOptions``, or
    a dict for :meth:`FusionOptions.from_mapping`.

    Raises:
        TypeError: any other type, naming ``argument``; or what ``from_mapping`` raises.
    """
    if options is None:
        return FusionOptions()
    if isinstance(options, FusionOptions):
        return options
    if isinstance(options, Mapping):
        return FusionOptions.from_mapping(options, argument)
    raise TypeError(
        f"{argument} must be a FusionOptions, a dict of pass options or None, "
        f"got {type(options).__name__}"
    )


class FusionPass(CustomGraphPass):
    """Rewrite ``cat(slices, -1) -> MXFP8 quantize -> MXFP8 GEMM`` into staged quantization,
    and ``cat(slices, -1) -> W8A16 MXFP8 linear`` into a GEMM that reads the slices.

    Put an instance in ``torch._inductor.config.post_grad_custom_post_pass`` (or use
    :func:`install`); the ``mxfp8_fusion`` backend does this for you. Counters: ``matches``
    (sites rewritten), ``skipped`` (candidate sites left unchanged) and ``graphs``, summed over
    every graph the instance has run on; ``reports`` lists each candidate site seen, with its
    outcome and how its GEMMs read the slices (``SiteReport.how``). Dynamo's
    ``counters["mxfp8_fusion"]`` sums ``sites_rewritten``, ``sites_skipped`` and, for
    rewritten sites, ``w8a16_gemms_from_slices`` over the process. Each decision is logged
    at DEBUG on the ``mxfp8_fusion`` logger, and each site left unchanged is a
    :class:`FusionSkippedWarning` (see ``FusionOptions.warn_skipped``).
    ``cached_graphs`` counts graphs whose reports were replayed from a cache hit
    (:meth:`replay`), which are in the other counters too.

    The pass never fails a compile: an unexpected error while analyzing or rewriting a site
    leaves that site exactly as it was, is logged as a warning and is reported as the reason,
    with a :class:`FusionSkippedWarning` like any other site left unchanged.

    Args:
        options: :class:`FusionOptions`, or a dict of them (see :func:`as_options`).
        **kwargs: :class:`FusionOptions` fields, instead of ``options``.

    Raises:
        TypeError, ValueError: on bad options (see :class:`FusionOptions`).
    """

    def __init__(self, options: FusionOptions | Mapping[str, Any] | None = None, **kwargs: Any):
        if options is not None and kwargs:
            raise TypeError("FusionPass: pass either options or keyword options, not both")
        self.options = as_options(options) if options is not None else FusionOptions(**kwargs)
        self.matches = 0
        self.skipped = 0
        self.reports: list[SiteReport] = []
        self.graphs = 0
        """Graphs the pass has run on."""
        self.contents: list[tuple[int, int]] = []
        """Per graph: its ``aten.cat`` nodes and its MXFP8 quantize/linear nodes, W8A16 ones
        too (for the hints of a report without candidate sites)."""
        self.cached_graphs = 0
        self.traced_cats = 0
        """``torch.cat`` calls in the graphs Dynamo traced for the backend (before Inductor's
        decompositions, which may rewrite a cat into other ops)."""
        self.traced_mxfp8_ops = 0
        """``mxfp8::`` ops in the graphs Dynamo traced for the backend (the eager API's,
        such as ``mm_slices_into``, too)."""

    def __call__(self, graph: fx.Graph) -> None:
        self.graphs += 1
        # Sites are analyzed one at a time, after the previous rewrite: a later cat may read
        # the output of an earlier site's GEMM, which the rewrite replaced.
        cats = [n for n in graph.nodes if pattern.is_cat(n)]
        self.contents.append((len(cats), _mxfp8_nodes(graph)))
        rewritten = False
        for cat in cats:
            report = self._site(graph, cat)
            if report is not None:
                self._record(report)
                rewritten |= report.rewritten
        if rewritten:
            graph.lint()

    def replay(self, reports: list[SiteReport], contents: list[tuple[int, int]]) -> None:
        """Count and warn about the reports of graphs Inductor served from its cache (the
        pass did not run on them) as if it had run."""
        first = self.graphs  # the stored reports number their graphs from 1
        self.graphs += len(contents)
        self.cached_graphs += len(contents)
        torch._dynamo.utils.counters["mxfp8_fusion"]["graphs_from_cache"] += len(contents)
        self.contents.extend(contents)
        for report in reports:
            self._record(dataclasses.replace(report, graph=first + report.graph))

    def _record(self, report: SiteReport) -> None:
        counters = torch._dynamo.utils.counters["mxfp8_fusion"]
        if report.rewritten:
            self.matches += 1
            counters["sites_rewritten"] += 1
            if report.w8a16:
                counters["w8a16_gemms_from_slices"] += report.w8a16
        else:
            self.skipped += 1
            counters["sites_skipped"] += 1
            if self.options.warn_skipped and self.options.enabled:
                warn_skipped(report)
        self.reports.append(report)
        log.debug("mxfp8_fusion pass: %s", report)

    def _site(self, graph: fx.Graph, cat: fx.Node) -> SiteReport | None:
        """Decide about ``cat`` and rewrite it when it qualifies; ``None``: not a candidate.

        Analysis only reads the graph, and a rewrite either completes or removes what it
        added (see :func:`rewrite.rewrite`), so on any error the site is as it was.
        """
        stage, site = "analyzing", None
        try:
            site = pattern.analyze(cat, self.options.max_slices)
            if site is None:
                return None
            reason = site.reason
            if reason is None and not self.options.enabled:
                reason = "the pass is disabled (FusionOptions.enabled=False)"
            report = SiteReport.from_site(site, self.graphs, reason)
            if reason is None:
                stage = "rewriting"
                widths.specialize(site)
                rewrite.rewrite(graph, site)
            return report
        except Exception as error:  # never fail a user's compile over an optimization
            reason = f"internal error while {stage} ({type(error).__name__}: {error})"
            log.warning("mxfp8_fusion pass: %s left unchanged: %s", cat.name, reason)
            torch._dynamo.utils.counters["mxfp8_fusion"]["internal_errors"] += 1
            return self._failure_report(cat, site, reason)

    def _failure_report(self, cat: fx.Node, site: pattern.Site | None, reason: str) -> SiteReport:
        if site is not None:
            with contextlib.suppress(Exception):
                report = SiteReport.from_site(site, self.graphs, reason)
                return dataclasses.replace(report, internal=True)
        return SiteReport(
            graph=self.graphs,
            cat=cat.name,
            widths=(),
            dtype="unknown",
            consumers=None,
            rewritten=False,
            reason=reason,
            internal=True,
            w8a16=None,
        ).at(cat.meta.get("stack_trace"))

    def uuid(self) -> bytes:
        fields = dataclasses.asdict(self.options)
        options = repr(sorted((k, v) for k, v in fields.items() if k not in _REPORT_ONLY))
        return get_hash_for_files(_SOURCES, options)

    def __repr__(self) -> str:
        return f"FusionPass({self.options})"


def _mxfp8_nodes(graph: fx.Graph) -> int:
    """The nodes of :data:`pattern.SINKS` in ``graph``: MXFP8 quantize and one-shot linear
    nodes, W8A8 or W8A16 (what a cat site would feed)."""
    try:
        targets = pattern.sink_targets()
        return sum(1 for n in graph.nodes if n.op == "call_function" and n.target in targets)
    except Exception:  # only a hint for the report: never worth failing the pass over
        return 0


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
