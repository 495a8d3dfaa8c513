"""Find ``cat -> MXFP8 quantize -> MXFP8 GEMM`` and ``cat -> W8A16 MXFP8 linear`` sites in a
post-grad FX graph and decide, with a reason a user can read, whether each one can be
rewritten.

A *site* is an ``aten.cat`` whose result reaches one of :data:`SINKS`: an
``mxfp8.quantize``, an ``mxfp8.linear`` or an ``mxfp8.linear_w8a16`` (directly or through
views that flatten leading dims). A site qualifies when the rewritten program computes
exactly what the original did and the BF16 concatenation is not needed by anything else:

- the cat is along the last dim, of 2 or more dims;
- every slice has the cat's dtype (BF16 or FP16), its rank and device, and a width known
  when compiling (static, or symbolic and free to be specialized: ``widths``) that is a
  positive multiple of 128 (so each slice owns whole scale chunks);
- every use of the cat (through views to ``[rows, K]``) is a sink, and the quantized
  values and scales are read only by MXFP8 GEMMs.

A cat may also reach them through slices of its last dim, ``cat[..., start:end]`` (a
row-parallel projection's input range, for one): each such range must start and end at
multiples of 128, and only the slices or slice parts inside it are read
(:func:`analyze`: the whole cat is the range ``[0, K)``).

W8A8 sinks read the columns quantized: the rewrite stages them into MXFP8 storage. A W8A16
sink (``Sink.staged`` False) reads them as they are: the rewrite hands it the slices, with
no storage. One site may feed both kinds; the same rules decide it.
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass, field

import torch
from torch import fx

from ..format import SOURCE_DTYPES, STAGE_ALIGN, Activation
from .widths import hint, required_dynamic

aten = torch.ops.aten

VIEW_OPS = (aten.view.default, aten.reshape.default, aten._unsafe_view.default)


@dataclass(frozen=True)
class Sink:
    """An MXFP8 op that reads a concatenation (its first argument, and only there): what a
    site feeds. A new op that the pass should rewrite plugs in here, in :data:`SINKS`, and
    ``rewrite.py`` says what it becomes."""

    op: str
    """Its name in ``torch.ops.mxfp8``."""
    role: str
    """The list of :class:`Site` and :class:`ColumnRange` it is collected in."""
    is_gemm: bool
    """True for a one-shot GEMM; False for a quantize, whose values and scales must be read
    only by :data:`GEMM`."""
    activation: Activation = Activation.W8A8
    """What the op does with the columns (the quantize: W8A8)."""

    @property
    def staged(self) -> bool:
        """True (W8A8): it reads the columns quantized to MXFP8, so the rewrite stages them
        into storage (a GEMM becomes ``mxfp8.mm`` on it). False (W8A16): a GEMM that reads
        the 16-bit columns as they are, rewritten to ``mxfp8.mm_slices`` on the slices: no
        storage."""
        return self.activation.quantized


SINKS = (
    Sink("quantize", "quantizes", False),
    Sink(Activation.W8A8.linear_op, "linears", True),
    Sink(Activation.W8A16.linear_op, "w8a16", True, Activation.W8A16),
)
GEMM = "mm"
"""The op that reads quantized values (argument 0) and scales (argument 1)."""


@functools.cache
def _targets() -> tuple[dict, object]:
    """``{OpOverload: Sink}`` and the GEMM's overload, looked up when first needed
    (``mxfp8_fusion.ops`` registers the ops)."""
    from .. import ops  # noqa: F401

    mx = torch.ops.mxfp8
    return {getattr(mx, sink.op).default: sink for sink in SINKS}, getattr(mx, GEMM).default


def sink_targets() -> tuple:
    """The overloads of :data:`SINKS`."""
    return tuple(_targets()[0])


def _sink(user: fx.Node, node: fx.Node) -> Sink | None:
    """The :class:`Sink` ``user`` is, where it reads ``node`` as its first argument only."""
    if user.op != "call_function" or not user.args or user.args[0] is not node:
        return None
    sink = _targets()[0].get(user.target)
    return sink if sink is not None and node not in user.args[1:] else None


@dataclass
class Site:
    """One ``cat`` that reaches a sink, and what was decided about it."""

    cat: fx.Node
    slices: list[fx.Node]
    widths: list[int | None]
    dtype: torch.dtype | None
    quantizes: list[fx.Node] = field(default_factory=list)
    linears: list[fx.Node] = field(default_factory=list)
    w8a16: list[fx.Node] = field(default_factory=list)
    views: list[fx.Node] = field(default_factory=list)
    gemms: int = 0
    """MXFP8 GEMMs that read the concatenation, counted whether or not the site qualifies."""
    w8a16_gemms: int = 0
    """How many of ``gemms`` are W8A16 (read the 16-bit columns, not quantized ones)."""
    reason: str | None = None
    """``None`` when the site qualifies, else why it was left unchanged."""
    ranges: list[ColumnRange] = field(default_factory=list)
    """What each column range of the concatenation stages and feeds, in column order; MXFP8
    ops that read the whole concatenation are the range ``[0, K)``."""


def _val(node) -> torch.Tensor | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def describe(node: fx.Node) -> str:
    """What ``node`` is, for a user: its op, never its FX name (which changes from one
    compile of the same code to the next, so one site would warn once per name)."""
    if node.op == "output":
        return "the graph output (it is returned)"
    if node.op == "placeholder":
        return "a graph input"
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target._opname}"
    return getattr(target, "__name__", str(target))


def _is_call(node: fx.Node, target) -> bool:
    return node.op == "call_function" and node.target == target


# Ops the eager API puts between a quantize result and the GEMM (``values[:tokens]``,
# ``scales.view(torch.uint8)``): they only re-view the same bytes, so they are kept as they
# are and read the staged storage instead.
_PASS_THROUGH = (aten.view.dtype, aten.slice.Tensor, aten.alias.default)


def _gemm_readers(item: fx.Node, index: int) -> str | None:
    """Every path from a quantize output must end at an ``mxfp8.mm`` argument ``index``."""
    mm = _targets()[1]
    which = "values" if index == 0 else "scales"
    stack = [item]
    while stack:
        node = stack.pop()
        for reader in node.users:
            if reader.op == "call_function" and reader.target in _PASS_THROUGH:
                if reader.args[0] is not node:
                    return f"the quantized {which} are also used by {describe(reader)}"
                stack.append(reader)
                continue
            if not (_is_call(reader, mm) and reader.args[index] is node):
                return f"the quantized {which} are also used by {describe(reader)}"
            others = [a for i, a in enumerate(reader.args) if i != index]
            if node in others or node in reader.kwargs.values():
                return f"the quantized {which} are used twice by {describe(reader)}"
    return None


def _quantized_readers(site: Site) -> str | None:
    """The values and scales of each quantize must be read only by ``mxfp8.mm``."""
    for q in site.quantizes:
        for item in q.users:
            if not (_is_call(item, operator.getitem) and item.args[1] in (0, 1)):
                return f"the quantize result is used whole by {describe(item)}"
            reason = _gemm_readers(item, item.args[1])
            if reason is not None:
                return reason
    return None


def _through(node: fx.Node, ops) -> list[fx.Node]:
    """``node`` and every node reached from it through ``ops`` applied to it."""
    out, stack = [], [node]
    while stack:
        node = stack.pop()
        out.append(node)
        stack += [u for u in node.users if u.op == "call_function" and u.target in ops]
    return out


def _count_gemms(cat: fx.Node) -> tuple[int, int]:
    """The GEMMs that read the cat, and how many of them are W8A16: one-shot GEMM sinks, and
    ``mxfp8.mm`` reads of values quantized from it, reached through views and column slices.

    Counted apart from the decision (which stops at the first reason to skip), so that a site
    left unchanged reports the GEMMs it feeds too.
    """
    mm = _targets()[1]
    gemms: set[fx.Node] = set()
    w8a16: set[fx.Node] = set()
    for node in _through(cat, (*VIEW_OPS, aten.slice.Tensor)):
        for user in node.users:
            sink = _sink(user, node)
            if sink is None:
                continue
            if sink.is_gemm:
                (gemms if sink.staged else w8a16).add(user)
                continue
            for item in user.users:
                if _is_call(item, operator.getitem) and item.args[1] == 0:
                    for values in _through(item, _PASS_THROUGH):
                        gemms.update(
                            r for r in values.users if _is_call(r, mm) and r.args[0] is values
                        )
    return len(gemms) + len(w8a16), len(w8a16)


def _slice_reason(site: Site, val: torch.Tensor, dim: int) -> str | None:
    vals = [_val(s) for s in site.slices]
    if any(v is None for v in vals):
        return "a slice has no tensor metadata"
    if val.dim() < 2:
        return f"the concatenation is {val.dim()}-D; it must be at least 2-D"
    if dim != val.dim() - 1:
        return f"cat is along dim {dim}, not the last dim ({val.dim() - 1})"
    dtypes = sorted({str(v.dtype).removeprefix("torch.") for v in vals})
    if len(dtypes) > 1:
        return f"the slices have mixed dtypes ({', '.join(dtypes)})"
    if val.dtype not in SOURCE_DTYPES or vals[0].dtype != val.dtype:
        dtype = str(vals[0].dtype).removeprefix("torch.")
        return f"a {dtype} cat is not a candidate: the pass stages bfloat16 and float16 slices only"
    for i, v in enumerate(vals):
        if v.dim() != val.dim():
            return f"slice {i} is {v.dim()}-D but the concatenation is {val.dim()}-D"
        if v.device != val.device:
            return f"slice {i} is on {v.device}, the concatenation on {val.device}"
        width = site.widths[i]
        if width is None:
            return (
                f"slice {i} has a data-dependent width ({v.shape[-1]}); widths must be known "
                "when compiling"
            )
        if required_dynamic(v.shape[-1]):
            return (
                f"slice {i}'s width is marked dynamic (mark_dynamic or a dynamic Dim); the "
                "rewrite places each slice's columns by widths known when compiling"
            )
        if width <= 0 or width % STAGE_ALIGN:
            return f"slice {i} has width {width}, not a positive multiple of {STAGE_ALIGN}"
    return None


def _cat_parts(cat: fx.Node) -> tuple[list, object, list[int | None]]:
    """``(slices, dim, widths)`` of a ``torch.cat`` node: its inputs, its dim argument, and
    each input's static last-dim width (None where unknown)."""
    tensors = cat.args[0] if cat.args else cat.kwargs.get("tensors", [])
    dim = cat.args[1] if len(cat.args) > 1 else cat.kwargs.get("dim", 0)
    slices = list(tensors)
    vals = [_val(s) for s in slices]
    widths = [hint(v.shape[-1]) if v is not None and v.dim() else None for v in vals]
    return slices, dim, widths


def _too_many(slices: list, max_slices: int | None) -> str | None:
    if max_slices is not None and len(slices) > max_slices:
        return f"{len(slices)} slices exceed the pass option max_slices={max_slices}"
    return None


def _reaches(cat: fx.Node) -> bool:
    """Whether ``cat`` reaches a sink through views and last-dim slices."""
    targets = sink_targets()
    stack, seen = [cat], set()
    while stack:
        node = stack.pop()
        for user in node.users:
            if user in seen or user.op != "call_function":
                continue
            seen.add(user)
            if user.target in targets:
                return True
            if user.target in VIEW_OPS or _is_last_dim_slice(user, node):
                stack.append(user)
    return False


def is_cat(node: fx.Node) -> bool:
    return _is_call(node, aten.cat.default)


# --- column ranges of a concatenation ---------------------------------------------------------
#
# Row-parallel tensor parallelism, and any code that projects part of a concatenation, takes a
# column range of the cat before the MXFP8 quantize: ``fc(cat(slices, -1)[..., start:end])``.
# A 128-aligned range is staged from the slices, or slice parts, inside it: the columns
# outside it are never quantized, stored or read. Each distinct range of one cat gets its own
# storage; MXFP8 ops that read the whole cat are the range ``[0, K)``: one analysis serves
# both.


@dataclass
class ColumnRange:
    """Columns ``[start, end)`` of a site's concatenation and the MXFP8 ops that read them.

    ``parts`` is what to stage, in column order: ``(slice index, first column within that
    slice, width)``; side by side they are exactly the range.
    """

    start: int
    end: int
    takes: list[fx.Node] = field(default_factory=list)
    """The ``aten.slice`` nodes that take the range (none for the whole concatenation)."""
    views: list[fx.Node] = field(default_factory=list)
    quantizes: list[fx.Node] = field(default_factory=list)
    linears: list[fx.Node] = field(default_factory=list)
    w8a16: list[fx.Node] = field(default_factory=list)
    parts: list[tuple[int, int, int]] = field(default_factory=list)

    @property
    def width(self) -> int:
        return self.end - self.start

    @property
    def staged(self) -> bool:
        """Whether a sink reads the range quantized (W8A8), so that it needs MXFP8 storage."""
        return bool(self.quantizes or self.linears)


_SLICE_DEFAULTS = {"dim": 0, "start": None, "end": None, "step": 1}


def _slice_args(take: fx.Node) -> dict:
    """``aten.slice.Tensor``'s dim, start, end and step, defaults filled in."""
    given = dict(zip(_SLICE_DEFAULTS, take.args[1:], strict=False))
    return {**_SLICE_DEFAULTS, **given, **take.kwargs}


def _is_last_dim_slice(user: fx.Node, node: fx.Node) -> bool:
    if not (_is_call(user, aten.slice.Tensor) and user.args[0] is node):
        return False
    val, dim = _val(node), _slice_args(user)["dim"]
    return (
        val is not None
        and val.dim() > 0
        and isinstance(dim, int)
        and dim % val.dim() == val.dim() - 1
    )


def _columns(rng: ColumnRange | None) -> str:
    if rng is None:
        return "the concatenation is"
    return f"columns [{rng.start}, {rng.end}) of the concatenation are"


def _columns_reach(rng: ColumnRange | None) -> str:
    if rng is None:
        return "the concatenation reaches"
    return f"columns [{rng.start}, {rng.end}) of the concatenation reach"


def _range(site: Site, start: int, end: int) -> ColumnRange:
    for rng in site.ranges:
        if (rng.start, rng.end) == (start, end):
            return rng
    rng = ColumnRange(start, end)
    site.ranges.append(rng)
    return rng


def _slice_bounds(take: fx.Node, k: int) -> tuple[int, int] | str:
    """``[start, end)`` that ``take`` keeps of ``k`` columns, or why it is not a column range."""
    args = _slice_args(take)
    start, end, step = args["start"], args["end"], args["step"]
    if not all(v is None or type(v) is int for v in (start, end, step)):
        return f"{describe(take)} takes columns with symbolic bounds; they must be static"
    if step != 1:
        return f"{describe(take)} takes columns with step {step}; a column range has step 1"
    start = 0 if start is None else start + k if start < 0 else start
    end = k if end is None else end + k if end < 0 else end
    return min(max(start, 0), k), min(max(end, 0), k)


def _consumers(cat: fx.Node, k: int | None, site: Site) -> str | None:
    """Walk the cat's uses through views and last-dim slices; fill ``site.ranges`` with the
    sinks each column range feeds (a use of the whole cat: the range ``[0, K)``), or return
    why not."""
    stack: list[tuple[fx.Node, ColumnRange | None]] = [(cat, None)]
    while stack:
        node, rng = stack.pop()
        width = k if rng is None else rng.width
        for user in node.users:
            if user.op == "call_function" and user.target in VIEW_OPS:
                val = _val(user)
                if val is None or val.dim() == 0 or hint(val.shape[-1]) != width:
                    return f"{_columns(rng)} also reshaped by {describe(user)}"
                (site.views if rng is None else rng.views).append(user)
                stack.append((user, rng))
                continue
            if rng is None and _is_last_dim_slice(user, node):
                if k is None:
                    return f"{describe(user)} takes columns of a width not known when compiling"
                bounds = _slice_bounds(user, k)
                if isinstance(bounds, str):
                    return bounds
                taken = _range(site, *bounds)
                taken.takes.append(user)
                stack.append((user, taken))
                continue
            sink = _sink(user, node)
            if sink is None:
                return f"{_columns(rng)} also used by {describe(user)}"
            val = _val(node)
            if val is None or val.dim() != 2:
                return f"{_columns_reach(rng)} {describe(user)} without a 2-D view"
            getattr(rng if rng is not None else _range(site, 0, k), sink.role).append(user)
            getattr(site, sink.role).append(user)
    return None


def _range_parts(site: Site) -> str | None:
    """Check each range is 128-aligned and non-empty; fill its ``parts`` from the slices."""
    site.ranges.sort(key=lambda r: (r.start, -r.end))  # a stable order for the rewrite
    offsets, column = [], 0
    for width in site.widths:
        offsets.append(column)
        column += width
    for rng in site.ranges:
        what = f"columns [{rng.start}, {rng.end})"
        if rng.takes:
            what += f" taken by {describe(rng.takes[0])}"
        if rng.start % STAGE_ALIGN or rng.end % STAGE_ALIGN:
            return f"{what} do not start and end at multiples of {STAGE_ALIGN}"
        if rng.start >= rng.end:
            return f"{what} are empty"
        rng.parts = []
        for i, (first, width) in enumerate(zip(offsets, site.widths, strict=True)):
            lo, hi = max(first, rng.start), min(first + width, rng.end)
            if lo < hi:
                rng.parts.append((i, lo - first, hi - lo))
    return None


def analyze(cat: fx.Node, max_slices: int | None = None) -> Site | None:
    """The :class:`Site` of ``cat``, or ``None`` when ``cat`` never reaches MXFP8 ops.

    The MXFP8 ops may read the whole cat or column ranges of it (last-dim slices); the whole
    cat is the range ``[0, K)``, so ``site.ranges`` always holds what each range stages and
    feeds. Every range must be static, have step 1 and start and end at multiples of 128
    (so it covers whole scale chunks and each of its parts is a 128-aligned column range of
    one slice).
    """
    if not _reaches(cat):
        return None
    slices, dim, widths = _cat_parts(cat)
    val = _val(cat)
    k = hint(val.shape[-1]) if val is not None and val.dim() else None
    site = Site(cat, slices, widths, val.dtype if val is not None else None, ranges=[])
    site.gemms, site.w8a16_gemms = _count_gemms(cat)
    if val is None:
        site.reason = "the concatenation has no tensor metadata"
        return site
    for check in (
        lambda: _consumers(cat, k, site),
        lambda: _slice_reason(site, val, dim % val.dim() if val.dim() else dim),
        lambda: _range_parts(site),
        lambda: _too_many(slices, max_slices),
        lambda: _quantized_readers(site),
    ):
        site.reason = check()
        if site.reason is not None:
            break
    return site
