"""Receipt: why the EAGLE-3 drafter layer's output differs between the rewritten program and
plain Inductor's, while the projection's output is bitwise equal.

Compiles the converted drafter at real dims (1024 tokens; caches off, so every compile
autotunes afresh) with ``backend="mxfp8_fusion"`` (fused) and plain Inductor (plain), twice
each, and counts differing output elements, in two modes:

1. Inductor's defaults: Triton times several configs of each reduction kernel (RMSNorm's
   sum of squares) and keeps the fastest, per compile;
2. ``torch.use_deterministic_algorithms(True)`` (and, where the installed Inductor has it,
   ``force_filter_reduction_configs``): reduction configs chosen without timing.

Writes ``benchmarks/results/examples_bitwise.json``.

    python benchmarks/examples_bitwise.py
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from common import environment, write_receipt

import mxfp8_fusion as mf

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

import eagle3_drafter as ex
from shared import compile_fused, compile_inductor, mark_tokens_dynamic

TOKENS = 1024


def _differing(a, b) -> int:
    return int((a[0] != b[0]).sum())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="benchmarks/results/examples_bitwise.json")
    parser.add_argument("--git-rev", default=None)
    args = parser.parse_args()
    torch._inductor.config.force_disable_caches = True  # every compile autotunes afresh
    cfg = ex.Eagle3Config.real()
    model = ex.build(cfg, "cuda")
    mf.convert(model)
    inputs = ex.make_inputs(cfg, TOKENS, "cuda")
    mark_tokens_dynamic(inputs, ex.TOKEN_DIMS)
    results = {}
    with torch.no_grad():
        for mode in ("inductor defaults", "reduction configs chosen without timing"):
            if mode != "inductor defaults":
                torch.use_deterministic_algorithms(True, warn_only=True)
                if hasattr(torch._inductor.config, "force_filter_reduction_configs"):
                    torch._inductor.config.force_filter_reduction_configs = True
            runs = []
            for _ in range(2):
                torch._dynamo.reset()
                fused = compile_fused(model)(*inputs)
                torch._dynamo.reset()
                plain = compile_inductor(model)(*inputs)
                runs.append((fused, plain))
            (f1, p1), (f2, p2) = runs
            results[mode] = {
                "fused_vs_plain_output": [_differing(f1, p1), _differing(f2, p2)],
                "fused_compile_1_vs_2_output": _differing(f1, f2),
                "plain_compile_1_vs_2_output": _differing(p1, p2),
                "fused_vs_plain_projection_bitwise": torch.equal(f1[1], p1[1]),
            }
            print(mode, results[mode])
    write_receipt(
        args.out,
        {
            "benchmark": "examples_bitwise",
            "environment": environment(args.git_rev),
            "what": (
                f"EAGLE-3 drafter (3 x 4096 -> 4096, one Llama-3.1-8B decoder layer), converted, "
                f"{TOKENS} tokens: output elements (of {f1[0].numel()}) that differ between "
                "compiled programs, two compiles of each"
            ),
            "results": results,
        },
    )


if __name__ == "__main__":
    main()
