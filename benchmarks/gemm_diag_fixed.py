"""Diagnostic: GEMM kernel time (profiler, eager launches over rotating weight copies) vs K at
N 2048 for a fixed CTA count, to separate a launch's fixed cost from its per-stage cost,
and vs the CTA count at N 7168, K 43008, 64 tokens.

On an H200: ``OUT=dir python benchmarks/gemm_diag_fixed.py`` writes dir/gemm_diag_fixed.json
(receipt: benchmarks/results/gemm_diag_fixed.json; read in docs/gemm_log.md)."""

import json
import os
import sys
from dataclasses import replace

import torch

sys.path.insert(0, "benchmarks")
from gemm_diag_small_k import fns, kernel_us
from gemm_sweep import _Data
from mxfp8_fusion.kernels import gemm_sm90 as g

OUT = os.environ.get("OUT", "/tmp")
res = {}
specs = [
    ("swap-ab", 1, 132),
    ("tiled 128x64 c1 bf16", 256, 132),
    ("tiled 128x64 c1 stream-k bf16", 256, 132),
    ("tiled 64x64 c1 stream-k s11+4 bf16", 48, 132),
    ("tiled 128x128 c2 bf16", 256, 132),
]
for k in (256, 1024, 2048, 4096, 7168):
    data = _Data(2048, k, 256)
    for spec, t, c in specs:
        cfg = replace(g.config_from_spec(spec, t, 132), num_ctas=c)
        ku = kernel_us(fns(data, t, cfg), data.copies)
        res[f"K{k} {spec} t{t}"] = ku
        print(f"K{k} {spec} t{t}", json.dumps(ku), flush=True)
    ku = kernel_us(fns(data, 256, "cublas"), data.copies)
    print(f"K{k} cublas t256", json.dumps(ku), flush=True)
    del data
data = _Data(7168, 43008, 128)
for spec, t in [("tiled 128x128 c2 stream-k", 64), ("tiled 128x128 c2 stream-k bf16", 64)]:
    for c in (66, 100, 132):
        cfg = replace(g.config_from_spec(spec, t, 132), num_ctas=c)
        ku = kernel_us(fns(data, t, cfg), data.copies, calls=12)
        res[f"ref {spec} t{t} n{c}"] = ku
        print(f"ref {spec} t{t} n{c}", json.dumps(ku), flush=True)
x = torch.zeros(1024, device="cuda")
print("tiny add", json.dumps(kernel_us(lambda i: x.add_(1), 1)), flush=True)
json.dump(res, open(f"{OUT}/gemm_diag_fixed.json", "w"), indent=1)
