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
from dataclasses import asdict, dataclass, field

import torch
from common import cutlass_dsl_version, git_revision, host_us_per_call, require_cuda

from mxfp8_fusion import reference
from mxfp8_fusion.format import scale_bytes
from mxfp8_fusion.kernels.quantize import host as kernel

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


def _measure(name, what, fn, nbytes, graph=False, **extra) -> Measurement:
    ms = _do_bench(fn, graph=graph)
    mode = "cuda-graph replay" if graph else "cuda-events, L2 flushed"
    return Measurement(name, what, ms, nbytes, nbytes / ms / 1e9, mode, extra)


def _bitwise_equal(values, scales, want_v, want_s) -> bool:
    return bool(
        torch.equal(values.view(torch.uint8), want_v.view(torch.uint8))
        and torch.equal(scales.view(torch.uint8), want_s.view(torch.uint8))
    )


def _many_is_bitwise(many_fn, values, scales, want_v, want_s) -> bool:
    """``run_many``'s bytes, written over poisoned storage, against the reference's."""
    values.view(torch.uint8).fill_(0x5A)  # poison: the check must see run_many's bytes
    scales.view(torch.uint8).fill_(0xA5)
    many_fn()
    return _bitwise_equal(values, scales, want_v, want_s)


def _measure_tiles(slices, values, scales, nbytes, tiles: str) -> dict[int, Measurement]:
    """The six launches at each ``tile_rows`` of ``--tiles``."""
    ours_by_tile = {}
    for tile_rows in [int(t) for t in tiles.split(",") if t]:
        fn = _ours(slices, values, scales, tile_rows)
        fn()
        ours_by_tile[tile_rows] = _measure(
            f"ours_tile{tile_rows}",
            f"CuTe DSL slice kernel, 6 launches, tile_rows={tile_rows}",
            fn,
            nbytes,
            tile_rows=tile_rows,
        )
    return ours_by_tile


def _measure_launch_modes(slices, values, scales, nbytes) -> dict[str, Measurement]:
    """The six launches as a graph replay, without PDL, without the L2 prefetch, and one
    slice alone."""
    found = {}
    found["ours_graph"] = _measure(
        "ours_graph",
        "CuTe DSL slice kernel, 6 launches replayed from a CUDA graph",
        _ours(slices, values, scales, kernel.DEFAULT_TILE_ROWS),
        nbytes,
        graph=True,
    )
    # the same six launches without programmatic dependent launch, side by side
    plain_fn = _ours(slices, values, scales, kernel.DEFAULT_TILE_ROWS, pdl=False)
    plain_fn()
    found["ours_plain"] = _measure(
        "ours_plain_launch", "CuTe DSL slice kernel, 6 plain launches (pdl=False)", plain_fn, nbytes
    )
    found["ours_plain_graph"] = _measure(
        "ours_plain_launch_graph", "6 plain launches replayed from a CUDA graph", plain_fn, nbytes,
        graph=True,
    )  # fmt: skip
    # and with PDL but without the L2 prefetch before its wait
    no_prefetch_fn = _ours(slices, values, scales, kernel.DEFAULT_TILE_ROWS, prefetch=False)
    no_prefetch_fn()
    found["ours_no_prefetch"] = _measure(
        "ours_no_prefetch", "6 PDL launches without the L2 prefetch (prefetch=False)",
        no_prefetch_fn, nbytes,
    )  # fmt: skip
    found["one_slice"] = _measure(
        "ours_one_slice",
        "CuTe DSL slice kernel, one 4096 x 7168 slice (one launch)",
        _ours(slices[:1], values, scales, kernel.DEFAULT_TILE_ROWS),
        _traffic(TOKENS, WIDTH, 1),
    )
    return found


def _measure_inductor(slices, nbytes) -> dict[str, Measurement]:
    ind_fn = _inductor(slices)
    ind_fn()
    inductor_graph = _measure(
        "inductor_graph", "Inductor kernel replayed from a CUDA graph", ind_fn, nbytes, graph=True
    )
    inductor = _measure(
        "inductor",
        "torch.compile(cat + plain-torch quantize_rows), row-major scales",
        ind_fn,
        nbytes,
    )
    return {"inductor_graph": inductor_graph, "inductor": inductor}


def _reference_geometry(slices, values, scales, tiles: str) -> dict:
    """Every measurement at the reference geometry, in the order they run: the copy ceiling,
    the tile sweep, the launch modes, ``run_many``, then Inductor. Returns the named
    measurements (``m``), the tile sweep, the receipt's list of them, and the two bitwise
    checks."""
    nbytes = _traffic(TOKENS, WIDTH, SLICES)
    _ours(slices, values, scales, kernel.DEFAULT_TILE_ROWS)()
    want_v, want_s = reference.quantize(torch.cat(slices, dim=1))
    bitwise = _bitwise_equal(values, scales, want_v, want_s)

    copy_src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    copy_dst = torch.empty_like(copy_src)
    m = {}
    m["copy"] = _measure(
        "copy",
        "device-to-device copy, same read+write bytes",
        lambda: copy_dst.copy_(copy_src),
        2 * (nbytes // 2),
    )
    ours_by_tile = _measure_tiles(slices, values, scales, nbytes, tiles)
    m["ours"] = ours_by_tile.get(kernel.DEFAULT_TILE_ROWS) or min(
        ours_by_tile.values(), key=lambda x: x.median_ms
    )
    m |= _measure_launch_modes(slices, values, scales, nbytes)
    many_fn = _ours_many(slices, values, scales)
    many_ok = _many_is_bitwise(many_fn, values, scales, want_v, want_s)
    m["ours_many"] = _measure(
        "ours_many", "CuTe DSL kernel, all six slices in one launch (run_many)", many_fn, nbytes
    )
    m["ours_many_graph"] = _measure(
        "ours_many_graph", "run_many replayed from a CUDA graph", many_fn, nbytes, graph=True
    )
    del want_v, want_s
    m |= _measure_inductor(slices, nbytes)
    order = ["ours_plain", "ours_plain_graph", "ours_no_prefetch", "ours_graph", "one_slice",
             "ours_many", "ours_many_graph", "inductor_graph", "inductor"]  # fmt: skip
    results = [m["copy"], *ours_by_tile.values(), *(m[name] for name in order)]
    return {"m": m, "ours_by_tile": ours_by_tile, "results": results,
            "bitwise": bitwise, "many_ok": many_ok}  # fmt: skip


def _latency_many(small, v, sc, b, tokens, row) -> list[Measurement]:
    """Latency row of the six slices: ``run_many`` checked bitwise, then timed (and with the
    few-token tile off); adds its fields to ``row``."""
    results = []
    many_fn = _ours_many(small, v, sc)
    want_v, want_s = reference.quantize(torch.cat(small, dim=1))
    row["ours_many_bitwise_equal_to_reference"] = _many_is_bitwise(many_fn, v, sc, want_v, want_s)
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
        row[f"ours_many_over_inductor_time_{key}"] = mm.median_ms / row[f"inductor_ms_{key}"]
    if tokens == 1:
        row["ours_many_host_us_per_call"] = host_us_per_call(many_fn)
    return results


def _latency_row(slices, tokens: int, count: int) -> tuple[dict, list[Measurement]]:
    """The first ``tokens`` rows of ``count`` slices, ours and Inductor, events and graph
    replay: the receipt's latency row and its measurements."""
    small = [s[:tokens].contiguous() for s in slices[:count]]
    v, sc = _storage(tokens, count * WIDTH)
    ours_fn = _ours(small, v, sc, kernel.DEFAULT_TILE_ROWS)
    ind = _inductor(small)
    ours_fn()
    ind()
    b = _traffic(tokens, WIDTH, count)
    row = {"tokens": tokens, "slices": count}
    results = []
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
        results += _latency_many(small, v, sc, b, tokens, row)
    if tokens == 1:
        row["ours_host_us_per_call"] = host_us_per_call(ours_fn)
        row["inductor_host_us_per_call"] = host_us_per_call(ind)
    return row, results


def _ratios(m: dict) -> dict[str, float]:
    copy, ours, inductor = m["copy"], m["ours"], m["inductor"]
    return {
        "ours_over_copy_bandwidth": ours.tb_per_s / copy.tb_per_s,
        "inductor_time_over_ours_time": inductor.median_ms / ours.median_ms,
        "inductor_over_copy_bandwidth": inductor.tb_per_s / copy.tb_per_s,
        "ours_graph_over_copy_bandwidth": m["ours_graph"].tb_per_s / copy.tb_per_s,
        "ours_plain_launch_over_copy_bandwidth": m["ours_plain"].tb_per_s / copy.tb_per_s,
        "ours_no_prefetch_over_copy_bandwidth": m["ours_no_prefetch"].tb_per_s / copy.tb_per_s,
        "ours_plain_launch_graph_over_copy_bandwidth": m["ours_plain_graph"].tb_per_s
        / copy.tb_per_s,
        "inductor_graph_time_over_ours_graph_time": m["inductor_graph"].median_ms
        / m["ours_graph"].median_ms,
        "ours_one_slice_over_copy_bandwidth": m["one_slice"].tb_per_s / copy.tb_per_s,
        "ours_many_over_copy_bandwidth": m["ours_many"].tb_per_s / copy.tb_per_s,
        "ours_many_graph_over_copy_bandwidth": m["ours_many_graph"].tb_per_s / copy.tb_per_s,
        "inductor_time_over_ours_many_time": inductor.median_ms / m["ours_many"].median_ms,
    }


_RATIO_DIRECTIONS = {
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
}


def _receipt(ref: dict, latency: list[dict], results: list[Measurement]) -> dict:
    m = ref["m"]
    headline = ("copy", "ours", "inductor", "ours_graph", "inductor_graph", "ours_many",
                "ours_many_graph")  # fmt: skip
    return {
        "benchmark": "quantize_slice",
        "geometry": {
            "slices": SLICES,
            "tokens": TOKENS,
            "width": WIDTH,
            "dtype": "bfloat16",
            "destination": [TOKENS, SLICES * WIDTH],
        },
        "bytes_rule": "2 B read + 1 B written per element + 1 scale byte per 32 elements; "
        "copy moves the same total (half read, half written)",
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cutlass_dsl": cutlass_dsl_version(),
        "git_revision": git_revision(),
        "default_tile_rows": kernel.DEFAULT_TILE_ROWS,
        "small_tokens": kernel.SMALL_TOKENS,
        "ours_bitwise_equal_to_reference": ref["bitwise"],
        "ours_many_bitwise_equal_to_reference": ref["many_ok"],
        "headline": {name: asdict(m[name]) for name in headline},
        "ratios": _ratios(m),
        "ratio_directions": _RATIO_DIRECTIONS,
        "latency": latency,
        "latency_note": "ours_over_inductor_time < 1 means ours is faster; 'events' includes "
        "host launch gaps the GPU cannot hide, 'graph' is GPU time only; "
        "ours_many_default_tile_ms_graph is run_many with the few-token tile turned off",
        "measurements": [asdict(m) for m in results],
    }


def _print_latency(latency: list[dict]) -> None:
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


def _print_report(receipt: dict, ref: dict) -> None:
    m = ref["m"]
    print(f"{receipt['gpu']}  torch {receipt['torch']}  cutlass-dsl {receipt['cutlass_dsl']}")
    print(f"bitwise equal to reference: 6 launches {ref['bitwise']}, one launch {ref['many_ok']}")
    print(f"{'what':<34}{'median ms':>12}{'TB/s':>10}")
    table = [m["copy"], *ref["ours_by_tile"].values()]
    table += [m[name] for name in ("ours_graph", "ours_plain", "ours_plain_graph",
                                   "ours_no_prefetch", "one_slice", "ours_many",
                                   "ours_many_graph", "inductor", "inductor_graph")]  # fmt: skip
    for row in table:
        print(f"{row.name:<34}{row.median_ms:>12.4f}{row.tb_per_s:>10.3f}")
    for name, value in receipt["ratios"].items():
        print(f"{name:<34}{value:>12.3f}")
    _print_latency(receipt["latency"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/quantize_slice.json")
    parser.add_argument("--tiles", default="32,64,128", help="tile_rows values to sweep")
    args = parser.parse_args()
    require_cuda(__file__)
    torch.manual_seed(0)
    slices = [torch.randn(TOKENS, WIDTH, dtype=torch.bfloat16, device="cuda") for _ in range(6)]
    values, scales = _storage(TOKENS, SLICES * WIDTH)
    ref = _reference_geometry(slices, values, scales, args.tiles)
    results = list(ref["results"])
    latency = []
    for tokens in (1, 16, 128):
        for count in (SLICES, 1):
            row, measured = _latency_row(slices, tokens, count)
            results += measured
            latency.append(row)
    receipt = _receipt(ref, latency, results)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(receipt, f, indent=2)
    _print_report(receipt, ref)


if __name__ == "__main__":
    main()
