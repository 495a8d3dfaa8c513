"""Markdown results table for the README, generated from the end-to-end receipt.

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
    print(
        f"{env['gpu']}, driver {env['driver']}, torch {env['torch']}, nvidia-cutlass-dsl "
        f"{env['nvidia_cutlass_dsl']}, revision {env['git_revision']}; median of "
        f"{receipt['rounds']} interleaved rounds (order rotated each round). Ratios are to "
        "(1); lower is better. "
        "*Queued*: the call's kernels timed behind a sleep kernel, so the host has launched "
        "them all before they run (GPU work only, as in a serving loop that runs ahead); "
        "*isolated*: the call starts on an idle GPU, so host launch time is on the clock.\n"
    )
    for result in receipt["results"]:
        print(f"**{result['geometry']['name']}**\n")
        print(
            "| path | mode | queued ms | queued / (1) | isolated ms | isolated / (1) | "
            "host ms | transient peak MiB | peak / (1) |"
        )
        print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        first = result["measurements"][0]
        for m in result["measurements"]:
            print(
                f"| {m['variant']}: {m['what']} | {m['mode']} | {m['median_ms_queued']:.3f} | "
                f"{m['median_ms_queued'] / first['median_ms_queued']:.3f} | "
                f"{m['median_ms']:.3f} | {m['median_ms'] / first['median_ms']:.3f} | "
                f"{m['host_ms']:.3f} | "
                f"{m['transient_peak_bytes'] / 2**20:.1f} | "
                f"{m['transient_peak_bytes'] / first['transient_peak_bytes']:.3f} |"
            )
        equal = ", ".join(f"{k}: {v}" for k, v in result["bitwise_equal_to_1"].items())
        print(f"\nBitwise equal to (1): {equal}.\n")


if __name__ == "__main__":
    main()
