"""Sustained SM clock and board power of the reference-geometry GEMM, ours vs cuBLAS BF16.

Each contender runs back to back for a few seconds while ``nvidia-smi`` samples the SM
clock, the power draw and the active clock-event reasons every 50 ms (the first quarter of
the samples, the ramp, is dropped). A GEMM that holds the board at its power limit runs at
whatever clock that power buys, so its time is set by energy per FLOP as well as by cycles
per FLOP; ``cycles_per_call`` (time x median clock) separates the two. cuBLAS also runs with
an all-zero A operand: same instructions, less switching, less power.

    python benchmarks/gemm_power.py            # writes benchmarks/results/gemm_power.json
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time

import torch
from common import environment, write_receipt
from mxfp8_fusion.kernels import gemm_sm90

from mxfp8_fusion import reference

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


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--n", type=int, default=7168)
    p.add_argument("--k", type=int, default=43008)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--out", default="benchmarks/results/gemm_power.json")
    p.add_argument("--git-rev", default=None)
    args = p.parse_args()
    tokens, n, k = args.tokens, args.n, args.k
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
        results[name] = r = sustained(fn, args.seconds)
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
    write_receipt(
        args.out,
        {
            "what": "sustained back-to-back GEMMs (tokens x N x K below, BF16 out): ms per "
            "call and nvidia-smi's SM clock, power and clock-event reasons (median of 50 ms "
            "samples after the first quarter)",
            **environment(args.git_rev),
            "shape": {"tokens": tokens, "n": n, "k": k},
            "power_limit_w": limit,
            "results": results,
        },
    )


if __name__ == "__main__":
    main()
