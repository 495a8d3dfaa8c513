"""mxfp8_fusion.warmup on the CPU: which builds a projection needs, bad arguments, the
command line, and the parallel compile into the kernel cache (``CUTE_DSL_ARCH``)."""

import importlib.util
import subprocess
import sys

import pytest
import torch

import mxfp8_fusion as mf
from mxfp8_fusion import kernel_warmup

H200 = ((9, 0), 132)


def test_capture_sizes_are_vllms_defaults():
    sizes = kernel_warmup.capture_sizes(512)
    assert sizes[:4] == [1, 2, 4, 8] and sizes[-1] == 512 and len(sizes) == 67
    assert kernel_warmup.capture_sizes(6) == [1, 2, 4]


def test_a_drafter_projection_needs_a_handful_of_builds():
    from mxfp8_fusion.kernels import gemm_sm90_buffers as buffers
    from mxfp8_fusion.kernels import quantize_slice as qs

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
    on_b200 = kernel_warmup.builds_for(projection, [1, 300], (10, 0), 148)
    assert {b.kind for b in on_b200} == {"quantizer"} and on_b200[0].arch == "sm_100a"
    assert kernel_warmup.builds_for(projection, [1], (8, 0), 108) == []


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
    ],
)
def test_bad_arguments_name_themselves(kwargs, error, match):
    with pytest.raises(error, match=match):
        mf.warmup(**kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU message")
def test_without_a_gpu_it_says_so():
    with pytest.raises(RuntimeError, match="no CUDA device"):
        mf.warmup([(4096, 4096)])
    run = _command_line("4096x4096+4096")
    assert run.returncode == 2 and "no CUDA device" in run.stderr


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
    from mxfp8_fusion.kernels import kernel_cache, launcher
    from mxfp8_fusion.kernels import quantize_slice as qs
    from mxfp8_fusion.progress import Bar

    monkeypatch.setenv(kernel_cache.ENV, str(tmp_path))
    monkeypatch.setattr(launcher, "_functions", {})
    builds = [qs.build_of(qs.config_of(False, w, 1, "sm_90a")) for w in (128, 256)]
    builds.append(qs.build_of(qs.config_of(True, 128, 1, "sm_90a")))
    kernel_warmup._compile_in_workers(builds, tmp_path, 2, Bar("test", 3, enabled=False))
    assert all(kernel_cache.stored(tmp_path, b) and launcher.loaded(b) for b in builds)
