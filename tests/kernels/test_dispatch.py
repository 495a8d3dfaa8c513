"""Which kernel each compute capability gets (kernels/dispatch.py), with the capability and
the kernel modules mocked: the GEMM (CuTe DSL on sm_90, cuBLAS on 10.x and 12.x, else none),
the quantizer's build target, and the reason a call falls back to the reference."""

from types import SimpleNamespace

import pytest
import torch

from mxfp8_fusion.kernels import dispatch


class _Recorder:
    def __init__(self, answer=None):
        self.calls = []
        self.answer = answer  # None: served, else the reason it refuses

    def run_if_served(self, *args):
        self.calls.append(args)
        return self.answer

    run_many_if_served = run_if_served


@pytest.fixture
def routed(monkeypatch):
    """Mock the capability, the DSL's presence and the kernel modules; returns a setter."""
    modules = SimpleNamespace(sm90=_Recorder(), cublas=_Recorder(), quantizer=_Recorder())
    real_quantizer = dispatch._quantize_slice()
    modules.quantizer.arch_for = real_quantizer.arch_for
    modules.quantizer.ARCHS = real_quantizer.ARCHS
    monkeypatch.setattr(dispatch, "_gemm_sm90", lambda: modules.sm90)
    monkeypatch.setattr(dispatch, "_gemm_cublas", lambda: modules.cublas)
    monkeypatch.setattr(dispatch, "_quantize_slice", lambda: modules.quantizer)
    dispatch._quantizer_arch.cache_clear()

    def route(capability, dsl=True):
        monkeypatch.setattr(dispatch, "_device_capability", lambda device: capability)
        monkeypatch.setattr(dispatch, "cute_dsl_installed", lambda: dsl)
        return modules

    yield route
    dispatch._quantizer_arch.cache_clear()


GEMM_ROUTES = [
    ((9, 0), True, "sm90"),
    ((9, 0), False, None),  # the SM90 kernels need the DSL
    ((10, 0), True, "cublas"),
    ((10, 0), False, "cublas"),  # cuBLAS does not
    ((10, 3), True, "cublas"),
    ((12, 0), True, "cublas"),
    ((12, 1), False, "cublas"),
    ((8, 9), True, None),  # FP8 but no block-scaled MMA and no wgmma
    ((11, 0), True, None),
    ((9, 4), True, None),  # what ROCm reports for an MI300: not sm_90
    (None, True, None),  # not a CUDA device
]


@pytest.mark.parametrize("capability,dsl,expected", GEMM_ROUTES)
def test_gemm_dispatch_per_capability(routed, capability, dsl, expected):
    modules = routed(capability, dsl)
    args = tuple(torch.empty(1) for _ in range(6))
    reason = dispatch.mm_into(*args)
    assert (reason is None) == (expected is not None), reason
    assert len(modules.sm90.calls) == (expected == "sm90")
    assert len(modules.cublas.calls) == (expected == "cublas")
    if expected:
        assert getattr(modules, expected).calls[0] == args


QUANTIZER_ROUTES = [
    ((9, 0), True, "sm_90a"),
    ((10, 0), True, "sm_100a"),
    ((10, 3), True, "sm_103a"),
    ((12, 0), True, "sm_120a"),
    ((12, 1), True, "sm_121a"),
    ((12, 0), False, None),  # the quantizer is a CuTe DSL kernel everywhere
    ((8, 9), True, None),  # no griddepcontrol, no max.u16x2 before sm_90
    ((11, 0), True, None),
    (None, True, None),
]


@pytest.mark.parametrize("capability,dsl,arch", QUANTIZER_ROUTES)
def test_quantizer_build_per_capability(routed, capability, dsl, arch):
    modules = routed(capability, dsl)
    source, values, scales = torch.empty(4, 128), torch.empty(4, 128), torch.empty(512)
    assert (dispatch.quantize_slice(source, values, scales, 0) is None) == (arch is not None)
    reason = dispatch.quantize_slices([source, source], values, scales, [0, 128])
    assert (reason is None) == (arch is not None)
    if arch is None:
        assert modules.quantizer.calls == []
    else:  # the build target is chosen per call from the device, and passed to the kernel
        assert [call[-1] for call in modules.quantizer.calls] == [arch, arch]
        assert modules.quantizer.calls[1][3] == [0, 128]


def test_fallback_reasons_name_what_is_missing(routed):
    args = tuple(torch.empty(1) for _ in range(6))
    source, values, scales = torch.empty(4, 128), torch.empty(4, 128), torch.empty(512)
    modules = routed((12, 0))
    modules.cublas.answer = "N=200 and K=1024 must be multiples"
    assert dispatch.mm_into(*args) == "GPU sm_120: N=200 and K=1024 must be multiples"
    modules = routed((9, 0))
    modules.sm90.answer = "scale buffers must be 16-byte aligned"
    assert dispatch.mm_into(*args) == "GPU sm_90: scale buffers must be 16-byte aligned"
    routed((11, 0))
    assert "sm_110 has no MXFP8 GEMM kernel" in dispatch.mm_into(*args)
    assert "quantizer is built for sm_90a, sm_100a" in dispatch.quantize_slice(
        source, values, scales, 0
    )
    routed((12, 0), dsl=False)
    assert dispatch.quantize_slice(source, values, scales, 0) == (
        "nvidia-cutlass-dsl is not installed"
    )


def test_only_the_cute_arch_has_a_w8a16_kernel():
    from mxfp8_fusion.kernels import capability

    assert [cap for cap, row in capability.ARCHS.items() if row.w8a16] == [(9, 0)]
    assert capability.kernels_of((10, 0)).w8a16 is None
    assert capability.kernels_of((8, 9)).w8a16 is None
