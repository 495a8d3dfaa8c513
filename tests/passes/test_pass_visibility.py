"""A site left unchanged is visible by default: a warning at the user's line, once per site
and reason, and the same counters and reports when Inductor serves the graph from its
cache."""

import inspect
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
from helpers.passes import NO_CACHE, linear, randn, w8a16

import mxfp8_fusion as mf
from mxfp8_fusion.passes import report
from mxfp8_fusion.passes.fusion import FusionPass
from mxfp8_fusion.passes.report import FusionSkippedWarning


class Narrow(torch.nn.Module):
    """Slices 96 wide: not a multiple of 128, so the site is left unchanged."""

    def __init__(self):
        super().__init__()
        self.fc = linear(192)

    def forward(self, a, b):
        return self.fc(torch.cat([a, b], -1))


_CAT_LINE = inspect.getsourcelines(Narrow.forward)[1] + 1
_REASON = "slice 0 has width 96, not a positive multiple of 128"


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(report, "_warned", set())
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _compile_twice(options=None) -> list[warnings.WarningMessage]:
    xs = [randn(8, 96, seed=i) for i in range(2)]
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        for _ in range(2):
            torch._dynamo.reset()
            with torch._inductor.config.patch(NO_CACHE):
                torch.compile(Narrow(), backend="mxfp8_fusion", options=options)(*xs)
    return [w for w in caught if issubclass(w.category, FusionSkippedWarning)]


def test_skipped_site_warns_once_at_the_users_line():
    (warning,) = _compile_twice()
    assert warning.filename == __file__ and warning.lineno == _CAT_LINE
    assert str(warning.message).endswith(_REASON)
    assert "BF16 concatenation is still materialized" in str(warning.message)


def test_warning_can_be_silenced_per_compile():
    assert _compile_twice({"mxfp8_fusion.warn_skipped": False}) == []
    # it changes no graph, so it is not part of the pass's cache identity
    assert FusionPass(warn_skipped=False).uuid() == FusionPass().uuid()


def test_report_only_pass_and_explain_do_not_warn():
    assert _compile_twice({"mxfp8_fusion.enabled": False}) == []
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        explained = mf.explain(Narrow(), *[randn(8, 96, seed=i) for i in range(2)])
    assert explained.sites[0].reason == _REASON
    assert not [w for w in caught if issubclass(w.category, FusionSkippedWarning)]


class AlsoScaled(torch.nn.Module):
    """The concatenation is also read by a product: the site is left unchanged."""

    def __init__(self):
        super().__init__()
        self.fc = linear(256)

    def forward(self, a, b):
        h = torch.cat([a, b], -1)
        return self.fc(h), h * 2


def test_a_recompile_with_dynamic_tokens_does_not_warn_again():
    """Static tokens, then a recompile with symbolic tokens: the graphs differ (their FX node
    names with them), the site and its reason do not, so it warns once, naming no node."""
    model = AlsoScaled()
    compiled = torch.compile(model, backend="mxfp8_fusion")
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        with torch._inductor.config.patch(NO_CACHE):
            for tokens in (8, 16):  # the second call recompiles with dynamic tokens
                compiled(*[randn(tokens, 128, seed=i) for i in range(2)])
    (warning,) = [w for w in caught if issubclass(w.category, FusionSkippedWarning)]
    assert str(warning.message).endswith("the concatenation is also used by aten.mul")


_TESTS = Path(__file__).resolve().parents[1]  # the helpers package's folder


@pytest.mark.slow
def test_cache_hit_replays_counters_reports_and_warning(tmp_path):
    """Two fresh processes on one Inductor cache: the second is served from the FX graph
    cache, the pass does not run, and it still counts and warns about the site."""
    script = textwrap.dedent(
        """
        import sys, torch
        sys.path[:0] = sys.argv[1:3]  # this folder, and tests/ for the helpers
        from test_pass_visibility import Narrow
        from helpers.passes import randn

        xs = [randn(8, 96, seed=i) for i in range(2)]
        with torch.no_grad():
            torch.compile(Narrow(), backend="mxfp8_fusion")(*xs)
        counters = torch._dynamo.utils.counters
        print(counters["inductor"]["fxgraph_cache_hit"], dict(counters["mxfp8_fusion"]))
        """
    )
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path)}
    runs = [
        subprocess.run(
            [sys.executable, "-c", script, os.path.dirname(__file__), str(_TESTS)],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
        )
        for _ in range(2)
    ]
    for run in runs:
        assert run.returncode == 0, run.stderr[-3000:]
        assert _REASON in run.stderr
    last = [run.stdout.strip().splitlines()[-1] for run in runs]
    assert last[0] == "0 {'sites_skipped': 1}"
    assert last[1] == "1 {'graphs_from_cache': 1, 'sites_skipped': 1}"


class NamedA(torch.nn.Module):
    """Widths 96 and 160: the site is left unchanged."""

    def __init__(self):
        super().__init__()
        self.fc = linear(256)

    def forward(self, a, b):
        return self.fc(torch.cat([a, b], -1))


class NamedB(torch.nn.Module):
    """``NamedA``'s program under other names (module, attribute, arguments)."""

    def __init__(self):
        super().__init__()
        self.proj = linear(256)

    def forward(self, h, e):
        return self.proj(torch.cat([h, e], -1))


@pytest.mark.parametrize("activation", ["mxfp8", "bf16"])
def test_cache_hit_replays_the_report_when_only_names_differ(tmp_path, monkeypatch, activation):
    """Dynamo's graphs differ in their names, Inductor's post-autograd graphs do not: the
    second compile is served from the FX graph cache and still counts and warns, at its own
    line."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    xs = [randn(8, 96, seed=0), randn(8, 160, seed=1)]
    counters = torch._dynamo.utils.counters
    seen = []
    for model in (NamedA(), NamedB()):
        torch._dynamo.reset()
        counters.clear()
        if activation == "bf16":
            w8a16(model)
        with warnings.catch_warnings(record=True) as caught, torch.no_grad():
            warnings.simplefilter("always")
            torch.compile(model, backend="mxfp8_fusion")(*xs)
        skipped = [w for w in caught if issubclass(w.category, FusionSkippedWarning)]
        seen.append((counters["inductor"]["fxgraph_cache_hit"], dict(counters["mxfp8_fusion"])))
        assert len(skipped) == 1 and "slice 0 has width 96" in str(skipped[0].message)
        line = inspect.getsourcelines(type(model).forward)[1] + 1
        assert (skipped[0].filename, skipped[0].lineno) == (__file__, line)
    assert seen[0] == (0, {"sites_skipped": 1})
    assert seen[1] == (1, {"graphs_from_cache": 1, "sites_skipped": 1})


class Wide(torch.nn.Module):
    """Two 128-wide slices: a site the pass rewrites."""

    def __init__(self):
        super().__init__()
        self.fc = linear(256)

    def forward(self, a, b):
        return self.fc(torch.cat([a, b], -1))


@pytest.mark.parametrize("stage", ["analyzing", "rewriting"])
def test_an_internal_error_warns_at_the_users_line(monkeypatch, stage):
    """An error inside the pass leaves the site as it was, and the user sees that the fusion
    did not happen: a FusionSkippedWarning at the cat's line, naming the error."""
    from mxfp8_fusion.passes import pattern, rewrite

    def boom(*args, **kwargs):
        raise RuntimeError("boom")

    if stage == "analyzing":
        monkeypatch.setattr(pattern, "_consumers", boom)
    else:
        monkeypatch.setattr(rewrite, "rewrite", boom)
    xs = [randn(8, 128, seed=i) for i in range(2)]
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        with torch._inductor.config.patch(NO_CACHE):
            torch.compile(Wide(), backend="mxfp8_fusion")(*xs)
    (warning,) = [w for w in caught if issubclass(w.category, FusionSkippedWarning)]
    assert str(warning.message).endswith(f"internal error while {stage} (RuntimeError: boom)")
    line = inspect.getsourcelines(Wide.forward)[1] + 1
    assert (warning.filename, warning.lineno) == (__file__, line)
    assert torch._dynamo.utils.counters["mxfp8_fusion"]["internal_errors"] == 1


def test_an_fp32_cat_is_plainly_not_a_candidate():
    """No "BF16 concatenation" for an FP32 one, and no dtype check's wording: what the pass
    takes, in words."""
    xs = [randn(8, 128, dtype=torch.float32, seed=i) for i in range(2)]
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        with torch._inductor.config.patch(NO_CACHE):
            torch.compile(Wide(), backend="mxfp8_fusion")(*xs)
    (warning,) = [w for w in caught if issubclass(w.category, FusionSkippedWarning)]
    assert str(warning.message) == (
        "mxfp8_fusion: a torch.cat feeding 1 MXFP8 GEMM(s) was left as written: a float32 cat "
        "is not a candidate: the pass stages bfloat16 and float16 slices only"
    )
