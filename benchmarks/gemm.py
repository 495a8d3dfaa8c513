"""GEMM receipt: the SM90 MXFP8 kernel vs cuBLAS BF16 vs dequantize-then-cuBLAS.

At N = 7168, K = 43008 (the reference geometry: six 7168-wide slices) and several token
counts, measured side by side in one process, interleaved per round:

* ours: ``kernels.gemm_sm90.run`` on MXFP8 values + blocked scales, into a BF16 output
* cublas_bf16: ``torch.mm`` on the BF16 tensors (``x @ w.T``), what a user without MXFP8 runs
* dequant_cublas: dequantize both MXFP8 operands to BF16, then ``torch.mm`` (emulation)

Medians of CUDA-event timings of back-to-back launches, and of CUDA Graph replays of the
same launches (GPU time without host launch gaps, what decode under graphs sees; at few
tokens the kernel is shorter than a Python launch). TFLOP/s uses 2*M*N*K. Writes
benchmarks/results/gemm.json.

    python benchmarks/gemm.py [--tokens 16 128 512 4096 16384] [--rounds 20] [--out PATH]

Across token counts and model shapes (gemm_sweep.py holds the machinery):

    python benchmarks/gemm.py --sweep [--before] [--out benchmarks/results/gemm_sweep.json]
    python benchmarks/gemm.py --tune --write-table kernels/gemm_sm90_table.py \
        [--out benchmarks/results/gemm_tune.json]
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import asdict, dataclass

import torch
from common import capture_graph, environment, write_receipt
from mxfp8_fusion.kernels import gemm_select

from mxfp8_fusion import reference


@dataclass
class Row:
    tokens: int
    n: int
    k: int
    config: str
    ours_ms: float
    cublas_bf16_ms: float
    dequant_cublas_ms: float
    ours_tflops: float
    cublas_bf16_tflops: float
    dequant_cublas_tflops: float
    ours_over_cublas_bf16_time: float
    ours_over_dequant_cublas_time: float
    ours_speedup_over_vllm_triton_211: float
    ours_graph_ms: float
    cublas_bf16_graph_ms: float
    ours_over_cublas_bf16_graph_time: float
    ours_host_us_per_launch: float


# Idle time before every sample, then an untimed warm-up of the same launches. Right after
# a cuBLAS BF16 GEMM our kernel measured 10% slower (6.0 vs 5.45 ms at 4096 tokens, same
# data) than after an idle GPU: the power and clock state left by the previous kernel leaks
# into the next sample. Resting alone biases short kernels the other way (the clocks drop
# while idle), hence the warm-up. Every contender is timed alike.
_REST_S = 0.05


def _time(fn, rounds: int, inner: int) -> float:
    times = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        time.sleep(_REST_S)
        for _ in range(inner):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / inner)
    return statistics.median(times)


def _dequant_bf16(values, scales):
    return reference.dequantize(values, scales).to(torch.bfloat16)


def bench(tokens: int, n: int, k: int, rounds: int) -> Row:
    from mxfp8_fusion.kernels import gemm_sm90

    gen = torch.Generator(device="cuda").manual_seed(tokens)
    x = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02
    xv, xs = reference.quantize(x)
    wv, ws = reference.quantize(w)
    out = torch.empty(tokens, n, device="cuda", dtype=torch.bfloat16)
    cfg = gemm_select.choose_config(
        tokens, n, k, torch.cuda.get_device_properties(0).multi_processor_count
    )

    def ours():
        gemm_sm90.run(xv, xs, wv, ws, None, out)

    def cublas():
        torch.mm(x, w.t(), out=out)

    def dequant():
        torch.mm(_dequant_bf16(xv, xs), _dequant_bf16(wv, ws).t(), out=out)

    flops = 2.0 * tokens * n * k
    inner = max(1, min(50, int(2e13 // flops)))
    for fn in (ours, cublas, dequant):
        fn()
    torch.cuda.synchronize()
    t_ours, t_cub, t_deq = [], [], []
    for _ in range(rounds):  # interleaved: machine drift hits all three alike
        t_ours.append(_time(ours, 1, inner))
        t_cub.append(_time(cublas, 1, inner))
        t_deq.append(_time(dequant, 1, max(1, inner // 4)))
    mo, mc, md = (statistics.median(t) for t in (t_ours, t_cub, t_deq))
    # GPU time without host launch gaps: `inner` launches captured in one CUDA graph each
    graphs = [capture_graph([fn] * inner) for fn in (ours, cublas)]
    t_graph = ([], [])
    for _ in range(rounds):
        for times, graph in zip(t_graph, graphs, strict=True):
            times.append(_time(graph.replay, 1, 1) / inner)
    go, gc = (statistics.median(t) for t in t_graph)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(inner):
        ours()
    host_us = (time.perf_counter() - start) / inner * 1e6
    torch.cuda.synchronize()
    tf = lambda ms: flops / (ms * 1e-3) / 1e12  # noqa: E731
    return Row(
        tokens=tokens,
        n=n,
        k=k,
        config=str(cfg),
        ours_ms=mo,
        cublas_bf16_ms=mc,
        dequant_cublas_ms=md,
        ours_tflops=tf(mo),
        cublas_bf16_tflops=tf(mc),
        dequant_cublas_tflops=tf(md),
        ours_over_cublas_bf16_time=mo / mc,
        ours_over_dequant_cublas_time=mo / md,
        ours_speedup_over_vllm_triton_211=tf(mo) / 211.0,
        ours_graph_ms=go,
        cublas_bf16_graph_ms=gc,
        ours_over_cublas_bf16_graph_time=go / gc,
        ours_host_us_per_launch=host_us,
    )


def bench_variants(tokens: int, n: int, k: int, names, rounds: int) -> dict:
    """Median ms of each named config (kernels/gemm_names.py: e.g. ``"tiled 128x64 c1
    stream-k"``) against the table's choice, checked bitwise against it first."""
    from mxfp8_fusion.kernels import gemm_sm90
    from mxfp8_fusion.kernels.gemm_names import config_from_spec

    gen = torch.Generator(device="cuda").manual_seed(0)
    xv, xs = reference.quantize(torch.randn(tokens, k, device="cuda", generator=gen))
    wv, ws = reference.quantize(torch.randn(n, k, device="cuda", generator=gen))
    out = torch.empty(tokens, n, device="cuda", dtype=torch.bfloat16)
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    base = gemm_select.choose_config(tokens, n, k, num_sms)
    gemm_sm90.run(xv, xs, wv, ws, None, out, config=base)
    expected = out.clone()
    fns = {}
    for name in names:
        cfg = config_from_spec(name, tokens, num_sms)
        fns[name] = lambda cfg=cfg: gemm_sm90.run(xv, xs, wv, ws, None, out, config=cfg)
        out.zero_()
        fns[name]()
        same = bool(torch.equal(out.view(torch.int16), expected.view(torch.int16)))
        print(f"variant {name}: bitwise equal to the default config: {same}", flush=True)
    samples = {name: [] for name in names}
    for _ in range(rounds):  # interleaved, so clock drift hits every variant alike
        for name, fn in fns.items():
            samples[name].append(_time(fn, 1, 3))
    result = {}
    for name in names:
        result[name] = ms = statistics.median(samples[name])
        print(
            f"variant {name:28s} tokens {tokens}: {ms:.3f} ms "
            f"{2.0 * tokens * n * k / ms / 1e9:.1f} TF/s",
            flush=True,
        )
    return result


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, nargs="+", default=[16, 128, 512, 4096, 16384])
    p.add_argument("--n", type=int, default=7168)
    p.add_argument("--k", type=int, default=43008)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--out", default="benchmarks/results/gemm.json")
    p.add_argument("--git-rev", default=None)
    p.add_argument(
        "--variants",
        nargs="*",
        default=[],
        help="also time these named configs (ours only) at the first token count",
    )
    p.add_argument("--sweep", action="store_true", help="every listed shape and token count")
    p.add_argument("--tune", action="store_true", help="time candidate configs per point")
    p.add_argument("--before", action="store_true", help="sweep: also the pre-table heuristic")
    p.add_argument("--write-table", default=None, help="tune: write the table module here")
    p.add_argument("--plot", default=None, help="redraw the PNG of this sweep receipt")
    p.add_argument("--shapes", default=None, help="sweep/tune: N,K;N,K;... (default: all)")
    p.add_argument("--sweep-tokens", type=int, nargs="+", default=None)
    p.add_argument("--workers", type=int, default=12)
    p.add_argument("--deadline-s", type=float, default=420.0)
    p.add_argument("--no-stream-k", action="store_true", help="tune: leave stream-K out")
    p.add_argument("--lock", default=None, help="sweep/tune: GPU lock file shared with others")
    p.add_argument("--gate", default=None, help="tune: leave out specs containing its words")
    p.add_argument("--tune-base", default=None, help="tune: earlier receipt for other points")
    args = p.parse_args()
    if args.sweep or args.tune or args.plot:
        import gemm_sweep

        gemm_sweep.main(args)
        return
    variants = {}
    if args.variants:
        variants = bench_variants(args.tokens[0], args.n, args.k, args.variants, args.rounds)
    rows = []
    for t in args.tokens:
        row = bench(t, args.n, args.k, args.rounds)
        rows.append(row)
        print(
            f"tokens {t:6d}: ours {row.ours_ms:8.3f} ms {row.ours_tflops:7.1f} TF/s | "
            f"cuBLAS bf16 {row.cublas_bf16_ms:8.3f} ms {row.cublas_bf16_tflops:7.1f} | "
            f"dequant+cuBLAS {row.dequant_cublas_ms:8.3f} ms | "
            f"ours/cublas time {row.ours_over_cublas_bf16_time:.3f} | graph replay: ours "
            f"{row.ours_graph_ms:.3f} ms, cuBLAS {row.cublas_bf16_graph_ms:.3f} ms, ratio "
            f"{row.ours_over_cublas_bf16_graph_time:.3f} | host {row.ours_host_us_per_launch:.0f} us",
            flush=True,
        )
    receipt = {
        "what": "MXFP8 GEMM (SM90 CuTe DSL; config per row: kernel 'swap-ab' for few tokens, "
        "else 'tiled') vs cuBLAS BF16 torch.mm vs dequantize-to-BF16 "
        "+ cuBLAS; BF16 output, no bias",
        **environment(args.git_rev),
        "timing": "median of CUDA-event timings, interleaved rounds; before every sample 50 ms "
        "idle and an untimed run of the same launches (ours, cuBLAS and dequant alike), so "
        "no sample inherits the previous kernel's power and clock state",
        "ratio_direction": "ours_over_X_time < 1 means ours is faster",
        "rows": [asdict(r) for r in rows],
        "variants_ms": variants,
    }
    write_receipt(args.out, receipt)


if __name__ == "__main__":
    main()
