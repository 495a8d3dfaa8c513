"""The ``mxfp8_fusion`` backend: entry point, mode/options, composition with a user pass,
``install`` for Inductor setups the user owns, uuid and the FX graph cache (``explain``:
test_explain.py)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch
from helpers.passes import NO_CACHE, CatLinear, assert_bitwise, slices
from torch._dynamo.utils import counters
from torch._inductor.compile_fx import compile_fx
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch._inductor.utils import run_and_get_code

from mxfp8_fusion.passes.fusion import ComposedPass, FusionOptions, FusionPass, compose, install


def run_backend(model, xs, **compile_kwargs):
    """Compile with ``backend="mxfp8_fusion"`` (caches off), check bitwise, return the code."""
    with torch.no_grad(), torch._inductor.config.patch(NO_CACHE):
        expected = model(*xs)
        compiled = torch.compile(model, backend="mxfp8_fusion", **compile_kwargs)
        got, codes = run_and_get_code(compiled, *xs)
    assert_bitwise(got, expected)
    return "\n".join(codes)


class Recorder(CustomGraphPass):
    """A user's own post-grad pass: records that it ran."""

    def __init__(self, tag: str = "v1"):
        self.tag = tag
        self.calls = 0

    def __call__(self, graph):
        self.calls += 1

    def uuid(self):
        return f"recorder-{self.tag}"


# --- backend arguments ----------------------------------------------------------------------


def test_backend_by_name_rewrites():
    code = run_backend(CatLinear(256), slices())
    assert "quantize_slices_" in code
    assert counters["mxfp8_fusion"]["sites_rewritten"] == 1


@pytest.mark.parametrize("mode", ["default", "reduce-overhead", "max-autotune-no-cudagraphs"])
def test_backend_accepts_mode(mode):
    code = run_backend(CatLinear(256), slices(), mode=mode)
    assert "quantize_slices_" in code


def test_backend_accepts_inductor_options():
    code = run_backend(CatLinear(256), slices(), options={"epilogue_fusion": False})
    assert "quantize_slices_" in code


def test_backend_pass_options_through_torch_compile_options():
    xs = slices((128, 128, 128))
    code = run_backend(CatLinear(384), xs, options={"mxfp8_fusion.max_slices": 2})
    assert "quantize_slices_" not in code
    assert counters["mxfp8_fusion"]["sites_skipped"] == 1


def test_a_compile_without_mxfp8_layers_says_convert_first_once(monkeypatch, caplog):
    """Compiling a model that was not converted: one notice naming convert (explain's hint),
    not one per compile; a converted model gets none."""
    from mxfp8_fusion import progress
    from mxfp8_fusion.passes import backend

    monkeypatch.setattr(progress, "_said", set())
    monkeypatch.setattr(backend, "_saw_mxfp8", [False])
    plain = torch.nn.Sequential(torch.nn.Linear(256, 64, dtype=torch.bfloat16))
    x = torch.randn(8, 256, dtype=torch.bfloat16)
    with caplog.at_level(logging.INFO, logger="mxfp8_fusion"):
        run_backend(CatLinear(256), slices())
        assert not [m for m in caplog.messages if "nothing to rewrite" in m]
        monkeypatch.setattr(backend, "_saw_mxfp8", [False])
        for _ in range(2):
            torch._dynamo.reset()
            run_backend(plain, [x])
    said = [m for m in caplog.messages if "nothing to rewrite" in m]
    assert len(said) == 1 and "mxfp8_fusion.convert(model)" in said[0]


def test_a_compile_of_the_eager_api_does_not_say_convert_first(monkeypatch, caplog):
    """A function calling mm_slices_into does use MXFP8 (an op of the eager API): no notice
    that the graph holds no MXFP8 linear."""
    import mxfp8_fusion as mf
    from mxfp8_fusion import progress
    from mxfp8_fusion.passes import backend

    monkeypatch.setattr(progress, "_said", set())
    monkeypatch.setattr(backend, "_saw_mxfp8", [False])
    weight = mf.pack_weight(torch.randn(64, 256, dtype=torch.bfloat16))
    out = torch.empty(8, 64, dtype=torch.bfloat16)

    def project(a, b):
        return mf.mm_slices_into([a, b], weight, out)

    with caplog.at_level(logging.INFO, logger="mxfp8_fusion"), torch.no_grad():
        with torch._inductor.config.patch(NO_CACHE):
            torch.compile(project, backend="mxfp8_fusion")(*slices())
    assert not [m for m in caplog.messages if "nothing to rewrite" in m]


def test_backend_rejects_unknown_option():
    compiled = torch.compile(CatLinear(256), backend="mxfp8_fusion", options={"no_such": 1})
    with pytest.raises(Exception, match="Unexpected optimization option no_such"):
        compiled(*slices())


def test_backend_keeps_user_post_pass():
    user = Recorder()
    with torch._inductor.config.patch(post_grad_custom_post_pass=user):
        code = run_backend(CatLinear(256), slices())
        assert torch._inductor.config.post_grad_custom_post_pass is user  # not replaced
    assert user.calls == 1
    assert "quantize_slices_" in code


def test_backend_keeps_user_post_pass_given_in_options():
    user = Recorder()
    code = run_backend(CatLinear(256), slices(), options={"post_grad_custom_post_pass": user})
    assert user.calls == 1 and "quantize_slices_" in code


BAD_OPTIONS = [
    pytest.param(
        {"enabled": "false"},
        TypeError,
        "enabled must be True or False, got 'false' (str)",
        id="enabled-str",
    ),
    pytest.param(
        {"enabled": 0}, TypeError, "enabled must be True or False, got 0 (int)", id="enabled-int"
    ),
    pytest.param(
        {"enabled": None},
        TypeError,
        "enabled must be True or False, got None (NoneType)",
        id="enabled-none",
    ),
    pytest.param(
        {"max_slices": "8"},
        TypeError,
        "max_slices must be None or an int >= 1, got '8' (str)",
        id="max-str",
    ),
    pytest.param(
        {"max_slices": 1.5},
        TypeError,
        "max_slices must be None or an int >= 1, got 1.5 (float)",
        id="max-float",
    ),
    pytest.param(
        {"max_slices": True},
        TypeError,
        "max_slices must be None or an int >= 1, got True (bool)",
        id="max-bool",
    ),
    pytest.param(
        {"max_slices": -1},
        ValueError,
        "max_slices must be None or an int >= 1, got -1 (to leave every site unchanged, set enabled to False)",
        id="max-negative",
    ),
    pytest.param(
        {"max_slices": 0},
        ValueError,
        "max_slices must be None or an int >= 1, got 0 (to leave every site unchanged, set enabled to False)",
        id="max-zero",
    ),
]


@pytest.mark.parametrize(("fields", "error", "message"), BAD_OPTIONS)
def test_pass_options_checked_when_built(fields, error, message):
    with pytest.raises(error) as info:
        FusionOptions(**fields)
    assert str(info.value) == message
    with pytest.raises(error, match=re.escape(message)):
        FusionPass(**fields)
    with pytest.raises(error, match=re.escape(message)):
        install({}, **fields)


@pytest.mark.parametrize(
    "fields", [{}, {"enabled": False}, {"max_slices": 1}, {"max_slices": None}]
)
def test_pass_options_accept_their_values(fields):
    assert dataclasses.asdict(FusionOptions(**fields)) == {
        **dataclasses.asdict(FusionOptions()),
        **fields,
    }


@pytest.mark.parametrize(("fields", "error", "message"), BAD_OPTIONS)
def test_backend_names_bad_pass_option_as_written(fields, error, message):
    """Through ``torch.compile(options=...)`` the error names ``mxfp8_fusion.<field>``; Dynamo
    wraps what a backend raises, with the original as ``inner_exception``."""
    ((name, value),) = fields.items()
    options = {f"mxfp8_fusion.{name}": value}
    compiled = torch.compile(CatLinear(256), backend="mxfp8_fusion", options=options)
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as info:
        with torch.no_grad():
            compiled(*slices())
    assert isinstance(info.value.inner_exception, error)
    assert str(info.value.inner_exception) == f"mxfp8_fusion.{message}"


def test_backend_rejects_unknown_pass_option():
    options = {"mxfp8_fusion.max_slice": 2}
    compiled = torch.compile(CatLinear(256), backend="mxfp8_fusion", options=options)
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as info:
        compiled(*slices())
    assert isinstance(info.value.inner_exception, TypeError)
    assert str(info.value.inner_exception) == (
        "options: unknown pass option 'mxfp8_fusion.max_slice' (did you mean "
        "'mxfp8_fusion.max_slices'?); the pass options are "
        "mxfp8_fusion.enabled, mxfp8_fusion.max_slices, mxfp8_fusion.warn_skipped"
    )


# --- install / compose / uuid ---------------------------------------------------------------


def test_install_into_config_dict_for_own_compile_fx():
    user = Recorder()
    config = {"post_grad_custom_post_pass": user, **NO_CACHE}
    fusion = install(config)
    install(config, fusion)  # installing again does not run the pass twice
    composed = config["post_grad_custom_post_pass"]
    assert isinstance(composed, ComposedPass) and composed.passes == (user, fusion)

    model, xs = CatLinear(256), slices()

    def own_backend(gm, example_inputs):  # what a serving engine owning compile_fx does
        return compile_fx(gm, example_inputs, config_patches=config)

    with torch.no_grad():
        assert_bitwise(torch.compile(model, backend=own_backend)(*xs), model(*xs))
    assert fusion.matches == 1 and user.calls == 1


def test_install_globally():
    with torch._inductor.config.patch(post_grad_custom_post_pass=None, **NO_CACHE):
        fusion = install(max_slices=8)
        assert torch._inductor.config.post_grad_custom_post_pass is fusion
        model, xs = CatLinear(256), slices()
        with torch.no_grad():
            assert_bitwise(torch.compile(model)(*xs), model(*xs))
    assert fusion.matches == 1


def test_pass_pickles_and_keeps_its_uuid():
    import pickle

    fusion = FusionPass(max_slices=3)
    assert pickle.loads(pickle.dumps(fusion)).uuid() == fusion.uuid()


def test_uuid_covers_options_and_composition():
    default = FusionPass().uuid()
    assert default == FusionPass(FusionOptions()).uuid()
    assert FusionPass(max_slices=4).uuid() != default
    assert FusionPass(enabled=False).uuid() != default
    composed = compose(Recorder("v1"), FusionPass()).uuid()
    assert composed not in (None, default)
    assert compose(Recorder("v2"), FusionPass()).uuid() != composed
    assert compose(lambda g: None, FusionPass()).uuid() is None  # a plain callable: no caching


# --- fresh processes ------------------------------------------------------------------------

_CACHE_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    from torch import nn
    from torch._dynamo.utils import counters
    from torch._inductor.utils import run_and_get_code
    from mxfp8_fusion.nn import MXFP8Linear

    torch.manual_seed(0)
    fc = MXFP8Linear.from_linear(nn.Linear(256, 64, dtype=torch.bfloat16))
    def f(a, b):
        return fc(torch.cat([a, b], -1))
    a, b = (torch.randn(8, 128, dtype=torch.bfloat16) for _ in range(2))
    options = json.loads(sys.argv[1]) or None
    with torch.no_grad():
        out, code = run_and_get_code(
            torch.compile(f, backend="mxfp8_fusion", options=options), a, b
        )
        same = torch.equal(out.view(torch.int16), f(a, b).view(torch.int16))
    print(json.dumps({
        "rewritten": "quantize_slices_" in "".join(code),
        "fx_hit": counters["inductor"]["fxgraph_cache_hit"]
        + counters["aot_autograd"]["autograd_cache_hit"] > 0,
        "pass_ran": counters["mxfp8_fusion"]["sites_rewritten"]
        + counters["mxfp8_fusion"]["sites_skipped"]
        - counters["mxfp8_fusion"]["graphs_from_cache"],
        "replayed": counters["mxfp8_fusion"]["graphs_from_cache"],
        "bitwise": same,
    }))
    """
)


def _run(script: str, *args: str, env: dict | None = None) -> str:
    result = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout


@pytest.mark.slow
def test_fx_graph_cache_serves_rewritten_program_in_new_process(tmp_path):
    env = {
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
    }
    first = json.loads(_run(_CACHE_SCRIPT, "{}", env=env).splitlines()[-1])
    second = json.loads(_run(_CACHE_SCRIPT, "{}", env=env).splitlines()[-1])
    miss = {"rewritten": True, "fx_hit": False, "pass_ran": 1, "replayed": 0, "bitwise": True}
    assert first == miss
    # the pass does not run on a hit; its stored report is replayed (counted once)
    assert second == {**miss, "fx_hit": True, "pass_ran": 0, "replayed": 1}
    # Other pass options -> another uuid -> a cache miss; the pass runs and skips the site.
    opts = json.dumps({"mxfp8_fusion.max_slices": 1})
    third = json.loads(_run(_CACHE_SCRIPT, opts, env=env).splitlines()[-1])
    assert third == {**miss, "rewritten": False}


@pytest.mark.slow
def test_backend_by_name_without_importing_the_package():
    script = textwrap.dedent(
        """
        import sys
        import torch
        assert "mxfp8_fusion" not in sys.modules
        f = torch.compile(lambda a, b: (torch.cat([a, b], -1) * 2), backend="mxfp8_fusion")
        a, b = torch.randn(4, 8), torch.randn(4, 8)
        assert torch.equal(f(a, b), (torch.cat([a, b], -1) * 2))
        # The entry point imported the package (and its ops): an MXFP8 model now compiles
        # with the backend found by name, and its cat site is rewritten.
        from torch import nn
        from torch._dynamo.utils import counters
        from mxfp8_fusion.nn import MXFP8Linear
        fc = MXFP8Linear.from_linear(nn.Linear(256, 64, dtype=torch.bfloat16))
        g = torch.compile(lambda a, b: fc(torch.cat([a, b], -1)), backend="mxfp8_fusion")
        x, y = (torch.randn(8, 128, dtype=torch.bfloat16) for _ in range(2))
        with torch._inductor.config.patch(fx_graph_cache=False, force_disable_caches=True):
            same = torch.equal(g(x, y), fc(torch.cat([x, y], -1)))
        print("ok", "mxfp8_fusion" in sys.modules, same, counters["mxfp8_fusion"]["sites_rewritten"])
        """
    )
    assert _run(script).split()[-4:] == ["ok", "True", "True", "1"]


# --- CUDA -----------------------------------------------------------------------------------


@pytest.mark.gpu
def test_reduce_overhead_with_fresh_kernel_buffers():
    """mode="reduce-overhead" on the GPU kernels whose per-stream buffers are first made
    during cudagraph trees' warm-up, which sends the thread's allocations to the graph's
    private pool: kept buffers must come from outside it (a kept one inside failed the
    pool's check: "tensors in the cudagraph pool not tracked as outputs")."""
    from mxfp8_fusion.kernels.gemm_sm90.host import buffers as gemm_sm90_buffers

    gemm_sm90_buffers.kept_buffers.clear()
    model = CatLinear(512, n=256).cuda()
    for tokens in (300, 16):  # the tiled kernel's references, the swap-AB workspace
        xs = [x.cuda() for x in slices((256, 256), tokens=tokens)]
        with torch.no_grad(), torch._inductor.config.patch(NO_CACHE):
            expected = model(*xs)
            compiled = torch.compile(model, backend="mxfp8_fusion", mode="reduce-overhead")
            for _ in range(3):
                got = compiled(*xs).clone()
        assert_bitwise(got, expected)
        torch._dynamo.reset()
