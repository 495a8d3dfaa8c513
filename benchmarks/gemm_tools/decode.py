"""The decode regime of ``benchmarks/gemm.py --decode``: the points a drafter's GEMMs run at
(1-64 tokens on drafter-sized weights, and the few-hundred-token points of the reference
and MoE shapes), the targets each is held to, and the weight-read floor.

A decode GEMM streams its weight once; the floor is the MXFP8 weight's bytes (E4M3 values
and one E8M0 scale per 32) at ``FLOOR_TB_S``. Ratios are ours / cuBLAS BF16 time, measured
side by side in one process (gemm_tools.points).
"""

from __future__ import annotations

import math

from mxfp8_fusion.format import GROUP

DRAFTER_TOKENS = (1, 2, 4, 8, 16, 32, 64)
# (N, K) -> (what it is, the token counts measured)
POINTS = {
    (4096, 12288): ("EAGLE-3 drafter fc of an 8B model (3 x 4096)", DRAFTER_TOKENS),
    (11008, 4096): ("7B MLP up_proj", DRAFTER_TOKENS),
    (4096, 11008): ("7B MLP down_proj", DRAFTER_TOKENS),
    (7168, 14336): ("DeepSeek-V3 / Kimi MTP eh_proj (2 x 7168)", DRAFTER_TOKENS),
    (7168, 43008): ("six-slice drafter fc (the reference geometry)", (96, 128)),
    (2048, 7168): ("MoE expert gate / up_proj (DeepSeek-V3)", (48, 64, 96, 128, 192, 256)),
}
FLOOR_TB_S = 4.0
DRAFTER_SHAPES = ((4096, 12288), (11008, 4096), (4096, 11008))
# (what, shapes, lowest and highest token count, the most ours / cuBLAS BF16 may take)
TARGETS = (
    ("drafter shapes, 1-32 tokens", DRAFTER_SHAPES, 1, 32, 0.55),
    ("MTP eh_proj, 1-32 tokens", ((7168, 14336),), 1, 32, 0.55),
    ("drafter shapes, 64 tokens", DRAFTER_SHAPES, 64, 64, 0.85),
    ("reference shape, 96-128 tokens", ((7168, 43008),), 96, 128, 0.80),
    ("MoE shape, 48-256 tokens", ((2048, 7168),), 48, 256, 1.50),
)


def floor_us(n: int, k: int) -> float:
    """Microseconds to read an N x K MXFP8 weight (values and scales) at FLOOR_TB_S."""
    return n * k * (1 + 1 / GROUP) / (FLOOR_TB_S * 1e6)


def _ratio(receipt: dict, n: int, k: int, tokens: int) -> float:
    for shape in receipt["shapes"]:
        if (shape["n"], shape["k"]) == (n, k):
            for p in shape["points"]:
                if p["tokens"] == tokens:
                    return p["contenders"]["ours"].get("over_cublas_bf16", math.nan)
    return math.nan


def targets(receipt: dict) -> list[dict]:
    """Each target (TARGETS) against the receipt's points: the worst ratio in its range and
    whether every point in it meets the bound (a point not measured fails it)."""
    rows = []
    for what, shapes, lo, hi, bound in TARGETS:
        ratios = {
            f"{n}x{k} t{t}": _ratio(receipt, n, k, t)
            for n, k in shapes
            for t in POINTS[(n, k)][1]
            if lo <= t <= hi
        }
        worst = max(ratios.values(), key=lambda r: math.inf if math.isnan(r) else r)
        met = all(r <= bound for r in ratios.values())  # NaN fails
        rows.append({"target": what, "at_most": bound, "worst": worst, "met": met,
                     "ratios": ratios})  # fmt: skip
    return rows


def annotate(receipt: dict) -> None:
    """Add each point's floor and its time over the floor, and the targets, to a sweep
    receipt of the decode points; print them."""
    for shape in receipt["shapes"]:
        floor = floor_us(shape["n"], shape["k"])
        shape["floor_us"] = floor
        for p in shape["points"]:
            ours = p["contenders"]["ours"]
            ours["over_floor"] = ours.get("ms", math.nan) * 1e3 / floor
    receipt["floor"] = f"MXFP8 weight bytes (values + scales) at {FLOOR_TB_S} TB/s"
    receipt["targets"] = targets(receipt)
    for shape in receipt["shapes"]:
        print(f"N {shape['n']} K {shape['k']} (floor {shape['floor_us']:.1f} us):")
        for p in shape["points"]:
            c = p["contenders"]
            print(
                f"  {p['tokens']:4d} tokens: ours {c['ours'].get('ms', math.nan) * 1e3:7.1f} us "
                f"({c['ours'].get('over_cublas_bf16', math.nan):.3f} of cuBLAS BF16 "
                f"{c['cublas_bf16']['ms'] * 1e3:.1f} us, {c['ours']['over_floor']:.2f}x the floor)"
                f"  {c['ours']['label']}"
            )
    for t in receipt["targets"]:
        state = "met" if t["met"] else "MISSED"
        print(f"target {t['target']}: at most {t['at_most']}, worst {t['worst']:.3f}: {state}")
