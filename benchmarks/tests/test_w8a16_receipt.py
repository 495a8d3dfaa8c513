"""benchmarks/w8a16.py's logic on the CPU: the floor, the rows, and the targets' states
(met, MISSED, not measured) with the numbers that decide them."""

import json

import pytest
import w8a16 as bench

CHECKS = {"within_bound": True, "bitwise_concatenated": True, "bitwise_graph": True,
          "err_vs_oracle": 1e-3}  # fmt: skip


def row(tokens, ours, humming=20.0, shape="drafter_fc_3x4096_to_4096", **checks):
    n, widths = bench.SHAPES[shape]
    us = {"ours": ours, "humming": humming, "humming_with_cat": humming + 5, "cublas_bf16": 30.0}
    return bench.make_row(shape, tokens, n, widths, "cfg", us, {**CHECKS, **checks})


def test_the_floor_is_the_mxfp8_weight_read():
    # 4096 x 12288 values and one scale byte per 32: 13.0 us at 4 TB/s (docs: BASELINES)
    assert bench.floor_us(4096, 12288) == pytest.approx(12.98, abs=0.01)
    r = row(8, 17.0)
    assert r.k == 12288 and r.slices == 3
    assert r.ours_over_floor == pytest.approx(17.0 / 12.98, rel=1e-3)


def test_every_target_met():
    rows = [row(1, 17.0), row(8, 17.5), row(1024, 100.0, humming=110.0)]
    memory = {"output_bytes": 100, "ours_peak_bytes": 100}
    found = bench.targets(rows, memory, {"drafter": True}, {"drafter": 9.0})
    assert {name: t["state"] for name, t in found.items()} == dict.fromkeys(bench.TARGETS, "met")
    assert found["geomean"]["geomean"] < 0.9


def test_each_target_can_be_missed_and_says_where():
    rows = [row(1, 25.0), row(64, 21.0), row(128, 19.0, within_bound=False)]
    memory = {"output_bytes": 100, "ours_peak_bytes": 300}
    found = bench.targets(rows, memory, {"drafter": False}, {"drafter": 15.0})
    assert all(t["state"] == "MISSED" for t in found.values())
    assert [p[:2] for p in found["every_point"]["slower_points"]] == [
        ["drafter_fc_3x4096_to_4096", 1], ["drafter_fc_3x4096_to_4096", 64]
    ]  # fmt: skip
    assert found["decode_floor"]["worst_over_floor"] == pytest.approx(25.0 / 12.98, rel=1e-3)
    assert found["numerics"]["points_failing"] == [["drafter_fc_3x4096_to_4096", 128]]


def test_what_was_not_run_is_not_measured(tmp_path):
    found = bench.targets([row(1, 10.0)], None, {"drafter": True}, None)
    assert found["memory"]["state"] == "not measured"
    assert found["startup"]["state"] == "not measured"
    assert bench.startup_seconds(tmp_path / "absent.json") is None
    receipt = {"results": {"drafter": {"cold_warmup": {"total_s": 12.5}, "cold": {}}}}
    (tmp_path / "startup.json").write_text(json.dumps(receipt))
    assert bench.startup_seconds(tmp_path / "startup.json") == {"drafter": 12.5}
