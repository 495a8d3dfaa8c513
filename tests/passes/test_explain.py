"""``explain``: every candidate site with its outcome or reason, the hints when there is
none, and its argument checks."""

from __future__ import annotations

import logging

import pytest
import torch
from expecttest import assert_expected_inline
from helpers.passes import CatLinear, randn, slices

import mxfp8_fusion as mf
from mxfp8_fusion.passes.fusion import FusionOptions


def test_explain_lists_every_site_with_reasons(caplog):
    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.good = CatLinear(256)
            self.bad = CatLinear(256)

        def forward(self, a, b, c, d):
            return self.good(a, b), self.bad(c, d)

    xs = [*slices(), randn(8, 96, seed=3), randn(8, 160, seed=4)]
    with caplog.at_level(logging.DEBUG, logger="mxfp8_fusion"):
        report = mf.explain(Two(), *xs)
    assert [s.rewritten for s in report.sites] == [True, False]
    assert report.sites[1].reason == "slice 0 has width 96, not a positive multiple of 128"
    text = str(report)
    assert "2 candidate site(s) in 1 graph(s), 1 rewritten, 1 not rewritten" in text
    assert "rewritten (staged quantization)" in text
    assert "not rewritten: slice 0 has width 96, not a positive multiple of 128" in text
    logged = [r.getMessage() for r in caplog.records if r.name.startswith("mxfp8_fusion")]
    assert sum("width 96" in m for m in logged) == 1
    assert sum("rewritten (staged" in m for m in logged) == 1


def test_explain_without_candidates():
    report = mf.explain(torch.nn.Linear(8, 8), torch.randn(2, 8))
    assert report.sites == [] and "0 candidate site(s)" in str(report)
    assert "the model is a bare nn.Linear, which convert does not swap" in str(report)
    assert "weight dtype torch.float32 is not bfloat16 or float16" in str(report)
    assert "no torch.cat in the compiled graph(s)" in str(report)


@pytest.mark.parametrize(
    "options",
    [
        {"max_slices": 1},
        {"mxfp8_fusion.max_slices": 1},
        {"mxfp8_fusion.max_slices": 1, "epilogue_fusion": False},
        FusionOptions(max_slices=1),
    ],
    ids=["bare-key", "prefixed-key", "with-inductor-option", "FusionOptions"],
)
def test_explain_accepts_options_as_dict_or_fusion_options(options):
    report = mf.explain(CatLinear(256), *slices(), options=options)
    (site,) = report.sites
    assert site.reason == "2 slices exceed the pass option max_slices=1"


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        (2, TypeError, "options must be a FusionOptions, a dict or None, got int"),
        ({"max_slices": "8"}, TypeError, "max_slices must be None or an int >= 1, got '8' (str)"),
        (
            {"mxfp8_fusion.enabled": "false"},
            TypeError,
            "mxfp8_fusion.enabled must be True or False, got 'false' (str)",
        ),
        (
            {"max_slices": 2, "mxfp8_fusion.max_slices": 3},
            TypeError,
            "options: 'max_slices' and 'mxfp8_fusion.max_slices' set the same option",
        ),
        (
            {"no_such": 1},
            ValueError,
            "explain: Unexpected optimization option no_such for backend mxfp8_fusion; known "
            "options are Inductor's config keys and mxfp8_fusion.<FusionOptions field>",
        ),
    ],
    ids=["int", "bad-value", "bad-value-prefixed", "twice", "unknown-key"],
)
def test_explain_rejects_bad_options_before_compiling(options, error, message):
    def model(*xs):
        raise AssertionError("not called")

    with pytest.raises(error) as info:
        mf.explain(model, *slices(), options=options)
    assert str(info.value) == message


def test_explain_takes_compile_keywords_and_model_kwargs_apart():
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = CatLinear(256)

        def forward(self, a, b, *, scale=1.0):
            return self.inner(a, b) * scale

    report = mf.explain(
        Scaled(),
        *slices(),
        mode="max-autotune-no-cudagraphs",
        fullgraph=True,
        kwargs={"scale": 2.0},
    )
    assert [s.rewritten for s in report.sites] == [True]
    with pytest.raises(TypeError) as info:
        mf.explain(Scaled(), *slices(), scale=2.0)
    assert str(info.value) == (
        "explain: unexpected keyword argument(s) scale; pass the model's keyword arguments as "
        "kwargs={...} (explain's own keywords are options, mode, dynamic, fullgraph and kwargs)"
    )
    with pytest.raises(ValueError, match="Unrecognized mode=fastest"):
        mf.explain(Scaled(), *slices(), mode="fastest")


def test_explain_counts_the_gemm_of_a_site_left_unchanged():
    class ReturnsCat(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = CatLinear(256)

        def forward(self, a, b):
            x = torch.cat([a, b], -1)
            return self.inner.fc(x), x

    (site,) = mf.explain(ReturnsCat(), *slices()).sites
    assert site.consumers == 1
    assert str(site).splitlines()[0] == (
        "graph 1, cat: cat of 2 bfloat16 slices [128, 128] -> 1 MXFP8 GEMM(s): not rewritten: "
        "the concatenation is also used by the graph output (it is returned)"
    )


class PlainCatLinear(torch.nn.Module):
    """The drafter's projection left as a BF16 nn.Linear (not converted)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(256, 64, dtype=torch.bfloat16)

    def forward(self, a, b):
        return self.fc(torch.cat([a, b], -1))


class BreakBetween(CatLinear):
    def forward(self, *slices):
        x = torch.cat(slices, -1)
        torch._dynamo.graph_break()
        return self.fc(x)


class ScaledCat(CatLinear):
    def forward(self, *slices):
        return self.fc(torch.cat(slices, -1) * 2)


def test_explain_without_candidates_says_why():
    assert_expected_inline(
        str(mf.explain(PlainCatLinear(), *slices())),
        """\
mxfp8_fusion: 0 candidate site(s) in 1 graph(s), 0 rewritten, 0 not rewritten
  no torch.cat reaches an MXFP8 quantize or linear; the compiled program is unchanged. Likely why:
  - no MXFP8 linear in the compiled graph(s): convert the model first with mxfp8_fusion.convert(model) (an nn.Linear is a BF16 GEMM, which the pass leaves alone)""",
    )
    assert_expected_inline(
        str(mf.explain(BreakBetween(256), *slices())),
        """\
mxfp8_fusion: 0 candidate site(s) in 2 graph(s), 0 rewritten, 0 not rewritten
  no torch.cat reaches an MXFP8 quantize or linear; the compiled program is unchanged. Likely why:
  - the torch.cat and the MXFP8 linear are in different graphs (2 compiled): a graph break between them; find it with torch._dynamo.explain(model)(*inputs), or compile with fullgraph=True""",
    )
    assert_expected_inline(
        str(mf.explain(ScaledCat(256), *slices())),
        """\
mxfp8_fusion: 0 candidate site(s) in 1 graph(s), 0 rewritten, 0 not rewritten
  no torch.cat reaches an MXFP8 quantize or linear; the compiled program is unchanged. Likely why:
  - a torch.cat and an MXFP8 linear are in one graph, but the cat does not feed the linear directly: an op other than a reshape between them (a dtype cast, arithmetic, a transpose) hides the site""",
    )


class RepeatedCat(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = CatLinear(384).fc

    def forward(self, x):
        return self.fc(torch.cat([x, x, x], -1))


def test_explain_says_inductor_rewrote_a_repeated_cat():
    """cat([x, x, x]) is traced, then rewritten by Inductor into expand + clone before the
    pass runs: not "no torch.cat"."""
    (hint,) = mf.explain(RepeatedCat(), randn(8, 128)).hints()
    assert hint.startswith("the 1 torch.cat(s) traced are gone from the graph(s) the pass sees")
    assert "expand + clone" in hint


def test_explain_of_the_eager_api_says_it_uses_mxfp8():
    weight = mf.pack_weight(torch.randn(64, 256, dtype=torch.bfloat16))
    out = torch.empty(8, 64, dtype=torch.bfloat16)

    def project(a, b):
        return mf.mm_slices_into([a, b], weight, out)

    (hint,) = mf.explain(project, *slices()).hints()
    assert "call the eager API's MXFP8 ops" in hint and "convert" not in hint
