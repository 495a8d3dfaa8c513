"""The pass on column ranges of a concatenation: ``fc(cat(slices, -1)[..., start:end])`` (a
row-parallel projection's input, or any code that projects part of a cat) stages only the
slices or slice parts inside the range, bitwise equal to the eager path."""

from __future__ import annotations

import pytest
import torch
from expecttest import assert_expected_inline
from helpers.passes import Capture, assert_bitwise, linear, randn
from test_pass import compile_and_check
from torch import nn

import mxfp8_fusion as mf

WIDTHS = [384, 256, 384]  # K = 1024; slice boundaries at 384 and 640


class RangeLinear(nn.Module):
    """``fc(cat(slices, -1)[..., start:end])``, the range taken as ``take`` says."""

    def __init__(self, start: int, end: int, take: str = "index", n: int = 64, k: int = 1024):
        super().__init__()
        self.fc = linear(end - start, n)
        self.start, self.end, self.take, self.k = start, end, take, k

    def forward(self, *slices):
        x = torch.cat(slices, dim=-1)
        if self.take == "narrow":
            x = x.narrow(-1, self.start, self.end - self.start)
        elif self.take == "negative":
            x = x[..., self.start - self.k : self.end - self.k or None]
        else:
            x = x[..., self.start : self.end]
        return self.fc(x)


def inputs(*lead: int, widths=WIDTHS, dtype=torch.bfloat16):
    return [randn(*lead, w, dtype=dtype, seed=i) for i, w in enumerate(widths)]


def assert_range_rewritten(cap, slices: int, gemms: int = 1) -> None:
    assert cap.fusion.matches == 1 and cap.fusion.skipped == 0
    counts = cap.counts_after
    for op in ("aten.cat", "mxfp8.quantize", "mxfp8.linear"):
        assert counts[op] == 0, (op, cap.graph_after)
    assert counts["staged slices"] == slices
    assert counts["mxfp8.mm"] == gemms


def test_snapshot_range_across_two_slices():
    """Columns [512, 1024): the second half of slice 1 (a column view) and all of slice 2;
    slice 0 is never read."""
    cap = compile_and_check(RangeLinear(512, 1024), *inputs(8))
    assert_expected_inline(
        cap.before[-1][0],
        """\
cat0 = aten.cat([in0, in1, in2], -1)
slice0 = aten.slice(cat0, 1, 512, 1024)
linear0 = mxfp8.linear(slice0, in3, in4, in5)
return [linear0]""",
    )
    assert_expected_inline(
        cap.graph_after,
        """\
empty0 = aten.empty([8, 512], dtype=float8_e4m3fn, device=device(type='cpu'))
empty1 = aten.empty([2048], dtype=uint8, device=device(type='cpu'))
slice0 = aten.slice(in0, 1, 128, 256)
quantize_slices0 = mxfp8.quantize_slices_([slice0, in1], empty0, empty1, [0, 128])
mm0 = mxfp8.mm(empty0, empty1, in2, in3, in4, bfloat16)
return [mm0]""",
    )


def test_snapshot_three_d_dynamic_parts_of_one_slice():
    """Columns [128, 256) of slice 0 alone, leading dims flattened and symbolic."""
    xs = inputs(2, 3)
    for x in xs:
        torch._dynamo.mark_dynamic(x, 0)
        torch._dynamo.mark_dynamic(x, 1)
    cap = compile_and_check(RangeLinear(128, 256), *xs)
    assert_range_rewritten(cap, slices=1)
    assert_expected_inline(
        cap.graph_after,
        """\
sym_size0 = aten.sym_size(in0, 0)
sym_size1 = aten.sym_size(in0, 1)
mul0 = mul(sym_size0, sym_size1)
empty0 = aten.empty([mul0, 128], dtype=float8_e4m3fn, device=device(type='cpu'))
add0 = add(mul0, 127)
floordiv0 = floordiv(add0, 128)
mul1 = mul(floordiv0, 512)
empty1 = aten.empty([mul1], dtype=uint8, device=device(type='cpu'))
reshape0 = aten.reshape(in0, [mul0, 384])
slice0 = aten.slice(reshape0, 1, 128, 256)
quantize_slices0 = mxfp8.quantize_slices_([slice0], empty0, empty1, [0])
mul2 = mul(in1, in2)
mm0 = mxfp8.mm(empty0, empty1, in3, in4, in5, bfloat16)
reshape1 = aten.reshape(mm0, [in6, in2, 64])
return [reshape1]""",
    )


RANGES = [
    pytest.param(0, 512, "index", 2, id="first-two-parts"),
    pytest.param(384, 640, "index", 1, id="exactly-slice-1"),
    pytest.param(256, 768, "index", 3, id="part-whole-part"),
    pytest.param(0, 1024, "narrow", 3, id="whole-by-narrow"),
    pytest.param(640, 1024, "narrow", 1, id="last-slice-by-narrow"),
    pytest.param(128, 1024, "negative", 3, id="negative-bounds"),
]


@pytest.mark.parametrize(("start", "end", "take", "parts"), RANGES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_range_rewritten_bitwise(start, end, take, parts, dtype):
    model = RangeLinear(start, end, take).to(dtype)
    cap = compile_and_check(model, *inputs(16, dtype=dtype))
    assert_range_rewritten(cap, slices=parts)


def test_range_dynamic_token_count_compiles_once():
    model = RangeLinear(256, 768)
    cap = Capture()
    compiled = torch.compile(model, backend=cap)
    with torch.no_grad():
        for tokens in (4, 17, 64, 2):
            xs = inputs(tokens)
            for x in xs:
                torch._dynamo.mark_dynamic(x, 0)
            assert_bitwise(compiled(*xs), model(*xs))
    assert cap.compiles == 1
    assert_range_rewritten(cap, slices=3)


class TwoRanges(nn.Module):
    """Two column ranges of one cat to two linears, and the whole cat to a third."""

    def __init__(self):
        super().__init__()
        self.lo = linear(512, 64, seed=1)
        self.hi = linear(512, 32, seed=2)
        self.all = linear(1024, 16, seed=3)

    def forward(self, *slices):
        x = torch.cat(slices, dim=-1)
        return self.lo(x[:, :512]), self.hi(x[:, 512:]), self.all(x)


def test_several_ranges_of_one_cat_each_staged():
    cap = compile_and_check(TwoRanges(), *inputs(8))
    assert_range_rewritten(cap, slices=2 + 2 + 3, gemms=3)
    assert_expected_inline(
        cap.graph_after,
        """\
empty0 = aten.empty([8, 1024], dtype=float8_e4m3fn, device=device(type='cpu'))
empty1 = aten.empty([4096], dtype=uint8, device=device(type='cpu'))
quantize_slices0 = mxfp8.quantize_slices_([in0, in1, in2], empty0, empty1, [0, 384, 640])
empty2 = aten.empty([8, 512], dtype=float8_e4m3fn, device=device(type='cpu'))
empty3 = aten.empty([2048], dtype=uint8, device=device(type='cpu'))
slice0 = aten.slice(in1, 1, 0, 128)
quantize_slices1 = mxfp8.quantize_slices_([in0, slice0], empty2, empty3, [0, 384])
empty4 = aten.empty([8, 512], dtype=float8_e4m3fn, device=device(type='cpu'))
empty5 = aten.empty([2048], dtype=uint8, device=device(type='cpu'))
slice1 = aten.slice(in1, 1, 128, 256)
quantize_slices2 = mxfp8.quantize_slices_([slice1, in2], empty4, empty5, [0, 128])
mm0 = mxfp8.mm(empty2, empty3, in3, in4, in5, bfloat16)
mm1 = mxfp8.mm(empty4, empty5, in6, in7, in8, bfloat16)
mm2 = mxfp8.mm(empty0, empty1, in9, in10, in11, bfloat16)
return [mm0, mm1, mm2]""",
    )


class RangeQuantizedTwice(nn.Module):
    """``mf.quantize`` of a column range once, two GEMMs from it (the eager API's form)."""

    def __init__(self):
        super().__init__()
        self.fcs = nn.ModuleList(linear(512, 64, seed=i) for i in range(2))

    def forward(self, *slices):
        q = mf.quantize(torch.cat(slices, dim=-1)[:, 256:768])
        return tuple(
            mf.mm_quantized(q, mf.MXFP8Weight(fc.weight_values, fc.weight_scales), bias=fc.bias)
            for fc in self.fcs
        )


def test_range_through_quantize_feeds_every_gemm():
    cap = compile_and_check(RangeQuantizedTwice(), *inputs(8))
    assert_range_rewritten(cap, slices=3, gemms=2)
    (report,) = cap.fusion.reports
    assert report.rewritten and report.consumers == 2


class RangeAlsoReturned(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = linear(512)

    def forward(self, *slices):
        x = torch.cat(slices, dim=-1)[:, 512:]
        return self.fc(x), x


class StridedRange(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = linear(512)

    def forward(self, *slices):
        return self.fc(torch.cat(slices, dim=-1)[:, ::2])


UNCHANGED = [
    pytest.param(
        lambda: RangeLinear(64, 576),
        "columns [64, 576) taken by aten.slice do not start and end at multiples of 128",
        id="range-not-128-aligned",
    ),
    pytest.param(
        RangeAlsoReturned,
        "columns [512, 1024) of the concatenation are also used by the graph output (it is "
        "returned)",
        id="range-returned",
    ),
    pytest.param(
        StridedRange,
        "aten.slice takes columns with step 2; a column range has step 1",
        id="strided-range",
    ),
]


@pytest.mark.parametrize(("make_model", "reason"), UNCHANGED)
def test_non_qualifying_range_left_exactly_unchanged(make_model, reason):
    cap = compile_and_check(make_model(), *inputs(8))
    assert cap.unchanged
    assert cap.fusion.matches == 0 and cap.fusion.skipped == 1
    (report,) = cap.fusion.reports
    assert not report.rewritten
    assert report.reason == reason  # no FX node names: they vary between compiles


def test_explain_reports_range_sites():
    report = mf.explain(RangeLinear(512, 1024), *inputs(8))
    assert len(report.rewritten) == 1 and not report.skipped
    report = mf.explain(RangeLinear(64, 576), *inputs(8))
    (site,) = report.skipped
    assert "do not start and end at multiples of 128" in site.reason
