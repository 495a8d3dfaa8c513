"""The README's compact results table, generated from the end-to-end receipt.

python benchmarks/readme_table.py [benchmarks/results/end_to_end.json]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> None:
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/end_to_end.json")
    receipt = json.loads(path.read_text())
    env = receipt["environment"]
    results = receipt["results"]
    names = [r["geometry"]["name"].split(":")[0] for r in results]
    head = ["path"] + [f"{n}: {what}" for n in names for what in ("time / (1)", "peak / (1)")]
    print("| " + " | ".join(head) + " |")
    print("| --- |" + " ---: |" * (len(head) - 1))
    firsts = [r["measurements"][0] for r in results]
    for i, m in enumerate(results[0]["measurements"]):
        cells = [f"({m['variant'].split('_')[0]}) {m['what']}"]
        for r, first in zip(results, firsts, strict=True):
            row = r["measurements"][i]
            cells.append(f"{row['median_ms_queued'] / first['median_ms_queued']:.2f}")
            cells.append(f"{row['transient_peak_bytes'] / first['transient_peak_bytes']:.2f}")
        print("| " + " | ".join(cells) + " |")
    geoms = "; ".join(
        f"{r['geometry']['name']}: {r['measurements'][0]['median_ms_queued']:.2f} ms and "
        f"{r['measurements'][0]['transient_peak_bytes'] / 2**20:.0f} MiB for (1)"
        for r in results
    )
    print(
        f"\n{env['gpu']}, torch {env['torch']}, nvidia-cutlass-dsl {env['nvidia_cutlass_dsl']}; "
        f"median of {receipt['rounds']} interleaved rounds of GPU time with the host running "
        f"ahead; lower is better ({geoms})."
    )


if __name__ == "__main__":
    main()
