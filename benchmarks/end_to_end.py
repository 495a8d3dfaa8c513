"""End-to-end receipt: what staging buys a drafter-like projection, memory and time.

Six ways to run ``fc(cat([h1, ..., hn], -1))`` (fc an MXFP8 linear), measured side by side,
interleaved A B A B in one process:

1. concatenated eager: ``torch.cat`` + one-shot ``mm``
2. staged eager: ``empty_input`` + ``quantize_input_slice`` per slice + ``mm_quantized_into``
3. the module compiled with ``backend="mxfp8_fusion"``
4. the module compiled with plain Inductor (no pass)
5. BF16 ``torch.cat`` + cuBLAS ``torch.mm`` (what a user without MXFP8 runs)
6. CUDA Graph replay (``mode="reduce-overhead"``) of 3, its inputs static buffers (as when
   a serving engine captures the whole step and the slices come from earlier layers; fed
   fresh tensors, cudagraph trees would first copy them into its own buffers)

For each: transient peak bytes above what was allocated before the call, the median time,
and ratios to (1) with their direction. Writes ``benchmarks/results/end_to_end.json`` and
the allocation traces for the memory-timeline picture (``plot_memory.py``).

    python benchmarks/end_to_end.py [--rounds 30] [--out benchmarks/results/end_to_end.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from common import (
    QUEUE_CYCLES,
    Drafter,
    environment,
    make_drafter,
    run_staged,
    time_interleaved,
    transient_peak,
)

import mxfp8_fusion as mf


@dataclass(frozen=True)
class Geometry:
    name: str
    tokens: int
    hidden: int
    slices: int

    @property
    def flops(self) -> float:
        return 2.0 * self.tokens * self.hidden * self.slices * self.hidden


GEOMETRIES = [
    Geometry("reference: 6 x 7168 -> 7168, tokens 4096", tokens=4096, hidden=7168, slices=6),
    Geometry("drafter: 3 x 4096 -> 4096, tokens 16384", tokens=16384, hidden=4096, slices=3),
]


@dataclass
class Measurement:
    variant: str
    mode: str
    what: str
    median_ms: float
    median_ms_queued: float
    host_ms: float
    transient_peak_bytes: int
    resident_bytes: int = 0


def staged_runner(model: Drafter):
    return lambda *hidden: run_staged(model, list(hidden))


def bf16_runner(model: Drafter, weight_bf16: torch.Tensor):
    bias = model.fc.bias

    def run(*hidden):
        return torch.addmm(bias, torch.cat(hidden, dim=-1), weight_bf16.t())

    return run


def allocation_trace(fn, hidden) -> list[tuple[float, int]]:
    """(time in µs from the first event, bytes allocated above the start) per allocator event."""
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    try:
        fn(*hidden)
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    events = snapshot["device_traces"][torch.cuda.current_device()]
    level, trace = 0, [(0.0, 0)]
    t0 = events[0]["time_us"] if events else 0
    for e in events:
        if e["action"] == "alloc":
            level += e["size"]
        elif e["action"] == "free_completed":
            level -= e["size"]
        else:
            continue
        trace.append((float(e["time_us"] - t0), level))
    return trace


def host_ms(fn, hidden, calls: int = 10) -> float:
    """Median host ms a call takes to return, with the GPU busy so no launch waits on it."""
    samples = []
    for _ in range(calls):
        torch.cuda._sleep(QUEUE_CYCLES)
        start = time.perf_counter()
        fn(*hidden)
        samples.append((time.perf_counter() - start) * 1e3)
        torch.cuda.synchronize()
    return statistics.median(samples)


def kernel_breakdown(fns: dict, hidden, calls: int = 5) -> dict[str, dict[str, float]]:
    """Per variant: mean GPU ms per call of each kernel (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    result = {}
    for name, fn in fns.items():
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn(*hidden)
            torch.cuda.synchronize()
        kernels = {}
        for event in prof.key_averages():
            if event.device_type == torch.autograd.DeviceType.CUDA:
                ms = event.device_time_total / 1e3 / calls
                kernels[event.key[:80]] = round(ms, 4)
        top = dict(sorted(kernels.items(), key=lambda kv: -kv[1])[:8])
        result[name] = {"gpu_ms_per_kernel": top}
        print(f"{name}: kernels " + ", ".join(f"{k[:48]} {v:.3f}" for k, v in top.items()))
    return result


def isolated_timeline(fns: dict, hidden, rounds: int = 8) -> dict[str, dict[str, float]]:
    """Where an isolated call's time goes: the GPU timeline of ``rounds`` isolated calls per
    variant (the order rotated as in :func:`time_interleaved`) under torch.profiler.

    Per variant, medians in us from the call's start on the host: when its first kernel and
    its GEMM (its longest kernel) start, the GPU time of the kernels before the GEMM, the
    GEMM's duration and when the last kernel ends. The profiler adds host time per op, so
    the start offsets are larger than in the untraced timing; the kernels' durations are not.
    """
    import tempfile

    from torch.profiler import ProfilerActivity, profile, record_function

    names = list(fns)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                torch.cuda.synchronize()
                with record_function(f"call:{name}"):
                    fns[name](*hidden)
                torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as trace:
        prof.export_chrome_trace(trace.name)
        events = json.loads(Path(trace.name).read_text())["traceEvents"]
    calls = sorted(
        (e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("call:")),
        key=lambda e: e["ts"],
    )
    kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    rows = {name: [] for name in names}
    for i, call in enumerate(calls):
        t0 = call["ts"]
        t1 = calls[i + 1]["ts"] if i + 1 < len(calls) else float("inf")
        ks = [k for k in kernels if t0 <= k["ts"] < t1]
        if not ks:
            continue
        gemm = max(ks, key=lambda k: k["dur"])
        rows[call["name"][len("call:") :]].append(
            {
                "first_kernel_start_us": ks[0]["ts"] - t0,
                "gemm_start_us": gemm["ts"] - t0,
                "kernels_before_gemm_us": sum(k["dur"] for k in ks if k["ts"] < gemm["ts"]),
                "gemm_us": gemm["dur"],
                "last_kernel_end_us": max(k["ts"] + k["dur"] for k in ks) - t0,
            }
        )
    return {
        name: {key: round(statistics.median(r[key] for r in rs), 1) for key in rs[0]}
        for name, rs in rows.items()
        if rs
    }


def variants_of(model: Drafter) -> dict[str, tuple[str, str, object]]:
    """name -> (mode, what, callable) of the six ways to run ``model``'s projection."""
    weight_bf16 = mf.reference.dequantize(model.fc.weight_values, model.fc.weight_scales).to(
        torch.bfloat16
    )
    return {
        "1_concatenated_eager": ("eager", "torch.cat + one-shot mxfp8_fusion.mm", model),
        "2_staged_eager": (
            "eager",
            "empty_input + quantize_input_slice + mm_quantized_into",
            staged_runner(model),
        ),
        "3_compiled_mxfp8_fusion": (
            "compiled",
            "torch.compile(backend='mxfp8_fusion')",
            torch.compile(model, backend="mxfp8_fusion"),
        ),
        "4_compiled_inductor": (
            "compiled",
            "torch.compile(backend='inductor'), no pass",
            torch.compile(model, backend="inductor"),
        ),
        "5_bf16_cat_cublas": (
            "eager",
            "BF16 torch.cat + cuBLAS addmm",
            bf16_runner(model, weight_bf16),
        ),
        "6_graph_replay_mxfp8_fusion": (
            "graph replay",
            "torch.compile(backend='mxfp8_fusion', mode='reduce-overhead'), static inputs",
            torch.compile(model, backend="mxfp8_fusion", mode="reduce-overhead"),
        ),
    }


def measure(fns: dict, hidden, rounds: int, breakdown: bool) -> dict:
    """Every variant warmed up, then its transient peak and output, its times (idle and
    queued), host time, isolated timeline, optionally its kernels, and the allocation traces
    of (1)-(3); ``resident`` is what the warm-up left allocated (graph pools)."""
    found = {"peaks": {}, "outputs": {}}
    with torch.no_grad():
        base = torch.cuda.memory_allocated()
        for fn in fns.values():  # warm-up: compiles, autotuning, graph capture
            for _ in range(3):
                fn(*hidden)
        found["resident"] = torch.cuda.memory_allocated() - base
        for name, fn in fns.items():
            found["peaks"][name], out = transient_peak(fn, hidden)
            found["outputs"][name] = out.clone()
        found["times"] = time_interleaved(fns, hidden, rounds, queued=False)
        found["queued"] = time_interleaved(fns, hidden, rounds, queued=True)
        found["host"] = {name: host_ms(fn, hidden) for name, fn in fns.items()}
        found["timeline"] = isolated_timeline(fns, hidden)
        found["diagnosis"] = kernel_breakdown(fns, hidden) if breakdown else None
        found["traces"] = {
            name: allocation_trace(fns[name], hidden)
            for name in ("1_concatenated_eager", "2_staged_eager", "3_compiled_mxfp8_fusion")
        }
    return found


def ratios_to_first(measurements: list[Measurement], times, queued) -> dict[str, float]:
    """Each variant's time, queued time and transient peak over (1)'s, and (3) over (2) and
    (5), each key naming its direction."""
    first = measurements[0]
    t1, q1, p1 = first.median_ms, first.median_ms_queued, first.transient_peak_bytes
    ratios = (
        {f"{m.variant}_over_1_time (lower is faster)": m.median_ms / t1 for m in measurements}
        | {
            f"{m.variant}_over_1_time_queued (lower is faster)": m.median_ms_queued / q1
            for m in measurements
        }
        | {
            f"{m.variant}_over_1_transient_peak (lower is less memory)": m.transient_peak_bytes / p1
            for m in measurements
        }
    )
    three, others = "3_compiled_mxfp8_fusion", (("2", "2_staged_eager"), ("5", "5_bf16_cat_cublas"))
    for key, other in others:
        ratios[f"3_over_{key}_time (lower is faster)"] = times[three] / times[other]
    for key, other in others:
        ratios[f"3_over_{key}_time_queued (lower is faster)"] = queued[three] / queued[other]
    return ratios


def bench_geometry(geo: Geometry, rounds: int, breakdown: bool = False) -> dict:
    """One geometry's receipt entry: the six variants measured side by side (module doc)."""
    torch._dynamo.reset()
    model, hidden = make_drafter(geo.tokens, geo.hidden, geo.slices, torch.device("cuda"))
    variants = variants_of(model)
    fns = {name: v[2] for name, v in variants.items()}
    # (6) reads its own static copies of the same slices
    static_hidden = [h.clone() for h in hidden]
    for h in static_hidden:
        torch._dynamo.mark_static_address(h)
    graphed = fns["6_graph_replay_mxfp8_fusion"]
    fns["6_graph_replay_mxfp8_fusion"] = lambda *_: graphed(*static_hidden)
    found = measure(fns, hidden, rounds, breakdown)
    times, queued, peaks, outputs = (found[key] for key in ("times", "queued", "peaks", "outputs"))
    ref = outputs["1_concatenated_eager"].view(torch.int16)
    bitwise = {
        name: bool(torch.equal(outputs[name].view(torch.int16), ref))
        for name in ("2_staged_eager", "3_compiled_mxfp8_fusion", "6_graph_replay_mxfp8_fusion")
    }
    measurements = []
    for name, (mode, what, _) in variants.items():
        resident = found["resident"] if name.startswith("6") else 0
        row = (times[name], queued[name], found["host"][name], peaks[name], resident)
        measurements.append(Measurement(name, mode, what, *row))
    k = geo.hidden * geo.slices
    diagnosis = found["diagnosis"]
    return {
        "geometry": asdict(geo)
        | {"in_features": k, "out_features": geo.hidden, "tflop_per_call": geo.flops / 1e12},
        "bytes": {
            "bf16_concatenation": geo.tokens * k * 2,
            "mxfp8_storage": geo.tokens * k + mf.format.scale_bytes(geo.tokens, k),
            "output": geo.tokens * geo.hidden * 2,
        },
        "measurements": [asdict(m) for m in measurements],
        "ratios": ratios_to_first(measurements, times, queued),
        "bitwise_equal_to_1": bitwise,
        "isolated_timeline_us": found["timeline"],
        "memory_traces": found["traces"],
    } | ({"kernel_breakdown": diagnosis} if diagnosis else {})


def print_table(result: dict) -> None:
    geo = result["geometry"]
    print(f"\n{geo['name']}  ({geo['tflop_per_call']:.3f} TFLOP per call)")
    first = result["measurements"][0]
    t1, q1, p1 = first["median_ms"], first["median_ms_queued"], first["transient_peak_bytes"]
    print(
        f"{'variant':<30} {'mode':<13} {'ms':>8} {'x (1)':>6} {'queued ms':>10} {'x (1)':>6} "
        f"{'host ms':>8} {'transient peak':>16} {'x (1)':>6}"
    )
    for m in result["measurements"]:
        print(
            f"{m['variant']:<30} {m['mode']:<13} {m['median_ms']:>8.3f} {m['median_ms'] / t1:>6.3f} "
            f"{m['median_ms_queued']:>10.3f} {m['median_ms_queued'] / q1:>6.3f} {m['host_ms']:>8.3f} "
            f"{m['transient_peak_bytes']:>16,} {m['transient_peak_bytes'] / p1:>6.3f}"
        )
    print("bitwise equal to (1):", result["bitwise_equal_to_1"])
    print("isolated calls, profiled (us from the call's start): first kernel / GEMM start / GEMM")
    for name, t in result["isolated_timeline_us"].items():
        print(
            f"  {name:<30} {t['first_kernel_start_us']:8.1f} {t['gemm_start_us']:8.1f} "
            f"{t['gemm_us']:8.1f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--out", default="benchmarks/results/end_to_end.json")
    parser.add_argument("--git-rev", default=None)
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="also record per-kernel GPU times and host launch time per variant",
    )
    args = parser.parse_args()
    receipt = {
        "benchmark": "end_to_end",
        "environment": environment(args.git_rev),
        "method": (
            "median of CUDA-event timings of one call, variants interleaved A B A B per round "
            "(each round's order rotated by one), "
            "two ways: median_ms starts on an idle GPU (host launch time before each kernel is "
            "on the clock); median_ms_queued starts after a ~3 ms sleep kernel the host launches "
            "the call behind (GPU work only, as when the host runs ahead in a serving loop); "
            "host_ms = median host time for a call to return; "
            "isolated_timeline_us = the GPU timeline of 8 isolated calls per variant under "
            "torch.profiler (medians from the call's start on the host; the profiler adds host "
            "time per op, not kernel time); "
            "transient peak = max_memory_allocated during the call minus memory_allocated "
            "before it; ratios are variant / (1) concatenated eager"
        ),
        "rounds": args.rounds,
        "results": [],
    }
    for geo in GEOMETRIES:
        result = bench_geometry(geo, args.rounds, args.breakdown)
        print_table(result)
        receipt["results"].append(result)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(receipt, indent=1))
    print(f"\nreceipt: {args.out}")


if __name__ == "__main__":
    main()
