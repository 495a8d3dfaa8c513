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
and ratios to (1) with their direction. Writes ``benchmarks/results/end_to_end.json`` with
the allocation traces of (1)-(3). From a receipt, ``--plot`` draws the memory timeline
(``end_to_end_memory.png`` beside the receipt, or ``--png``) and ``--readme-table`` prints
the README's results table.

    python benchmarks/end_to_end.py [--rounds 30] [--out benchmarks/results/end_to_end.json]
    python benchmarks/end_to_end.py --plot [RECEIPT] [--png PATH]
    python benchmarks/end_to_end.py --readme-table [RECEIPT]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from common import (
    Drafter,
    allocation_trace,
    environment,
    host_ms,
    isolated_timeline,
    kernel_breakdown,
    make_drafter,
    require_cuda,
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


RECEIPT = "benchmarks/results/end_to_end.json"
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


# the traces the memory-timeline picture draws, and their legends
PLOT_LABELS = {
    "1_concatenated_eager": "concatenated eager (cat + one-shot mm)",
    "2_staged_eager": "staged eager (quantize_input_slice + mm_quantized_into)",
    "3_compiled_mxfp8_fusion": "compiled, backend='mxfp8_fusion'",
}


def plot_memory(receipt: dict, out: Path) -> None:
    """Allocated bytes over one call of the concatenated path and of the staged paths, one
    panel per geometry, as a PNG at ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = receipt["results"]
    fig, axes = plt.subplots(1, len(results), figsize=(6.5 * len(results), 4.2), squeeze=False)
    for ax, result in zip(axes[0], results, strict=True):
        for name, label in PLOT_LABELS.items():
            trace = result["memory_traces"].get(name)
            if not trace:
                continue
            t = [p[0] / 1000.0 for p in trace]
            mib = [p[1] / 2**20 for p in trace]
            ax.step(t, mib, where="post", label=label, linewidth=1.8)
        sizes = result["bytes"]
        ax.axhline(sizes["bf16_concatenation"] / 2**20, color="grey", linestyle=":", linewidth=1)
        ax.text(
            0,
            sizes["bf16_concatenation"] / 2**20,
            " BF16 concatenation alone",
            va="bottom",
            fontsize=8,
            color="grey",
        )
        ax.set_title(result["geometry"]["name"], fontsize=10)
        ax.set_xlabel("host time of allocator events within the call (ms)")
        ax.set_ylabel("MiB allocated above the start of the call")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower center")
    env = receipt["environment"]
    fig.suptitle(
        f"mxfp8_fusion: transient memory of one projection call ({env['gpu']}, torch {env['torch']})",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


def print_readme_table(receipt: dict) -> None:
    """The README's compact results table (queued time and transient peak over (1), per
    geometry) and the line under it."""
    env = receipt["environment"]
    results = receipt["results"]
    names = [r["geometry"]["name"].split(":")[0] for r in results]
    head = ["path"] + [f"{n}: {what}" for n in names for what in ("time / (1)", "peak / (1)")]
    print("| " + " | ".join(head) + " |")
    print("| --- |" + " ---: |" * (len(head) - 1))
    firsts = [r["measurements"][0] for r in results]
    for i, m in enumerate(results[0]["measurements"]):
        cells = [f"({m['variant'].split('_')[0]}) {m['what']}"]
        for r, first in zip(results, firsts, strict=True):
            row = r["measurements"][i]
            cells.append(f"{row['median_ms_queued'] / first['median_ms_queued']:.2f}")
            cells.append(f"{row['transient_peak_bytes'] / first['transient_peak_bytes']:.2f}")
        print("| " + " | ".join(cells) + " |")
    geoms = "; ".join(
        f"{r['geometry']['name']}: {r['measurements'][0]['median_ms_queued']:.2f} ms and "
        f"{r['measurements'][0]['transient_peak_bytes'] / 2**20:.0f} MiB for (1)"
        for r in results
    )
    print(
        f"\n{env['gpu']}, torch {env['torch']}, nvidia-cutlass-dsl {env['nvidia_cutlass_dsl']}; "
        f"median of {receipt['rounds']} interleaved rounds of GPU time with the host running "
        f"ahead; lower is better ({geoms})."
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--out", default=RECEIPT)
    parser.add_argument("--git-rev", default=None)
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="also record per-kernel GPU times and host launch time per variant",
    )
    parser.add_argument(
        "--plot",
        nargs="?",
        const=RECEIPT,
        metavar="RECEIPT",
        help="draw a receipt's memory timeline",
    )
    parser.add_argument("--png", default=None, help="--plot: default beside the receipt")
    parser.add_argument(
        "--readme-table",
        nargs="?",
        const=RECEIPT,
        metavar="RECEIPT",
        help="print the README's table",
    )
    args = parser.parse_args()
    if args.plot or args.readme_table:
        if args.plot:
            png = args.png or Path(args.plot).with_name("end_to_end_memory.png")
            plot_memory(json.loads(Path(args.plot).read_text()), Path(png))
        if args.readme_table:
            print_readme_table(json.loads(Path(args.readme_table).read_text()))
        return
    require_cuda(__file__)
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
