"""kernels/runtime/launcher.py on the CPU (``CUTE_DSL_ARCH``): each kernel's TVM-FFI entry takes
exactly the arguments the host passes, and a build is compiled once per process."""

import importlib.util

import pytest
import torch
from helpers.gemm import config_of, schedule_id, swap_ab, tiled

requires_cutlass = pytest.mark.skipif(
    importlib.util.find_spec("cutlass") is None, reason="nvidia-cutlass-dsl is not installed"
)
STREAM = 0


def _target(monkeypatch):
    if not torch.cuda.is_available():
        monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")


def _accepts(fn, args) -> bool:
    """Whether TVM-FFI takes ``args``: a layout or type mismatch raises TypeError before
    any CUDA work; matching arguments get as far as the CUDA runtime (none here, or a
    launch on address 1 is never made: the arguments are only checked on a GPU)."""
    if torch.cuda.is_available():
        pytest.skip("calls the entry with made-up addresses: CPU only")
    try:
        fn(*args)
    except TypeError:
        return False
    except RuntimeError:
        return True
    return True


@requires_cutlass
def test_quantizer_entries_take_the_hosts_arguments(monkeypatch):
    _target(monkeypatch)
    from mxfp8_fusion.kernels.quantize import host as qs
    from mxfp8_fusion.kernels.runtime import launcher

    one = launcher.function(qs.build_of(qs.config_of(False, 256, 1, "sm_90a")))
    assert _accepts(one, (1 << 40, 1 << 41, 1 << 42, 5, 256, 512, 128, 4, STREAM))
    assert not _accepts(one, (1 << 40, 1 << 41, 1 << 42, 5, 256, 512, 128, STREAM))
    many = launcher.function(qs.build_of(qs.config_of(False, 256, 3, "sm_90a")))
    absent = (None,) * 5
    args = (1 << 40, 1 << 41, 5, 768, 4, 1, 2, 3, *absent, 256, 256, 256, *absent)
    assert _accepts(many, (*args, 0, 256, 512, *absent, STREAM))
    # a slot past the build's slice count must be absent (None), not an address
    wrong = (1 << 40, 1 << 41, 5, 768, 4, 1, 2, 3, 4, *absent[1:], 256, 256, 256, *absent)
    assert not _accepts(many, (*wrong, 0, 256, 512, *absent, STREAM))


@requires_cutlass
@pytest.mark.slow
@pytest.mark.parametrize(
    "schedule", [swap_ab(), tiled(128, 128, 2, 1), tiled(128, 64, 1)], ids=schedule_id
)
def test_gemm_entries_take_the_hosts_arguments(monkeypatch, schedule):
    """Both kernels and both tiled schedules: the bias and a tiled build's workspace are
    absent (None) where the build has none."""
    _target(monkeypatch)
    from mxfp8_fusion.kernels.gemm_sm90 import workspace
    from mxfp8_fusion.kernels.gemm_sm90.host import gemm as g
    from mxfp8_fusion.kernels.runtime import launcher

    is_tiled = schedule["kernel"] == "tiled"
    cfg = config_of(schedule, 300 if is_tiled else 16)
    fn = launcher.function(g.gemm_build(cfg, 256, 512, 256, torch.bfloat16, None))
    operands = (1 << 40, 1 << 41, 1 << 42, 1 << 43, None, 1 << 44, 16, 3)
    extra = ((1 << 45, 1 << 46) if is_tiled else ()) + (
        (None, None) if workspace.floats(cfg) is None else (1 << 47, 1 << 48)
    )
    assert _accepts(fn, (*operands, *extra, STREAM))
    with_bias = (*operands[:4], 1 << 49, *operands[5:])
    assert not _accepts(fn, (*with_bias, *extra, STREAM))


@requires_cutlass
def test_a_build_compiles_once_per_process(monkeypatch):
    _target(monkeypatch)
    from mxfp8_fusion.kernels.quantize import host as qs
    from mxfp8_fusion.kernels.runtime import cache as kernel_cache
    from mxfp8_fusion.kernels.runtime import launcher

    build = qs.build_of(qs.config_of(True, 384, 1, "sm_90a"))
    calls = []
    real = launcher.compile_build
    monkeypatch.setattr(launcher, "compile_build", lambda b: calls.append(b) or real(b))
    monkeypatch.setattr(kernel_cache, "cache_dir", lambda: None)  # no disk: compile here
    first = launcher.function(build)
    assert launcher.function(build) is first and launcher.loaded(build)
    assert calls == [build]


def test_builds_are_named_by_data():
    from mxfp8_fusion.kernels.quantize import host as qs
    from mxfp8_fusion.kernels.runtime import launcher

    a = qs.build_of(qs.config_of(False, 256, 1, "sm_90a"))
    assert a == qs.build_of(qs.config_of(False, 256, 1, "sm_90a"))
    assert a != qs.build_of(qs.config_of(False, 256, 1, "sm_120a"))
    assert "width=256" in a.describe() and a.describe().endswith("for sm_90a")
    assert isinstance(a, launcher.Build) and hash(a) == hash(tuple(a))


@requires_cutlass
@pytest.mark.slow
@pytest.mark.parametrize("tokens", [16, 300])
def test_w8a16_entries_take_the_hosts_arguments(monkeypatch, tokens):
    """The W8A16 host (gemm_sm90.host.w8a16) assembles what its swap-AB (16 tokens) and tiled
    (300) entries take from three slices: the slots past them absent, the workspace as the
    build has it."""
    _target(monkeypatch)
    from mxfp8_fusion.kernels.gemm_sm90.host import buffers, w8a16
    from mxfp8_fusion.kernels.runtime import launcher

    launched = []
    monkeypatch.setattr(w8a16, "gpu_of", lambda index: (132, "NVIDIA H200"))
    monkeypatch.setattr(w8a16, "raw_stream", lambda index: STREAM)
    monkeypatch.setattr(
        w8a16.launcher, "launch", lambda build, args: launched.append((build, args))
    )
    monkeypatch.setattr(
        buffers, "bf16_references", lambda m, n, *rest: torch.empty(m + n, dtype=torch.int32)
    )
    monkeypatch.setattr(buffers, "stream_workspace", lambda cfg, *rest: (1 << 45, 1 << 46))
    slices = [torch.empty(tokens, 256, dtype=torch.bfloat16) for _ in range(3)]
    values = torch.empty(256, 768, dtype=torch.float8_e4m3fn)
    scales = torch.empty(256 * 24, dtype=torch.uint8)
    out = torch.empty(tokens, 256, dtype=torch.bfloat16)
    assert w8a16.refusal(slices, values, scales, None, out) is None
    w8a16.run(slices, values, scales, None, out)
    ((build, args),) = launched
    assert build.kind == "gemm w8a16" and build.facts[2] == (256, 256, 256)
    fn = launcher.function(build)
    assert _accepts(fn, args)
    assert not _accepts(fn, (*args[:-1], 1 << 47, args[-1]))  # one argument too many
