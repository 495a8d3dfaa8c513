"""The pass on W8A16 sites: ``fc(cat(slices, -1))`` with a W8A16 MXFP8 linear (16-bit
activations, ``MXFP8Linear(activation="bf16")``) becomes ``mxfp8.mm_slices`` on the slices
themselves: no concatenation, no storage, no quantization; bitwise equal to eager."""

from __future__ import annotations

import functools
import re

import pytest
import torch
from expecttest import assert_expected_inline
from helpers.passes import (
    NO_CACHE,
    Capture,
    CatLinear,
    SharedCat,
    ViewSlices,
    assert_bitwise,
    assert_left_unchanged,
    linear,
    randn,
    slices,
    w8a16,
)
from test_pass import ReturnsCat, compile_and_check
from test_pass_column_range import RANGES, RangeLinear, TwoRanges, inputs
from torch import nn
from torch._inductor.utils import run_and_get_code

import mxfp8_fusion as mf

ABSENT = ("aten.cat", "aten.empty", "mxfp8.quantize", "mxfp8.quantize_slices_")
ABSENT += ("mxfp8.linear", "mxfp8.linear_w8a16", "mxfp8.mm")


def assert_read_from_slices(cap: Capture, slices: int, gemms: int = 1) -> None:
    """One site rewritten; its W8A16 GEMMs read ``slices`` sources, with no storage."""
    assert cap.fusion.matches == 1 and cap.fusion.skipped == 0
    counts = cap.counts_after
    for op in ABSENT:
        assert counts[op] == 0, (op, cap.graph_after)
    assert counts["mxfp8.mm_slices"] == gemms
    assert counts["read slices"] == slices
    (report,) = cap.fusion.reports
    assert report.rewritten and report.consumers == report.w8a16 == gemms


# --- rewritten sites ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("widths", [[128, 128], [128, 256, 128], [256] * 6])
def test_w8a16_drafter_reads_the_slices(widths, dtype):
    model = w8a16(CatLinear(sum(widths))).to(dtype)
    xs = [randn(8, w, dtype=dtype, seed=i) for i, w in enumerate(widths)]
    cap = compile_and_check(model, *xs)
    assert_read_from_slices(cap, slices=len(widths))


def test_snapshot_six_slices():
    """The drafter's ``fc(cat(h1, ..., h6))``: one GEMM reading the six slices."""
    cap = compile_and_check(w8a16(CatLinear(6 * 128)), *slices([128] * 6))
    assert_expected_inline(
        cap.before[-1][0],
        """\
cat0 = aten.cat([in0, in1, in2, in3, in4, in5], -1)
linear_w8a160 = mxfp8.linear_w8a16(cat0, in6, in7, in8)
return [linear_w8a160]""",
    )
    assert_expected_inline(
        cap.graph_after,
        """\
mm_slices0 = mxfp8.mm_slices([in0, in1, in2, in3, in4, in5], in6, in7, in8)
return [mm_slices0]""",
    )
    assert_read_from_slices(cap, slices=6)


def test_snapshot_three_d_slices_dynamic():
    """Leading dims flattened by reshapes to a symbolic token count, kept symbolic."""
    xs = [randn(2, 3, 128, seed=i) for i in range(3)]
    cap = compile_and_check(w8a16(CatLinear(384)), *xs, dynamic=True)
    assert_read_from_slices(cap, slices=3)
    assert_expected_inline(
        cap.graph_after,
        """\
sym_size0 = aten.sym_size(in0, 0)
sym_size1 = aten.sym_size(in0, 1)
mul0 = mul(sym_size0, sym_size1)
reshape0 = aten.reshape(in0, [mul0, 128])
reshape1 = aten.reshape(in1, [mul0, 128])
reshape2 = aten.reshape(in2, [mul0, 128])
mm_slices0 = mxfp8.mm_slices([reshape0, reshape1, reshape2], in3, in4, in5)
reshape3 = aten.reshape(mm_slices0, [in6, in7, 64])
return [reshape3]""",
    )


def test_view_slices_of_one_tensor():
    cap = compile_and_check(w8a16(ViewSlices([(0, 128), (256, 512), (128, 256)])), randn(16, 640))
    assert_read_from_slices(cap, slices=3)
    assert cap.counts_after["aten.slice"] == 3


@pytest.mark.parametrize("how", ["mark_dynamic", "dynamic=True"])
def test_dynamic_token_count_compiles_once(how):
    model = w8a16(CatLinear(384))
    cap = Capture()
    compiled = torch.compile(model, backend=cap, dynamic=True if how == "dynamic=True" else None)
    with torch.no_grad():
        for tokens in (4, 17, 64, 2):  # 1 would be specialized by Dynamo (0/1 rule)
            xs = [randn(tokens, w, seed=tokens + i) for i, w in enumerate((128, 128, 128))]
            if how == "mark_dynamic":
                for x in xs:
                    torch._dynamo.mark_dynamic(x, 0)
            assert_bitwise(compiled(*xs), model(*xs))
    assert cap.compiles == 1
    assert_read_from_slices(cap, slices=3)


@pytest.mark.parametrize(("start", "end", "take", "parts"), RANGES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_column_range_reads_the_parts(start, end, take, parts, dtype):
    model = w8a16(RangeLinear(start, end, take)).to(dtype)
    cap = compile_and_check(model, *inputs(16, dtype=dtype))
    assert_read_from_slices(cap, slices=parts)


def test_snapshot_column_range_across_two_slices():
    """Columns [512, 1024): the second half of slice 1 (a column view) and all of slice 2."""
    cap = compile_and_check(w8a16(RangeLinear(512, 1024)), *inputs(8))
    assert_expected_inline(
        cap.graph_after,
        """\
slice0 = aten.slice(in0, 1, 128, 256)
mm_slices0 = mxfp8.mm_slices([slice0, in1], in2, in3, in4)
return [mm_slices0]""",
    )


# --- W8A8 and W8A16 sinks of one cat --------------------------------------------------------


def test_one_cat_feeds_a_w8a8_and_a_w8a16_linear():
    """The W8A8 linear is staged as ever; the W8A16 one reads the slices; no cat remains."""
    cap = compile_and_check(w8a16(SharedCat(256), "b"), *slices())
    assert cap.fusion.matches == 1 and cap.fusion.skipped == 0
    assert_expected_inline(
        cap.graph_after,
        """\
empty0 = aten.empty([8, 256], dtype=float8_e4m3fn, device=device(type='cpu'))
empty1 = aten.empty([1024], dtype=uint8, device=device(type='cpu'))
quantize_slices0 = mxfp8.quantize_slices_([in0, in1], empty0, empty1, [0, 128])
mm0 = mxfp8.mm(empty0, empty1, in2, in3, in4, bfloat16)
mm_slices0 = mxfp8.mm_slices([in0, in1], in5, in6, in7)
return [mm0, mm_slices0]""",
    )
    (report,) = cap.fusion.reports
    assert (report.consumers, report.w8a16) == (2, 1)


def test_ranges_of_one_cat_staged_and_read():
    """Two W8A8 ranges staged each; the W8A16 projection of the whole cat reads the slices."""
    cap = compile_and_check(w8a16(TwoRanges(), "all"), *inputs(8))
    assert cap.fusion.matches == 1
    counts = cap.counts_after
    assert counts["aten.cat"] == 0 and counts["aten.empty"] == 4
    assert counts["mxfp8.quantize_slices_"] == 2 and counts["staged slices"] == 4
    assert counts["mxfp8.mm"] == 2 and counts["mxfp8.mm_slices"] == 1
    assert counts["read slices"] == 3


# --- the generated code ---------------------------------------------------------------------


@pytest.mark.parametrize("views", [False, True], ids=["inputs", "column-views"])
def test_generated_code_passes_the_slices_as_they_are(views):
    """Inductor hands ``mm_slices`` the slices where they are (column views of a wider
    tensor as strided views, not copies), and allocates nothing of the concatenation's size:
    no buffer at all but the GEMM's output, which the op makes."""
    tokens, ranges = 24, [(0, 128), (256, 512), (128, 256)]
    if views:
        model = w8a16(ViewSlices(ranges))
        xs = [randn(tokens, 640)]
    else:
        model = w8a16(CatLinear(512))
        xs = [randn(tokens, b - a, seed=i) for i, (a, b) in enumerate(ranges)]
    with torch.no_grad(), torch._inductor.config.patch(NO_CACHE):
        expected = model(*xs)
        got, codes = run_and_get_code(torch.compile(model, backend="mxfp8_fusion"), *xs)
    assert_bitwise(got, expected)
    code = "\n".join(codes)
    (call,) = re.findall(r"torch\.ops\.mxfp8\.mm_slices\.default\(\[([^\]]*)\]", code)
    if views:
        assert call == ", ".join(
            f"reinterpret_tensor(arg0_1, ({tokens}, {b - a}), (640, 1), {a})" for a, b in ranges
        )
    else:
        assert call == "arg0_1, arg1_1, arg2_1"
    assert not re.search(r"empty_strided_\w+\(\(", code), code  # no buffer allocated
    assert not re.search(r"def kernel|cpp_fused|triton_", code), code  # no copy kernel
    assert "ops.mxfp8.linear" not in code and "ops.mxfp8.quantize" not in code


@pytest.mark.parametrize("mode", ["default", "reduce-overhead", "max-autotune-no-cudagraphs"])
def test_backend_modes(mode):
    model, xs = w8a16(CatLinear(256)), slices()
    with torch.no_grad(), torch._inductor.config.patch(NO_CACHE):
        expected = model(*xs)
        compiled = torch.compile(model, backend="mxfp8_fusion", mode=mode)
        got, codes = run_and_get_code(compiled, *xs)
    assert_bitwise(got, expected)
    assert "mm_slices" in "\n".join(codes)
    counters = torch._dynamo.utils.counters["mxfp8_fusion"]
    assert counters["sites_rewritten"] == counters["w8a16_gemms_from_slices"] == 1


# --- sites left unchanged -------------------------------------------------------------------


UNCHANGED = [
    pytest.param(
        lambda: w8a16(CatLinear(128)),
        lambda: [randn(8, 64), randn(8, 64, seed=1)],
        "slice 0 has width 64, not a positive multiple of 128",
        id="width-64",
    ),
    pytest.param(
        lambda: w8a16(CatLinear(256)),  # BF16 + FP16 promote to FP32, which W8A16 takes
        lambda: [randn(8, 128), randn(8, 128, dtype=torch.float16, seed=1)],
        "the slices have mixed dtypes (bfloat16, float16)",
        id="mixed-dtypes",
    ),
    pytest.param(
        lambda: w8a16(ReturnsCat()),
        slices,
        "the concatenation is also used by the graph output (it is returned)",
        id="cat-returned",
    ),
]


@pytest.mark.parametrize(("make_model", "make_inputs", "reason"), UNCHANGED)
def test_non_qualifying_site_left_exactly_unchanged(make_model, make_inputs, reason):
    report = assert_left_unchanged(compile_and_check(make_model(), *make_inputs()), reason)
    assert report.w8a16 == 1  # counted although the decision stopped early
    assert f"-> 1 W8A16 MXFP8 GEMM(s): not rewritten: {reason}" in str(report)


def test_max_slices_option_leaves_site_unchanged():
    xs = slices((128, 128, 128))
    options = mf.FusionOptions(max_slices=2)
    cap = compile_and_check(w8a16(CatLinear(384)), *xs, options=options)
    assert cap.unchanged
    assert cap.fusion.reports[0].reason == "3 slices exceed the pass option max_slices=2"


def test_failed_rewrite_leaves_graph_unchanged(monkeypatch):
    """An error while building the W8A16 GEMM (after the cat's W8A8 storage was built)
    removes every node the rewrite added: the graph is as it was, the compile goes on."""
    from mxfp8_fusion.passes import rewrite

    real = rewrite._Builder.call

    def broken(self, target, *args, **kwargs):
        if target == torch.ops.mxfp8.mm_slices.default:
            raise RuntimeError("boom")
        return real(self, target, *args, **kwargs)

    monkeypatch.setattr(rewrite._Builder, "call", broken)
    cap = compile_and_check(w8a16(SharedCat(256), "b"), *slices())
    assert cap.unchanged and cap.fusion.matches == 0
    assert cap.fusion.reports[0].reason == "internal error while rewriting (RuntimeError: boom)"


# --- what the pass reports ------------------------------------------------------------------


class FourSites(nn.Module):
    """A W8A8 site, a W8A16 site, a cat feeding one of each, and a W8A16 site left unchanged
    (slices 64 wide)."""

    def __init__(self):
        super().__init__()
        self.w8a8 = linear(256, seed=1)
        self.w8a16 = w8a16(linear(256, seed=2))
        self.both = nn.ModuleList([linear(256, seed=3), w8a16(linear(256, seed=4))])
        self.narrow = w8a16(linear(128, seed=5))

    def forward(self, a, b, c, d, e):
        both = torch.cat([a, c], -1)
        return (
            self.w8a8(torch.cat([a, b], -1)),
            self.w8a16(torch.cat([b, c], -1)),
            *(fc(both) for fc in self.both),
            self.narrow(torch.cat([d, e], -1)),
        )


def test_explain_says_how_each_site_was_rewritten():
    report = mf.explain(FourSites(), *slices(), randn(8, 128, seed=2), *slices((64, 64)))
    lines = [str(report).splitlines()[0], *(str(s).splitlines()[0] for s in report.sites)]
    assert_expected_inline(
        "\n".join(lines),
        """\
mxfp8_fusion: 4 candidate site(s) in 1 graph(s), 3 rewritten, 1 not rewritten
graph 1, cat_1: cat of 2 bfloat16 slices [128, 128] -> 1 MXFP8 GEMM(s): rewritten (staged quantization)
graph 1, cat_2: cat of 2 bfloat16 slices [128, 128] -> 1 W8A16 MXFP8 GEMM(s): rewritten (W8A16: the GEMM(s) read the slices, no storage)
graph 1, cat: cat of 2 bfloat16 slices [128, 128] -> 2 MXFP8 GEMM(s) (1 W8A8, 1 W8A16): rewritten (staged quantization for the W8A8 GEMM(s); the W8A16 GEMM(s) read the slices, no storage)
graph 1, cat_3: cat of 2 bfloat16 slices [64, 64] -> 1 W8A16 MXFP8 GEMM(s): not rewritten: slice 0 has width 64, not a positive multiple of 128""",
    )
    assert [(s.consumers, s.w8a16) for s in report.sites] == [(1, 0), (1, 1), (2, 1), (1, 1)]


def test_cache_hit_replays_the_w8a16_report(tmp_path):
    """Compiled twice on one Inductor cache: the second compile is served from it, so the
    pass does not run, and its stored report (W8A16 count included) is replayed."""
    from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir

    from mxfp8_fusion.passes.backend import mxfp8_fusion_backend
    from mxfp8_fusion.passes.fusion import FusionPass

    model, xs = w8a16(SharedCat(256)), slices()
    runs = []
    with temporary_cache_dir(str(tmp_path)), torch.no_grad():
        for _ in range(2):
            torch._dynamo.reset()
            fusion = FusionPass()
            backend = functools.partial(mxfp8_fusion_backend, fusion=fusion)
            assert_bitwise(torch.compile(model, backend=backend)(*xs), model(*xs))
            runs.append((fusion.cached_graphs, fusion.reports))
    (first, fresh), (second, replayed) = runs
    assert (first, second) == (0, 1)
    assert replayed == fresh and fresh[0].rewritten and fresh[0].w8a16 == 2
    assert torch._dynamo.utils.counters["mxfp8_fusion"]["w8a16_gemms_from_slices"] == 4
