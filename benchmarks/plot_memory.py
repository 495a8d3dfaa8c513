"""Memory-timeline picture from the end-to-end receipt: allocated bytes over one call of the
concatenated path and of the staged paths, side by side.

    python benchmarks/plot_memory.py [benchmarks/results/end_to_end.json] [out.png]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

LABELS = {
    "1_concatenated_eager": "concatenated eager (cat + one-shot mm)",
    "2_staged_eager": "staged eager (quantize_input_slice + mm_quantized_into)",
    "3_compiled_mxfp8_fusion": "compiled, backend='mxfp8_fusion'",
}


def main() -> None:
    receipt_path = Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/end_to_end.json")
    out = Path(
        sys.argv[2] if len(sys.argv) > 2 else receipt_path.with_name("end_to_end_memory.png")
    )
    receipt = json.loads(receipt_path.read_text())
    results = receipt["results"]
    fig, axes = plt.subplots(1, len(results), figsize=(6.5 * len(results), 4.2), squeeze=False)
    for ax, result in zip(axes[0], results, strict=True):
        for name, label in LABELS.items():
            trace = result["memory_traces"].get(name)
            if not trace:
                continue
            t = [p[0] / 1000.0 for p in trace]
            mib = [p[1] / 2**20 for p in trace]
            ax.step(t, mib, where="post", label=label, linewidth=1.8)
        sizes = result["bytes"]
        ax.axhline(sizes["bf16_concatenation"] / 2**20, color="grey", linestyle=":", linewidth=1)
        ax.text(
            0,
            sizes["bf16_concatenation"] / 2**20,
            " BF16 concatenation alone",
            va="bottom",
            fontsize=8,
            color="grey",
        )
        ax.set_title(result["geometry"]["name"], fontsize=10)
        ax.set_xlabel("host time of allocator events within the call (ms)")
        ax.set_ylabel("MiB allocated above the start of the call")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower center")
    env = receipt["environment"]
    fig.suptitle(
        f"mxfp8_fusion: transient memory of one projection call ({env['gpu']}, torch {env['torch']})",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
