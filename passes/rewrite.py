"""Rewrite one qualifying :class:`~.pattern.Site`: staged MXFP8 quantization for its W8A8
sinks, the slices themselves for its W8A16 ones.

Before::

    cat = aten.cat([s0, s1, ...], -1)          # [..., K] BF16, materialized
    x = view(cat, [M, K])                      # only when slices have leading dims
    values, scales = mxfp8.quantize(x)         # or y = mxfp8.linear(x, w, ws, bias)
    y = mxfp8.mm(values, scales, w, ws, bias, dtype)
    z = mxfp8.linear_w8a16(x, w2, ws2, bias2)  # W8A16: x used as it is

After::

    values = aten.empty([M, K], float8_e4m3fn)
    scales = aten.empty([scale_bytes(M, K)], uint8)
    mxfp8.quantize_slices_([view(s0, [M, w0]), view(s1, [M, w1]), ...],
                           values, scales, [0, w0, ...])   # one launch for equal slices
    y = mxfp8.mm(values, scales, w, ws, bias, dtype)   # every W8A8 GEMM of the site
    z = mxfp8.mm_slices([view(s0, [M, w0]), view(s1, [M, w1]), ...], w2, ws2, bias2)

A site whose sinks are all W8A16 gets no storage at all: its GEMMs read the slices where
they are.

A column range of the concatenation (``y = mxfp8.linear(cat[:, a:b], ...)``, ``a`` and
``b`` multiples of 128) gets storage of ``b - a`` columns, and only the slices or slice parts
inside the range are quantized into it (a part is a column view ``aten.slice(s, 1, c0, c1)``
of its slice); the columns outside it are never read. A W8A16 GEMM of the range gets the
same parts.

``M`` stays symbolic: it is built from ``sym_size`` nodes of the first slice. Every new
node gets ``meta["val"]`` from running its target on the fake values of its inputs, so the
passes after this one (fake-tensor update, reinplacing, lowering) see consistent metadata.
"""

from __future__ import annotations

import operator

import torch
from torch import fx
from torch.fx.node import map_arg

from ..format import ROW_BLOCK, VALUE_DTYPE, row_block_bytes, scale_bytes
from .pattern import ColumnRange, Site, describe

aten = torch.ops.aten

_COPIED_META = ("stack_trace", "nn_module_stack", "source_fn_stack", "seq_nr")


class _Builder:
    """Creates nodes at the current insertion point, each with a fake ``meta["val"]``."""

    def __init__(self, graph: fx.Graph, fake_mode, origin: fx.Node):
        self.graph = graph
        self.fake_mode = fake_mode
        self.origin = origin
        self.created: list[fx.Node] = []

    def call(self, target, *args, **kwargs) -> fx.Node:
        node = self.graph.call_function(target, args, kwargs)
        self.created.append(node)
        fake_args, fake_kwargs = map_arg((args, kwargs), lambda n: n.meta["val"])
        with self.fake_mode:
            node.meta["val"] = target(*fake_args, **fake_kwargs)
        for key in _COPIED_META:
            if key in self.origin.meta:
                node.meta[key] = self.origin.meta[key]
        return node

    def mul(self, a, b):
        if isinstance(a, int) and isinstance(b, int):
            return a * b
        if a == 1:
            return b
        if b == 1:
            return a
        return self.call(operator.mul, a, b)

    def rows(self, source: fx.Node):
        """Product of the leading dims of ``source``: an int, or a node holding a SymInt."""
        rows = 1
        for d, size in enumerate(source.meta["val"].shape[:-1]):
            term = size if isinstance(size, int) else self.call(aten.sym_size.int, source, d)
            rows = self.mul(rows, term)
        return rows

    def scale_bytes(self, rows, k: int):
        """``format.scale_bytes(rows, k)``, as graph arithmetic when ``rows`` is a node."""
        if isinstance(rows, int):
            return scale_bytes(rows, k)
        padded = self.call(operator.add, rows, ROW_BLOCK - 1)
        blocks = self.call(operator.floordiv, padded, ROW_BLOCK)
        return self.call(operator.mul, blocks, row_block_bytes(k))

    def empty(self, size: list, dtype: torch.dtype, device: torch.device) -> fx.Node:
        return self.call(
            aten.empty.memory_format, size, dtype=dtype, device=device, pin_memory=False
        )


def _fake_mode(site: Site):
    return site.cat.meta["val"].fake_mode


class _Parts:
    """What each column range reads of the slices: ``[rows, width]`` views, made once each
    (a slice with leading dims is flattened by a reshape to ``rows``), and column views of
    them for the parts of a slice."""

    def __init__(self, build: _Builder, site: Site, rows):
        self.build = build
        self.site = site
        self.rows = rows
        self.flat: dict[int, fx.Node] = {}

    def of(self, rng: ColumnRange) -> tuple[list[fx.Node], list[int]]:
        """The range's sources in column order, and the column each starts at in it."""
        sources, columns, column = [], [], 0
        for i, first, width in rng.parts:
            source = self.site.slices[i]
            if source.meta["val"].dim() != 2:
                if i not in self.flat:
                    shape = [self.rows, self.site.widths[i]]
                    self.flat[i] = self.build.call(aten.reshape.default, source, shape)
                source = self.flat[i]
            if width != self.site.widths[i]:  # a part of the slice: a strided column view
                source = self.build.call(aten.slice.Tensor, source, 1, first, first + width)
            sources.append(source)
            columns.append(column)
            column += width
        return sources, columns


def _stage(build: _Builder, parts: _Parts, rng: ColumnRange, device) -> tuple:
    """MXFP8 storage for ``rng``, its parts quantized into it: ``(values, scales, sources)``."""
    values = build.empty([parts.rows, rng.width], VALUE_DTYPE, device)
    # raw scale bytes, as the eager API passes them: Inductor allocates a uint8 buffer in
    # its own wrapper code, an e8m0 one through a slower aten fallback
    scales = build.empty([build.scale_bytes(parts.rows, rng.width)], torch.uint8, device)
    sources, columns = parts.of(rng)
    build.call(torch.ops.mxfp8.quantize_slices_.default, sources, values, scales, columns)
    return values, scales, sources


def _gemms(graph: fx.Graph, build: _Builder, rng: ColumnRange, read: tuple) -> list:
    """``(sink, replacement)`` for each GEMM sink of ``rng``: ``mxfp8.mm`` on the staged
    storage (W8A8), ``mxfp8.mm_slices`` on the range's sources (W8A16)."""
    mx = torch.ops.mxfp8
    values, scales, sources = read
    made = []
    for linear in (*rng.linears, *rng.w8a16):
        build.origin = linear
        with graph.inserting_before(linear):
            x, b_values, b_scales, bias = linear.args
            if linear in rng.w8a16:
                node = build.call(mx.mm_slices.default, sources, b_values, b_scales, bias)
            else:
                dtype = x.meta["val"].dtype
                node = build.call(mx.mm.default, values, scales, b_values, b_scales, bias, dtype)
            made.append((linear, node))
    return made


def rewrite(graph: fx.Graph, site: Site) -> None:
    """Replace ``site`` in ``graph`` (``site.reason`` must be None): per column range, one
    MXFP8 storage holding only the slices or slice parts inside it, for the range's W8A8
    sinks (none when it has only W8A16 ones); its W8A16 GEMMs read those parts as they are.

    All new nodes are built (and their fake values computed) before anything is replaced;
    if that fails, they are removed again and the graph is exactly as it was. Replacing then
    only rewires uses and erases nodes that :func:`_check_replaceable` showed to be free.

    Raises:
        RuntimeError: when ``site`` cannot be replaced as analyzed (the graph is unchanged).
    """
    _check_replaceable(site)
    device = site.cat.meta["val"].device
    ranges = site.ranges
    build = _Builder(graph, _fake_mode(site), site.cat)
    reads, gemms = [], []
    try:
        with graph.inserting_before(site.cat):
            rows = None  # a W8A16 site of 2-D slices needs no token count
            if site.cat.meta["val"].dim() != 2 or any(rng.staged for rng in ranges):
                rows = build.rows(site.slices[0])
            parts = _Parts(build, site, rows)
            for rng in ranges:
                if rng.staged:
                    reads.append(_stage(build, parts, rng, device))
                else:
                    reads.append((None, None, parts.of(rng)[0]))
        for rng, read in zip(ranges, reads, strict=True):
            gemms += _gemms(graph, build, rng, read)
    except Exception:
        for node in reversed(build.created):
            graph.erase_node(node)
        raise
    for rng, (values, scales, _) in zip(ranges, reads, strict=True):
        for quantize in rng.quantizes:
            for item in list(quantize.users):
                item.replace_all_uses_with(values if item.args[1] == 0 else scales)
                graph.erase_node(item)
            graph.erase_node(quantize)
    for linear, mm in gemms:
        linear.replace_all_uses_with(mm)
        graph.erase_node(linear)
    chain = [*site.views, *(n for rng in ranges for n in (*rng.takes, *rng.views))]
    for node in reversed(_in_graph_order(graph, chain)):
        graph.erase_node(node)
    graph.erase_node(site.cat)


def _check_replaceable(site: Site) -> None:
    """Every node the rewrite erases must be read only by nodes it erases or replaces.

    The analysis already ensures this; checking it again before the first change means an
    analysis bug fails here, with the graph untouched, and not halfway through replacing.
    """
    ranges = site.ranges
    replaced = {linear for rng in ranges for linear in (*rng.linears, *rng.w8a16)}
    quantizes = [q for rng in ranges for q in rng.quantizes]
    for quantize in quantizes:
        for item in quantize.users:
            if not (item.target is operator.getitem and item.args[1] in (0, 1)):
                raise RuntimeError(f"a quantize result is read whole by {describe(item)}")
            replaced.add(item)
    erased = {site.cat, *site.views, *quantizes}
    erased.update(n for rng in ranges for n in (*rng.takes, *rng.views))
    for node in erased:
        for user in node.users:
            if user not in erased and user not in replaced:
                raise RuntimeError(f"{describe(node)} is also read by {describe(user)}")


def _in_graph_order(graph: fx.Graph, nodes: list[fx.Node]) -> list[fx.Node]:
    wanted = set(nodes)
    return [n for n in graph.nodes if n in wanted]
