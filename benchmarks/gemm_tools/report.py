"""What a GEMM sweep or tune receipt becomes (``benchmarks/gemm.py --sweep`` / ``--tune``):
the printed summary, the measured table (kernels/gemm_sm90/tuning/table.json) and the plot of
ratios to cuBLAS BF16."""

from __future__ import annotations

import json
import math
from pathlib import Path


def summary(receipt: dict) -> None:
    """Print each point's ratio to cuBLAS BF16 (and the pre-table heuristic's, where measured)."""
    for shape in receipt["shapes"]:
        print(f"N {shape['n']} K {shape['k']}:")
        for p in shape["points"]:
            c = p["contenders"]
            ours = c["ours"]
            line = f"  {p['tokens']:6d}  ours {ours.get('over_cublas_bf16', math.nan):.3f}"
            line += f" ({ours['label']}, rel err {ours['rel_err_vs_dequant_cublas']:.1e})"
            if "before" in c:
                line += f"  before {c['before'].get('over_cublas_bf16', math.nan):.3f}"
            print(line + f"  cuBLAS {c['cublas_bf16']['ms']:.4f} ms", flush=True)


# A point keeps the previous point's schedule while it is within this factor of the
# fastest there: closer than the run-to-run spread, a switch would only follow noise.
STICKY = 1.03


def best_contenders(shape: dict) -> list[tuple[int, dict]]:
    """(tokens, chosen contender) per measured point of a tune receipt's shape, of our timed
    contenders (each with its ``schedule``, ``label``, ``ms`` and ``over_cublas_bf16``): the
    fastest, or the one of the previous point's schedule within STICKY of it where both
    are of one kernel."""
    rows = []
    prev = None  # the previous point's chosen schedule
    for p in shape["points"]:
        timed = [
            c
            for name, c in p["contenders"].items()
            if name != "cublas_bf16" and math.isfinite(c.get("ms", float("nan")))
        ]
        if timed:
            best = min(timed, key=lambda c: c["ms"])
            # a neighbour's schedule sticks only within one kernel: the swap-AB kernel's time
            # grows faster with tokens than the tiled one's
            kept = [c for c in timed if c["schedule"] == prev]
            same_kernel = prev is not None and prev["kernel"] == best["schedule"]["kernel"]
            if same_kernel and kept and kept[0]["ms"] <= STICKY * best["ms"]:
                best = kept[0]
            rows.append((p["tokens"], best))
            prev = best["schedule"]
    return rows


REGENERATE = (
    "python benchmarks/gemm.py --tune --rounds 5 --out benchmarks/results/gemm_tune.json "
    "--write-table kernels/gemm_sm90/tuning/table.json"
)


def merge_states(states: list[dict]) -> dict:
    """The workers' final states merged per (N, K): points, compile times, errors."""
    by_shape: dict = {}
    for st in states:
        if "n" in st:
            entry = by_shape.setdefault((st["n"], st["k"]), {"points": [], "compile_s": {}})
            entry["points"] += st["points"]
            entry["compile_s"].update(st["compile_s"])
            entry.setdefault("errors", {}).update(st.get("errors", {}))
            entry.setdefault("compile_failures", {}).update(st.get("compile_failures", {}))
            entry.setdefault("worker_status", []).append([st["status"], st["returncode"]])
    return by_shape


def merge_base(by_shape: dict, base: dict) -> dict:
    """Points of an earlier tune receipt ``base`` that this tune did not measure, each marked
    with the revision that measured it."""
    taken = 0
    for shape in base["shapes"]:
        entry = by_shape.setdefault((shape["n"], shape["k"]), {"points": [], "compile_s": {}})
        have = {p["tokens"] for p in entry["points"]}
        for p in shape["points"]:
            if p["tokens"] not in have:
                # a point the base itself kept from an earlier receipt keeps its revision
                entry["points"].append({"measured_at": base["git_revision"], **p})
                taken += 1
    return {"base_receipt": f"{taken} points from the tune at {base['git_revision']}"}


def table_of(receipt: dict, receipt_path: str | None = None) -> dict:
    """The measured table of a tune receipt, as ``table.json`` holds it: the fastest valid
    contender's schedule per point (:func:`best_contenders`) and what it measured, keyed by
    the receipt's device, SM count and toolchain. ``receipt_path`` is where the receipt was
    written (default: the tune's default receipt of its activation)."""
    from mxfp8_fusion.kernels.gemm_sm90.tuning import table

    if "sms" not in receipt:
        raise ValueError("the receipt names no SM count: rerun the tune to write a table")
    shapes = []
    for shape in receipt["shapes"]:
        rows = [
            {"tokens": t, "schedule": c["schedule"],
             "measured": {"label": c["label"], "ms": round(c["ms"], 4),
                          "over_cublas_bf16": round(c["over_cublas_bf16"], 2)}}
            for t, c in best_contenders(shape)
        ]  # fmt: skip
        if rows:
            shapes.append({"n": shape["n"], "k": shape["k"], "rows": rows})
    toolchain = {table.TOOLCHAIN_PACKAGE: receipt["nvidia_cutlass_dsl"]}
    toolchain.update(torch=receipt["torch"], driver=receipt["driver"])
    activation = receipt.get("activation", "mxfp8")
    return {
        "device": receipt["gpu"], "sms": receipt["sms"], "toolchain": toolchain,
        **({"activation": activation} if activation != "mxfp8" else {}),
        "revision": receipt.get("git_revision", "unknown"),
        "receipt": receipt_path or (RECEIPT if activation == "mxfp8" else RECEIPT_W8A16),
        "shapes": shapes,
    }  # fmt: skip


def write_table(receipt: dict, path: str, receipt_path: str | None = None) -> None:
    """Put the table of a tune receipt (:func:`table_of`; written at ``receipt_path``) into
    the ``table.json`` at ``path``: it replaces the table of the same device, SM count,
    toolchain and activation, and is written last (the device's latest)."""
    from mxfp8_fusion.kernels.gemm_sm90.tuning import table

    new = table_of(receipt, receipt_path)

    def key(t):  # a W8A16 tune's table stands beside the W8A8 one of its device
        return t["device"], t["sms"], t["toolchain"], t.get("activation", "mxfp8")

    document = json.loads(Path(path).read_text()) if Path(path).exists() else {"tables": []}
    kept = [t for t in document["tables"] if key(t) != key(new)]
    document = {"about": ABOUT, "tables": [*kept, new]}
    Path(path).write_text(table.dumps(document))
    print("wrote", path)


ABOUT = (
    "Measured GEMM schedules per device, toolchain, weight shape (N, K) and token count: "
    "data that benchmarks/gemm.py --tune --write-table writes, not edited by hand "
    "(gemm_sm90/tuning/table.py reads it)."
)
RECEIPT = "benchmarks/results/gemm_tune.json"
RECEIPT_W8A16 = "benchmarks/results/gemm_tune_w8a16.json"


# The ratios to cuBLAS BF16 the GEMM aims for, drawn dotted: (largest tokens of the band,
# ratio), for the reference shape and for the others
TARGETS = {
    (7168, 43008): [(32, 0.65), (64, 0.70), (128, 0.85), (256, 1.05), (16384, 1.15)],
    "other": [(16, 0.80), (256, 1.00), (16384, 1.20)],
}


def plot(receipt: dict, out: Path) -> None:
    """Ratio to cuBLAS BF16 vs tokens, one panel per shape (after; before where measured)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = receipt["shapes"]
    cols = 3
    rows = -(-len(shapes) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.6 * rows), squeeze=False)
    for ax, shape in zip(axes.flat, shapes, strict=False):
        pts = shape["points"]
        for name, style in (("before", "--"), ("ours", "-")):
            xs = [p["tokens"] for p in pts if name in p["contenders"]]
            ys = [p["contenders"][name].get("over_cublas_bf16", float("nan")) for p in pts]
            ys = [y for p, y in zip(pts, ys, strict=True) if name in p["contenders"]]
            if xs:
                label = "ours (table)" if name == "ours" else "before (heuristic)"
                ax.plot(xs, ys, style, marker="o", markersize=3, label=label)
        key = (shape["n"], shape["k"])
        lo = 1
        for hi, target in TARGETS.get(key, TARGETS["other"]):
            ax.hlines(target, lo, hi, colors="gray", linestyles=":", linewidth=1)
            lo = hi
        ax.axhline(1.0, color="black", linewidth=0.6)
        ax.set_xscale("log", base=2)
        ax.set_title(f"N {shape['n']}, K {shape['k']}", fontsize=10)
        ax.set_xlabel("tokens")
        ax.set_ylabel("time / cuBLAS BF16")
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(shapes) :]:
        ax.axis("off")
    fig.suptitle("MXFP8 GEMM (H200, CUDA Graph replay) vs cuBLAS BF16; dotted: targets")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print("wrote", out)
