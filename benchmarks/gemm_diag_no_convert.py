"""Diagnostic: what the tiled GEMM's conversions cost, by leaving them out (wrong results on
purpose). At each point the table's tiled config runs four ways, each in its own process,
beside cuBLAS BF16 in the same process (CUDA Graph replay, interleaved, medians of 7 rounds;
ratios are ours / cuBLAS BF16 time):

* ``00``: the kernel as shipped;
* ``10``: the consumers neither load nor convert A (``MXFP8TiledGemmSm90.no_a_diag``): an
  optimistic bound for any design that takes A's conversion off them;
* ``01``: the converter neither converts nor stores B (``no_b_diag``);
* ``11``: both, the TMA + wgmma pipeline and its schedule alone.

With both flags off (the default) the kernels' PTX is unchanged.

On an H200: ``OUT=dir python benchmarks/gemm_diag_no_convert.py`` writes
dir/gemm_diag_no_convert.json (receipt: benchmarks/results/gemm_diag_no_convert.json; read
in docs/gemm_log.md)."""

import json
import os
import statistics
import subprocess
import sys

CASES = [  # (tokens, N, K)
    (96, 7168, 43008),
    (128, 7168, 43008),
    (256, 7168, 43008),
    (1024, 7168, 43008),
    (4096, 7168, 43008),
    (192, 2048, 7168),
    (1024, 2048, 7168),
    (128, 4096, 12288),
    (256, 18432, 7168),
    (1024, 18432, 7168),
    (512, 7168, 14336),
]
FLAGS = ("00", "10", "01", "11")  # (no A, no B)
ROUNDS = 7


def _case(t: int, n: int, k: int) -> dict:
    """The table's config at (t, N, K) against cuBLAS BF16, in one process's current flags."""
    import torch
    from gemm_sweep import MAX_INNER, _Data, _graph, _replay_ms
    from mxfp8_fusion.kernels import gemm_sm90 as g

    d = _Data(n, k, t)
    x, sx, xd = d.inp.values[:t], d.inp.scales, d.xd[:t]
    inner = min(MAX_INNER, max(d.copies, int(2e13 // (2.0 * t * n * k)), 1))
    cfg = g.choose_config(t, n, k, 132)
    out = torch.empty(t, n, device="cuda", dtype=torch.bfloat16)

    def ours(i):
        w = d.wq[i % d.copies]
        g.run(x, sx, w.values, w.scales, None, out, config=cfg)

    def cublas(i):
        torch.mm(xd, d.w[i % d.copies].T)

    ours(0)
    torch.cuda.synchronize()
    graphs = {name: _graph([lambda i=i, f=f: f(i) for i in range(inner)])
              for name, f in (("ours", ours), ("cublas", cublas))}  # fmt: skip
    times = {name: [] for name in graphs}
    order = list(graphs)
    for r in range(ROUNDS):
        for name in order[r % 2 :] + order[: r % 2]:
            times[name].append(_replay_ms(graphs[name], inner, 0.01))
    med = {name: statistics.median(v) for name, v in times.items()}
    return {
        "tokens": t, "n": n, "k": k, "spec": g.spec_of(cfg),
        "ours_us": med["ours"] * 1e3, "cublas_us": med["cublas"] * 1e3,
        "over_cublas": med["ours"] / med["cublas"],
    }  # fmt: skip


def measure(flags: str) -> None:
    """One process: every case with ``flags`` set, one JSON line per case."""
    import torch
    from mxfp8_fusion.kernels.gemm_sm90_tiled import MXFP8TiledGemmSm90 as kernel

    kernel.no_a_diag = flags[0] == "1"  # before the first compile of this process
    kernel.no_b_diag = flags[1] == "1"
    for case in CASES:
        print(json.dumps(_case(*case)), flush=True)
        torch.cuda.empty_cache()


def main() -> None:
    from machine import environment, write_receipt

    runs = {}
    for flags in FLAGS:
        done = subprocess.run(
            [sys.executable, __file__, flags], capture_output=True, text=True, check=True
        )
        runs[flags] = [json.loads(line) for line in done.stdout.splitlines() if line[:1] == "{"]
    rows = []
    for per_flag in zip(*(runs[f] for f in FLAGS), strict=True):
        row = {key: per_flag[0][key] for key in ("tokens", "n", "k", "spec")}
        row["over_cublas"] = {
            f: round(r["over_cublas"], 3) for f, r in zip(FLAGS, per_flag, strict=True)
        }
        rows.append(row)
        print(row["tokens"], row["n"], row["k"], row["spec"], row["over_cublas"], flush=True)
    receipt = {"what": __doc__.split("\n\n")[0], "flags": "first digit: no A; second: no B"}
    receipt.update(environment(), rows=rows, runs=runs)
    write_receipt(os.path.join(os.environ.get("OUT", "/tmp"), "gemm_diag_no_convert.json"), receipt)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    if len(sys.argv) > 1:
        measure(sys.argv[1])
    else:
        main()
