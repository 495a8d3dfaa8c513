"""benchmarks/w8a16.py's logic on the CPU: the floor, the rows, and the targets' states
(met, MISSED, not measured) with the numbers that decide them."""

import json

import pytest
import w8a16 as bench

CHECKS = {"within_bound": True, "bitwise_concatenated": True, "bitwise_graph": True,
          "bitwise_repeats": True, "err_vs_oracle": 1e-3}  # fmt: skip
RATE = 3e12  # bytes per second: the copy rate a run measures
BIG = "reference_6x7168_to_7168"  # 318 MB of weight: the floor rule at 1-8 tokens
SMALL = "moe_gate_up_7168_to_2048"  # 15 MB: the Humming rule


def row(tokens, ours, humming=20.0, shape="drafter_fc_3x4096_to_4096", cublas=30.0, **checks):
    n, widths = bench.SHAPES[shape]
    us = {"ours": ours, "humming": humming, "humming_with_cat": humming + 5, "cublas_bf16": cublas}
    return bench.make_row(shape, tokens, n, widths, "cfg", us, {**CHECKS, **checks}, RATE)


def test_the_floor_is_the_mxfp8_weight_read_at_the_measured_rate():
    # 4096 x 12288 values and one scale byte per 32: 17.3 us at 3 TB/s
    assert bench.floor_us(4096, 12288, RATE) == pytest.approx(17.30, abs=0.01)
    assert bench.floor_us(4096, 12288, 2 * RATE) == pytest.approx(8.65, abs=0.01)
    r = row(8, 17.0)
    assert r.k == 12288 and r.slices == 3
    assert r.ours_over_floor == pytest.approx(17.0 / 17.30, rel=1e-3)


def test_every_target_met():
    rows = [
        row(1, 15.0, shape=SMALL), row(8, 16.0, shape=SMALL),  # at most 0.95 of Humming
        row(1, 110.0, 130.0, BIG), row(4, 115.0, 130.0, BIG),  # at most 1.25 of the floor
        row(1024, 100.0, humming=130.0, cublas=95.0), row(4096, 300.0, 380.0, BIG, 280.0),
    ]  # fmt: skip
    memory = {"output_bytes": 100, "ours_peak_bytes": 100}
    found = bench.targets(rows, memory, {"drafter": True}, {"drafter": 9.0})
    assert {name: t["state"] for name, t in found.items()} == dict.fromkeys(bench.TARGETS, "met")
    assert found["geomean"]["geomean"] < 0.85


def test_each_target_can_be_missed_and_says_where():
    rows = [
        row(1, 25.0, shape=SMALL), row(64, 21.0), row(128, 19.0, within_bound=False),
        row(8, 140.0, 150.0, BIG), row(2048, 90.0, 100.0, cublas=80.0),
    ]  # fmt: skip
    memory = {"output_bytes": 100, "ours_peak_bytes": 300}
    found = bench.targets(rows, memory, {"drafter": False}, {"drafter": 15.0})
    assert all(t["state"] == "MISSED" for t in found.values())
    assert [p[:2] for p in found["every_point"]["slower_points"]] == [
        [SMALL, 1], ["drafter_fc_3x4096_to_4096", 64]
    ]  # fmt: skip
    decode = found["decode_floor"]
    assert decode["small_weights_over_humming"] == [[SMALL, 1, 1.25]]
    floor = bench.floor_us(7168, 43008, RATE)
    assert decode["big_weights_over_floor"] == [[BIG, 8, pytest.approx(140.0 / floor)]]
    assert found["prefill_vs_cublas"]["worst"] == pytest.approx(90.0 / 80.0)
    assert found["numerics"]["points_failing"] == [["drafter_fc_3x4096_to_4096", 128]]


def test_the_prefill_rule_reads_1024_to_4096_tokens_only():
    rows = [row(512, 50.0, 60.0, cublas=10.0), row(1024, 100.0, 120.0, cublas=95.0)]
    found = bench.targets(rows, None, {"drafter": True}, None)
    assert found["prefill_vs_cublas"]["state"] == "met"
    assert found["prefill_vs_cublas"]["points"] == [
        ["drafter_fc_3x4096_to_4096", 1024, pytest.approx(100.0 / 95.0)]
    ]


def test_one_point_slower_than_humming_misses_every_point_and_equal_time_does_not():
    rows = [row(16, 20.0), row(32, 10.0), row(64, 20.2)]
    found = bench.targets(rows, None, {"drafter": True}, None)
    assert found["every_point"]["state"] == "MISSED"
    assert found["every_point"]["slower_points"] == [
        ["drafter_fc_3x4096_to_4096", 64, pytest.approx(1.01)]
    ]
    assert bench.targets(rows[:2], None, {"d": True}, None)["every_point"]["state"] == "met"


def test_the_geomean_is_met_at_0_85_and_missed_just_above():
    at = [row(16, 20.0 * 0.85 * 0.9), row(32, 20.0 * 0.85 / 0.9)]  # geomean 0.85 exactly
    found = bench.targets(at, None, {"drafter": True}, None)["geomean"]
    assert found["state"] == "met" and found["geomean"] == pytest.approx(0.85)
    above = [row(16, 20.0 * 0.85 * 0.9), row(32, 20.0 * 0.851 / 0.9)]
    assert bench.targets(above, None, {"drafter": True}, None)["geomean"]["state"] == "MISSED"


def test_the_decode_rule_splits_at_50_mb_of_mxfp8_weight():
    # 11008 x 4096 is 46.5 MB (Humming rule), 4096 x 12288 is 51.9 MB (floor rule)
    assert bench.weight_bytes(11008, 4096) < bench.BIG_WEIGHT_BYTES
    assert bench.weight_bytes(4096, 12288) >= bench.BIG_WEIGHT_BYTES
    floor = bench.floor_us(4096, 12288, RATE)
    rows = [
        row(1, 19.0, shape="mlp_up_4096_to_11008"),  # 0.95 of Humming: met
        row(8, 1.25 * floor, humming=10.0),  # slower than Humming, but at 1.25 of the floor
        row(16, 30.0, shape="mlp_up_4096_to_11008"),  # beyond 8 tokens: neither rule
    ]
    decode = bench.targets(rows, None, {"d": True}, None)["decode_floor"]
    assert decode["state"] == "met"
    assert decode["small_weights_over_humming"] == [["mlp_up_4096_to_11008", 1, 0.95]]
    assert decode["big_weights_over_floor"] == [
        ["drafter_fc_3x4096_to_4096", 8, pytest.approx(1.25)]
    ]
    rows[0] = row(1, 19.2, shape="mlp_up_4096_to_11008")  # 0.96 of Humming
    assert bench.targets(rows, None, {"d": True}, None)["decode_floor"]["state"] == "MISSED"
    rows[0], rows[1] = row(1, 19.0, shape="mlp_up_4096_to_11008"), row(8, 1.26 * floor)
    assert bench.targets(rows, None, {"d": True}, None)["decode_floor"]["state"] == "MISSED"


def test_a_target_with_no_point_in_its_range_is_not_measured():
    found = bench.targets([row(64, 10.0)], None, {"drafter": True}, None)
    assert found["prefill_vs_cublas"] == {
        "target": bench.TARGETS["prefill_vs_cublas"],
        "state": "not measured",
        "why": "no point at 1024-4096 tokens",
    }
    assert found["decode_floor"]["state"] == "not measured"
    empty = bench.targets([], None, {}, None)
    assert {t["state"] for t in empty.values()} == {"not measured"}


def test_the_receipt_names_the_measured_rate_of_the_floor():
    receipt = bench.build_receipt([row(1, 10.0)], {}, {}, 15, None, RATE)
    assert receipt["copy_bytes_per_s"] == RATE
    assert "3.000 TB/s" in receipt["ratio"] and "measured in this run" in receipt["ratio"]
    assert f"{bench.COPY_BYTES} bytes" in receipt["copy"]
    assert receipt["rows"][0]["config"] == "cfg"


def test_one_more_repeat_that_differs_fails_the_numerics():
    found = bench.targets([row(1024, 1.0, bitwise_repeats=False)], None, {"d": True}, None)
    assert found["numerics"]["state"] == "MISSED"


def test_what_was_not_run_is_not_measured(tmp_path):
    found = bench.targets([row(1, 10.0)], None, {"drafter": True}, None)
    assert found["memory"]["state"] == "not measured"
    assert found["startup"]["state"] == "not measured"
    assert bench.startup_seconds(tmp_path / "absent.json") is None
    receipt = {"results": {"drafter": {"cold_warmup": {"total_s": 12.5}, "cold": {}}}}
    (tmp_path / "startup.json").write_text(json.dumps(receipt))
    assert bench.startup_seconds(tmp_path / "startup.json") == {"drafter": 12.5}


def test_humming_numerics_name_the_points_outside_the_bound_and_with_varying_bits():
    rows = [
        row(1, 10.0, humming_within_bound=True, humming_bitwise_repeats=True,
            humming_err_vs_oracle=1e-3),
        row(64, 10.0, humming_within_bound=False, humming_bitwise_repeats=False,
            humming_err_vs_oracle=4e-3),
        row(128, 10.0),  # Humming not checked (None): left out
    ]  # fmt: skip
    found = bench.humming_numerics(rows)
    assert found["points_checked"] == 2
    assert found["outside_bound"] == found["bits_vary"] == [["drafter_fc_3x4096_to_4096", 64]]
    assert found["max_err_vs_oracle"] == 4e-3 and found["ours_max_err_vs_oracle"] == 1e-3
    assert "humming_numerics" in bench.build_receipt(rows, {}, {}, 5, None, RATE)
    assert "humming_numerics" not in bench.targets(rows, None, {"d": True}, None)
