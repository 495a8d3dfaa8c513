"""What a GEMM's time depends on besides the GEMM: the state the GPU starts it in.

end_to_end.py times whole calls on an idle GPU ("isolated") and queued behind a sleep
kernel. The two disagree by more than the host's launch time. This script times one GEMM
alone (ours and cuBLAS BF16, reference geometry) after each of these starts, interleaved:

* idle 20 ms: the host sleeps 20 ms after a sync, then launches;
* idle: launched right after a sync (the GPU idles only for the host's launch time);
* after a sleep kernel: queued behind ``torch.cuda._sleep`` (end_to_end.py's "queued");
* after copies: queued behind ~1 ms of device-to-device copies;
* after itself: queued behind one more run of the same GEMM.

Events bracket the GEMM only. Writes benchmarks/results/gemm_start.json.

    python benchmarks/gemm_start.py [--rounds 9]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from machine import environment, write_receipt
from mxfp8_fusion.kernels import gemm_sm90

from mxfp8_fusion import reference

_SLEEP_CYCLES = 6_000_000  # about 3 ms at H200 clocks, as in end_to_end.py


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--out", default="benchmarks/results/gemm_start.json")
    p.add_argument("--git-rev", default=None)
    args = p.parse_args()
    tokens, n, k = 4096, 7168, 43008
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02
    xv, xs = reference.quantize(x)
    wv, ws = reference.quantize(w)
    out = torch.empty(tokens, n, device="cuda", dtype=torch.bfloat16)
    src = torch.empty(512 << 20, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)
    gemms = {
        "ours": lambda: gemm_sm90.run(xv, xs, wv, ws, None, out),
        "cublas_bf16": lambda: torch.mm(x, w.t(), out=out),
    }

    def copies(_gemm):
        for _ in range(3):
            dst.copy_(src)

    starts = {
        "idle_20ms": lambda _gemm: time.sleep(0.02),
        "idle": lambda _gemm: None,
        "after_sleep_kernel": lambda _gemm: torch.cuda._sleep(_SLEEP_CYCLES),
        "after_copies": copies,
        "after_itself": lambda gemm: gemm(),
    }
    for gemm in gemms.values():
        gemm()
    samples = {(s, g): [] for s in starts for g in gemms}
    for _ in range(args.rounds):  # interleaved: drift hits every cell alike
        for start_name, start in starts.items():
            for gemm_name, gemm in gemms.items():
                torch.cuda.synchronize()
                start(gemm)
                begin = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                begin.record()
                gemm()
                end.record()
                end.synchronize()
                samples[(start_name, gemm_name)].append(begin.elapsed_time(end))
    rows = []
    for start_name in starts:
        ours = statistics.median(samples[(start_name, "ours")])
        cublas = statistics.median(samples[(start_name, "cublas_bf16")])
        rows.append(
            {"start": start_name, "ours_ms": ours, "cublas_bf16_ms": cublas, "ratio": ours / cublas}
        )
        print(
            f"{start_name:20s} ours {ours:.3f} ms, cuBLAS BF16 {cublas:.3f} ms, {ours / cublas:.3f}"
        )
    receipt = {
        "what": "one GEMM at tokens 4096, N 7168, K 43008 (ours: MXFP8 SM90 kernel; cuBLAS: BF16 "
        "torch.mm), timed alone by CUDA events after each start state",
        **environment(args.git_rev),
        "rounds": args.rounds,
        "ratio_direction": "ours_ms / cublas_bf16_ms; < 1 means ours is faster",
        "rows": rows,
    }
    write_receipt(args.out, receipt)


if __name__ == "__main__":
    main()
