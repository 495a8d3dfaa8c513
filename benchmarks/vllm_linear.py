"""vLLM MXFP8 linear receipt (sm_90): the plugin's kernel against what vLLM runs otherwise.

The layer is built as vLLM's MXFP8 linear methods build it (E4M3 ``weight`` ``[N, K]`` and
uint8 E8M0 ``weight_scale`` ``[N, K/32]``), then packed by the plugin's
``process_weights``; no vLLM is needed. Per token count, measured side by side in one
process, interleaved per round, as CUDA Graph replays (what vLLM's decode under graphs
sees):

* ours: ``apply_weights`` (the plugin kernel's call: input quantized to MXFP8, MXFP8 GEMM)
* dequant_cublas: dequantize the MXFP8 weight to BF16, then cuBLAS BF16 (``F.linear``), per
  call: vLLM's emulation kernel when its weights stay MXFP8
* bf16_cublas: cuBLAS BF16 on the weight dequantized once at load: vLLM's emulation kernel
  by default (``VLLM_MXFP8_EMULATION_DEQUANT_AT_LOAD``), twice the weight memory

Medians over rounds; ratios are ours' time over the other's (below 1: ours is faster). Writes
benchmarks/results/vllm_linear.json.

    python benchmarks/vllm_linear.py [--tokens 1 16 128 1024 4096 16384] [--rounds 15]
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import asdict, dataclass

import torch
from common import environment, write_receipt
from torch import nn

from mxfp8_fusion.vllm import linear

SHAPES = {
    "reference_6x7168_to_7168": (7168, 6 * 7168),
    "drafter_fc_3x4096_to_4096": (4096, 3 * 4096),
}
TOKENS = (1, 16, 128, 1024, 4096, 16384)


@dataclass
class Row:
    shape: str
    tokens: int
    n: int
    k: int
    ours_graph_ms: float
    dequant_cublas_graph_ms: float
    bf16_cublas_graph_ms: float
    ours_tflops: float
    ours_over_dequant_cublas_time: float
    ours_over_bf16_cublas_time: float
    bitwise_equal_to_mm: bool


def vllm_style_layer(n: int, k: int, seed: int = 0, device: str = "cuda") -> nn.Module:
    """Parameters as vLLM's loader leaves them: created empty, the checkpoint bytes copied in."""
    gen = torch.Generator(device=device).manual_seed(seed)
    layer = nn.Module()
    layer.weight = nn.Parameter(
        torch.empty(n, k, dtype=torch.float8_e4m3fn, device=device), requires_grad=False
    )
    layer.weight_scale = nn.Parameter(
        torch.empty(n, k // 32, dtype=torch.uint8, device=device), requires_grad=False
    )
    w = torch.randn(n, k, device=device, generator=gen) * 64 * k**-0.5
    layer.weight.data.copy_(w.clamp(-448, 448).to(torch.float8_e4m3fn))
    layer.weight_scale.data.copy_(
        torch.randint(118, 126, (n, k // 32), device=device, dtype=torch.uint8, generator=gen)
    )
    return layer


def dequantize(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """MXFP8 ``[N, K]`` with row-major E8M0 ``[N, K/32]`` to BF16 (exact: powers of two)."""
    n, k = values.shape
    factors = torch.exp2(scales.float() - 127).to(torch.bfloat16)
    return (values.to(torch.bfloat16).view(n, k // 32, 32) * factors[..., None]).view(n, k)


def _capture(fn, inner: int) -> torch.cuda.CUDAGraph:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # warm up (and compile) outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(inner):
            fn()
    return graph


def _replay_ms(graph: torch.cuda.CUDAGraph, inner: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()  # warm: clocks and caches as in steady decoding
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / inner


def bench(shape: str, tokens: int, rounds: int) -> Row:
    n, k = SHAPES[shape]
    layer = vllm_style_layer(n, k)
    raw_values, raw_scales = layer.weight.data.clone(), layer.weight_scale.data.clone()
    linear.process_weights(layer, shape)
    w_bf16 = dequantize(raw_values, raw_scales)
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    x = torch.randn(tokens, k, device="cuda", generator=gen).to(torch.bfloat16)

    import mxfp8_fusion as mf

    expected = mf.mm(x, mf.pack_weight(raw_values, raw_scales))
    same = torch.equal(linear.apply_weights(layer, x).view(torch.int16), expected.view(torch.int16))
    fns = {
        "ours": lambda: linear.apply_weights(layer, x),
        "dequant_cublas": lambda: torch.nn.functional.linear(x, dequantize(raw_values, raw_scales)),
        "bf16_cublas": lambda: torch.nn.functional.linear(x, w_bf16),
    }
    inner = max(1, min(50, int(4e12 // (2.0 * tokens * n * k))))
    graphs = {name: _capture(fn, inner) for name, fn in fns.items()}
    times = {name: [] for name in fns}
    for _ in range(rounds):  # interleaved: drift hits every contender alike
        for name, graph in graphs.items():
            times[name].append(_replay_ms(graph, inner))
    ms = {name: statistics.median(t) for name, t in times.items()}
    return Row(
        shape=shape,
        tokens=tokens,
        n=n,
        k=k,
        ours_graph_ms=ms["ours"],
        dequant_cublas_graph_ms=ms["dequant_cublas"],
        bf16_cublas_graph_ms=ms["bf16_cublas"],
        ours_tflops=2.0 * tokens * n * k / (ms["ours"] * 1e-3) / 1e12,
        ours_over_dequant_cublas_time=ms["ours"] / ms["dequant_cublas"],
        ours_over_bf16_cublas_time=ms["ours"] / ms["bf16_cublas"],
        bitwise_equal_to_mm=bool(same),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS))
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", default="benchmarks/results/vllm_linear.json")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("vllm_linear.py measures on a CUDA device (sm_90); none is here")
    rows = [bench(shape, t, args.rounds) for shape in args.shapes for t in args.tokens]
    print(
        f"{'shape':28} {'tokens':>6} {'ours ms':>9} {'deq+cuBLAS':>10} {'BF16 cuBLAS':>11} "
        f"{'ours/deq':>8} {'ours/bf16':>9} bitwise"
    )
    for r in rows:
        print(
            f"{r.shape:28} {r.tokens:6d} {r.ours_graph_ms:9.4f} {r.dequant_cublas_graph_ms:10.4f} "
            f"{r.bf16_cublas_graph_ms:11.4f} {r.ours_over_dequant_cublas_time:8.3f} "
            f"{r.ours_over_bf16_cublas_time:9.3f} {r.bitwise_equal_to_mm}"
        )
    write_receipt(
        args.out,
        {
            "what": "vLLM MXFP8 linear on sm_90: the mxfp8_fusion plugin kernel (apply_weights) "
            "vs dequantize-then-cuBLAS BF16 per call vs cuBLAS BF16 on a weight dequantized at load",
            "mode": f"CUDA Graph replay of back-to-back calls, median of {args.rounds} interleaved rounds",
            "ratio": "ours_over_*_time = ours' time / the other's time (below 1: ours faster)",
            "environment": environment(),
            "rows": [asdict(r) for r in rows],
        },
    )


if __name__ == "__main__":
    main()
