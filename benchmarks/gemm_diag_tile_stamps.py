"""Diagnostic: where the tiled GEMM spends its time per output tile, from clock stamps the
kernel writes inside itself (gemm_sm90_tiled.TILE_STAMPS) for each CTA's first segments.

Per configuration, medians over the CTAs and over 6 eager launches (weights rotating over 2
copies, after a warm-up), microseconds:

* ``per_tile``: for segment j of each CTA, every stamp relative to the earliest stamp of
  the launch;
* ``waits_share``: over segments 1.., the share of consumer 0's mainloop (its first thread)
  spent waiting for A (the FP8 stage), for B (the 16-bit stage) and for its own wgmmas, and
  the share of the first converter thread's segment spent waiting for the FP8 stage and for
  a free 16-bit slot (SM cycles, gemm_sm90_tiled.TILE_WAITS);
* ``phases``: over segments 1.. (the first one also waits for the pipelines to fill):
  ``gap`` (consumer 0 done with segment j - 1 until its first 16-bit stage of segment j),
  ``mainloop`` (first stage until its last wgmma of the segment has finished), ``per_stage``
  (mainloop over the segment's K stages), ``epilogue`` (until its sums are stored or
  published), and ``converter_lead`` (how far the first converter thread's first stage of a
  segment came before consumer 0's).

On an H200: ``OUT=dir python benchmarks/gemm_diag_tile_stamps.py`` writes
dir/gemm_diag_tile_stamps.json (receipt: benchmarks/results/gemm_diag_tile_stamps.json; read
in docs/gemm_log.md)."""

import json
import os
import statistics

import torch
from gemm_diag_stamps import stamped_launches
from mxfp8_fusion.kernels.gemm_sm90_tiled import (
    STAMP_WORDS,
    STAMPED_TILES,
    TILE_STAMPS,
    TILE_WAITS,
    MXFP8TiledGemmSm90,
)

CASES = [  # (spec, tokens, N, K)
    ("tiled 192x128 c1", 4096, 18432, 7168),
    ("tiled 192x128 c1", 4096, 7168, 14336),
    ("tiled 192x128 c1", 2048, 7168, 43008),
    ("tiled 128x128 c2", 4096, 2048, 7168),
    ("tiled 128x64 c1 stream-k", 96, 2048, 7168),
    ("tiled 128x64 c1 stream-k", 256, 2048, 7168),
    ("tiled 128x128 c2 stream-k", 512, 2048, 7168),
    ("tiled 128x128 c2 stream-k", 128, 7168, 43008),
]
POINTS = {name: i for i, name in enumerate(TILE_STAMPS)}
WAITS = {name: len(TILE_STAMPS) + i for i, name in enumerate(TILE_WAITS)}
SHARES = {  # wait: the total it is a share of
    "consumer_a_wait": "consumer_mainloop",
    "consumer_b_wait": "consumer_mainloop",
    "consumer_wgmma_wait": "consumer_mainloop",
    "converter_a_wait": "converter_tile",
    "converter_slot_wait": "converter_tile",
}


def launch_stamps(buf, ctas):
    """[cta][segment] -> ({point: us since the launch's earliest stamp} (stamped ones),
    {wait: SM cycles})."""
    raw = buf.view(ctas, STAMPED_TILES, STAMP_WORDS).cpu().tolist()
    t0 = min(x for cta in raw for seg in cta for x in seg[: len(TILE_STAMPS)] if x)
    return [
        [
            (
                {name: (seg[i] - t0) / 1000 for name, i in POINTS.items() if seg[i]},
                {name: seg[i] for name, i in WAITS.items()},
            )
            for seg in cta
            if seg[POINTS["consumer_start"]]
        ]
        for cta in raw
    ]


def med(values):
    return round(statistics.median(values), 3) if values else None


def summarize(stamped, k_stages):
    launches = [[[seg for seg, _w in cta] for cta in rel] for rel in stamped]
    shares = {wait: [] for wait in SHARES}
    for rel in stamped:
        for cta in rel:
            for _seg, waits in cta[1:]:
                for wait, total in SHARES.items():
                    if waits[total]:
                        shares[wait].append(waits[wait] / waits[total])
    per_tile = {}
    for j in range(STAMPED_TILES):
        segs = [cta[j] for rel in launches for cta in rel if len(cta) > j]
        if segs:
            per_tile[j] = {n: med([s[n] for s in segs if n in s]) for n in TILE_STAMPS}
    phases = {"gap": [], "mainloop": [], "per_stage": [], "epilogue": [], "converter_lead": []}
    for rel in launches:
        for cta in rel:
            for j in range(1, len(cta)):
                prev, seg = cta[j - 1], cta[j]
                need = ("consumer_first_stage", "consumer_mainloop_done", "consumer_done")
                if not all(n in seg for n in need) or "consumer_done" not in prev:
                    continue
                main = seg["consumer_mainloop_done"] - seg["consumer_first_stage"]
                phases["gap"].append(seg["consumer_first_stage"] - prev["consumer_done"])
                phases["mainloop"].append(main)
                phases["per_stage"].append(main / k_stages)
                phases["epilogue"].append(seg["consumer_done"] - seg["consumer_mainloop_done"])
                if "converter_first_stage" in seg:
                    lead = seg["consumer_first_stage"] - seg["converter_first_stage"]
                    phases["converter_lead"].append(lead)
    ends = [max(s["consumer_done"] for cta in rel for s in cta) for rel in launches]
    return {
        "segments_per_cta": max(len(cta) for cta in launches[0]),
        "last_consumer_done_us": med(ends),
        "waits_share": {k: med(v) for k, v in shares.items()},
        "phases_us": {k: med(v) for k, v in phases.items()},
        "per_tile_us": per_tile,
    }


def main():
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    buf = torch.zeros(num_sms * STAMPED_TILES * STAMP_WORDS, dtype=torch.int64, device="cuda")
    MXFP8TiledGemmSm90.stamps_addr = buf.data_ptr()  # before the first compile
    res = {
        "what": "tiled GEMM: per-CTA %globaltimer stamps per segment inside one launch "
        "(benchmarks/gemm_diag_tile_stamps.py; points: kernels/gemm_sm90_tiled.TILE_STAMPS), "
        "medians over CTAs and 6 eager launches, microseconds",
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cases": {},
    }
    for spec, tokens, n, k in CASES:
        read = lambda b: launch_stamps(b, num_sms)  # noqa: E731
        launches = stamped_launches(buf, spec, tokens, n, k, num_sms, 2, 6, read)
        # whole-tile segments: every stage of the tile (stream-K segments vary; the median
        # per-stage figure then uses the full count and reads low)
        key = f"{spec} t{tokens} N{n} K{k}"
        res["cases"][key] = summarize(launches, k // 128)
        print(key, json.dumps({x: y for x, y in res["cases"][key].items() if x != "per_tile_us"}))
        torch.cuda.empty_cache()
    path = os.path.join(os.environ.get("OUT", "/tmp"), "gemm_diag_tile_stamps.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
