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
    from mxfp8_fusion.kernels.gemm_sm90 import buffers
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
    from mxfp8_fusion.kernels.runtime import launcher
    from mxfp8_fusion.progress import Bar

    monkeypatch.setenv(kernel_cache.ENV, str(tmp_path))
    monkeypatch.setattr(launcher, "_functions", {})
    builds = [qs.build_of(qs.config_of(False, w, 1, "sm_90a")) for w in (128, 256)]
    builds.append(qs.build_of(qs.config_of(True, 128, 1, "sm_90a")))
    kernel_warmup._compile_in_workers(builds, tmp_path, 2, Bar("test", 3, enabled=False))
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
