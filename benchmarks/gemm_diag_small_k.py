"""Diagnostic for small-K shapes: per-kernel GPU time (profiler, eager calls over rotating
weight copies) against graph-replay time per call, and CTA-count variations at N 2048, K
7168.

On an H200: ``OUT=dir python benchmarks/gemm_diag_small_k.py`` writes
dir/gemm_diag_small_k.json (receipt: benchmarks/results/gemm_diag_small_k.json; read in
docs/gemm_log.md)."""

import json
import os
import statistics
import sys
from dataclasses import replace

import torch

sys.path.insert(0, "benchmarks")
from gemm_sweep import _Data, _graph, _replay_ms
from mxfp8_fusion.kernels import gemm_sm90 as g

from mxfp8_fusion import api

OUT = os.environ.get("OUT", "/tmp")
res = {}


def fns(data, t, cfg):
    out, a = data.out[:t], data.inp.values[:t]
    if cfg == "cublas":
        x = data.x[:t]
        return lambda i: torch.mm(x, data.w[i % data.copies].t(), out=out)
    if cfg is None:
        return lambda i: api.mm_quantized_into(data.inp, data.wq[i % data.copies], data.out, t)
    return lambda i: g.run(
        a,
        data.inp.scales,
        data.wq[i % data.copies].values,
        data.wq[i % data.copies].scales,
        None,
        out,
        config=cfg,
    )


def graph_ms(named, data, rounds=7, inner=40):
    graphs = {}
    for name, f in named.items():
        graphs[name] = _graph([lambda i=i, f=f: f(i) for i in range(inner)])
    times = {name: [] for name in graphs}
    names = list(graphs)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            times[name].append(_replay_ms(graphs[name], inner, 0.01) * 1000)
    return {name: round(statistics.median(v), 2) for name, v in times.items()}


def kernel_us(f, copies, calls=24):
    from torch.profiler import ProfilerActivity, profile

    for i in range(4):
        f(i)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(calls):
            f(i)
        torch.cuda.synchronize()
    per = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per.setdefault(e.name[:70], []).append(
                e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
            )
    return {k: [len(v), round(statistics.median(v), 2)] for k, v in per.items()}


def main():
    for (n, k), tokens in [((2048, 7168), (1, 16, 48, 256, 512)), ((7168, 43008), (1, 64))]:
        data = _Data(n, k, max(tokens))
        for t in tokens:
            key = f"{n}x{k} t{t}"
            cfg = g.choose_config(t, n, k, 132)
            named = {"ours": fns(data, t, None), "cublas": fns(data, t, "cublas")}
            res[key] = {
                "spec": g.spec_of(cfg),
                "graph_us": graph_ms(named, data),
                "kernels_ours": kernel_us(named["ours"], data.copies),
                "kernels_cublas": kernel_us(named["cublas"], data.copies),
            }
            print(key, json.dumps(res[key]), flush=True)
        del data

    # CTA-count and schedule variations at (2048, 7168)
    n, k = 2048, 7168
    data = _Data(n, k, 512)
    var = {
        1: [("swap-ab", c) for c in (33, 66, 99, 132)],
        16: [("swap-ab", c) for c in (66, 132)],
        48: [("tiled 64x64 c1 stream-k s11+4 bf16", c) for c in (44, 66, 132)]
        + [("tiled 128x64 c1 stream-k bf16", 132), ("tiled 64x128 c2 stream-k bf16", 132)],
        256: [("tiled 128x64 c1 stream-k", c) for c in (64, 96, 132)]
        + [
            ("tiled 128x64 c1 stream-k bf16", 132),
            ("tiled 128x64 c1", 132),
            ("tiled 128x64 c1 bf16", 132),
        ],
    }
    for t, specs in var.items():
        named = {"cublas": fns(data, t, "cublas")}
        for spec, c in specs:
            cfg = g.config_from_spec(spec, t, 132)
            cfg = replace(cfg, num_ctas=c)
            try:
                g.run(
                    data.inp.values[:t],
                    data.inp.scales,
                    data.wq[0].values,
                    data.wq[0].scales,
                    None,
                    data.out[:t],
                    config=cfg,
                )
                torch.cuda.synchronize()
            except Exception as e:
                print("FAILED", spec, c, e, flush=True)
                continue
            named[f"{spec} n{c}"] = fns(data, t, cfg)
        r = graph_ms(named, data)
        res[f"var t{t}"] = r
        print(f"var t{t}", json.dumps(r), flush=True)

    json.dump(res, open(f"{OUT}/gemm_diag_small_k.json", "w"), indent=1)


if __name__ == "__main__":
    main()
