"""Benchmark the CuTe DSL slice quantizer against the memory ceiling and Inductor.

Measured side by side in one run, on one GPU:

* ours: six 4096 x 7168 BF16 slices quantized into one [4096, 43008] MXFP8 destination
  (six launches of the slice kernel, blocked scales);
* copy: a device-to-device copy moving the same number of bytes (read + write), the ceiling;
* inductor: ``torch.compile`` of ``cat`` + the plain-torch quantizer
  (``reference.quantize_rows``: values and row-major scales), one fused Triton kernel;
* latency at 1, 16 and 128 tokens for the six slices and for one slice, both ways, timed with
  CUDA events (L2 flushed between runs) and as CUDA Graph replays (no host overhead); for the
  six slices also ``run_many`` (one launch, checked bitwise against the reference at each
  token count) and, as a graph replay, ``run_many`` with the few-token tile turned off
  (``small_tokens=0``: the 64-row tile at every token count);
* host time per call at one token (Python launch overhead), both ways;
* the six launches and the latency rows again with ``pdl=False`` (plain launches instead of
  programmatic dependent launch), and the six launches with ``prefetch=False`` (no L2
  prefetch before the launch's wait), side by side.

Writes a JSON receipt (``--out``) and prints a table. Times are medians of
``triton.testing.do_bench`` runs.
"""

import argparse
import json
import os
import time
from dataclasses import asdict, dataclass, field

import torch
from common import cutlass_dsl_version, git_revision
from mxfp8_fusion.kernels import quantize_slice as kernel

from mxfp8_fusion import reference
from mxfp8_fusion.format import scale_bytes

SLICES = 6
WIDTH = 7168
TOKENS = 4096


@dataclass
class Measurement:
    name: str
    what: str
    median_ms: float
    bytes: int
    tb_per_s: float
    mode: str = "cuda-events, L2 flushed"
    extra: dict = field(default_factory=dict)


def _do_bench(fn, graph: bool = False) -> float:
    import triton.testing

    if graph:
        with torch.cuda.stream(torch.cuda.Stream()):
            return triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def _traffic(tokens: int, width: int, slices: int) -> int:
    """Bytes a quantizer must move: 2 B read + 1 B written per element + the scale bytes."""
    elements = tokens * width * slices
    return elements * 3 + elements // 32


def _storage(tokens: int, k: int):
    values = torch.empty(tokens, k, dtype=torch.float8_e4m3fn, device="cuda")
    scales = torch.empty(scale_bytes(tokens, k), dtype=torch.float8_e8m0fnu, device="cuda")
    return values, scales


def _ours(slices, values, scales, tile_rows, **launch):
    def fn():
        for i, s in enumerate(slices):
            kernel.run(s, values, scales, i * s.shape[1], tile_rows=tile_rows, **launch)

    return fn


def _ours_many(slices, values, scales, **launch):
    columns = [i * s.shape[1] for i, s in enumerate(slices)]

    def fn():
        kernel.run_many(slices, values, scales, columns, **launch)

    return fn


def _inductor(slices):
    compiled = torch.compile(
        lambda *xs: reference.quantize_rows(torch.cat(xs, dim=1)), dynamic=False
    )

    def fn():
        return compiled(*slices)

    return fn


def _host_us_per_call(fn, calls: int = 300) -> float:
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def _measure(name, what, fn, nbytes, graph=False, **extra) -> Measurement:
    ms = _do_bench(fn, graph=graph)
    mode = "cuda-graph replay" if graph else "cuda-events, L2 flushed"
    return Measurement(name, what, ms, nbytes, nbytes / ms / 1e9, mode, extra)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/quantize_slice.json")
    parser.add_argument("--tiles", default="32,64,128", help="tile_rows values to sweep")
    args = parser.parse_args()
    torch.manual_seed(0)
    k = SLICES * WIDTH
    results: list[Measurement] = []

    # --- the reference geometry -----------------------------------------------------------
    slices = [torch.randn(TOKENS, WIDTH, dtype=torch.bfloat16, device="cuda") for _ in range(6)]
    values, scales = _storage(TOKENS, k)
    nbytes = _traffic(TOKENS, WIDTH, SLICES)

    _ours(slices, values, scales, kernel.DEFAULT_TILE_ROWS)()
    want_v, want_s = reference.quantize(torch.cat(slices, dim=1))
    bitwise = bool(
        torch.equal(values.view(torch.uint8), want_v.view(torch.uint8))
        and torch.equal(scales.view(torch.uint8), want_s.view(torch.uint8))
    )

    copy_src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    copy_dst = torch.empty_like(copy_src)
    copy = _measure(
        "copy",
        "device-to-device copy, same read+write bytes",
        lambda: copy_dst.copy_(copy_src),
        2 * (nbytes // 2),
    )
    results.append(copy)

    ours_by_tile = {}
    for tile_rows in [int(t) for t in args.tiles.split(",") if t]:
        fn = _ours(slices, values, scales, tile_rows)
        fn()
        m = _measure(
            f"ours_tile{tile_rows}",
            f"CuTe DSL slice kernel, 6 launches, tile_rows={tile_rows}",
            fn,
            nbytes,
            tile_rows=tile_rows,
        )
        ours_by_tile[tile_rows] = m
        results.append(m)
    ours = ours_by_tile.get(kernel.DEFAULT_TILE_ROWS) or min(
        ours_by_tile.values(), key=lambda m: m.median_ms
    )

    ours_graph = _measure(
        "ours_graph",
        "CuTe DSL slice kernel, 6 launches replayed from a CUDA graph",
        _ours(slices, values, scales, kernel.DEFAULT_TILE_ROWS),
        nbytes,
        graph=True,
    )
    # the same six launches without programmatic dependent launch, side by side
    plain_fn = _ours(slices, values, scales, kernel.DEFAULT_TILE_ROWS, pdl=False)
    plain_fn()
    ours_plain = _measure(
        "ours_plain_launch", "CuTe DSL slice kernel, 6 plain launches (pdl=False)", plain_fn, nbytes
    )
    ours_plain_graph = _measure(
        "ours_plain_launch_graph", "6 plain launches replayed from a CUDA graph", plain_fn, nbytes,
        graph=True,
    )  # fmt: skip
    # and with PDL but without the L2 prefetch before its wait
    no_prefetch_fn = _ours(slices, values, scales, kernel.DEFAULT_TILE_ROWS, prefetch=False)
    no_prefetch_fn()
    ours_no_prefetch = _measure(
        "ours_no_prefetch", "6 PDL launches without the L2 prefetch (prefetch=False)",
        no_prefetch_fn, nbytes,
    )  # fmt: skip
    results += [ours_plain, ours_plain_graph, ours_no_prefetch]
    one_slice = _measure(
        "ours_one_slice",
        "CuTe DSL slice kernel, one 4096 x 7168 slice (one launch)",
        _ours(slices[:1], values, scales, kernel.DEFAULT_TILE_ROWS),
        _traffic(TOKENS, WIDTH, 1),
    )
    many_fn = _ours_many(slices, values, scales)
    values.view(torch.uint8).fill_(0x5A)  # poison: the check below must see run_many's bytes
    scales.view(torch.uint8).fill_(0xA5)
    many_fn()
    many_ok = bool(
        torch.equal(values.view(torch.uint8), want_v.view(torch.uint8))
        and torch.equal(scales.view(torch.uint8), want_s.view(torch.uint8))
    )
    ours_many = _measure(
        "ours_many", "CuTe DSL kernel, all six slices in one launch (run_many)", many_fn, nbytes
    )
    ours_many_graph = _measure(
        "ours_many_graph", "run_many replayed from a CUDA graph", many_fn, nbytes, graph=True
    )
    del want_v, want_s
    results += [ours_graph, one_slice, ours_many, ours_many_graph]

    ind_fn = _inductor(slices)
    ind_fn()
    inductor_graph = _measure(
        "inductor_graph", "Inductor kernel replayed from a CUDA graph", ind_fn, nbytes, graph=True
    )
    results.append(inductor_graph)
    inductor = _measure(
        "inductor",
        "torch.compile(cat + plain-torch quantize_rows), row-major scales",
        ind_fn,
        nbytes,
    )
    results.append(inductor)

    # --- latency at small token counts -------------------------------------------------------
    latency = []
    for tokens in (1, 16, 128):
        for count in (SLICES, 1):
            small = [s[:tokens].contiguous() for s in slices[:count]]
            v, sc = _storage(tokens, count * WIDTH)
            ours_fn = _ours(small, v, sc, kernel.DEFAULT_TILE_ROWS)
            ind = _inductor(small)
            ours_fn()
            ind()
            b = _traffic(tokens, WIDTH, count)
            row = {"tokens": tokens, "slices": count}
            for graph in (False, True):
                key = "graph" if graph else "events"
                mo = _measure(f"ours_t{tokens}_s{count}_{key}", "ours", ours_fn, b, graph)
                mi = _measure(f"inductor_t{tokens}_s{count}_{key}", "inductor", ind, b, graph)
                results += [mo, mi]
                row[f"ours_ms_{key}"] = mo.median_ms
                row[f"inductor_ms_{key}"] = mi.median_ms
                row[f"ours_over_inductor_time_{key}"] = mo.median_ms / mi.median_ms
                plain = _ours(small, v, sc, kernel.DEFAULT_TILE_ROWS, pdl=False)
                mp = _measure(f"ours_plain_t{tokens}_s{count}_{key}", "pdl=False", plain, b, graph)
                results.append(mp)
                row[f"ours_plain_launch_ms_{key}"] = mp.median_ms
            if count > 1:
                many_fn = _ours_many(small, v, sc)
                want_v, want_s = reference.quantize(torch.cat(small, dim=1))
                v.view(torch.uint8).fill_(0x5A)  # poison: the check must see run_many's bytes
                sc.view(torch.uint8).fill_(0xA5)
                many_fn()
                row["ours_many_bitwise_equal_to_reference"] = bool(
                    torch.equal(v.view(torch.uint8), want_v.view(torch.uint8))
                    and torch.equal(sc.view(torch.uint8), want_s.view(torch.uint8))
                )
                del want_v, want_s
                default_tile = _ours_many(small, v, sc, small_tokens=0)
                default_tile()
                md = _measure(
                    f"ours_many_default_tile_t{tokens}_graph",
                    "run_many, few-token tile off (small_tokens=0)",
                    default_tile,
                    b,
                    True,
                )
                results.append(md)
                row["ours_many_default_tile_ms_graph"] = md.median_ms
                for graph in (False, True):
                    key = "graph" if graph else "events"
                    mm = _measure(f"ours_many_t{tokens}_{key}", "run_many", many_fn, b, graph)
                    results.append(mm)
                    row[f"ours_many_ms_{key}"] = mm.median_ms
                    row[f"ours_many_over_inductor_time_{key}"] = (
                        mm.median_ms / row[f"inductor_ms_{key}"]
                    )
                if tokens == 1:
                    row["ours_many_host_us_per_call"] = _host_us_per_call(many_fn)
            if tokens == 1:
                row["ours_host_us_per_call"] = _host_us_per_call(ours_fn)
                row["inductor_host_us_per_call"] = _host_us_per_call(ind)
            latency.append(row)

    ratios = {
        "ours_over_copy_bandwidth": ours.tb_per_s / copy.tb_per_s,
        "inductor_time_over_ours_time": inductor.median_ms / ours.median_ms,
        "inductor_over_copy_bandwidth": inductor.tb_per_s / copy.tb_per_s,
        "ours_graph_over_copy_bandwidth": ours_graph.tb_per_s / copy.tb_per_s,
        "ours_plain_launch_over_copy_bandwidth": ours_plain.tb_per_s / copy.tb_per_s,
        "ours_no_prefetch_over_copy_bandwidth": ours_no_prefetch.tb_per_s / copy.tb_per_s,
        "ours_plain_launch_graph_over_copy_bandwidth": ours_plain_graph.tb_per_s / copy.tb_per_s,
        "inductor_graph_time_over_ours_graph_time": inductor_graph.median_ms / ours_graph.median_ms,
        "ours_one_slice_over_copy_bandwidth": one_slice.tb_per_s / copy.tb_per_s,
        "ours_many_over_copy_bandwidth": ours_many.tb_per_s / copy.tb_per_s,
        "ours_many_graph_over_copy_bandwidth": ours_many_graph.tb_per_s / copy.tb_per_s,
        "inductor_time_over_ours_many_time": inductor.median_ms / ours_many.median_ms,
    }
    receipt = {
        "benchmark": "quantize_slice",
        "geometry": {
            "slices": SLICES,
            "tokens": TOKENS,
            "width": WIDTH,
            "dtype": "bfloat16",
            "destination": [TOKENS, k],
        },
        "bytes_rule": "2 B read + 1 B written per element + 1 scale byte per 32 elements; "
        "copy moves the same total (half read, half written)",
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cutlass_dsl": cutlass_dsl_version(),
        "git_revision": git_revision(),
        "default_tile_rows": kernel.DEFAULT_TILE_ROWS,
        "small_tokens": kernel.SMALL_TOKENS,
        "ours_bitwise_equal_to_reference": bitwise,
        "ours_many_bitwise_equal_to_reference": many_ok,
        "headline": {
            "copy": asdict(copy),
            "ours": asdict(ours),
            "inductor": asdict(inductor),
            "ours_graph": asdict(ours_graph),
            "inductor_graph": asdict(inductor_graph),
            "ours_many": asdict(ours_many),
            "ours_many_graph": asdict(ours_many_graph),
        },
        "ratios": ratios,
        "ratio_directions": {
            "ours_over_copy_bandwidth": "higher is better; target >= 0.85",
            "inductor_time_over_ours_time": "> 1 means ours is faster",
            "inductor_over_copy_bandwidth": "Inductor's fraction of the copy ceiling",
            "ours_graph_over_copy_bandwidth": "as ours_over_copy_bandwidth, graph replay",
            "ours_plain_launch_over_copy_bandwidth": "six launches without programmatic "
            "dependent launch, same run; higher is better",
            "ours_plain_launch_graph_over_copy_bandwidth": "same, graph replay",
            "inductor_graph_time_over_ours_graph_time": "> 1 means ours is faster",
            "ours_one_slice_over_copy_bandwidth": "one launch, no gaps between kernels",
            "ours_many_over_copy_bandwidth": "six slices in one launch; higher is better",
            "ours_many_graph_over_copy_bandwidth": "same, graph replay",
            "inductor_time_over_ours_many_time": "> 1 means ours (one launch) is faster",
        },
        "latency": latency,
        "latency_note": "ours_over_inductor_time < 1 means ours is faster; 'events' includes "
        "host launch gaps the GPU cannot hide, 'graph' is GPU time only; "
        "ours_many_default_tile_ms_graph is run_many with the few-token tile turned off",
        "measurements": [asdict(m) for m in results],
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(receipt, f, indent=2)

    print(f"{receipt['gpu']}  torch {receipt['torch']}  cutlass-dsl {receipt['cutlass_dsl']}")
    print(f"bitwise equal to reference: 6 launches {bitwise}, one launch {many_ok}")
    print(f"{'what':<34}{'median ms':>12}{'TB/s':>10}")
    table = [copy, *ours_by_tile.values(), ours_graph, ours_plain, ours_plain_graph]
    table += [ours_no_prefetch, one_slice]
    table += [ours_many, ours_many_graph]
    for m in [*table, inductor, inductor_graph]:
        print(f"{m.name:<34}{m.median_ms:>12.4f}{m.tb_per_s:>10.3f}")
    for name, value in ratios.items():
        print(f"{name:<34}{value:>12.3f}")
    head = ["ours ev", "plain ev", "ind ev", "ours gr", "plain gr", "ind gr"]
    print(f"{'tokens':>6}{'slices':>7}" + "".join(f"{h:>10}" for h in head))
    for row in latency:
        cells = [row[f"{w}_ms_{key}"] for key in ("events", "graph")
                 for w in ("ours", "ours_plain_launch", "inductor")]  # fmt: skip
        print(f"{row['tokens']:>6}{row['slices']:>7}" + "".join(f"{c:>10.4f}" for c in cells))
    for row in latency:
        if "ours_many_ms_events" in row:
            print(
                f"tokens {row['tokens']:>4} six slices in one launch: events "
                f"{row['ours_many_ms_events']:.4f} ms, graph {row['ours_many_ms_graph']:.4f} ms "
                f"(few-token tile off {row['ours_many_default_tile_ms_graph']:.4f} ms; "
                f"inductor graph {row['inductor_ms_graph']:.4f} ms); bitwise "
                f"{row['ours_many_bitwise_equal_to_reference']}"
            )
    for row in latency:
        if "ours_host_us_per_call" in row:
            print(
                f"host us/call at 1 token, {row['slices']} slice(s): ours "
                f"{row['ours_host_us_per_call']:.1f}, inductor "
                f"{row['inductor_host_us_per_call']:.1f}, one launch "
                f"{row.get('ours_many_host_us_per_call', float('nan')):.1f}"
            )


if __name__ == "__main__":
    main()
