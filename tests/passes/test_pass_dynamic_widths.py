"""Slice widths Dynamo made symbolic are specialized with a guard, so a second model of the
same class is rewritten too, and a site left unchanged reports its real reason."""

import pytest
import torch
from helpers.passes import NO_CACHE, Capture, CatLinear, assert_bitwise, randn, w8a16

import mxfp8_fusion as mf
from mxfp8_fusion.passes import report as report_module
from mxfp8_fusion.passes.report import FusionSkippedWarning


@pytest.fixture(autouse=True)
def fresh_dynamo():
    # automatic dynamic shapes remember sizes per code object for the whole process
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _slices(width: int, tokens: int = 8) -> list[torch.Tensor]:
    return [randn(tokens, width, seed=i) for i in range(3)]


def test_second_model_of_a_class_is_rewritten():
    """CatLinear(768) then CatLinear(1536), CatLinear(3072): from the second on, Dynamo
    traces the widths as symbols; each site is still rewritten, one compile per width."""
    captures = []
    for width in (256, 512, 1024):
        model = CatLinear(3 * width)
        xs = _slices(width)
        cap = Capture()
        with torch.no_grad():
            assert_bitwise(torch.compile(model, backend=cap)(*xs), model(*xs))
        captures.append(cap)
    for cap in captures:
        assert [r.rewritten for r in cap.fusion.reports] == [True], cap.fusion.reports
    assert [r.widths for r in captures[-1].fusion.reports] == [(1024, 1024, 1024)]


def test_specialized_width_guards_recompile():
    """The guard on a specialized width holds: the compiled program is reused for its width
    and a call with another width compiles again (and is rewritten again)."""
    model = CatLinear(3 * 256)
    other = CatLinear(3 * 512)
    cap = Capture()
    with torch.no_grad():
        torch.compile(model, backend=cap)(*_slices(256))
        compiled = torch.compile(other, backend=cap)
        compiled(*_slices(512))  # the widths are symbolic here
        compiles = cap.compiles
        assert_bitwise(compiled(*_slices(512, tokens=8)), other(*_slices(512, tokens=8)))
        assert cap.compiles == compiles
    assert [r.rewritten for r in cap.fusion.reports] == [True, True]


def test_explain_gives_the_real_reason_after_widths_went_symbolic():
    """After other widths were compiled, a site whose widths are not multiples of 128 (or
    that has too many slices) is reported for that, not for being symbolic."""
    with torch.no_grad():
        torch.compile(CatLinear(3 * 256), backend=Capture())(*_slices(256))
        report = mf.explain(CatLinear(3 * 160), *_slices(160))
        assert report.sites[0].reason == "slice 0 has width 160, not a positive multiple of 128"
        report = mf.explain(CatLinear(3 * 384), *_slices(384), options={"max_slices": 2})
        assert report.sites[0].reason == "3 slices exceed the pass option max_slices=2"


@pytest.mark.parametrize("activation", ["mxfp8", "bf16"])
def test_a_width_marked_dynamic_is_left_unchanged_and_the_compile_succeeds(activation, monkeypatch):
    """``mark_dynamic`` on the slices' widths: specializing them would fail the whole compile
    (Dynamo's ConstraintViolationError at its guard check); the site is left unchanged with
    the reason, and the compile goes on, as it does with plain Inductor. W8A8 and W8A16
    alike."""
    monkeypatch.setattr(report_module, "_warned", set())  # it warns once per line and reason
    model, xs = CatLinear(2 * 128), _slices(128)[:2]
    if activation == "bf16":
        w8a16(model)
    for x in xs:
        torch._dynamo.mark_dynamic(x, 1)
    with torch.no_grad(), torch._inductor.config.patch(NO_CACHE):
        compiled = torch.compile(model, backend="mxfp8_fusion")
        with pytest.warns(FusionSkippedWarning, match="slice 0's width is marked dynamic"):
            assert_bitwise(compiled(*xs), model(*xs))
        report = mf.explain(model, *xs)
    assert report.sites[0].reason.startswith("slice 0's width is marked dynamic")
