"""Launch order on an sm_90 GPU: the slice quantizer starts its CTAs behind the previous kernel
(programmatic dependent launch) and waits for it before touching memory; the GEMMs and their
pre-passes follow it in stream order. A chain in which every kernel reads what the kernel
launched just before it wrote (quantize a GEMM's output, multiply it, quantize that output
...) gives the bytes of the same chain with a device sync after every launch: eagerly, and
replayed from a CUDA Graph with new inputs."""

from __future__ import annotations

import pytest
import torch
from helpers.gemm import requires_cutlass, requires_sm90

import mxfp8_fusion as mf

WIDTH = 4096  # square weights, so each step's output is the next step's input
STEPS = 6


def _chain(x, weights, staged, outs, sync: bool):
    """Each step quantizes the previous output into its staged input and multiplies it."""
    prev = x
    for w, inp, out in zip(weights, staged, outs, strict=True):
        mf.quantize_input_slice(prev, inp, 0)
        if sync:
            torch.cuda.synchronize()
        mf.mm_quantized_into(inp, w, out)
        if sync:
            torch.cuda.synchronize()
        prev = out
    return prev


@pytest.mark.gpu
@requires_cutlass
@requires_sm90
@pytest.mark.parametrize("tokens", [1, 8, 24, 64])
def test_chained_launches_match_launches_with_a_sync_between(tokens):
    """1-32 tokens take the swap-AB GEMM (from 17 with its token conversion), 64 the tiled
    one on this shape: every kernel of the chain depends on the one before it."""
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    weights = [
        mf.pack_weight(
            torch.randn(WIDTH, WIDTH, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02
        )
        for _ in range(STEPS)
    ]
    staged = [mf.empty_input(tokens, WIDTH, "cuda") for _ in range(STEPS)]
    outs = [torch.empty(tokens, WIDTH, device="cuda", dtype=torch.bfloat16) for _ in range(STEPS)]

    def fresh():
        return torch.randn(tokens, WIDTH, device="cuda", dtype=torch.bfloat16, generator=gen)

    x = fresh()
    want = _chain(x, weights, staged, outs, sync=True).clone()
    for _ in range(3):
        for out in outs:
            out.fill_(float("nan"))
        got = _chain(x, weights, staged, outs, sync=False)
        torch.cuda.synchronize()
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _chain(x, weights, staged, outs, sync=False)
    x.copy_(fresh())
    graph.replay()
    torch.cuda.synchronize()
    got = outs[-1].clone()
    want = _chain(x, weights, staged, outs, sync=True)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
