"""The slice quantizer through CUDA Graphs, programmatic dependent launch, the custom ops and
the public API, on a GPU it is built for (marked ``gpu``): every call takes the kernel and
writes the reference's bytes."""

import pytest
import torch
from helpers.quantize import (
    DTYPES,
    poisoned,
    requires_sm90,
    wide_range,
)

from mxfp8_fusion import reference


@pytest.mark.gpu
@requires_sm90
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
def test_cuda_graph_capture_and_replay(dtype):
    import tvm_ffi

    from mxfp8_fusion.kernels.quantize import host as kernel
    from mxfp8_fusion.kernels.runtime import launcher

    gen = torch.Generator(device="cuda").manual_seed(3)
    static = wide_range(200, 1024, dtype, "cuda", gen)
    values, scales = poisoned(256, 2048, "cuda")
    kernel.run(static, values, scales, 1024)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kernel.run(static, values, scales, 1024)
    # every build launches through its TVM-FFI entry loaded from the kernel cache
    assert all(isinstance(fn, tvm_ffi.Function) for fn in launcher._functions.values())
    for seed in (4, 5):
        gen.manual_seed(seed)
        static.copy_(wide_range(200, 1024, dtype, "cuda", gen))
        graph.replay()
        want_v, want_s = poisoned(256, 2048, "cuda")
        reference.quantize_slice_(static, want_v, want_s, 1024)
        torch.cuda.synchronize()
        assert torch.equal(values.view(torch.uint8), want_v.view(torch.uint8))
        assert torch.equal(scales.view(torch.uint8), want_s.view(torch.uint8))


@pytest.mark.gpu
@requires_sm90
def test_programmatic_launch_reads_only_after_the_previous_kernel():
    """Launches use programmatic dependent launch: each lets the next kernel's CTAs start
    early. The next one must still read nothing before this one has finished. Here the
    second launch's source is the destination the first launch writes, viewed as BF16, so
    an early read would see the poison."""
    from mxfp8_fusion.kernels.quantize import host as kernel

    gen = torch.Generator(device="cuda").manual_seed(11)
    for _ in range(3):
        first = torch.randn(4096, 8192, dtype=torch.bfloat16, device="cuda", generator=gen)
        values, scales = poisoned(4096, 8192, "cuda")
        chained = values.view(torch.bfloat16)  # [4096, 4096]
        values2, scales2 = poisoned(4096, 4096, "cuda")
        kernel.run(first, values, scales, 0)
        kernel.run(chained, values2, scales2, 0)
        want_v, want_s = poisoned(4096, 8192, "cuda")
        reference.quantize_slice_(first, want_v, want_s, 0)
        want_v2, want_s2 = poisoned(4096, 4096, "cuda")
        reference.quantize_slice_(want_v.view(torch.bfloat16), want_v2, want_s2, 0)
        assert torch.equal(values.view(torch.uint8), want_v.view(torch.uint8))
        assert torch.equal(values2.view(torch.uint8), want_v2.view(torch.uint8))
        assert torch.equal(scales2.view(torch.uint8), want_s2.view(torch.uint8))


def _count_kernel_runs(monkeypatch) -> list[int]:
    from mxfp8_fusion.kernels.quantize import host as kernel

    calls = []
    real = kernel.run_if_served

    def counting(*args, **kwargs):
        reason = real(*args, **kwargs)
        if reason is None:
            calls.append(1)
        return reason

    monkeypatch.setattr(kernel, "run_if_served", counting)
    return calls


@pytest.mark.gpu
@requires_sm90
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
def test_public_quantize_uses_the_kernel(dtype, monkeypatch):
    import mxfp8_fusion

    calls = _count_kernel_runs(monkeypatch)
    gen = torch.Generator(device="cuda").manual_seed(9)
    x = wide_range(300, 1024, dtype, "cuda", gen)
    got = mxfp8_fusion.quantize(x)
    want_v, want_s = reference.quantize(x)
    assert calls, "mxfp8_fusion.quantize did not run the CuTe kernel"
    assert torch.equal(got.values.view(torch.uint8), want_v.view(torch.uint8))
    assert torch.equal(got.scales.view(torch.uint8), want_s.view(torch.uint8))


@pytest.mark.gpu
@requires_sm90
def test_slice_op_uses_the_kernel(monkeypatch):
    calls = _count_kernel_runs(monkeypatch)
    gen = torch.Generator(device="cuda").manual_seed(10)
    source = wide_range(129, 1024, torch.bfloat16, "cuda", gen)
    values, scales = poisoned(256, 2048, "cuda")
    want_v, want_s = poisoned(256, 2048, "cuda")
    torch.ops.mxfp8.quantize_slice_(source, values, scales, 1024)
    reference.quantize_slice_(source, want_v, want_s, 1024)
    assert calls, "mxfp8::quantize_slice_ did not run the CuTe kernel"
    assert torch.equal(values.view(torch.uint8), want_v.view(torch.uint8))
    assert torch.equal(scales.view(torch.uint8), want_s.view(torch.uint8))
