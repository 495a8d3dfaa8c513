"""Diagnostic: where one swap-AB GEMM launch spends its time, from clock stamps the kernel
writes inside itself (gemm_sm90_swap_ab.STAMPS: entry, barriers ready, first load issued,
all loads issued, first stage landed, all segments done, stream-K fixup done, all stages
released), per CTA, relative to the earliest CTA's entry. Per configuration: the median and
the latest CTA at each point, medians over 12 eager launches (weights rotating over 4
copies, after a warm-up).

On an H200: ``OUT=dir python benchmarks/gemm_diag_stamps.py`` writes dir/gemm_diag_stamps.json
(receipt: benchmarks/results/gemm_diag_stamps.json; read in docs/gemm_log.md)."""

import json
import os
import statistics
import sys

import torch

sys.path.insert(0, "tests")
from gemm_helpers import random_operand
from mxfp8_fusion.kernels import gemm_sm90 as g
from mxfp8_fusion.kernels.gemm_sm90_swap_ab import STAMPS, MXFP8SwapABGemmSm90

CASES = [  # (spec, tokens, N, K)
    ("swap-ab", 1, 2048, 7168),
    ("swap-ab", 1, 2048, 1024),
    ("swap-ab", 1, 2048, 256),
    ("swap-ab", 1, 7168, 43008),
    ("swap-ab bf16-tokens mc2", 1, 2048, 7168),
]


def stamps_of(buf, ctas):
    """Per CTA that ran: microseconds since the earliest entry (None where not stamped)."""
    rows = [r for r in buf.view(ctas, len(STAMPS)).cpu().tolist() if r[0] != 0]
    t0 = min(r[0] for r in rows)
    return [[(x - t0) / 1000 if x else None for x in r] for r in rows]


def summarize(launches):
    out = {"ctas": len(launches[0])}
    for j, name in enumerate(STAMPS):
        per = [[r[j] for r in rel if r[j] is not None] for rel in launches]
        out[name] = {
            "median_cta_us": round(statistics.median(statistics.median(p) for p in per), 2),
            "latest_cta_us": round(statistics.median(max(p) for p in per), 2),
        }
    return out


def stamped_launches(buf, spec, tokens, n, k, num_sms, copies, launches, read):
    """``read(buf)`` after each of ``launches`` eager launches of ``spec`` on random operands
    (the weight rotating over ``copies`` copies, each launched once before), with ``buf``
    zeroed before each launch."""
    cfg = g.config_from_spec(spec, tokens, num_sms)
    a, sa = random_operand(tokens, k, seed=1)
    weights = [random_operand(n, k, seed=2 + i) for i in range(copies)]
    out = torch.empty(tokens, n, device="cuda", dtype=torch.bfloat16)
    for b, sb in weights:
        g.run(a, sa, b, sb, None, out, config=cfg)
    results = []
    for i in range(launches):
        b, sb = weights[i % copies]
        buf.zero_()
        torch.cuda.synchronize()
        g.run(a, sa, b, sb, None, out, config=cfg)
        torch.cuda.synchronize()
        results.append(read(buf))
    return results


def main():
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    buf = torch.zeros(num_sms * len(STAMPS), dtype=torch.int64, device="cuda")
    MXFP8SwapABGemmSm90.stamps_addr = buf.data_ptr()  # before the first compile
    res = {}
    for spec, tokens, n, k in CASES:
        read = lambda b: stamps_of(b, num_sms)  # noqa: E731
        launches = stamped_launches(buf, spec, tokens, n, k, num_sms, 4, 12, read)
        key = f"{spec} t{tokens} N{n} K{k}"
        res[key] = summarize(launches)
        print(key, json.dumps(res[key]), flush=True)
    path = os.path.join(os.environ.get("OUT", "/tmp"), "gemm_diag_stamps.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
