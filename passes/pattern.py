"""Find ``cat -> MXFP8 quantize -> MXFP8 GEMM`` sites in a post-grad FX graph and decide,
with a reason a user can read, whether each one can be rewritten.

A *site* is an ``aten.cat`` whose result reaches an ``mxfp8.quantize`` or an
``mxfp8.linear`` (directly or through views that flatten leading dims). A site qualifies
when the staged program computes exactly what the original did and the BF16 concatenation
is not needed by anything else:

- the cat is along the last dim, of 2 or more dims;
- every slice has the cat's dtype (BF16 or FP16), its rank and device, and a static width
  that is a positive multiple of 128 (so each slice owns whole scale chunks);
- every use of the cat (through views to ``[rows, K]``) is an MXFP8 quantize or one-shot
  linear, and the quantized values and scales are read only by MXFP8 GEMMs.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch
from torch import fx

from ..format import SOURCE_DTYPES, STAGE_ALIGN

aten = torch.ops.aten

VIEW_OPS = (aten.view.default, aten.reshape.default, aten._unsafe_view.default)


def _mxfp8_ops():
    """The custom ops, looked up when first needed (``mxfp8_fusion.ops`` registers them)."""
    from .. import ops  # noqa: F401

    mx = torch.ops.mxfp8
    return mx.quantize.default, mx.linear.default, mx.mm.default


@dataclass
class Site:
    """One ``cat`` that reaches MXFP8 quantization, and what was decided about it."""

    cat: fx.Node
    slices: list[fx.Node]
    widths: list[int | None]
    dtype: torch.dtype | None
    quantizes: list[fx.Node] = field(default_factory=list)
    linears: list[fx.Node] = field(default_factory=list)
    views: list[fx.Node] = field(default_factory=list)
    gemms: int = 0
    """MXFP8 GEMMs that read the concatenation, counted whether or not the site qualifies."""
    reason: str | None = None
    """``None`` when the site qualifies, else why it was left unchanged."""

    @property
    def ok(self) -> bool:
        return self.reason is None


def _val(node) -> torch.Tensor | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def _describe_user(user: fx.Node) -> str:
    if user.op == "output":
        return "the graph output (it is returned)"
    target = user.target
    if isinstance(target, torch._ops.OpOverload):
        name = f"{target.namespace}.{target._opname}"
    else:
        name = getattr(target, "__name__", str(target))
    return f"{name} (node {user.name})"


def _is_call(node: fx.Node, target) -> bool:
    return node.op == "call_function" and node.target == target


def _consumers(cat: fx.Node, k: int, site: Site) -> str | None:
    """Walk the cat's uses through views; fill ``site`` sinks or return why not."""
    quantize, linear, _ = _mxfp8_ops()
    stack = [cat]
    while stack:
        node = stack.pop()
        for user in node.users:
            if user.op == "call_function" and user.target in VIEW_OPS:
                val = _val(user)
                if val is None or val.shape[-1] != k:
                    return f"the concatenation is also reshaped by {_describe_user(user)}"
                site.views.append(user)
                stack.append(user)
                continue
            if _is_call(user, quantize) and user.args[0] is node:
                sink = site.quantizes
            elif _is_call(user, linear) and user.args[0] is node and node not in user.args[1:]:
                sink = site.linears
            else:
                return f"the concatenation is also used by {_describe_user(user)}"
            val = _val(node)
            if val is None or val.dim() != 2:
                return f"the concatenation reaches {_describe_user(user)} without a 2-D view"
            sink.append(user)
    return None


# Ops the eager API puts between a quantize result and the GEMM (``values[:tokens]``,
# ``scales.view(torch.uint8)``): they only re-view the same bytes, so they are kept as they
# are and read the staged storage instead.
_PASS_THROUGH = (aten.view.dtype, aten.slice.Tensor, aten.alias.default)


def _gemm_readers(item: fx.Node, index: int) -> str | None:
    """Every path from a quantize output must end at an ``mxfp8.mm`` argument ``index``."""
    _, _, mm = _mxfp8_ops()
    which = "values" if index == 0 else "scales"
    stack = [item]
    while stack:
        node = stack.pop()
        for reader in node.users:
            if reader.op == "call_function" and reader.target in _PASS_THROUGH:
                if reader.args[0] is not node:
                    return f"the quantized {which} are also used by {_describe_user(reader)}"
                stack.append(reader)
                continue
            if not (_is_call(reader, mm) and reader.args[index] is node):
                return f"the quantized {which} are also used by {_describe_user(reader)}"
            others = [a for i, a in enumerate(reader.args) if i != index]
            if node in others or node in reader.kwargs.values():
                return f"the quantized {which} are used twice by {_describe_user(reader)}"
    return None


def _quantized_readers(site: Site) -> str | None:
    """The values and scales of each quantize must be read only by ``mxfp8.mm``."""
    for q in site.quantizes:
        for item in q.users:
            if not (_is_call(item, operator.getitem) and item.args[1] in (0, 1)):
                return f"the quantize result is used whole by {_describe_user(item)}"
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


def _count_gemms(cat: fx.Node) -> int:
    """One-shot linears of the cat and ``mxfp8.mm`` reads of values quantized from it.

    Counted apart from the decision (which stops at the first reason to skip), so that a site
    left unchanged reports the GEMMs it feeds too.
    """
    quantize, linear, mm = _mxfp8_ops()
    gemms: set[fx.Node] = set()
    for node in _through(cat, VIEW_OPS):
        for user in node.users:
            if _is_call(user, linear) and user.args[0] is node:
                gemms.add(user)
            if not (_is_call(user, quantize) and user.args[0] is node):
                continue
            for item in user.users:
                if _is_call(item, operator.getitem) and item.args[1] == 0:
                    for values in _through(item, _PASS_THROUGH):
                        gemms.update(
                            r for r in values.users if _is_call(r, mm) and r.args[0] is values
                        )
    return len(gemms)


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
        return f"dtype {str(vals[0].dtype).removeprefix('torch.')} is not bfloat16 or float16"
    for i, v in enumerate(vals):
        if v.dim() != val.dim():
            return f"slice {i} is {v.dim()}-D but the concatenation is {val.dim()}-D"
        if v.device != val.device:
            return f"slice {i} is on {v.device}, the concatenation on {val.device}"
        width = site.widths[i]
        if width is None:
            return (
                f"slice {i} has a symbolic width ({v.shape[-1]}); widths must be static "
                "(mark only the token dim dynamic, e.g. torch._dynamo.mark_dynamic(x, 0))"
            )
        if width <= 0 or width % STAGE_ALIGN:
            return f"slice {i} has width {width}, not a positive multiple of {STAGE_ALIGN}"
    return None


def _static(size) -> int | None:
    return size if isinstance(size, int) else None


def analyze(cat: fx.Node, max_slices: int | None = None) -> Site | None:
    """The :class:`Site` of ``cat``, or ``None`` when ``cat`` never reaches MXFP8 ops."""
    quantize, linear, _ = _mxfp8_ops()
    tensors = cat.args[0] if cat.args else cat.kwargs.get("tensors", [])
    dim = cat.args[1] if len(cat.args) > 1 else cat.kwargs.get("dim", 0)
    slices = list(tensors)
    vals = [_val(s) for s in slices]
    widths = [_static(v.shape[-1]) if v is not None and v.dim() else None for v in vals]
    val = _val(cat)
    site = Site(cat, slices, widths, val.dtype if val is not None else None)
    reason = _consumers(cat, val.shape[-1] if val is not None and val.dim() else -1, site)
    if not (site.quantizes or site.linears or _reaches(cat, (quantize, linear))):
        return None
    site.gemms = _count_gemms(cat)
    if reason is None:
        if val is None:
            reason = "the concatenation has no tensor metadata"
        else:
            norm = dim % val.dim() if val.dim() else dim
            reason = _slice_reason(site, val, norm)
    if reason is None and max_slices is not None and len(slices) > max_slices:
        reason = f"{len(slices)} slices exceed the pass option max_slices={max_slices}"
    if reason is None:
        reason = _quantized_readers(site)
    site.reason = reason
    return site


def _reaches(cat: fx.Node, targets) -> bool:
    stack, seen = [cat], set()
    while stack:
        node = stack.pop()
        for user in node.users:
            if user in seen:
                continue
            seen.add(user)
            if user.op == "call_function" and user.target in targets:
                return True
            if user.op == "call_function" and user.target in VIEW_OPS:
                stack.append(user)
    return False


def is_cat(node: fx.Node) -> bool:
    return _is_call(node, aten.cat.default)


def find_sites(graph: fx.Graph, max_slices: int | None = None) -> list[Site]:
    """Every cat in ``graph`` that reaches an MXFP8 quantize or linear, in graph order."""
    sites = []
    for node in graph.nodes:
        if is_cat(node):
            site = analyze(node, max_slices)
            if site is not None:
                sites.append(site)
    return sites
