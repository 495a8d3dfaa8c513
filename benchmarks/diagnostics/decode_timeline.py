"""The decode diagnostic's timeline (``swap_ab_decode.py``, not shipped): a device op that
stamps %globaltimer per CTA, and the summaries of the stamped launches: the median and the
latest CTA, and one launch CTA by CTA beside the kernel's stream-K geometry."""

from __future__ import annotations

import statistics

STAMPS = ("start", "segments_done", "end")
"""Where a CTA stamps: its consumers' start, its segments done (before the fixup), its end."""


def stamp_op(stamps_addr: int):
    """A device op writing %globaltimer into a CTA's row of the stamps buffer (nothing where
    ``stamps_addr`` is 0)."""
    from cutlass import Int64
    from cutlass.cutlass_dsl import dsl_user_op

    from mxfp8_fusion.kernels.runtime.ptx import inline_ptx

    @dsl_user_op
    def stamp(cta, point: int, *, loc=None, ip=None):
        if stamps_addr:
            addr = Int64(stamps_addr) + (Int64(cta) * len(STAMPS) + point) * 8
            inline_ptx(
                "{\n.reg .u64 t;\nmov.u64 t, %globaltimer;\nst.global.u64 [$0], t;\n}",
                "l", [addr.ir_value(loc=loc, ip=ip)], None, True, loc=loc, ip=ip,
            )  # fmt: skip

    return stamp


def timeline(buf, ctas: int) -> list[list[float]]:
    rows = [r for r in buf.view(ctas, len(STAMPS)).cpu().tolist() if r[0] != 0]
    t0 = min(r[0] for r in rows)
    # a CTA without a tail to fix up stamps no segments_done: its segments end at its end
    return [[(r[0] - t0) / 1e3, ((r[1] or r[2]) - t0) / 1e3, (r[2] - t0) / 1e3] for r in rows]


def summary(launches) -> dict:
    out = {"ctas": len(launches[0])}
    for j, name in enumerate(STAMPS):
        out[name] = {
            "median_cta_us": round(statistics.median(statistics.median(r[j] for r in rel)
                                                     for rel in launches), 2),
            "latest_cta_us": round(statistics.median(max(r[j] for r in rel)
                                                     for rel in launches), 2),
        }  # fmt: skip
    return out


def geometry(cfg, n: int, k: int) -> list[list[int]]:
    """Per CTA of a ``cluster`` 1 decode launch of ``cfg``: its units, the segments (weight
    tiles) they touch, whether it holds a split tile's tail, and how many lower CTAs' parts
    its fixup waits for (the kernel's stream-K split, swap_ab.parts, on up to
    ``cfg.num_ctas`` CTAs, fewer with ``tile_aligned``)."""
    from mxfp8_fusion.kernels.gemm_sm90.config import aligned_groups

    k_tiles = k // 128
    tiles = -(-n // cfg.tile_w)
    units = tiles * k_tiles
    groups = min(cfg.num_ctas, units)
    if cfg.tile_aligned:
        groups = aligned_groups(tiles, k_tiles, groups)
    rows = []
    for q in range(groups):
        begin, end = q * units // groups, (q + 1) * units // groups
        head = begin // k_tiles  # a tile's tail can only be a CTA's first segment
        tail = begin > head * k_tiles and end >= (head + 1) * k_tiles
        first = ((head * k_tiles + 1) * groups - 1) // units
        segments = (end - 1) // k_tiles - head + 1
        rows.append([end - begin, segments, int(tail), q - first if tail else 0])
    return rows


def per_cta(launches, geometry) -> dict:
    """The launch whose latest CTA ends at the median of the launches, CTA by CTA, beside
    each CTA's geometry, and the median and latest end of each (segments, tail) class."""
    ends = sorted(launches, key=lambda rel: max(r[2] for r in rel))
    launch = ends[len(ends) // 2]
    rows = [[round(v, 2) for v in r] + g for r, g in zip(launch, geometry, strict=False)]
    classes = {}
    for r in rows:
        classes.setdefault(f"segments {r[4]}, tail {r[5]}", []).append(r)
    return {
        "columns": ["start_us", "segments_done_us", "end_us", "units", "segments", "tail",
                    "parts_awaited"],
        "rows": rows,
        "classes": {name: {"ctas": len(rs),
                           "segments_done_us": [statistics.median(r[1] for r in rs),
                                                max(r[1] for r in rs)],
                           "end_us": [statistics.median(r[2] for r in rs), max(r[2] for r in rs)]}
                    for name, rs in sorted(classes.items())},
    }  # fmt: skip
