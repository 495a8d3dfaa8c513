"""What the pass decided about each candidate site, in words a user can act on."""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SiteReport:
    """One candidate site: a ``cat`` that reaches an MXFP8 quantize or linear (W8A8 or W8A16).

    Attributes:
        graph: which compiled graph (1-based, in the order the pass saw them).
        cat: the FX node name of the concatenation.
        widths: the slices' widths (``None`` where symbolic).
        dtype: the concatenation's dtype, as a string.
        consumers: how many MXFP8 GEMMs read the concatenation (``None`` when the site could
            not be analyzed).
        w8a16: how many of ``consumers`` are W8A16 (16-bit activations, MXFP8 weight): once
            rewritten, they read the slices as they are, with no storage; the others (W8A8)
            read MXFP8 storage the slices are quantized into (``None`` when not analyzed).
        rewritten: whether the site was rewritten.
        reason: why not, when it was not.
        source: the user code that made the cat, when known.
        internal: the site was left unchanged by an unexpected error in the pass (logged as a
            warning when it happened, and a :class:`FusionSkippedWarning` as any site left
            unchanged).
    """

    graph: int
    cat: str
    widths: tuple[int | None, ...]
    dtype: str
    consumers: int | None
    rewritten: bool
    reason: str | None = None
    source: str | None = None
    internal: bool = False
    w8a16: int | None = 0

    @classmethod
    def from_site(cls, site, graph: int, reason: str | None) -> SiteReport:
        source = _user_line(site.cat.meta.get("stack_trace") or "")
        return cls(
            graph=graph,
            cat=site.cat.name,
            widths=tuple(site.widths),
            dtype=str(site.dtype).removeprefix("torch."),
            consumers=site.gemms,
            rewritten=reason is None,
            reason=reason,
            source=source,
            w8a16=site.w8a16_gemms,
        )

    def at(self, trace: str | None) -> SiteReport:
        """This report, its ``source`` read from ``trace`` (an FX ``stack_trace``) when that
        names a user line: a report replayed for another program with the same graph points
        at that program's line."""
        source = _user_line(trace or "")
        return dataclasses.replace(self, source=source) if source else self

    @property
    def how(self) -> str:
        """How the site's GEMMs read the slices once rewritten (whether or not it was)."""
        if not self.w8a16:
            return "staged quantization"
        if self.w8a16 == self.consumers:
            return "W8A16: the GEMM(s) read the slices, no storage"
        return (
            "staged quantization for the W8A8 GEMM(s); the W8A16 GEMM(s) read the slices, "
            "no storage"
        )

    def __str__(self) -> str:
        widths = ", ".join("?" if w is None else str(w) for w in self.widths)
        shape = (
            f"cat of {len(self.widths)} {self.dtype} slices [{widths}]"
            if self.widths
            else "cat (not analyzed)"
        )
        what = f"graph {self.graph}, {self.cat}: {shape} -> {self._gemms()}: "
        what += f"rewritten ({self.how})" if self.rewritten else f"not rewritten: {self.reason}"
        if self.source:
            what += f"\n    at: {self.source}"
        return what

    def _gemms(self) -> str:
        if self.consumers is None:
            return "? MXFP8 GEMM(s)"
        if not self.w8a16:
            return f"{self.consumers} MXFP8 GEMM(s)"
        if self.w8a16 == self.consumers:
            return f"{self.consumers} W8A16 MXFP8 GEMM(s)"
        w8a8 = self.consumers - self.w8a16
        return f"{self.consumers} MXFP8 GEMM(s) ({w8a8} W8A8, {self.w8a16} W8A16)"


@dataclass
class FusionReport:
    """Every candidate site of one compiled model; ``str()`` gives a readable summary.

    Attributes:
        sites: one report per candidate site, in the order the pass saw them.
        graphs: how many graphs the pass ran on.
        contents: per graph, its ``torch.cat`` nodes and its MXFP8 quantize/linear nodes;
            they say why, when no site was found.
        model: why the explained module holds no MXFP8 layer, when it holds none.
        traced_cats: the ``torch.cat`` calls Dynamo traced, before Inductor's decompositions
            (which rewrite some, so that the pass never sees them).
        traced_mxfp8_ops: the ``mxfp8::`` ops Dynamo traced (the eager API's too).
    """

    sites: list[SiteReport] = field(default_factory=list)
    graphs: int = 0
    contents: list[tuple[int, int]] = field(default_factory=list)
    model: str | None = None
    traced_cats: int = 0
    traced_mxfp8_ops: int = 0

    @property
    def rewritten(self) -> list[SiteReport]:
        return [s for s in self.sites if s.rewritten]

    @property
    def skipped(self) -> list[SiteReport]:
        return [s for s in self.sites if not s.rewritten]

    def __str__(self) -> str:
        head = (
            f"mxfp8_fusion: {len(self.sites)} candidate site(s) in {self.graphs} graph(s), "
            f"{len(self.rewritten)} rewritten, {len(self.skipped)} not rewritten"
        )
        if not self.sites:
            head += (
                "\n  no torch.cat reaches an MXFP8 quantize or linear; the compiled program is "
                "unchanged. Likely why:"
            )
            return "\n".join([head, *(f"  - {hint}" for hint in self.hints())])
        return "\n".join([head, *(f"  - {s}" for s in self.sites)])

    def hints(self) -> list[str]:
        """Why no candidate site was found, read from what the compiled graphs hold."""
        if not self.graphs:
            return [
                "no graph was compiled: Dynamo found no tensor operations to compile, or "
                "skipped the function"
            ]
        if not any(mxfp8 for _, mxfp8 in self.contents) and self.traced_mxfp8_ops:
            return [
                "the compiled graph(s) call the eager API's MXFP8 ops (such as "
                "mxfp8_fusion.mm_slices_into or mm_quantized_into), which already read the "
                "slices or staged storage: there is no cat -> MXFP8 linear left to rewrite"
            ]
        hints = []
        if self.model is not None:
            hints.append(self.model)
        elif not any(mxfp8 for _, mxfp8 in self.contents):
            hints.append(
                "no MXFP8 linear in the compiled graph(s): convert the model first with "
                "mxfp8_fusion.convert(model) (an nn.Linear is a BF16 GEMM, which the pass "
                "leaves alone)"
            )
        if not any(cats for cats, _ in self.contents):
            hints.append(self._no_cat())
        if hints:
            return hints
        if not any(cats and mxfp8 for cats, mxfp8 in self.contents):
            return [
                f"the torch.cat and the MXFP8 linear are in different graphs ({self.graphs} "
                "compiled): a graph break between them; find it with "
                "torch._dynamo.explain(model)(*inputs), or compile with fullgraph=True"
            ]
        return [
            "a torch.cat and an MXFP8 linear are in one graph, but the cat does not feed the "
            "linear directly: an op other than a reshape between them (a dtype cast, "
            "arithmetic, a transpose) hides the site"
        ]

    def _no_cat(self) -> str:
        if self.traced_cats:  # Dynamo traced one: Inductor's decompositions took it apart
            return (
                f"the {self.traced_cats} torch.cat(s) traced are gone from the graph(s) the "
                "pass sees: Inductor rewrote them first (a cat of one tensor repeated, "
                "torch.cat([x, x, x], -1), becomes expand + clone, with no concatenation left "
                "to stage); the pass rewrites a cat of distinct slices"
            )
        return (
            "no torch.cat in the compiled graph(s): the pass rewrites torch.cat(slices, "
            "dim=-1) feeding an MXFP8 linear"
        )


def _user_line(trace: str) -> str | None:
    """``file:line: code`` of the innermost frame of an FX ``stack_trace``."""
    lines = trace.rstrip().splitlines()
    for i in range(len(lines) - 1, -1, -1):
        head = lines[i].strip()
        if head.startswith("File "):
            parts = head.split('"')
            where = parts[1] if len(parts) > 2 else head
            line = head.split("line ")[-1].split(",")[0] if "line " in head else "?"
            code = lines[i + 1].strip() if i + 1 < len(lines) else ""
            return f"{where}:{line}: {code}"
    return None


class FusionSkippedWarning(UserWarning):
    """A candidate site was left unchanged: its BF16 (FP16) concatenation is still
    materialized.

    Issued once per site and reason in a process, at the user's line that made the cat.
    Silence it with ``warnings.filterwarnings("ignore", category=FusionSkippedWarning)``, or
    per compile with the pass option ``"mxfp8_fusion.warn_skipped": False``.
    """


_warned: set[tuple[str | None, str | None]] = set()


def warn_skipped(report: SiteReport) -> None:
    """Issue :class:`FusionSkippedWarning` for ``report``, once per source line and reason."""
    key = (report.source, report.reason)
    if key in _warned:
        return
    _warned.add(key)
    cat = f"a torch.cat feeding {report.consumers or 'an'} MXFP8 GEMM(s)"
    sixteen = {"bfloat16": "BF16", "float16": "FP16"}.get(report.dtype)
    if sixteen is not None:
        message = (
            f"mxfp8_fusion: {cat} was not rewritten, so its {sixteen} concatenation is still "
            f"materialized: {report.reason}"
        )
    else:  # a cat of another dtype (FP32) is no fusion lost; one not analyzed says why
        message = f"mxfp8_fusion: {cat} was left as written: {report.reason}"
    filename, lineno = "<unknown>", 0
    if report.source:  # shown at the user's line, which the warning prints beneath it
        where = report.source.partition(": ")[0]
        filename, _, line = where.rpartition(":")
        lineno = int(line) if line.isdigit() else 0
    warnings.warn_explicit(message, FusionSkippedWarning, filename or "<unknown>", lineno)
