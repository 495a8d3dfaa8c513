"""Shared pieces of the pass and backend tests: models, a capturing test backend, helpers.

No tests here: the test modules import it as ``helpers.passes`` (tests/conftest.py).
"""

from __future__ import annotations

import operator
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch import fx, nn
from torch._inductor.compile_fx import compile_fx
from torch._inductor.custom_graph_pass import CustomGraphPass

import mxfp8_fusion as mf
from mxfp8_fusion.nn import MXFP8Linear
from mxfp8_fusion.passes.fusion import ComposedPass, FusionOptions, FusionPass
from mxfp8_fusion.passes.report import SiteReport

NO_CACHE = {"fx_graph_cache": False, "force_disable_caches": True}


def linear(k: int, n: int = 64, seed: int = 0, bias: bool = True) -> MXFP8Linear:
    """An MXFP8Linear from a random BF16 nn.Linear (the CPU reference runs it)."""
    gen = torch.Generator().manual_seed(seed)
    lin = nn.Linear(k, n, bias=bias, dtype=torch.bfloat16)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n, k, generator=gen) * k**-0.5)
        if bias:
            lin.bias.copy_(torch.randn(n, generator=gen) * 0.1)
    return MXFP8Linear.from_linear(lin)


def w8a16(model: nn.Module, *names: str) -> nn.Module:
    """``model`` with its MXFP8 linears (those ``names`` name, else all) made W8A16
    (``activation="bf16"``), in place: the same weights, their input multiplied as it is."""
    for name, module in model.named_modules():
        if isinstance(module, MXFP8Linear) and (not names or name in names):
            module.activation = "bf16"
    return model


def randn(*shape: int, dtype=torch.bfloat16, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen) * 3).to(dtype)


def slices(widths=(128, 128), tokens: int = 8) -> list[torch.Tensor]:
    """BF16 ``[tokens, width]`` inputs, one per width, each with its own seed."""
    return [randn(tokens, w, seed=i) for i, w in enumerate(widths)]


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int16)


def assert_bitwise(a, b) -> None:
    if isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_bitwise(x, y)
        return
    assert a.shape == b.shape and a.dtype == b.dtype
    assert torch.equal(bits(a.contiguous()), bits(b.contiguous()))


def op_name(node: fx.Node) -> str:
    if node.op != "call_function":
        return node.op
    if node.target is operator.getitem:
        return "getitem"
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target._opname}"
    return getattr(target, "__name__", str(target))


def op_counts(graph: fx.Graph) -> Counter:
    """Call nodes per op, plus ``"staged slices"``: the sources of all slice quantizers, and
    ``"read slices"``: the sources of all W8A16 GEMMs from slices."""
    counts = Counter(op_name(n) for n in graph.nodes if n.op == "call_function")
    for key, op in (("staged slices", "quantize_slices_"), ("read slices", "mm_slices")):
        counts[key] = sum(len(n.args[0]) for n in graph.nodes if op_name(n) == f"mxfp8.{op}")
    return counts


def render(graph: fx.Graph) -> str:
    """One line per call node, ``name = op(args)``: a readable snapshot of a graph.

    Graph inputs are named ``in0, in1, ...`` in order of first use and other nodes after
    their op, so the snapshot does not depend on how a torch version names nodes or orders
    lifted parameters.
    """
    names: dict[fx.Node, str] = {}
    per_op: Counter = Counter()

    def name(n: fx.Node) -> str:
        if n not in names:
            base = "in" if n.op == "placeholder" else op_name(n).split(".")[-1].rstrip("_")
            names[n] = f"{base}{per_op[base]}"
            per_op[base] += 1
        return names[n]

    def arg(a) -> str:
        if isinstance(a, fx.Node):
            return name(a)
        if isinstance(a, (list, tuple)):
            return "[" + ", ".join(arg(x) for x in a) + "]"
        if isinstance(a, torch.dtype):
            return str(a).removeprefix("torch.")
        return repr(a)

    lines = []
    for n in graph.nodes:
        if n.op == "call_function":
            args = [arg(a) for a in n.args]
            args += [f"{k}={arg(v)}" for k, v in n.kwargs.items() if k not in ("pin_memory",)]
            lines.append(f"{name(n)} = {op_name(n)}({', '.join(args)})")
        elif n.op == "output":
            lines.append(f"return {arg(n.args[0])}")
    return "\n".join(lines)


class _Snapshot(CustomGraphPass):
    def __init__(self, sink: list):
        self.sink = sink

    def __call__(self, graph: fx.Graph) -> None:
        self.sink.append((render(graph), op_counts(graph)))

    def uuid(self):
        return None


@dataclass
class Capture:
    """A test backend: Inductor with caches off, the post-grad graph captured before and
    after the fusion pass."""

    options: FusionOptions = field(default_factory=FusionOptions)
    before: list = field(default_factory=list)
    after: list = field(default_factory=list)
    compiles: int = 0

    def __post_init__(self):
        self.fusion = FusionPass(self.options)

    def __call__(self, gm, example_inputs):
        self.compiles += 1
        chain = ComposedPass([_Snapshot(self.before), self.fusion, _Snapshot(self.after)])
        patches = {**NO_CACHE, "post_grad_custom_post_pass": chain}
        return compile_fx(gm, example_inputs, config_patches=patches)

    @property
    def graph_after(self) -> str:
        return self.after[-1][0]

    @property
    def counts_after(self) -> Counter:
        return self.after[-1][1]

    @property
    def unchanged(self) -> bool:
        return all(b[0] == a[0] for b, a in zip(self.before, self.after, strict=True))


def assert_left_unchanged(cap: Capture, reason: str) -> SiteReport:
    """The graph's one site was left exactly as it was, for ``reason``: its report."""
    assert cap.unchanged
    assert cap.fusion.matches == 0 and cap.fusion.skipped == 1
    (report,) = cap.fusion.reports
    assert not report.rewritten
    assert reason in report.reason
    assert report.consumers == 1  # counted although the decision stopped early
    return report


# --- models -----------------------------------------------------------------------------


class CatLinear(nn.Module):
    """``fc(cat(slices, -1))``: the drafter's projection, slices as inputs."""

    def __init__(self, k: int, n: int = 64, dim: int = -1):
        super().__init__()
        self.fc = linear(k, n)
        self.dim = dim

    def forward(self, *slices):
        return self.fc(torch.cat(slices, dim=self.dim))


class ViewSlices(nn.Module):
    """Slices that are column views of one wider tensor."""

    def __init__(self, ranges: list[tuple[int, int]], n: int = 64):
        super().__init__()
        self.ranges = ranges
        self.fc = linear(sum(b - a for a, b in ranges), n)

    def forward(self, x):
        return self.fc(torch.cat([x[..., a:b] for a, b in self.ranges], dim=-1))


class TwoStep(nn.Module):
    """``mf.quantize(cat)`` once, then ``mm_quantized`` with several weights."""

    def __init__(self, k: int, gemms: int = 2):
        super().__init__()
        self.fcs = nn.ModuleList(linear(k, 64, seed=i) for i in range(gemms))

    def forward(self, *slices):
        q = mf.quantize(torch.cat(slices, dim=-1))
        outs = []
        for fc in self.fcs:
            outs.append(mf.mm_quantized(q, fc.weight, bias=fc.bias))
        return tuple(outs)


class SharedCat(nn.Module):
    """One cat feeding two one-shot MXFP8 linears."""

    def __init__(self, k: int):
        super().__init__()
        self.a = linear(k, 64, seed=1)
        self.b = linear(k, 32, seed=2)

    def forward(self, *slices):
        x = torch.cat(slices, dim=-1)
        return self.a(x), self.b(x)


class TwoSites(nn.Module):
    """Two independent cat -> MXFP8 linear sites in one graph."""

    def __init__(self, k1: int, k2: int):
        super().__init__()
        self.a = linear(k1, 64, seed=1)
        self.b = linear(k2, 64, seed=2)

    def forward(self, x, y, z):
        return self.a(torch.cat([x, y], -1)), self.b(torch.cat([y, z, x], -1))
