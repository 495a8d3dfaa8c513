"""The post-grad fusion pass: exact matches, rewritten graphs, untouched graphs, and compiled
outputs bitwise equal to the concatenated eager path."""

from __future__ import annotations

import logging
import re

import pytest
import torch
from expecttest import assert_expected_inline
from helpers.passes import (
    NO_CACHE,
    Capture,
    CatLinear,
    SharedCat,
    TwoSites,
    TwoStep,
    ViewSlices,
    assert_bitwise,
    assert_left_unchanged,
    linear,
    randn,
)
from torch import nn
from torch._inductor.utils import run_and_get_code

import mxfp8_fusion as mf

REWRITTEN_ABSENT = ("aten.cat", "mxfp8.quantize", "mxfp8.linear")


def compile_and_check(model, *inputs, dynamic=None, options=None) -> Capture:
    """Compile with the capturing backend, run, compare bitwise with eager; return capture."""
    cap = Capture(options) if options is not None else Capture()
    with torch.no_grad():
        expected = model(*inputs)
        got = torch.compile(model, backend=cap, dynamic=dynamic)(*inputs)
    assert_bitwise(got, expected)
    return cap


def assert_rewritten(cap: Capture, sites: int, slices: int, gemms: int) -> None:
    assert cap.fusion.matches == sites
    assert cap.fusion.skipped == 0
    counts = cap.counts_after
    for op in REWRITTEN_ABSENT:
        assert counts[op] == 0, (op, cap.graph_after)
    assert counts["mxfp8.quantize_slices_"] == sites
    assert counts["staged slices"] == slices
    assert counts["mxfp8.mm"] == gemms
    assert counts["aten.empty"] == 2 * sites


# --- rewritten sites ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("widths", [[128, 128], [128, 256, 128], [256] * 6])
def test_drafter_cat_rewritten(widths, dtype):
    model = CatLinear(sum(widths)).to(dtype)
    xs = [randn(8, w, dtype=dtype, seed=i) for i, w in enumerate(widths)]
    cap = compile_and_check(model, *xs)
    assert_rewritten(cap, sites=1, slices=len(widths), gemms=1)


def test_sixteen_slices():
    xs = [randn(4, 128, seed=i) for i in range(16)]
    cap = compile_and_check(CatLinear(16 * 128), *xs)
    assert_rewritten(cap, sites=1, slices=16, gemms=1)


def test_snapshot_two_slices():
    cap = compile_and_check(CatLinear(256), randn(8, 128), randn(8, 128, seed=1))
    assert_expected_inline(
        cap.before[-1][0],
        """\
cat0 = aten.cat([in0, in1], -1)
linear0 = mxfp8.linear(cat0, in2, in3, in4)
return [linear0]""",
    )
    assert_expected_inline(
        cap.graph_after,
        """\
empty0 = aten.empty([8, 256], dtype=float8_e4m3fn, device=device(type='cpu'))
empty1 = aten.empty([1024], dtype=uint8, device=device(type='cpu'))
quantize_slices0 = mxfp8.quantize_slices_([in0, in1], empty0, empty1, [0, 128])
mm0 = mxfp8.mm(empty0, empty1, in2, in3, in4, bfloat16)
return [mm0]""",
    )


def test_view_slices_of_one_tensor():
    model = ViewSlices([(0, 128), (256, 512), (128, 256)])
    cap = compile_and_check(model, randn(16, 640))
    assert_rewritten(cap, sites=1, slices=3, gemms=1)
    assert cap.counts_after["aten.slice"] == 3


def test_three_d_slices_flattened_through_view_dynamic():
    xs = [randn(2, 3, 128, seed=i) for i in range(3)]
    cap = compile_and_check(CatLinear(384), *xs, dynamic=True)
    assert_rewritten(cap, sites=1, slices=3, gemms=1)
    assert_expected_inline(
        cap.graph_after,
        """\
sym_size0 = aten.sym_size(in0, 0)
sym_size1 = aten.sym_size(in0, 1)
mul0 = mul(sym_size0, sym_size1)
empty0 = aten.empty([mul0, 384], dtype=float8_e4m3fn, device=device(type='cpu'))
add0 = add(mul0, 127)
floordiv0 = floordiv(add0, 128)
mul1 = mul(floordiv0, 1536)
empty1 = aten.empty([mul1], dtype=uint8, device=device(type='cpu'))
reshape0 = aten.reshape(in0, [mul0, 128])
reshape1 = aten.reshape(in1, [mul0, 128])
reshape2 = aten.reshape(in2, [mul0, 128])
quantize_slices0 = mxfp8.quantize_slices_([reshape0, reshape1, reshape2], empty0, empty1, [0, 128, 256])
mm0 = mxfp8.mm(empty0, empty1, in3, in4, in5, bfloat16)
reshape3 = aten.reshape(mm0, [in6, in7, 64])
return [reshape3]""",
    )


def test_two_step_quantize_once_feeds_all_gemms():
    xs = [randn(8, 128, seed=i) for i in range(3)]
    cap = compile_and_check(TwoStep(384, gemms=3), *xs)
    assert_rewritten(cap, sites=1, slices=3, gemms=3)
    assert_expected_inline(
        cap.graph_after,
        """\
empty0 = aten.empty([8, 384], dtype=float8_e4m3fn, device=device(type='cpu'))
empty1 = aten.empty([1536], dtype=uint8, device=device(type='cpu'))
quantize_slices0 = mxfp8.quantize_slices_([in0, in1, in2], empty0, empty1, [0, 128, 256])
view0 = aten.view(empty1, uint8)
view1 = aten.view(in3, uint8)
mm0 = mxfp8.mm(empty0, view0, in4, view1, in5, bfloat16)
view2 = aten.view(in6, uint8)
mm1 = mxfp8.mm(empty0, view0, in7, view2, in8, bfloat16)
view3 = aten.view(in9, uint8)
mm2 = mxfp8.mm(empty0, view0, in10, view3, in11, bfloat16)
return [mm0, mm1, mm2]""",
    )


def test_shared_cat_feeds_two_linears():
    xs = [randn(8, 128, seed=i) for i in range(2)]
    cap = compile_and_check(SharedCat(256), *xs)
    assert_rewritten(cap, sites=1, slices=2, gemms=2)


def test_two_sites_in_one_graph():
    x, y, z = randn(8, 128), randn(8, 256, seed=1), randn(8, 128, seed=2)
    cap = compile_and_check(TwoSites(384, 512), x, y, z)
    assert_rewritten(cap, sites=2, slices=5, gemms=2)


@pytest.mark.parametrize("how", ["mark_dynamic", "dynamic=True"])
def test_dynamic_token_count_compiles_once(how):
    model = CatLinear(256)
    cap = Capture()
    compiled = torch.compile(model, backend=cap, dynamic=True if how == "dynamic=True" else None)
    with torch.no_grad():
        for tokens in (4, 17, 64, 2):  # 1 would be specialized by Dynamo (0/1 rule)
            xs = [randn(tokens, 128, seed=tokens + i) for i in range(2)]
            if how == "mark_dynamic":
                for x in xs:
                    torch._dynamo.mark_dynamic(x, 0)
            assert_bitwise(compiled(*xs), model(*xs))
    assert cap.compiles == 1
    assert_rewritten(cap, sites=1, slices=2, gemms=1)
    assert "aten.sym_size" in cap.graph_after


def test_no_bf16_concatenation_buffer_in_generated_code():
    tokens, widths = 24, [128, 256, 128]
    model = CatLinear(sum(widths))
    xs = [randn(tokens, w, seed=i) for i, w in enumerate(widths)]
    with torch.no_grad(), torch._inductor.config.patch(NO_CACHE):
        expected = model(*xs)
        got, codes = run_and_get_code(torch.compile(model, backend="mxfp8_fusion"), *xs)
    assert_bitwise(got, expected)
    code = "\n".join(codes)
    assert "quantize_slices_" in code
    assert "mxfp8.linear" not in code and "mxfp8.quantize.default" not in code
    bf16_buffers = re.findall(r"empty_strided_\w+\(\(([^)]*)\), \([^)]*\), torch\.bfloat16\)", code)
    cat_shape = f"{tokens}, {sum(widths)}"
    assert cat_shape not in bf16_buffers, code
    assert not re.search(r"\w*fused\w*_cat\w*", code), code


# --- sites left unchanged -------------------------------------------------------------------


class ReturnsCat(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = linear(256)

    def forward(self, a, b):
        x = torch.cat([a, b], -1)
        return self.fc(x), x


class CatReadByAnotherOp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = linear(256)

    def forward(self, a, b):
        x = torch.cat([a, b], -1)
        return self.fc(x) + x.sum()


class QuantizedReturned(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = linear(256)

    def forward(self, a, b):
        q = mf.quantize(torch.cat([a, b], -1))
        return mf.mm_quantized(q, self.fc.weight), q.values


class MixedDtypes(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = linear(256)

    def forward(self, a, b):
        x = torch.cat([a, b], -1)  # BF16 + FP16 promote to FP32
        values, scales = torch.ops.mxfp8.quantize(x)
        fc = self.fc
        return torch.ops.mxfp8.mm(
            values,
            scales.view(torch.uint8),
            fc.weight_values,
            fc.weight_scales.view(torch.uint8),
            None,
            torch.bfloat16,
        )


UNCHANGED = [
    pytest.param(
        lambda: CatLinear(256),
        lambda: [randn(8, 96), randn(8, 160, seed=1)],
        "slice 0 has width 96, not a positive multiple of 128",
        id="width-not-multiple-of-128",
    ),
    pytest.param(
        lambda: CatLinear(128, dim=0),
        lambda: [randn(8, 128), randn(4, 128, seed=1)],
        "cat is along dim 0, not the last dim (1)",
        id="cat-along-dim-0",
    ),
    pytest.param(
        ReturnsCat,
        lambda: [randn(8, 128), randn(8, 128, seed=1)],
        "the concatenation is also used by the graph output (it is returned)",
        id="cat-returned",
    ),
    pytest.param(
        CatReadByAnotherOp,
        lambda: [randn(8, 128), randn(8, 128, seed=1)],
        "the concatenation is also used by",
        id="cat-read-by-sum",
    ),
    pytest.param(
        QuantizedReturned,
        lambda: [randn(8, 128), randn(8, 128, seed=1)],
        "the quantized values are also used by the graph output (it is returned)",
        id="quantized-values-returned",
    ),
    pytest.param(
        MixedDtypes,
        lambda: [randn(8, 128), randn(8, 128, dtype=torch.float16, seed=1)],
        "the slices have mixed dtypes (bfloat16, float16)",
        id="mixed-dtypes",
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize(("make_model", "make_inputs", "reason"), UNCHANGED)
def test_non_qualifying_site_left_exactly_unchanged(make_model, make_inputs, reason):
    assert_left_unchanged(compile_and_check(make_model(), *make_inputs()), reason)


def test_max_slices_option_leaves_site_unchanged():
    xs = [randn(8, 128, seed=i) for i in range(3)]
    cap = compile_and_check(CatLinear(384), *xs, options=mf.FusionOptions(max_slices=2))
    assert cap.unchanged
    assert "3 slices exceed the pass option max_slices=2" in cap.fusion.reports[0].reason


def test_disabled_pass_reports_but_leaves_graph_unchanged():
    xs = [randn(8, 128, seed=i) for i in range(2)]
    cap = compile_and_check(CatLinear(256), *xs, options=mf.FusionOptions(enabled=False))
    assert cap.unchanged and cap.fusion.matches == 0
    assert "disabled" in cap.fusion.reports[0].reason


def test_graph_without_candidates_untouched():
    model = nn.Sequential(linear(256))
    cap = compile_and_check(model, randn(8, 256))
    assert cap.unchanged and cap.fusion.reports == []


# --- CUDA -----------------------------------------------------------------------------------


@pytest.mark.gpu
def test_cuda_bitwise_and_transient_peak():
    """On CUDA the rewritten site allocates only MXFP8 storage and the output (+ 1 MiB)."""
    device = torch.device("cuda")
    tokens, hidden, slices = 1024, 1024, 6
    k = hidden * slices
    model = CatLinear(k, n=hidden).to(device)
    xs = [randn(tokens, hidden, seed=i).to(device) for i in range(slices)]
    cap = Capture()
    compiled = torch.compile(model, backend=cap)
    with torch.no_grad():
        expected = model(*xs)
        got = compiled(*xs)  # compiles and warms up
        assert_bitwise(got, expected)
        del got
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        out = compiled(*xs)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    assert_bitwise(out, expected)
    assert cap.fusion.matches == 1
    storage = tokens * k + mf.format.scale_bytes(tokens, k)
    output = tokens * hidden * 2
    assert peak <= storage + output + 2**20, (peak, storage, output)


class ChainedSites(nn.Module):
    """The second cat reads the first site's GEMM output: sites are rewritten in turn."""

    def __init__(self):
        super().__init__()
        self.first = linear(256, 128, seed=1)
        self.second = linear(256, 64, seed=2)

    def forward(self, a, b, c):
        return self.second(torch.cat([self.first(torch.cat([a, b], -1)), c], -1))


def test_chained_sites():
    xs = [randn(8, 128, seed=i) for i in range(3)]
    cap = compile_and_check(ChainedSites(), *xs)
    assert_rewritten(cap, sites=2, slices=4, gemms=2)


def test_failed_rewrite_leaves_graph_unchanged(monkeypatch):
    from mxfp8_fusion.passes import rewrite

    def broken_empty(self, size, dtype, device):
        if dtype == torch.uint8:  # the scale buffer: after the values buffer was built
            raise RuntimeError("boom")
        return self.call(torch.ops.aten.empty.memory_format, size, dtype=dtype, device=device)

    monkeypatch.setattr(rewrite._Builder, "empty", broken_empty)
    cap = compile_and_check(CatLinear(256), randn(8, 128), randn(8, 128, seed=1))
    assert cap.unchanged and cap.fusion.matches == 0
    assert "internal error while rewriting (RuntimeError: boom)" in cap.fusion.reports[0].reason


def test_failed_analysis_leaves_graph_unchanged(monkeypatch, caplog):
    from mxfp8_fusion.passes import pattern

    def broken_consumers(cat, k, site):
        raise RuntimeError("boom")

    monkeypatch.setattr(pattern, "_consumers", broken_consumers)
    with caplog.at_level(logging.WARNING, logger="mxfp8_fusion"):
        cap = compile_and_check(CatLinear(256), randn(8, 128), randn(8, 128, seed=1))
    assert cap.unchanged and cap.fusion.matches == 0 and cap.fusion.skipped == 1
    head, at = str(cap.fusion.reports[0]).splitlines()
    assert_expected_inline(
        head,
        """graph 1, cat: cat (not analyzed) -> ? MXFP8 GEMM(s): not rewritten: internal error while analyzing (RuntimeError: boom)""",
    )
    assert at.endswith("return self.fc(torch.cat(slices, dim=self.dim))")  # the user's line
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.getMessage() == (
        "mxfp8_fusion pass: cat left unchanged: internal error while analyzing (RuntimeError: boom)"
    )


def test_failed_analysis_of_one_site_leaves_the_other_rewritten(monkeypatch):
    from mxfp8_fusion.passes import pattern

    real = pattern._slice_reason

    def broken_for_three_slices(site, val, dim):
        if len(site.slices) == 3:
            raise ValueError("boom")
        return real(site, val, dim)

    monkeypatch.setattr(pattern, "_slice_reason", broken_for_three_slices)
    x, y, z = randn(8, 128), randn(8, 256, seed=1), randn(8, 128, seed=2)
    cap = compile_and_check(TwoSites(384, 512), x, y, z)
    assert cap.fusion.matches == 1 and cap.fusion.skipped == 1
    first, second = cap.fusion.reports
    assert first.rewritten
    assert second.reason == "internal error while analyzing (ValueError: boom)"
    counts = cap.counts_after
    assert counts["aten.cat"] == 1 and counts["mxfp8.linear"] == 1
    assert counts["mxfp8.quantize_slices_"] == 1 and counts["mxfp8.mm"] == 1


def test_rewrite_checks_the_site_before_changing_the_graph(monkeypatch):
    """An analysis that wrongly accepts a cat with another reader is caught by the rewrite
    before it replaces anything (erasing the cat would fail halfway through)."""
    from mxfp8_fusion.passes import pattern

    real = pattern.analyze

    def accepting(cat, max_slices=None):
        site = real(cat, max_slices)
        if site is not None:
            site.reason = None
        return site

    monkeypatch.setattr(pattern, "analyze", accepting)
    cap = compile_and_check(ReturnsCat(), randn(8, 128), randn(8, 128, seed=1))
    assert cap.unchanged and cap.fusion.matches == 0
    assert cap.fusion.reports[0].reason == (
        "internal error while rewriting (RuntimeError: aten.cat is also read by the graph "
        "output (it is returned))"
    )


def test_uuid_hashes_every_file_of_the_pass_package():
    """A new pattern file cannot escape the uuid (Inductor's cache key of the pass)."""
    from pathlib import Path

    from mxfp8_fusion.passes import fusion

    package = Path(fusion.__file__).parent
    hashed = {Path(p).resolve() for p in fusion._SOURCES}
    assert {p.resolve() for p in package.rglob("*.py")} <= hashed
