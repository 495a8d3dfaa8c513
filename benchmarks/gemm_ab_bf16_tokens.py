"""Variant 49 against the same tile converting A in registers, at 384-4096 tokens.

At each point, in one process: "X bf16" (the tile on the BF16 path, A converted by the
consumers), "X bf16-tokens" (the tokens converted once by a launch before the GEMM, which is
on the clock, and read by SS wgmmas), the table's config, and cuBLAS BF16 (torch.mm on BF16
operands of the same shape). CUDA Graph replay, 7 interleaved rounds with the order rotated,
medians; ratios are ours / cuBLAS BF16 time, below 1 ours is faster.

On an H200: ``OUT=dir MXFP8_GIT_REV=rev python benchmarks/gemm_ab_bf16_tokens.py`` writes
dir/ab_a16.json."""
import json, os, statistics, sys
import torch
sys.path.insert(0, "benchmarks")
from gemm_sweep import MAX_INNER, _Data, _graph, _replay_ms
from mxfp8_fusion.kernels import gemm_sm90 as g
CASES = [(384, 7168, 43008), (512, 7168, 43008), (1024, 7168, 43008), (4096, 7168, 43008),
         (1024, 18432, 7168), (512, 7168, 14336)]
TILES = ["tiled 128x128 c2", "tiled 128x128 c2 stream-k-tail"]
res = []
for t, n, k in CASES:
    d = _Data(n, k, t)
    x, sx, xd = d.inp.values[:t], d.inp.scales, d.xd[:t]
    inner = min(MAX_INNER, max(d.copies, int(2e13 // (2.0 * t * n * k)), 1))
    out = torch.empty(t, n, device="cuda", dtype=torch.bfloat16)
    cfgs = {"table " + g.spec_of(g.choose_config(t, n, k, 132)): g.choose_config(t, n, k, 132)}
    for s in TILES:
        for w in ("bf16", "bf16-tokens"):
            cfgs[f"{s} {w}"] = g.config_from_spec(f"{s} {w}", t, 132)
    graphs = {}
    ref = None
    for name, cfg in cfgs.items():
        fns = [lambda i=i, cfg=cfg: g.run(x, sx, d.wq[i % d.copies].values, d.wq[i % d.copies].scales, None, out, config=cfg) for i in range(inner)]
        fns[0](); torch.cuda.synchronize()
        graphs[name] = _graph(fns)
    graphs["cublas"] = _graph([lambda i=i: torch.mm(xd, d.w[i % d.copies].T) for i in range(inner)])
    times = {k_: [] for k_ in graphs}
    order = list(graphs)
    for r in range(7):
        rot = order[r % len(order):] + order[:r % len(order)]
        for name in rot:
            times[name].append(_replay_ms(graphs[name], inner, 0.01))
    med = {k_: statistics.median(v) for k_, v in times.items()}
    row = {"tokens": t, "n": n, "k": k, "cublas_us": round(med["cublas"] * 1000, 2),
           "over_cublas": {k_: round(v / med["cublas"], 3) for k_, v in med.items() if k_ != "cublas"}}
    print(json.dumps(row), flush=True)
    res.append(row)
    del d, graphs; torch.cuda.empty_cache()
json.dump({"gpu": torch.cuda.get_device_name(), "git_revision": os.environ.get("MXFP8_GIT_REV"),
           "mode": "CUDA Graph replay, 7 interleaved rounds, medians; ratio = ours / cuBLAS BF16 time",
           "points": res}, open(os.path.join(os.environ["OUT"], "ab_a16.json"), "w"), indent=1)
