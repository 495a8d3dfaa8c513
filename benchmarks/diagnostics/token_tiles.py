"""Diagnostic (not shipped): where the W8A16 token-tile kernel's time goes, from kernel
variants defined here as subclasses of the shipped kernel (the shipped source is untouched):

* ``shipped``: the kernel as shipped (one weight fragment per consumer: it converts a stage
  once the wgmmas of the one before are done);
* ``double-buffered``: two weight fragments per consumer, so a stage is converted while the
  wgmmas of the one before run (the consumer waits for the wgmmas two stages back, frees
  their stage, then waits for the next): the same wgmmas in the same order, so the same
  bits as ``shipped`` (docs/gemm_log.md, variant 58);
* ``no-convert``: the double-buffered loop without the weight's loads and conversion (wrong
  results on purpose): the TMA stream, the pipeline and the wgmmas alone, the ceiling of
  this design;
* ``packed``: the shipped loop on a weight whose bytes are permuted inside every 64 bytes of
  K so that each thread's fragment bytes of a stage row are one 16-byte chunk: one 16-byte
  shared load per row instead of eight 4-byte loads of which half the bytes are another
  thread's. It runs on a permuted copy of the weight (``permute_weight``) and must give the
  shipped kernel's bits on the natural one (docs/gemm_log.md, variant 59);
* ``blocked``: ``packed`` on a weight also laid out in stage blocks: the 128 rows x 64 K
  bytes of each (weight tile, K stage) contiguous (8 KB), so that a stage's load reads
  one block instead of 128 row pieces of 64 bytes (``block_weight``); the same bits;
* ``ping-pong``: the shipped loop with the two consumers taking turns to issue their
  wgmmas (named barriers: consumer 0 issues stage s, then consumer 1 stage s, then
  consumer 0 stage s + 1, ...), so each converts its next stage while the other's wgmmas
  run instead of both converting at once; the same wgmmas per consumer in the same order,
  so the same bits;
* ``packed-no-lds``: ``packed`` with the weight's shared loads replaced by words made from
  the thread's row (wrong results on purpose): the conversion's instructions without its
  shared-memory traffic, between ``packed`` and ``no-convert``;
* ``pairs``: the shipped kernel on CTA pairs (``cluster`` 2), each CTA loading half of every
  stage's token tile for both: the same bits as ``shipped`` on whole tiles, and on split
  ones where the pairs split them as the CTAs do;
* ``prefetch``: the shipped kernel whose producer asks L2 for the weight 16 stages ahead
  of its loads (a TMA prefetch after each stage's loads): the same bits;
* ``before``: the stage loop as it was before variant 65, each scale factor made in seven
  instructions (the shipped loop makes one in a PRMT and an IMAD where the stage's scale
  bytes are below 128) and each weight word's shared address in an add of its own: the
  same bits;
* ``early-release``: the shipped loop with each stage freed once its wgmmas are done, before
  the consumer waits for the next stage's load rather than after: while a consumer waits
  for data it holds no stage, so one more stage can be in flight; the same bits.

Per case (a token-tile config at a token count), every variant and cuBLAS BF16 side by side
in one process: CUDA Graph replay cycling over weight copies beyond L2, interleaved per
round in rotated order, medians. Each variant's output is compared bitwise with
``shipped``'s first. The variants compile in parallel processes into a private kernel cache.

On an H100 or H200: ``python benchmarks/diagnostics/token_tiles.py --out DIR`` writes
DIR/gemm_diag_token_tiles.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # token_tile_variants

CASES = [  # (tokens, N, K, token tile, split tail)
    (64, 4096, 12288, 64, True),
    (128, 4096, 12288, 128, True),
    (64, 2048, 7168, 64, True),
    (256, 4096, 12288, 128, True),
    (1024, 4096, 12288, 256, False),
    (4096, 4096, 12288, 256, False),
    (512, 2048, 7168, 64, False),
    (1024, 2048, 7168, 128, False),
    (512, 7168, 14336, 256, False),
    (2048, 7168, 14336, 256, True),
    (1024, 11008, 4096, 256, False),
    (128, 7168, 43008, 128, True),
    (256, 7168, 43008, 256, True),
    (512, 4096, 12288, 128, False),
    (128, 7168, 14336, 128, True),
    (512, 11008, 4096, 192, True),
    (256, 4096, 20480, 128, True),
]
VARIANTS = (
    "shipped",
    "double-buffered",
    "no-convert",
    "packed",
    "blocked",
    "ping-pong",
    "packed-no-lds",
    "pairs",
    "prefetch",
    "before",
    "early-release",
)
ROUNDS = 9
SLICES_ENV = "TOKEN_TILES_SLICES"
"""How the harness tells its compile workers ``--slices``."""
VIEWS_ENV = "TOKEN_TILES_VIEWS"
WEIGHTS_ENV = "TOKEN_TILES_WEIGHTS"


def _data(n: int, k: int, tokens: int):
    """The case's operands (gemm_tools.points._Data); with ``--weights vllm`` the weight is
    the W8A16 benchmark's instead (benchmarks/w8a16.py: vllm_linear.vllm_style_layer, random
    E8M0 scales 118-125 per block), in as many copies, and cuBLAS multiplies its BF16 values."""
    from gemm_tools.points import _Data

    d = _Data(n, k, tokens)
    d.laid_out = {}
    if os.environ.get(WEIGHTS_ENV) == "vllm":
        from vllm_linear import dequantize, vllm_style_layer

        import mxfp8_fusion as mf

        layer = vllm_style_layer(n, k)
        values, scales = layer.weight.data, layer.weight_scale.data
        d.wq = [mf.pack_weight(values.clone(), scales.clone()) for _ in range(d.copies)]
        d.w = [dequantize(values, scales) for _ in range(d.copies)]
    return d


def compile_variant(variant: str, cfg, n: int, widths: tuple, out_dtype):
    """The compiled build of ``variant``'s kernel for ``cfg`` (a ``launcher.Build`` compiler)."""
    import cutlass

    from mxfp8_fusion.kernels.gemm_sm90.host import buffers
    from mxfp8_fusion.kernels.gemm_sm90.host import gemm as host
    from mxfp8_fusion.kernels.runtime import launcher

    out_ty = getattr(cutlass, host.CUTLASS_TYPES[out_dtype])
    from token_tile_variants import CLASSES

    kernel = CLASSES[variant](cfg, n, widths, n, None, out_ty)
    args = host.compile_args(cfg, widths, out_dtype, None)
    return launcher.compile_kernel(kernel, args, buffers.ARCH)


def _config(tokens, tile, split, variant="shipped"):
    from token_tile_variants import CLUSTERS

    from mxfp8_fusion.kernels.gemm_sm90.config import swap_ab_config

    pairs = CLUSTERS.get(variant, 1)
    return swap_ab_config(tokens, 132, 2, True, 128, pairs, "bf16", tile, split)


def _build(variant, tokens, n, k, tile, split):
    import torch

    from mxfp8_fusion.kernels.gemm_sm90.host import buffers
    from mxfp8_fusion.kernels.runtime import launcher

    facts = (variant, _config(tokens, tile, split, variant), n, _widths(k), torch.bfloat16)
    return launcher.Build("gemm w8a16 diagnostic", facts, buffers.ARCH, compile_variant)


def _compile(job) -> str:
    from mxfp8_fusion.kernels.runtime import launcher

    t0 = time.perf_counter()
    try:
        launcher.function(_build(*job))
    except Exception as e:  # recorded; the other builds go on
        return f"{job}: {type(e).__name__}: {e}"[:400]
    return f"{job}: {time.perf_counter() - t0:.0f} s"


def _widths(k: int) -> tuple:
    """The slice widths of K: ``--slices`` equal ones (one by default)."""
    count = int(os.environ.get(SLICES_ENV, "1"))
    return (k // count,) * count


_SLICES = {}  # (address, tokens) of x -> its slices, kept alive for the captured graphs


def _slices_of(x) -> list:
    """``x`` cut into the ``_widths`` slices: copies, each its own contiguous tensor (as a
    model's projections leave them), or with ``--views`` column views of ``x``."""
    key = (x.data_ptr(), *x.shape)
    if key not in _SLICES:
        widths = _widths(x.shape[1])
        parts = x.split(widths, dim=1)
        views = os.environ.get(VIEWS_ENV) == "1"
        _SLICES[key] = list(parts) if views or len(parts) == 1 else [p.contiguous() for p in parts]
    return _SLICES[key]


def _launch(build, cfg, x, w, out, tokens):
    """One launch of ``build`` on ``x`` cut into its slices (``_slices_of``; host.w8a16's
    argument order)."""
    from mxfp8_fusion.kernels.gemm_sm90.constants import MAX_SLICES
    from mxfp8_fusion.kernels.gemm_sm90.host import buffers
    from mxfp8_fusion.kernels.runtime import launcher

    parts = _slices_of(x)
    unused = (None,) * (MAX_SLICES - len(parts))
    ptrs = [p.data_ptr() for p in parts]
    strides = [p.stride(0) for p in parts]
    stream = launcher.raw_stream(0)
    args = (*ptrs, *unused, *strides, *unused, w.values.data_ptr(),
            w.scales.data_ptr(), None, out.data_ptr(), tokens)  # fmt: skip
    args += buffers.stream_workspace(cfg, x.device, 0, stream)
    launcher.launch(build, (*args, stream))


def _weights(d, variant):
    """The weight copies ``variant`` reads: ``d.wq``, or their permuted copies (made once)."""
    from token_tile_variants import LAYOUTS

    lay = LAYOUTS.get(variant)
    if lay is None:
        return d.wq
    if variant not in d.laid_out:
        from types import SimpleNamespace

        d.laid_out[variant] = [SimpleNamespace(values=lay(w.values), scales=w.scales) for w in d.wq]
    return d.laid_out[variant]


def _contenders(builds, cfgs, d, outs, tokens) -> dict:
    """name -> (launch i -> None): each variant (its config in ``cfgs``), and cuBLAS BF16 on
    the same tokens."""
    import torch

    x = d.x[:tokens]
    fns = {
        v: (
            lambda i, v=v: _launch(
                builds[v], cfgs[v], x, _weights(d, v)[i % d.copies], outs[v], tokens
            )
        )
        for v in builds
    }
    fns["cublas_bf16"] = lambda i: torch.mm(x, d.w[i % d.copies].t(), out=outs["shipped"])
    return fns


def measure(variants, cases, rest_s: float = 0.02) -> list[dict]:
    import torch
    from common import capture_graph
    from gemm_tools.points import MAX_INNER, _replay_ms

    rows = []
    for tokens, n, k, tile, split in cases:
        cfgs = {v: _config(tokens, tile, split, v) for v in variants}
        _SLICES.clear()  # the last case's tokens are freed
        d = _data(n, k, tokens)
        x = d.x[:tokens]
        outs = {v: torch.full((tokens, n), float("nan"), device="cuda", dtype=torch.bfloat16)
                for v in variants}  # fmt: skip
        builds = {v: _build(v, tokens, n, k, tile, split) for v in variants}
        for v in variants:
            _launch(builds[v], cfgs[v], x, _weights(d, v)[0], outs[v], tokens)
        torch.cuda.synchronize()
        same = {v: bool(torch.equal(outs[v], outs["shipped"])) for v in variants}
        inner = min(MAX_INNER, max(d.copies, int(2e13 // (2.0 * tokens * n * k)), 1))
        fns = _contenders(builds, cfgs, d, outs, tokens)
        graphs = {
            name: capture_graph([lambda i=i, f=f: f(i) for i in range(inner)])
            for name, f in fns.items()
        }
        samples = {name: [] for name in graphs}
        names = list(graphs)
        for r in range(ROUNDS):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                samples[name].append(_replay_ms(graphs[name], inner, rest_s) * 1e3)
        us = {name: round(statistics.median(v), 2) for name, v in samples.items()}
        row = {"tokens": tokens, "n": n, "k": k, "token_tile": tile, "split_tail": split,
               "us": us, "bitwise_as_shipped": same,
               "over_shipped": {v: round(us[v] / us["shipped"], 3) for v in variants}}  # fmt: skip
        print(json.dumps(row), flush=True)
        rows.append(row)
        del graphs
        torch.cuda.empty_cache()
    return rows


def launch_once(variants, cases) -> None:
    """Each variant launched once on each of ``cases`` (indices into CASES), for a profiler:
    ``ncu -k regex:"SwapAB|Packed|PingPong|Variant" ... token_tiles.py --once 7 4``."""
    import torch

    for i in cases:
        tokens, n, k, tile, split = CASES[i]
        d = _data(n, k, tokens)
        out = torch.empty(tokens, n, device="cuda", dtype=torch.bfloat16)
        for v in variants:
            cfg = _config(tokens, tile, split, v)
            _launch(_build(v, tokens, n, k, tile, split), cfg, d.x[:tokens], _weights(d, v)[0],
                    out, tokens)  # fmt: skip
            torch.cuda.synchronize()
        del d
        torch.cuda.empty_cache()


def compile_stamped(addr: int, cfg, n: int, widths: tuple, out_dtype):
    """``stamped``'s build writing into the buffer at ``addr`` (a launcher compiler)."""
    from token_tile_variants import Stamped

    Stamped.stamps_addr = addr
    return compile_variant("stamped", cfg, n, widths, out_dtype)


def stamps(case: int, launches: int = 5) -> dict:
    """``stamped`` on CASES[case]: per consumer, the median cycles (%clock64) of each step of
    a stage over its recorded stages, warps, CTAs and ``launches`` launches: waiting for the
    stage's load, for the previous stage's wgmmas, converting, issuing; a stage's period
    (issue to issue); from the consumer's start to its first stage's data (first_data), from
    its last recorded stage's issue to its end (tail: the drain, stores and split-tail sums
    where a CTA has at most STAMP_STAGES stages) and the whole (total). ``loads``: the
    producer's medians (``_producer_steps``)."""
    import torch
    from token_tile_variants import STAMP_CTAS, STAMP_POINTS, STAMP_ROWS, STAMP_STAGES, WARPS

    from mxfp8_fusion.kernels.gemm_sm90.host import buffers
    from mxfp8_fusion.kernels.runtime import launcher

    tokens, n, k, tile, split = CASES[case]
    cfg = _config(tokens, tile, split)
    shape = (STAMP_CTAS, WARPS, STAMP_ROWS, len(STAMP_POINTS))
    buf = torch.zeros(shape, dtype=torch.int64, device="cuda")
    facts = (buf.data_ptr(), cfg, n, _widths(k), torch.bfloat16)
    build = launcher.Build("gemm w8a16 stamped diagnostic", facts, buffers.ARCH, compile_stamped)
    d = _data(n, k, tokens)
    out = torch.empty(tokens, n, device="cuda", dtype=torch.bfloat16)
    names = ("load", "wgmma", "convert", "issue", "period", "first_data", "tail", "total")
    steps = {c: {name: [] for name in names} for c in (0, 1)}
    loads = {"slot_wait": [], "latency": [], "lead": []}
    for i in range(launches):
        buf.zero_()
        _launch(build, cfg, d.x[:tokens], d.wq[i % d.copies], out, tokens)
        torch.cuda.synchronize()
        t = buf.cpu()
        for cta in range(STAMP_CTAS):
            for warp in range(4, WARPS):  # the consumers' warps
                c = (warp - 4) // 4
                rows = [r for r in t[cta, warp, :STAMP_STAGES].tolist() if all(r)]
                begin, end = t[cta, warp, STAMP_STAGES, :2].tolist()
                if rows and begin and end:
                    steps[c]["first_data"].append(rows[0][0] - begin)
                    steps[c]["tail"].append(end - rows[-1][3])  # after its STAMP_STAGES-th
                    steps[c]["total"].append(end - begin)
                for prev, cur in itertools.pairwise(rows):
                    steps[c]["load"].append(cur[0] - prev[3])
                    steps[c]["period"].append(cur[3] - prev[3])
                for r in rows:
                    steps[c]["wgmma"].append(r[1] - r[0])
                    steps[c]["convert"].append(r[2] - r[1])
                    steps[c]["issue"].append(r[3] - r[2])
            _producer_steps(t[cta], loads)
    return {
        "tokens": tokens, "n": n, "k": k, "token_tile": tile, "split_tail": split,
        "cycles": {f"consumer {c}": {name: statistics.median(v) if v else None
                                     for name, v in steps[c].items()} for c in steps},
        "loads": {name: statistics.median(v) if v else None for name, v in loads.items()},
        "samples": len(steps[0]["period"]),
    }  # fmt: skip


def _producer_steps(t, loads: dict) -> None:
    """Per stage of one CTA's stamps ``t`` [warp][stage][point]: the producer's wait for a
    free slot (slot_wait: freed minus the previous stage's issue), the stage's load latency
    seen by the consumers (latency: the first consumer warp's data stamp minus the issue; the
    load's own latency where that consumer waited), and how early the loads were issued
    (lead: the first consumer warp's previous issue stamp minus this issue)."""
    from token_tile_variants import STAMP_STAGES, WARPS

    stages = STAMP_STAGES
    prod = t[0].tolist()
    for s in range(1, stages):
        freed, issued = prod[s][0], prod[s][1]
        data = [t[w, s, 0].item() for w in range(4, WARPS) if t[w, s, 0].item()]
        wanted = [t[w, s - 1, 3].item() for w in range(4, WARPS) if t[w, s - 1, 3].item()]
        if not (freed and issued and prod[s - 1][1] and data and wanted):
            continue
        loads["slot_wait"].append(freed - prod[s - 1][1])
        loads["latency"].append(min(data) - issued)
        loads["lead"].append(min(wanted) - issued)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    p.add_argument("--receipt", default="gemm_diag_token_tiles.json", help="its file name in --out")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    p.add_argument("--workers", type=int, default=14)
    p.add_argument("--slices", type=int, default=1,
                   help="the tokens as this many equal slices of K, each its own tensor")  # fmt: skip
    p.add_argument("--views", action="store_true",
                   help="the slices as column views of one [M, K] tensor instead")  # fmt: skip
    p.add_argument("--weights", choices=["random", "vllm"], default="random",
                   help="vllm: the W8A16 benchmark's weight (random per-block scales)")  # fmt: skip
    p.add_argument("--cases", nargs="+", type=int, metavar="CASE",
                   help="time only these cases (indices; default all)")  # fmt: skip
    p.add_argument(
        "--once",
        nargs="+",
        type=int,
        metavar="CASE",
        help="launch each variant once on these cases (indices), time nothing",
    )
    p.add_argument("--rest", type=float, default=0.02,
                   help="seconds idle before each timed replay (0: back to back, as a sweep)")  # fmt: skip
    p.add_argument("--stamps", nargs="+", type=int, metavar="CASE",
                   help="per-stage clock stamps of the shipped loop on these cases (indices)")  # fmt: skip
    args = p.parse_args()
    os.environ[SLICES_ENV] = str(args.slices)
    os.environ[VIEWS_ENV] = "1" if args.views else "0"
    os.environ[WEIGHTS_ENV] = args.weights
    if args.stamps:
        from common import environment

        with tempfile.TemporaryDirectory() as cache:
            os.environ["MXFP8_FUSION_CACHE_DIR"] = cache
            rows = [stamps(i) for i in args.stamps]
        for row in rows:
            print(json.dumps(row), flush=True)
        Path(args.out).mkdir(parents=True, exist_ok=True)
        receipt = {"what": stamps.__doc__, "slices": args.slices, "rows": rows, **environment()}
        (Path(args.out) / args.receipt).write_text(json.dumps(receipt, indent=1))
        return
    variants = ["shipped", *(v for v in args.variants if v != "shipped")]
    with tempfile.TemporaryDirectory() as cache:
        # the variants are not shipped builds: a private cache the compile workers share
        os.environ["MXFP8_FUSION_CACHE_DIR"] = cache
        picked = args.once or args.cases
        cases = [CASES[i] for i in picked] if picked else CASES
        jobs = [(v, *case) for case in cases for v in variants]
        t0 = time.perf_counter()
        with ProcessPoolExecutor(args.workers) as pool:  # before CUDA starts here
            for line in pool.map(_compile, jobs):
                print("compiled", line, flush=True)
        compile_s = round(time.perf_counter() - t0, 1)
        if args.once:
            launch_once(variants, args.once)
            return
        rows = measure(variants, cases, args.rest)
    from common import environment

    what, variants_doc, how = __doc__.split("\n\n")[:3]
    receipt = {"what": what, "variants": variants_doc, "how": how,
               "compile_s": compile_s, "rounds": ROUNDS, "rest_s": args.rest, "slices": args.slices,
               "slice_views": args.views, "weights": args.weights, "rows": rows,
               **environment()}  # fmt: skip
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / args.receipt).write_text(json.dumps(receipt, indent=1))


if __name__ == "__main__":
    main()
