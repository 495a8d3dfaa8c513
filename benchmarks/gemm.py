"""GEMM receipts: the SM90 MXFP8 kernel against cuBLAS BF16.

By default, at N = 7168, K = 43008 (the reference geometry: six 7168-wide slices) and several
token counts, measured side by side in one process, interleaved per round:

* ours: ``kernels.gemm_sm90.run`` on MXFP8 values + blocked scales, into a BF16 output
* cublas_bf16: ``torch.mm`` on the BF16 tensors (``x @ w.T``), what a user without MXFP8 runs
* dequant_cublas: dequantize both MXFP8 operands to BF16, then ``torch.mm`` (emulation)

Medians of CUDA-event timings of back-to-back launches, and of CUDA Graph replays of the
same launches (GPU time without host launch gaps, what decode under graphs sees; at few
tokens the kernel is shorter than a Python launch). TFLOP/s uses 2*M*N*K. Writes
benchmarks/results/gemm.json.

    python benchmarks/gemm.py [--tokens 16 128 512 4096 16384] [--rounds 20] [--out PATH]

Across token counts and model shapes, as CUDA Graph replays in worker processes
(benchmarks/gemm_tools): ``--sweep`` times the config the measured table picks (and with
``--before`` the pre-table heuristic's) and draws the ratios to cuBLAS beside its receipt;
``--tune`` times the candidate configs of each point, and ``--write-table`` writes the
fastest valid one per point as kernels/gemm_sm90/tuning/table.json; ``--plot RECEIPT`` redraws a
sweep's PNG:

    python benchmarks/gemm.py --sweep [--before] [--out benchmarks/results/gemm_sweep.json]
    python benchmarks/gemm.py --tune --write-table kernels/gemm_sm90/tuning/table.json \
        [--out benchmarks/results/gemm_tune.json]

``--activation bf16`` does either for the W8A16 kernels (the BF16 tokens read as they are;
receipts ``*_w8a16.json``, a table of their own beside the W8A8 one):

    python benchmarks/gemm.py --tune --activation bf16 --write-table kernels/gemm_sm90/tuning/table.json

``--power``: sustained SM clock and board power at one token count, ours against cuBLAS
BF16. Each contender runs back to back for ``--seconds`` while ``nvidia-smi`` samples the SM
clock, the power draw and the active clock-event reasons every 50 ms (the first quarter of
the samples, the ramp, is dropped). A GEMM that holds the board at its power limit runs at
whatever clock that power buys, so its time is set by energy per FLOP as well as by cycles
per FLOP; ``cycles_per_call`` (time x median clock) separates the two. cuBLAS also runs with
an all-zero A operand: same instructions, less switching, less power.

    python benchmarks/gemm.py --power [--tokens 4096]   # benchmarks/results/gemm_power.json

``--decode``: the sweep at the decode points (gemm_tools/decode.py: 1-64 tokens on
drafter-sized weights, 96-128 on the reference shape, 48-256 on the MoE shape), each with
its time over the weight-read floor, and the targets those points are held to, met or not:

    python benchmarks/gemm.py --decode [--rounds 9]   # benchmarks/results/gemm_decode.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

import torch
from common import capture_graph, environment, require_cuda, write_receipt

from mxfp8_fusion import reference
from mxfp8_fusion.kernels.gemm_sm90.tuning import select as gemm_select

RESULTS = "benchmarks/results"
OUT = {
    "gemm": f"{RESULTS}/gemm.json",
    "sweep": f"{RESULTS}/gemm_sweep.json",
    "tune": f"{RESULTS}/gemm_tune.json",
    "power": f"{RESULTS}/gemm_power.json",
    "decode": f"{RESULTS}/gemm_decode.json",
}
TOKENS = [16, 128, 512, 4096, 16384]
POWER_TOKENS = 4096


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
    from mxfp8_fusion.kernels.gemm_sm90.host import gemm as gemm_sm90

    gen = torch.Generator(device="cuda").manual_seed(tokens)
    x = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02
    xv, xs = reference.quantize(x)
    wv, ws = reference.quantize(w)
    out = torch.empty(tokens, n, device="cuda", dtype=torch.bfloat16)
    properties = torch.cuda.get_device_properties(0)
    cfg = gemm_select.choose_config(tokens, n, k, properties.multi_processor_count, properties.name)

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


def bench_variants(tokens: int, n: int, k: int, schedules, rounds: int) -> dict:
    """Median ms of the config of each schedule (a table entry: ``select.config_of``, e.g.
    ``{"kernel": "tiled", "tile_m": 128, "tile_n": 64, "converters": 1, "stream_k": 1}``),
    by its label, against the table's choice, checked bitwise against it first."""
    from mxfp8_fusion.kernels.gemm_sm90.config import label
    from mxfp8_fusion.kernels.gemm_sm90.host import gemm as gemm_sm90

    gen = torch.Generator(device="cuda").manual_seed(0)
    xv, xs = reference.quantize(torch.randn(tokens, k, device="cuda", generator=gen))
    wv, ws = reference.quantize(torch.randn(n, k, device="cuda", generator=gen))
    out = torch.empty(tokens, n, device="cuda", dtype=torch.bfloat16)
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    base = gemm_select.choose_config(tokens, n, k, num_sms, torch.cuda.get_device_name())
    gemm_sm90.run(xv, xs, wv, ws, None, out, config=base)
    expected = out.clone()
    fns = {}
    for schedule in schedules:
        cfg = gemm_select.config_of(schedule, tokens, num_sms)
        name = label(cfg)
        fns[name] = lambda cfg=cfg: gemm_sm90.run(xv, xs, wv, ws, None, out, config=cfg)
        out.zero_()
        fns[name]()
        same = bool(torch.equal(out.view(torch.int16), expected.view(torch.int16)))
        print(f"variant {name}: bitwise equal to the default config: {same}", flush=True)
    samples = {name: [] for name in fns}
    for _ in range(rounds):  # interleaved, so clock drift hits every variant alike
        for name, fn in fns.items():
            samples[name].append(_time(fn, 1, 3))
    result = {}
    for name in fns:
        result[name] = ms = statistics.median(samples[name])
        print(
            f"variant {name:28s} tokens {tokens}: {ms:.3f} ms "
            f"{2.0 * tokens * n * k / ms / 1e9:.1f} TF/s",
            flush=True,
        )
    return result


_QUERY = "clocks.sm,power.draw,clocks_event_reasons.active"


def sustained(fn, seconds: float) -> dict:
    """Run ``fn`` back to back for ``seconds``: ms per call and the sampled clock/power."""
    fn()
    torch.cuda.synchronize()
    sampler = subprocess.Popen(
        ["nvidia-smi", f"--query-gpu={_QUERY}", "--format=csv,noheader,nounits", "-lms", "50"],
        stdout=subprocess.PIPE,
        text=True,
    )
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    calls, t0 = 0, time.perf_counter()
    start.record()
    while time.perf_counter() - t0 < seconds:
        for _ in range(10):
            fn()
        calls += 10
        torch.cuda.synchronize()
    end.record()
    end.synchronize()
    sampler.terminate()
    lines = sampler.communicate()[0].strip().splitlines()
    rows = [line.split(", ") for line in lines[len(lines) // 4 :]]
    ms = start.elapsed_time(end) / calls
    clock = statistics.median(float(r[0]) for r in rows)
    return {
        "ms_per_call": ms,
        "sm_clock_mhz": clock,
        "power_w": statistics.median(float(r[1]) for r in rows),
        "clock_event_reasons": sorted({r[2] for r in rows}),
        "cycles_per_call_millions": ms * clock / 1e3,
        "calls": calls,
    }


def bench_power(tokens: int, n: int, k: int, seconds: float, git_rev: str | None) -> dict:
    """The ``--power`` receipt: :func:`sustained` for ours, cuBLAS BF16, and cuBLAS BF16 with
    an all-zero A operand."""
    from mxfp8_fusion.kernels.gemm_sm90.host import gemm as gemm_sm90

    gen = torch.Generator(device="cuda").manual_seed(0)
    xv, xs = reference.quantize(torch.randn(tokens, k, device="cuda", generator=gen))
    wv, ws = reference.quantize(torch.randn(n, k, device="cuda", generator=gen))
    x16 = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    w16 = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    zeros = torch.zeros_like(x16)
    out = torch.empty(tokens, n, device="cuda", dtype=torch.bfloat16)
    contenders = {
        "ours_mxfp8": lambda: gemm_sm90.run(xv, xs, wv, ws, None, out),
        "cublas_bf16": lambda: torch.mm(x16, w16.t(), out=out),
        "cublas_bf16_zero_a": lambda: torch.mm(zeros, w16.t(), out=out),
    }
    results = {}
    for name, fn in contenders.items():
        results[name] = r = sustained(fn, seconds)
        print(
            f"{name:20s} {r['ms_per_call']:.3f} ms/call  {r['sm_clock_mhz']:.0f} MHz  "
            f"{r['power_w']:.0f} W  {r['cycles_per_call_millions']:.2f} M cycles  "
            f"reasons {r['clock_event_reasons']}",
            flush=True,
        )
        time.sleep(1.0)
    limit = subprocess.run(
        ["nvidia-smi", "--query-gpu=power.limit", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return {
        "what": "sustained back-to-back GEMMs (tokens x N x K below, BF16 out): ms per "
        "call and nvidia-smi's SM clock, power and clock-event reasons (median of 50 ms "
        "samples after the first quarter)",
        **environment(git_rev),
        "shape": {"tokens": tokens, "n": n, "k": k},
        "power_limit_w": limit,
        "results": results,
    }


def bench_receipt(args) -> dict:
    """The default receipt: :func:`bench` at each token count (and the ``--variants``
    schedules at the first one)."""
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
    return {
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


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--tokens", type=int, nargs="+", default=None,
        help=f"default {TOKENS}; with --power one count, default {POWER_TOKENS}",
    )  # fmt: skip
    p.add_argument("--n", type=int, default=7168)
    p.add_argument("--k", type=int, default=43008)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--out", default=None, help="default benchmarks/results/gemm[_MODE].json")
    p.add_argument("--git-rev", default=None)
    p.add_argument(
        "--variants",
        nargs="*",
        type=json.loads,
        default=[],
        help="also time the configs of these schedules (ours only; each a table entry as JSON, "
        'e.g. \'{"kernel": "tiled", "tile_m": 128, "tile_n": 64, "converters": 1, '
        '"stream_k": 1}\') at the first token count',
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--sweep", action="store_true", help="every listed shape and token count")
    mode.add_argument("--tune", action="store_true", help="time candidate configs per point")
    mode.add_argument("--plot", default=None, help="redraw the PNG of this sweep receipt")
    mode.add_argument("--power", action="store_true", help="sustained clock and power")
    mode.add_argument("--decode", action="store_true", help="the decode points and their targets")
    p.add_argument("--before", action="store_true", help="sweep: also the pre-table heuristic")
    p.add_argument(
        "--write-table", default=None, help="tune: write the measured table (table.json) here"
    )
    p.add_argument("--shapes", default=None, help="sweep/tune: N,K;N,K;... (default: all)")
    p.add_argument("--sweep-tokens", type=int, nargs="+", default=None)
    p.add_argument("--workers", type=int, default=12)
    p.add_argument("--deadline-s", type=float, default=420.0)
    p.add_argument("--no-stream-k", action="store_true", help="tune: leave stream-K out")
    p.add_argument("--lock", default=None, help="sweep/tune: GPU lock file shared with others")
    p.add_argument(
        "--gate",
        default=None,
        help='tune: a JSON file listing partial schedules (e.g. [{"kernel": "swap-ab", '
        '"cluster": 2}]) whose configs are left out',
    )
    p.add_argument("--tune-base", default=None, help="tune: earlier receipt for other points")
    p.add_argument(
        "--activation", choices=["mxfp8", "bf16"], default="mxfp8",
        help="sweep/tune: mxfp8 (W8A8) or bf16 (W8A16: the BF16 tokens read as they are)",
    )  # fmt: skip
    p.add_argument("--seconds", type=float, default=3.0, help="power: per contender")
    p.add_argument(
        "--rest-s", type=float, default=None,
        help="sweep/tune: seconds idle before each timed replay (default 0.02, tune 0.01; "
        "0: back to back, as benchmarks/w8a16.py times, where the power cap lowers the clock)",
    )  # fmt: skip
    return p


def main() -> None:
    parser = _parser()
    args = parser.parse_args()
    if args.rest_s is not None and args.rest_s < 0:
        parser.error(f"--rest-s: seconds of idle, 0 or more (got {args.rest_s})")
    if not args.plot:  # a plot only reads its receipt
        require_cuda(__file__)
    mode = next((m for m in ("sweep", "tune", "power", "decode") if getattr(args, m)), "gemm")
    suffix = "_w8a16" if args.activation == "bf16" and mode in ("sweep", "tune") else ""
    args.out = args.out or OUT[mode].replace(".json", f"{suffix}.json")
    if args.sweep or args.tune or args.plot or args.decode:
        from gemm_tools import runs

        runs.run(args)
    elif args.power:
        if args.tokens and len(args.tokens) > 1:
            parser.error("--power: one token count")
        tokens = args.tokens[0] if args.tokens else POWER_TOKENS
        write_receipt(args.out, bench_power(tokens, args.n, args.k, args.seconds, args.git_rev))
    else:
        args.tokens = args.tokens or TOKENS
        write_receipt(args.out, bench_receipt(args))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":  # one job of a sweep or tune
        from gemm_tools import points

        points.worker(json.loads(sys.argv[2]))
    else:
        main()
