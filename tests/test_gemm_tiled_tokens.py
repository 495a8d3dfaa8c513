"""The tiled GEMM with the tokens converted once (``bf16_tokens``): the consumers read BF16 A
from shared memory (SS wgmma) instead of converting it. GPU tests: against the reference,
and bitwise against the same tile converting A in registers (the same BF16 values and K
order, so the same sums)."""

from __future__ import annotations

import pytest
import torch
from gemm_helpers import requires_cutlass, requires_sm90
from test_gemm_stream_k import OUTPUT_CASES, _check_spec

from mxfp8_fusion import reference

SPECS = [
    "tiled 128x128 c2 bf16-tokens",
    "tiled 128x128 c2 stream-k bf16-tokens",
    "tiled 128x128 c2 stream-k-tail bf16-tokens",
    "tiled 128x64 c1 stream-k bf16-tokens",
]


@pytest.mark.gpu
@requires_cutlass
@requires_sm90
@pytest.mark.parametrize("spec", SPECS)
# one token; one consumer's rows; just past them; partial row tiles; several waves on 8 CTAs
@pytest.mark.parametrize("tokens", [1, 64, 65, 200, 300])
@pytest.mark.parametrize("num_sms", [132, 8])
@pytest.mark.parametrize("out_dtype,spread,center,bias_dtype", OUTPUT_CASES)
def test_tiled_bf16_tokens_match_reference(
    spec, tokens, num_sms, out_dtype, spread, center, bias_dtype
):
    """N 640, K 4160 (33 stages, the last one partial): whole tiles, stream-K heads, middles
    and tails, and the tail schedule's whole waves."""
    _check_spec(spec, tokens, num_sms, out_dtype, spread, center, bias_dtype)


@pytest.mark.gpu
@requires_cutlass
@requires_sm90
@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("tokens", [1, 128, 300])
def test_tiled_bf16_tokens_equal_registers_bitwise(spec, tokens):
    """The same tile and schedule converting A in its consumers (spec word bf16) gives the
    same bytes: both multiply the same BF16 values in the same K order. Also bitwise
    across repeats and a CUDA Graph replay, with no allocation in the replay."""
    from mxfp8_fusion.kernels import gemm_sm90 as g

    n, k = 7168, 2048
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    a = reference.quantize(torch.randn(tokens, k, device="cuda", generator=gen))
    b = reference.quantize(torch.randn(n, k, device="cuda", generator=gen) * 0.05)
    cfg = g.config_from_spec(spec, tokens)
    regs = g.config_from_spec(spec.replace("bf16-tokens", "bf16"), tokens)
    outs = [torch.empty(tokens, n, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    g.run(*a, *b, None, outs[0], config=regs)
    for _ in range(2):  # again into the same output: the stream-K flags re-arm
        g.run(*a, *b, None, outs[1], config=cfg)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # its own token buffer and workspace
        g.run(*a, *b, None, outs[2], config=cfg)
    graph.replay()
    torch.cuda.synchronize()
    for out in outs[1:]:
        assert torch.equal(out.view(torch.int16), outs[0].view(torch.int16))
