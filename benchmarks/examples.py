"""Receipt for the examples at real dims: transient memory and time of each drafter site.

For each example of ``examples/`` (EAGLE-3 drafter 3 x 4096 -> 4096 with one Llama-3.1-8B
decoder layer, DeepSeek-V3 MTP block 2 x 7168 -> 7168 with one DeepSeek-V3 dense layer,
DFlash projection 6 x 7168 -> 7168), three programs, each compiled once with
``fullgraph=True`` and the token dim dynamic, then run at every token count:

1. ``fused``: the converted model (``mxfp8_fusion.convert``) compiled with
   ``backend="mxfp8_fusion"``;
2. ``inductor``: the same converted model compiled with plain Inductor (what the pass
   rewrites: the BF16 concatenation materialized, then quantized);
3. ``bf16``: the model before conversion (BF16 weights, cuBLAS GEMMs) compiled with plain
   Inductor.

Per row: transient peak bytes above what was allocated before the call, the median time
(variants interleaved, order rotated each round), ratios of (1) to (2) and (3) with their
direction, whether (1) and (2) agree bit for bit (the layer's output and the projection's),
and (1)'s relative error against (3). Writes ``benchmarks/results/examples.json``.

The EAGLE-3 and MTP rows need HF transformers; where it does not import they are skipped
with the reason (install it, or put a copy of it and its dependencies on PYTHONPATH).

``--bitwise`` measures instead why the EAGLE-3 drafter layer's output differs between the
rewritten program and plain Inductor's while the projection's output is bitwise equal. It
compiles the converted drafter at real dims (1024 tokens; caches off, so every compile
autotunes afresh) with ``backend="mxfp8_fusion"`` (fused) and plain Inductor (plain), twice
each, and counts differing output elements, in two modes:

1. Inductor's defaults: Triton times several configs of each reduction kernel (RMSNorm's
   sum of squares) and keeps the fastest, per compile;
2. ``torch.use_deterministic_algorithms(True)`` (and, where the installed Inductor has it,
   ``force_filter_reduction_configs``): reduction configs chosen without timing.

It writes ``benchmarks/results/examples_bitwise.json``.

``--decode`` times one drafter step at decode token counts (1, 8, 32, 64) as CUDA Graph
replay: each example's converted model compiled with ``backend="mxfp8_fusion"`` against its
BF16 model compiled with plain Inductor (both once, token dim dynamic), a graph of
``DECODE_INNER`` steps per program and token count, replays interleaved. The ratio is fused
/ BF16 step time; the target is at most ``DECODE_TARGET`` at 1-32 tokens. It writes
``benchmarks/results/examples_decode.json``.

    python benchmarks/examples.py [--rounds 20] [--only dflash eagle3 mtp]
    python benchmarks/examples.py --bitwise
    python benchmarks/examples.py --decode [--only eagle3]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from common import (
    capture_graph,
    environment,
    kernel_breakdown,
    require_cuda,
    time_interleaved,
    transient_peak,
    write_receipt,
)

import mxfp8_fusion as mf

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
sys.path.insert(0, str(EXAMPLES))

TOKENS = (1024, 4096, 16384)
BITWISE_TOKENS = 1024
RECEIPT = "benchmarks/results/examples.json"
BITWISE_RECEIPT = "benchmarks/results/examples_bitwise.json"
DECODE_RECEIPT = "benchmarks/results/examples_decode.json"
DECODE_TOKENS = (1, 8, 32, 64)
DECODE_INNER = 10  # drafter steps per graph
DECODE_TARGET = 0.75  # fused / BF16 step time at 1-32 tokens
DECODE_BREAKDOWN_TOKENS = 8  # this row also lists each program's longest kernels


@dataclass(frozen=True)
class Example:
    name: str
    module: str
    site: str
    needs_transformers: bool


EXAMPLE_LIST = [
    Example("dflash", "dflash_projection", "fc: 6 x 7168 -> 7168", False),
    Example("eagle3", "eagle3_drafter", "fc: 3 x 4096 -> 4096, then q/k/v: 2 x 4096", True),
    Example("mtp", "mtp_block", "eh_proj: 2 x 7168 -> 7168", True),
]


@dataclass
class Measurement:
    variant: str
    what: str
    median_ms: float
    median_ms_queued: float
    transient_peak_bytes: int


def _load(example: Example):
    """The example's module, or the reason it cannot run here."""
    try:
        module = __import__(example.module)
    except ImportError as error:
        hint = " (HF transformers is needed)" if example.needs_transformers else ""
        return None, f"{type(error).__name__}: {error}{hint}"
    return module, None


def _parts(example: Example, module):
    """(config at real dims, the inputs' token dims) of ``example``."""
    if example.name == "dflash":
        cfg = module.DFlashConfig.real()
        return cfg, module.token_dims(cfg)
    if example.name == "eagle3":
        return module.Eagle3Config.real(), module.TOKEN_DIMS
    return module.MTPConfig.real(), module.TOKEN_DIMS


def _rel_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.float() - ref.float()).norm() / ref.float().norm())


def _bitwise(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.equal(a.contiguous().view(torch.int16), b.contiguous().view(torch.int16)))


def compiled_variants(converted, bf16) -> dict[str, tuple[str, object]]:
    """name -> (what, compiled program) of the three programs (module doc)."""
    return {
        "1_fused": (
            "converted model, torch.compile(backend='mxfp8_fusion', fullgraph=True)",
            torch.compile(converted, backend="mxfp8_fusion", fullgraph=True),
        ),
        "2_inductor": (
            "converted model, torch.compile(backend='inductor', fullgraph=True), no pass",
            torch.compile(converted, backend="inductor", fullgraph=True),
        ),
        "3_bf16": (
            "BF16 model (before convert), torch.compile(backend='inductor', fullgraph=True)",
            torch.compile(bf16, backend="inductor", fullgraph=True),
        ),
    }


def _ratios(times, queued, peaks) -> dict[str, float]:
    """(1) over (2) and over (3): time, queued time, transient peak."""
    return {
        "1_over_2_time (lower is faster)": times["1_fused"] / times["2_inductor"],
        "1_over_3_time (lower is faster)": times["1_fused"] / times["3_bf16"],
        "1_over_2_time_queued (lower is faster)": queued["1_fused"] / queued["2_inductor"],
        "1_over_3_time_queued (lower is faster)": queued["1_fused"] / queued["3_bf16"],
        "1_over_2_transient_peak (lower is less memory)": peaks["1_fused"] / peaks["2_inductor"],
        "1_over_3_transient_peak (lower is less memory)": peaks["1_fused"] / peaks["3_bf16"],
    }


def bench_tokens(variants: dict, inputs, rounds: int) -> dict:
    """One token count's row: the programs of ``variants`` warmed up on ``inputs``, their
    transient peaks and outputs, their times (idle and queued), and the outputs compared."""
    fns = {name: v[1] for name, v in variants.items()}
    with torch.no_grad():
        for fn in fns.values():  # warm-up: compile (first token count), autotune
            for _ in range(2):
                fn(*inputs)
        peaks, outs = {}, {}
        for name, fn in fns.items():
            peaks[name], out = transient_peak(fn, inputs)
            outs[name] = tuple(o.clone() for o in out)
            del out
        times = time_interleaved(fns, inputs, rounds, queued=False)
        queued = time_interleaved(fns, inputs, rounds, queued=True)
    measurements = [
        Measurement(name, variants[name][0], times[name], queued[name], peaks[name]) for name in fns
    ]
    f, i, b = (outs[n] for n in ("1_fused", "2_inductor", "3_bf16"))
    return {
        "measurements": [asdict(m) for m in measurements],
        "ratios": _ratios(times, queued, peaks),
        "bitwise_1_vs_2": {"output": _bitwise(f[0], i[0]), "projection": _bitwise(f[1], i[1])},
        "rel_error_1_vs_3": {
            "output": _rel_error(f[0], b[0]),
            "projection": _rel_error(f[1], b[1]),
        },
    }


def bench_example(
    example: Example, tokens_list, rounds: int, device: torch.device | None = None, cfg=None
) -> dict:
    """One example's rows (``{"example", "skipped"}`` where it cannot run here). ``device``
    and ``cfg`` default to CUDA and the real dims."""
    module, reason = _load(example)
    if module is None:
        return {"example": example.name, "skipped": reason}
    device = device or torch.device("cuda")
    real, token_dims = _parts(example, module)
    cfg = cfg or real
    torch._dynamo.reset()
    bf16 = module.build(cfg, device)
    converted = mf.convert(copy.deepcopy(bf16))
    first = module.make_inputs(cfg, tokens_list[0], device)
    for x, dim in zip(first, token_dims, strict=True):
        torch._dynamo.mark_dynamic(x, dim)
    with torch.no_grad():
        report = mf.explain(converted, *first)
    torch._dynamo.reset()
    variants = compiled_variants(converted, bf16)
    rows = []
    for tokens in tokens_list:
        inputs = module.make_inputs(cfg, tokens, device)
        for x, dim in zip(inputs, token_dims, strict=True):
            torch._dynamo.mark_dynamic(x, dim)
        rows.append({"tokens": tokens} | bench_tokens(variants, inputs, rounds))
        print_row(example, rows[-1])
    return {
        "example": example.name,
        "site": example.site,
        "config": asdict(cfg),
        "explain": str(report),
        "sites_rewritten": len(report.rewritten),
        "sites_skipped": len(report.skipped),
        "rows": rows,
    }


def print_row(example: Example, row: dict) -> None:
    print(f"\n{example.name} ({example.site}), {row['tokens']} tokens")
    print(f"{'variant':<12} {'ms':>9} {'queued ms':>10} {'transient peak':>16}")
    for m in row["measurements"]:
        print(
            f"{m['variant']:<12} {m['median_ms']:>9.3f} {m['median_ms_queued']:>10.3f} "
            f"{m['transient_peak_bytes']:>16,}"
        )
    for key, value in row["ratios"].items():
        print(f"  {key}: {value:.3f}")
    print(f"  bitwise (1) vs (2): {row['bitwise_1_vs_2']}")
    print(f"  relative error (1) vs (3): {row['rel_error_1_vs_3']}")


def _step_graph(fn, inputs, inner: int):
    """A CUDA Graph of ``inner`` calls of ``fn(*inputs)`` (warmed up outside it)."""
    return capture_graph([lambda: fn(*inputs)] * inner)


def _replay_us(graph, inner: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    graph.replay()  # warm-up: both programs start from the same clock state
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / inner


def bench_decode_step(example: Example, tokens_list, rounds: int) -> dict:
    """One example's drafter step at each of ``tokens_list`` (module doc, ``--decode``)."""
    from shared import compile_fused, compile_inductor, mark_tokens_dynamic

    module, reason = _load(example)
    if module is None:
        return {"example": example.name, "skipped": reason}
    cfg, token_dims = _parts(example, module)
    torch._dynamo.reset()
    bf16 = module.build(cfg, "cuda")
    programs = {"fused": compile_fused(mf.convert(copy.deepcopy(bf16))),
                "bf16": compile_inductor(bf16)}  # fmt: skip
    rows = []
    with torch.no_grad():
        for tokens in tokens_list:
            inputs = module.make_inputs(cfg, tokens, "cuda")
            mark_tokens_dynamic(inputs, token_dims)
            for fn in programs.values():  # compile (first count), autotune
                fn(*inputs)
            graphs = {name: _step_graph(fn, inputs, DECODE_INNER) for name, fn in programs.items()}
            samples = {name: [] for name in graphs}
            for r in range(rounds):
                for name in list(graphs)[r % 2 :] + list(graphs)[: r % 2]:
                    samples[name].append(_replay_us(graphs[name], DECODE_INNER))
            us = {name: statistics.median(v) for name, v in samples.items()}
            rows.append({"tokens": tokens, "fused_us": us["fused"], "bf16_us": us["bf16"],
                         "fused_over_bf16": us["fused"] / us["bf16"]})  # fmt: skip
            if tokens == DECODE_BREAKDOWN_TOKENS:  # where a step's GPU time goes
                rows[-1]["kernels"] = kernel_breakdown(programs, inputs, top=16)
            print(f"{example.name} {tokens:3d} tokens: fused {us['fused']:8.1f} us, BF16 "
                  f"{us['bf16']:8.1f} us, ratio {rows[-1]['fused_over_bf16']:.3f}", flush=True)  # fmt: skip
            del graphs
    met = all(r["fused_over_bf16"] <= DECODE_TARGET for r in rows if r["tokens"] <= 32)
    return {"example": example.name, "site": example.site, "config": asdict(cfg),
            "rows": rows, "target_met": met}  # fmt: skip


def bench_decode(args) -> dict:
    """The ``--decode`` receipt."""
    results = []
    for example in EXAMPLE_LIST:
        if not args.only or example.name in args.only:
            try:
                results.append(bench_decode_step(example, DECODE_TOKENS, args.rounds))
            except Exception:  # record it and go on with the other examples
                results.append({"example": example.name, "failed": traceback.format_exc(limit=4)})
            torch.cuda.empty_cache()
    return {
        "benchmark": "examples_decode",
        "environment": environment(args.git_rev),
        "method": (
            "one drafter step per example at real dims: the converted model compiled with "
            "backend='mxfp8_fusion' (fused) and the BF16 model before convert compiled with "
            "plain Inductor (bf16), each once (fullgraph, token dim dynamic); per token count "
            f"a CUDA Graph of {DECODE_INNER} steps per program, replays interleaved (order "
            "rotated each round), one untimed replay before each timed one; medians in us "
            "per step"
        ),
        "target": f"fused_over_bf16 at most {DECODE_TARGET} at 1-32 tokens",
        "rounds": args.rounds,
        "results": results,
    }


def _differing(a, b) -> int:
    return int((a[0] != b[0]).sum())


def bench_bitwise(git_rev: str | None) -> dict:
    """The ``--bitwise`` receipt (module doc): differing output elements of two compiles of
    each program, under Inductor's defaults and with reduction configs chosen without
    timing."""
    import eagle3_drafter as ex
    from shared import compile_fused, compile_inductor, mark_tokens_dynamic

    torch._inductor.config.force_disable_caches = True  # every compile autotunes afresh
    cfg = ex.Eagle3Config.real()
    model = ex.build(cfg, "cuda")
    mf.convert(model)
    inputs = ex.make_inputs(cfg, BITWISE_TOKENS, "cuda")
    mark_tokens_dynamic(inputs, ex.TOKEN_DIMS)
    results = {}
    with torch.no_grad():
        for mode in ("inductor defaults", "reduction configs chosen without timing"):
            if mode != "inductor defaults":
                torch.use_deterministic_algorithms(True, warn_only=True)
                if hasattr(torch._inductor.config, "force_filter_reduction_configs"):
                    torch._inductor.config.force_filter_reduction_configs = True
            runs = []
            for _ in range(2):
                torch._dynamo.reset()
                fused = compile_fused(model)(*inputs)
                torch._dynamo.reset()
                plain = compile_inductor(model)(*inputs)
                runs.append((fused, plain))
            (f1, p1), (f2, p2) = runs
            results[mode] = {
                "fused_vs_plain_output": [_differing(f1, p1), _differing(f2, p2)],
                "fused_compile_1_vs_2_output": _differing(f1, f2),
                "plain_compile_1_vs_2_output": _differing(p1, p2),
                "fused_vs_plain_projection_bitwise": torch.equal(f1[1], p1[1]),
            }
            print(mode, results[mode])
    return {
        "benchmark": "examples_bitwise",
        "environment": environment(git_rev),
        "what": (
            f"EAGLE-3 drafter (3 x 4096 -> 4096, one Llama-3.1-8B decoder layer), converted, "
            f"{BITWISE_TOKENS} tokens: output elements (of {f1[0].numel()}) that differ between "
            "compiled programs, two compiles of each"
        ),
        "results": results,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS))
    parser.add_argument("--only", nargs="+", choices=[e.name for e in EXAMPLE_LIST])
    parser.add_argument(
        "--bitwise", action="store_true", help="the EAGLE-3 output's bits across compiles"
    )
    parser.add_argument(
        "--decode", action="store_true", help="a drafter step at decode token counts"
    )
    parser.add_argument(
        "--out", default=None,
        help=f"default {RECEIPT}; {BITWISE_RECEIPT} or {DECODE_RECEIPT} with those modes",
    )  # fmt: skip
    parser.add_argument("--git-rev", default=None)
    args = parser.parse_args()
    require_cuda(__file__)
    if args.bitwise:
        write_receipt(args.out or BITWISE_RECEIPT, bench_bitwise(args.git_rev))
        return
    if args.decode:
        write_receipt(args.out or DECODE_RECEIPT, bench_decode(args))
        return
    receipt = {
        "benchmark": "examples",
        "environment": environment(args.git_rev),
        "method": (
            "each example at real dims, three programs compiled once (fullgraph, token dim "
            "dynamic) and run at each token count: (1) the converted model with "
            "backend='mxfp8_fusion', (2) the same converted model with plain Inductor, (3) the "
            "BF16 model before convert with plain Inductor; median of CUDA-event timings of "
            "one call, variants interleaved (order rotated each round), median_ms from an idle "
            "GPU, median_ms_queued behind a ~3 ms sleep kernel (GPU work only); transient peak "
            "= max_memory_allocated during the call minus memory_allocated before it (outputs "
            "included); ratios are (1) / (2) and (1) / (3)"
        ),
        "rounds": args.rounds,
        "results": [],
    }
    for example in EXAMPLE_LIST:
        if args.only and example.name not in args.only:
            continue
        try:
            result = bench_example(example, args.tokens, args.rounds)
        except Exception:  # record it and go on with the other examples
            result = {"example": example.name, "failed": traceback.format_exc(limit=4)}
        for outcome in ("skipped", "failed"):
            if outcome in result:
                print(f"\n{example.name}: {outcome}: {result[outcome]}")
        receipt["results"].append(result)
        torch.cuda.empty_cache()
    write_receipt(args.out or RECEIPT, receipt)


if __name__ == "__main__":
    main()
