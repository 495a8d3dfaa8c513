"""Time to first result at every capture size, from a fresh process (CUDA only).

For each projection (the reference 7168 <- 6 x 7168 and a drafter's 4096 <- 3 x 4096), the
public API's staged call (``quantize_input_slices`` then ``mm_quantized``; with
``--activation bf16`` the W8A16 ``mm_slices`` from the slices) at every default capture size (1, 2, 4, then 8 to ``--max-tokens`` in steps of 8), each size's first call
timed to its result, in four fresh processes:

* ``cold``: an empty kernel cache, no warm-up: each new build compiles at its first call;
* ``cold_warmup``: an empty kernel cache, ``mxfp8_fusion.warmup`` (parallel compiles) first;
* ``warm``: the cache ``cold_warmup`` filled, no warm-up: builds are read from disk;
* ``warm_warmup``: that cache, ``warmup`` first (it reads them all), then the calls.

A process's clock starts once torch, CUDA and the inputs are ready (imports and CUDA
context are the same with or without this library). Every process's outputs are hashed:
all four must agree. Writes benchmarks/results/startup.json.

    python benchmarks/startup.py [--max-tokens 512] [--workers 16] [--activation bf16] [--out PATH]
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time

import torch
from common import environment, require_cuda, write_receipt

import mxfp8_fusion as mf
from mxfp8_fusion.kernel_warmup import capture_sizes

SHAPES = {
    "reference 7168 <- 6 x 7168": (7168, 7168, 6),
    "drafter 4096 <- 3 x 4096": (4096, 4096, 3),
}
SCENARIOS = ("cold", "cold_warmup", "warm", "warm_warmup")


def child(
    n: int, width: int, slices: int, warm_up: bool, max_tokens: int, workers: int,
    activation: str = "mxfp8",
) -> dict:  # fmt: skip
    """One scenario in this (fresh) process: the ready time of each capture size."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    k = width * slices
    weight = mf.pack_weight(torch.randn(n, k, generator=gen, device="cuda", dtype=torch.bfloat16))
    sizes = capture_sizes(max_tokens)
    inputs = {
        t: [torch.randn(t, width, generator=gen, device="cuda", dtype=torch.bfloat16)
            for _ in range(slices)]
        for t in sizes
    }  # fmt: skip
    torch.cuda.synchronize()
    start = time.perf_counter()
    report = None
    if warm_up:
        report = mf.warmup(
            [(n, [width] * slices)], sizes, workers=workers, progress=False, activation=activation
        )
    warmed = time.perf_counter() - start
    ready, digest = [], hashlib.sha256()
    for t in sizes:
        if activation == "bf16":
            out = mf.mm_slices(inputs[t], weight)
        else:
            dest = mf.empty_input(t, k, "cuda")
            mf.quantize_input_slices(inputs[t], dest)
            out = mf.mm_quantized(dest, weight)
        torch.cuda.synchronize()
        ready.append(time.perf_counter() - start)
        digest.update(out.view(torch.int16).cpu().numpy().tobytes())
    return {
        "warmup_s": warmed if warm_up else None,
        "warmup_report": dataclasses.asdict(report) if report else None,
        "sizes": sizes,
        "ready_s": ready,
        "total_s": ready[-1],
        "outputs_sha256": digest.hexdigest(),
    }


def _run_child(shape: str, scenario: str, cache: str, args, workers: int) -> dict:
    n, width, slices = SHAPES[shape]
    warm_up = "warmup" in scenario
    code = (
        "import json, sys; sys.path.insert(0, 'benchmarks'); import startup; "
        f"print('RESULT', json.dumps(startup.child({n}, {width}, {slices}, {warm_up}, "
        f"{args.max_tokens}, {workers}, {args.activation!r})))"
    )
    env = {**os.environ, "MXFP8_FUSION_CACHE_DIR": cache}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if run.returncode:
        raise RuntimeError(f"{shape} {scenario} failed:\n{run.stderr[-4000:]}")
    line = next(x for x in run.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def _scenarios(shape: str, args, sweep: list[int]) -> dict:
    """The four scenarios (and the sweep's cold warm-ups) for ``shape``, printed as they end."""
    cold_cache, cache = tempfile.mkdtemp(), tempfile.mkdtemp()
    caches = {"cold": cold_cache, **{s: cache for s in SCENARIOS[1:]}}
    caches.update({f"cold_warmup_{w}_workers": tempfile.mkdtemp() for w in sweep})
    workers = {f"cold_warmup_{w}_workers": w for w in sweep}
    results = {}
    for scenario, directory in caches.items():
        r = _run_child(shape, scenario, directory, args, workers.get(scenario, args.workers))
        results[scenario] = r
        print(f"{shape:>28} {scenario:>24}: all {len(r['sizes'])} sizes in {r['total_s']:6.2f} s")
    results["same_outputs_in_every_scenario"] = (
        len({r["outputs_sha256"] for r in results.values()}) == 1
    )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument(
        "--workers-sweep", default="", help="more cold warm-ups at these worker counts: 4,8"
    )
    parser.add_argument("--activation", choices=["mxfp8", "bf16"], default="mxfp8")
    parser.add_argument("--out", default=None, help="default: results/startup.json (W8A8), "
                        "results/startup_w8a16.json (--activation bf16)")  # fmt: skip
    args = parser.parse_args()
    require_cuda(__file__)
    suffix = "_w8a16" if args.activation == "bf16" else ""
    args.out = args.out or f"benchmarks/results/startup{suffix}.json"
    sweep = [int(w) for w in args.workers_sweep.split(",") if w]
    results = {shape: _scenarios(shape, args, sweep) for shape in SHAPES}
    write_receipt(
        args.out,
        {
            "what": "seconds from a ready fresh process to each capture size's first result "
            "(staged quantize + GEMM through the public API; W8A16: mm_slices), by "
            "kernel-cache scenario",
            "activation": args.activation,
            **environment(),
            "max_tokens": args.max_tokens,
            "workers": args.workers,
            "cpu_count": os.cpu_count(),
            "results": results,
        },
    )


if __name__ == "__main__":
    main()
