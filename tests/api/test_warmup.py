"""mxfp8_fusion.warmup on the CPU: which builds a projection needs, bad arguments, the
command line, and the parallel compile into the kernel cache (``CUTE_DSL_ARCH``)."""

import importlib.util
import logging
import subprocess
import sys

import pytest
import torch

import mxfp8_fusion as mf
from mxfp8_fusion import kernel_warmup, progress

H200 = ((9, 0), 132, "NVIDIA H200")


def test_capture_sizes_are_vllms_defaults():
    sizes = kernel_warmup.capture_sizes(512)
    assert sizes[:4] == [1, 2, 4, 8] and sizes[-1] == 512 and len(sizes) == 67
    assert kernel_warmup.capture_sizes(6) == [1, 2, 4]


def test_a_drafter_projection_needs_a_handful_of_builds():
    from mxfp8_fusion.kernels.gemm_sm90.host import buffers
    from mxfp8_fusion.kernels.quantize import host as qs

    projection = kernel_warmup._projection((4096, [4096] * 3), torch.bfloat16, None)
    builds = kernel_warmup.builds_for(projection, kernel_warmup.capture_sizes(), *H200)
    kinds = [b.kind for b in builds]
    assert kinds.count("quantizer") == 1 and 3 <= kinds.count("gemm") <= 12
    assert builds[0] == qs.build_of(qs.config_of(False, 4096, 3, "sm_90a"))
    assert len(set(builds)) == len(builds)
    assert {buffers.refs_build(12288), buffers.tokens_build(12288)} & set(builds)


def test_unequal_slices_and_other_gpus():
    projection = kernel_warmup._projection((256, [128, 256]), torch.float16, torch.float32)
    on_h200 = kernel_warmup.builds_for(projection, [1, 300], *H200)
    quantizers = [b.facts[0] for b in on_h200 if b.kind == "quantizer"]
    assert sorted(c.width for c in quantizers) == [128, 256] and all(c.fp16 for c in quantizers)
    # Blackwell: the quantizer is built for it, the GEMM is cuBLAS's (nothing to compile)
    on_b200 = kernel_warmup.builds_for(projection, [1, 300], (10, 0), 148, "NVIDIA B200")
    assert {b.kind for b in on_b200} == {"quantizer"} and on_b200[0].arch == "sm_100a"
    assert kernel_warmup.builds_for(projection, [1], (8, 0), 108, "NVIDIA A100") == []


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(projections=[(4096, 4096)], dtype=torch.float32), TypeError, "^dtype:"),
        (dict(projections=[(4096, 4096)], tokens=[0]), ValueError, "^tokens:"),
        (dict(projections=[(4096, 4096)], tokens=[True]), ValueError, "^tokens:"),
        (dict(projections=[(4096, 4096)], bias_dtype=torch.int8), TypeError, "^bias_dtype:"),
        (dict(projections=[(4096, 4096)], max_tokens=0), ValueError, "^max_tokens:"),
        (dict(projections=[4096]), TypeError, "^projections:"),
        (dict(projections=[(4096, -1)]), ValueError, "^projections:"),
        (dict(projections=3), TypeError, "^projections:"),
        (dict(projections=[(4096, 4096)], workers=0), ValueError, "^workers:"),
        (dict(projections=[(4096, [])]), ValueError, "^projections: sizes"),
        (dict(projections=[(4096, [128, 100])]), ValueError, "^projections: slice 1 has width"),
        (dict(projections=[(4096, [128, 160])]), ValueError, "^projections: slice 1 has width"),
        (dict(projections=[(4096, 100)]), ValueError, "^projections: in_features 100"),
        (dict(projections=[(0, 4096)]), ValueError, "^projections: sizes"),
        (dict(projections=[(4096, True)]), ValueError, "^projections: sizes"),
        (dict(projections=[(4096, 4096)], device="gpu0"), ValueError, "^device:"),
    ],
)
def test_bad_arguments_name_themselves(kwargs, error, match):
    """On any machine, before anything compiles (on a CPU, before finding no GPU)."""
    with pytest.raises(error, match=match):
        mf.warmup(**kwargs)


def test_a_projection_the_calls_refuse_cannot_be_made():
    with pytest.raises(ValueError, match="sizes must be positive ints"):
        kernel_warmup.Projection(4096, 0, ())  # builds_for divided by K = 0
    with pytest.raises(TypeError, match="^dtype:"):
        kernel_warmup.Projection(4096, 128, (128,), torch.float32)


@pytest.mark.parametrize("k", [160, 2880])
def test_a_width_the_quantizer_refuses_plans_no_quantizer(k):
    """``MXFP8Linear(k -> 128)``: its input width is no multiple of 128, so the calls run
    the reference quantizer (the GEMM still takes K = k); a quantizer build for it would not
    even compile."""
    projection = kernel_warmup._projection((128, k), torch.bfloat16, None)
    builds = kernel_warmup.builds_for(projection, [1, 64], *H200)
    assert [b for b in builds if b.kind == "quantizer"] == []
    assert any(b.kind == "gemm" for b in builds)


def test_every_planned_build_is_one_the_calls_launch():
    from mxfp8_fusion.kernels.quantize.geometry import check_config

    for n, k in [(256, 32), (256, 96), (256, 4096), (256, [128, 256]), (100, 256)]:
        projection = kernel_warmup._projection((n, k), torch.bfloat16, None)
        builds = kernel_warmup.builds_for(projection, [1, 512], *H200)
        for build in builds:
            if build.kind == "quantizer":
                check_config(build.facts[0])  # raises for a config the kernel refuses
        # N = 100: BF16 output rows of 200 bytes are not 16-byte aligned, the GEMM refuses
        assert any(b.kind == "gemm" for b in builds) == (n != 100)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine without CUDA")
def test_without_a_gpu_it_compiles_nothing_and_says_so(monkeypatch, caplog):
    monkeypatch.setattr(progress, "_said", set())
    with caplog.at_level(logging.INFO, logger="mxfp8_fusion"):
        report = mf.warmup([(4096, 4096)])
        model = mf.convert(torch.nn.Sequential(torch.nn.Linear(160, 128, dtype=torch.bfloat16)))
        assert mf.warmup(model).builds == 0
    assert (report.builds, report.compiled) == (0, 0)
    assert [m for m in caplog.messages if "nothing to compile (no CUDA device" in m]
    run = _command_line("4096x4096+4096")
    assert run.returncode == 0 and "nothing to compile" in run.stderr


def test_a_cpu_device_has_nothing_to_compile(monkeypatch, caplog):
    """Start-up code that passes the model's device needs no guard: on "cpu" every call runs
    the reference, on any machine, so warm-up compiles nothing and says so."""
    monkeypatch.setattr(progress, "_said", set())
    with caplog.at_level(logging.INFO, logger="mxfp8_fusion"):
        for device in ("cpu", torch.device("cpu")):
            assert mf.warmup([(4096, 4096)], device=device).builds == 0
    said = [m for m in caplog.messages if "nothing to compile for device cpu" in m]
    assert len(said) == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["4096x4096+96", "--activation", "bf16"],
            "projections: slice 1 has width 96: W8A16 slices (the GEMM reads each where it is) "
            "must be multiples of 128 wide, got (4096, [4096, 96])",
        ),
        (
            ["4096x4096+100"],
            "projections: slice 1 has width 100: staged slices (W8A8: each is quantized into "
            "its columns) must be multiples of 128 wide, got (4096, [4096, 100])",
        ),
    ],
)
def test_command_line_names_the_width_rule_of_the_activation(args, message):
    """One "got", the activation's own words, and the width rule before the weight's
    multiple-of-32 rule (widths that keep the first keep the second)."""
    run = _command_line(*args)
    assert run.returncode != 0
    assert run.stderr.strip().splitlines()[-1].endswith(f"warmup: {message}")


def test_command_line_names_a_bad_projection():
    run = _command_line("4096x100")
    assert run.returncode == 2 and "projections: in_features 100" in run.stderr


def _command_line(*args):
    command = [sys.executable, "-m", "mxfp8_fusion", "warmup", *args]
    return subprocess.run(command, capture_output=True, text=True)


def test_command_line_rejects_a_bad_shape():
    run = _command_line("4096by4096")
    assert run.returncode == 2 and "expected OUTxIN" in run.stderr


def test_a_model_lists_its_mxfp8_layers():
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512, dtype=torch.bfloat16),
        torch.nn.Linear(512, 128, bias=False, dtype=torch.bfloat16),
    )
    found = kernel_warmup.projections_of(mf.convert(model), torch.bfloat16)
    assert [(p.out_features, p.in_features, p.bias_dtype) for p in found] == [
        (512, 256, torch.bfloat16),
        (128, 512, None),
    ]


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("cutlass") is None, reason="needs the DSL")
def test_workers_compile_into_the_cache(monkeypatch, tmp_path):
    from mxfp8_fusion.kernels.quantize import host as qs
    from mxfp8_fusion.kernels.runtime import cache as kernel_cache
    from mxfp8_fusion.kernels.runtime import farm, launcher
    from mxfp8_fusion.progress import Bar

    monkeypatch.setenv(kernel_cache.ENV, str(tmp_path))
    monkeypatch.setattr(launcher, "_functions", {})
    builds = [qs.build_of(qs.config_of(False, w, 1, "sm_90a")) for w in (128, 256)]
    builds.append(qs.build_of(qs.config_of(True, 128, 1, "sm_90a")))
    farm.compile_in_workers(builds, tmp_path, 2, Bar("test", 3, enabled=False))
    assert all(kernel_cache.stored(tmp_path, b) and launcher.loaded(b) for b in builds)


def test_a_w8a16_projection_needs_gemm_builds_only():
    projection = kernel_warmup._projection((4096, [4096] * 3), torch.bfloat16, None, "bf16")
    builds = kernel_warmup.builds_for(projection, kernel_warmup.capture_sizes(), *H200)
    assert builds and {b.kind for b in builds} == {"gemm w8a16"}
    assert all(b.facts[2] == (4096,) * 3 for b in builds) and len(set(builds)) == len(builds)
    # FP16 slices run the reference on sm_90; Blackwell has no W8A16 kernel
    fp16 = kernel_warmup._projection((4096, [4096] * 3), torch.float16, None, "bf16")
    assert kernel_warmup.builds_for(fp16, [1, 64], *H200) == []
    assert kernel_warmup.builds_for(projection, [1], (10, 0), 148, "NVIDIA B200") == []


def test_a_model_says_its_layers_activation():
    model = torch.nn.Sequential(torch.nn.Linear(256, 128, dtype=torch.bfloat16))
    mf.convert(model, activation="bf16")
    (projection,) = kernel_warmup.projections_of(model, torch.bfloat16)
    assert projection.activation == "bf16" and projection.slices == (256,)
    with pytest.raises(ValueError, match="^activation: .*did you mean 'bf16'"):
        mf.warmup([(4096, 4096)], activation="bf61")


# --- a model's cat sites ---------------------------------------------------------------


class _Drafter(torch.nn.Module):
    """A drafter's ``fc(cat([a, b, c]))``: three hidden states of ``width`` into ``width``."""

    def __init__(self, width: int, activation: str, device="cpu"):
        super().__init__()
        from mxfp8_fusion.format import scale_bytes

        k = 3 * width
        values = torch.zeros(width, k, dtype=torch.float8_e4m3fn, device=device)
        scales = torch.full((scale_bytes(width, k),), 127, dtype=torch.uint8, device=device)
        self.fc = mf.MXFP8Linear(values, scales, activation=activation)

    def forward(self, a, b, c):
        return self.fc(torch.cat([a, b, c], dim=-1))


def _examples(tokens: int, width: int = 4096, device="meta"):
    return [torch.empty(tokens, width, dtype=torch.bfloat16, device=device) for _ in range(3)]


def test_a_cat_site_is_planned_with_its_slices():
    from mxfp8_fusion.kernels.quantize import host as qs

    tokens = [1, 8, 64, 256]
    model = _Drafter(4096, "mxfp8")
    (one,) = kernel_warmup.projections_of(model, torch.bfloat16)
    (site,) = kernel_warmup.projections_of(model, torch.bfloat16, _examples(8))
    assert one.slices == (12288,) and site.slices == (4096,) * 3
    staged = kernel_warmup.builds_for(site, tokens, *H200)
    quantizers = [b for b in staged if b.kind == "quantizer"]
    # the three-slice quantizer the compiled model launches, not the one-slice one
    assert quantizers == [qs.build_of(qs.config_of(False, 4096, 3, "sm_90a"))]
    plain = kernel_warmup.builds_for(one, tokens, *H200)
    assert [b for b in plain if b.kind == "quantizer"] != quantizers
    # the MXFP8 GEMM reads staged storage of K columns either way: the same builds
    assert [b for b in staged if b.kind != "quantizer"] == [
        b for b in plain if b.kind != "quantizer"
    ]


def test_a_w8a16_cat_site_is_planned_with_its_slices():
    tokens = [1, 8, 64, 256]
    model = _Drafter(4096, "bf16")
    (site,) = kernel_warmup.projections_of(model, torch.bfloat16, _examples(3))
    staged = kernel_warmup.builds_for(site, tokens, *H200)
    assert staged and {b.kind for b in staged} == {"gemm w8a16"}
    assert {b.facts[2] for b in staged} == {(4096, 4096, 4096)}
    (one,) = kernel_warmup.projections_of(model, torch.bfloat16)
    assert {b.facts[2] for b in kernel_warmup.builds_for(one, tokens, *H200)} == {(12288,)}


def test_the_layers_inputs_decide_the_plan():
    from mxfp8_fusion import sites

    class Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = _Drafter(256, "mxfp8")

        def forward(self, a, b, c):
            plain = self.inner.fc(torch.cat([a, b, c], dim=-1).contiguous() + 0)
            odd = torch.cat([a[:, :96], b, c, a[:, 96:]], dim=-1)  # a 96-wide slice
            return self.inner(a, b, c) + plain + self.inner.fc(odd)

    model = Twice()
    # a copied cat is a plain input; a 96-wide slice is not staged: both one slice
    assert sites.cat_widths(model, _examples(2, 256)) == {model.inner.fc: [(768,), (256,) * 3]}
    assert "forward" not in model.inner.fc.__dict__  # the class's forward is back
    with pytest.raises(TypeError, match="^example_inputs:"):
        sites.cat_widths(model, torch.empty(1))


def test_warmup_takes_example_inputs_on_any_machine():
    with pytest.raises(TypeError, match="^example_inputs:"):
        mf.warmup(_Drafter(256, "mxfp8"), [1], example_inputs=torch.empty(1), progress=False)


@pytest.mark.gpu
@pytest.mark.parametrize("activation", ["mxfp8", "bf16"])
def test_gpu_warmup_makes_ready_every_build_the_compiled_cat_site_launches(activation, monkeypatch):
    """The measurement behind issue 53: a drafter ``fc(cat([a, b, c]))`` (3 x 4096 -> 4096),
    warm-up first at tokens 1, 8, 64, 256, then the compiled model at those sizes: no build
    may be compiled or loaded after warm-up (before, W8A8 compiled the three-slice quantizer
    late, and W8A16 the GEMMs for slices (4096, 4096, 4096))."""
    from mxfp8_fusion.kernels.runtime import launcher

    monkeypatch.setattr(launcher, "_functions", {})  # this process has nothing loaded
    launched = []
    launch = launcher.launch
    monkeypatch.setattr(launcher, "launch", lambda b, a: (launched.append(b), launch(b, a)))
    tokens = [1, 8, 64, 256]
    model = _Drafter(4096, activation, device="cuda")
    with torch.no_grad():
        model.fc.weight_values.copy_((torch.randn(4096, 12288, device="cuda") / 8).to(
            torch.float8_e4m3fn))  # fmt: skip
    report = mf.warmup(model, tokens, example_inputs=_examples(8, device="cuda"), progress=False)
    ready = set(launcher._functions)
    assert report.builds == len(ready)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="mxfp8_fusion")
    runs = []
    for t in tokens:
        inputs = [torch.randn(t, 4096, dtype=torch.bfloat16, device="cuda") for _ in range(3)]
        runs.append((inputs, compiled(*inputs)))
    torch.cuda.synchronize()
    late = [b.describe() for b in launcher._functions if b not in ready]
    assert late == [], f"{len(late)} build(s) made after warm-up: {late}"
    for inputs, y in runs:  # eager (one slice, its own builds) only after the count
        assert torch.equal(y.view(torch.int16), model(*inputs).view(torch.int16))
    # the compiled model did stage the cat: its launches read three slices
    if activation == "mxfp8":
        assert any(b.kind == "quantizer" and b.facts[0].slices == 3 for b in launched)
    else:
        assert any(b.kind == "gemm w8a16" and b.facts[2] == (4096,) * 3 for b in launched)
