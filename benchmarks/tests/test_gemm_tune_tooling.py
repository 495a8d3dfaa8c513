"""The GEMM tune's orchestration (benchmarks/gemm_tools) on the CPU: a worker whose contender
never returns is killed, and its schedule is left out by the other workers; every point's
contenders resolve; the table writer's choice per point (gemm_tools/report.py)."""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from gemm_tools import points, report, runs

from mxfp8_fusion.kernels.gemm_sm90 import config
from mxfp8_fusion.kernels.gemm_sm90.tuning import select

K_SPLIT = select.schedule(config.tiled_config(64, 128, 2, 1))  # tiled 64x128 c2 stream-k


def test_a_hung_contender_is_killed_and_left_out(monkeypatch, tmp_path):
    hung_file = tmp_path / "hung.txt"
    job = {"n": 8, "k": 32, "out": str(tmp_path / "w.json"), "hung": str(hung_file)}
    # the worker's state as it stands while the first launch of a config never returns
    deep = select.schedule(config.tiled_config(64, 128, 2, 1, stages=(7, 3)))
    state = {"status": "timing", "since": time.time() - 10, "point": 32,
             "checking": {"label": "tiled 64x128 c2 stream-k s7+3", "schedule": deep}}  # fmt: skip
    Path(job["out"]).write_text(json.dumps(state))
    monkeypatch.setattr(runs, "POINT_TIMEOUT_S", 1.0)
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    popen = subprocess.Popen
    monkeypatch.setattr(runs.subprocess, "Popen", lambda cmd, **kw: popen(sleeper, **kw))
    t0 = time.time()
    states = runs._run_workers([job], deadline=time.time() + 60)
    assert time.time() - t0 < 30 and states[0]["returncode"] != 0  # killed, not waited for
    assert [json.loads(line) for line in hung_file.read_text().splitlines()] == [deep]


def test_workers_skip_schedules_that_hung():
    """A worker reads the hung schedules before each point; the tune's configs leave them
    out."""
    stream_k = select.schedule(config.tiled_config(128, 128, 2, 1))
    job = {"mode": "tune", "n": 7168, "k": 43008, "leave_out": [], "hung_schedules": [stream_k]}
    schedules = [select.schedule(cfg) for cfg in points._configs(job, 64, 132).values()]
    assert stream_k not in schedules and K_SPLIT in schedules


def test_every_sweep_and_tune_point_names_its_configs():
    """The sweep's and the tune's contenders resolve on the CPU at every point of every
    listed shape (a worker that raises here measures nothing at its token group)."""
    for n, k in points.SHAPES:
        for t in points.TOKENS:
            for mode in ("sweep", "tune"):
                job = {"mode": mode, "n": n, "k": k, "before": True, "leave_out": []}
                found = points._configs(job, t, 132)
                assert found and all(map(config.label, found.values())), (mode, n, k, t)
                assert all(
                    select.config_of(select.schedule(cfg), t, 132) == cfg for cfg in found.values()
                ), (mode, n, k, t)


def test_table_keeps_a_neighbours_schedule_only_within_one_kernel():
    """The table writer keeps the previous point's schedule within 3% of the fastest (fewer
    switch points), but not across kernels: the swap-AB kernel's time grows faster with
    tokens than the tiled one's."""
    wide = config.swap_ab_config(64, consumers=2, bf16_tokens=True, tile_w=128)
    configs = (wide, config.tiled_config(128, 128, 2), config.tiled_config(192, 128, 1))
    schedules = [select.schedule(cfg) for cfg in configs]

    def point(tokens, *times):
        contenders = {
            config.label(cfg): {"schedule": select.schedule(cfg), "ms": t, "over_cublas_bf16": t}
            for cfg, t in zip(configs, times, strict=True)
        }
        return {"tokens": tokens, "contenders": contenders}

    shape = {"points": [
        point(64, 1.00, 1.10, 1.20),
        point(96, 1.02, 1.00, 1.20),  # swap-AB within 3%, but of another kernel
        point(128, 1.50, 1.02, 1.00),  # the tiled neighbour within 3%: it sticks
        point(192, 2.00, 1.10, 1.00),
    ]}  # fmt: skip
    chosen = [c["schedule"] for _t, c in report.best_contenders(shape)]
    assert chosen == [schedules[0], schedules[1], schedules[1], schedules[2]]


def test_a_tune_of_some_shapes_keeps_the_bases_other_shapes(monkeypatch, tmp_path):
    """``--shapes`` with ``--tune-base``: the receipt, and so the table written from it,
    holds the base's shapes the tune did not measure, marked with the base's revision."""
    point = {"tokens": 1, "contenders": {"swap-ab": {"ms": 1.0, "over_cublas_bf16": 0.5}}}
    base = {"git_revision": "abc1234", "shapes": [
        {"n": 2048, "k": 7168, "points": [point]}, {"n": 7168, "k": 43008, "points": [point]},
    ]}  # fmt: skip
    (tmp_path / "base.json").write_text(json.dumps(base))
    measured = {"n": 2048, "k": 7168, "points": [dict(point, tokens=1)], "compile_s": {},
                "status": "done", "returncode": 0}  # fmt: skip
    monkeypatch.setattr(runs, "_run_workers", lambda jobs, deadline: [measured])
    import common

    monkeypatch.setattr(common, "environment", lambda rev: {"git_revision": rev})
    out = tmp_path / "tune.json"
    args = argparse.Namespace(
        plot=None, tune=True, sweep=False, before=False, shapes="2048,7168", sweep_tokens=[1],
        deadline_s=60.0, rounds=1, out=str(out), git_rev="def5678", write_table=None,
        tune_base=str(tmp_path / "base.json"), workers=1, lock=None, gate=None,
        no_stream_k=False, decode=False, activation="mxfp8", rest_s=None,
    )  # fmt: skip
    runs.run(args)
    shapes = {(s["n"], s["k"]): s["points"] for s in json.loads(out.read_text())["shapes"]}
    assert set(shapes) == {(2048, 7168), (7168, 43008)}
    assert shapes[(7168, 43008)][0]["measured_at"] == "abc1234"
    assert "measured_at" not in shapes[(2048, 7168)][0]


def test_decode_targets_take_the_worst_point_and_fail_unmeasured_ones():
    """``--decode``: a target is met only where every point in its range is measured and
    within its bound; each shape is measured at its own token counts."""
    from gemm_tools import decode

    def shape(n, k, ratios):
        pts = [{"tokens": t, "contenders": {"ours": {"over_cublas_bf16": r, "ms": 0.02}}}
               for t, r in ratios.items()]  # fmt: skip
        return {"n": n, "k": k, "points": pts}

    receipt = {"shapes": [
        shape(4096, 12288, dict.fromkeys(decode.DRAFTER_TOKENS, 0.5)),
        shape(11008, 4096, dict.fromkeys(decode.DRAFTER_TOKENS, 0.5) | {8: 0.6}),
        shape(7168, 14336, dict.fromkeys(decode.DRAFTER_TOKENS, 0.5)),
    ]}  # fmt: skip
    rows = {r["target"]: r for r in decode.targets(receipt)}
    drafters = rows["drafter shapes, 1-32 tokens"]
    assert not drafters["met"]  # 0.6 at 8 tokens, and 4096 x 11008 never measured
    assert drafters["ratios"]["11008x4096 t8"] == 0.6
    assert rows["MTP eh_proj, 1-32 tokens"]["met"]
    assert rows["MTP eh_proj, 1-32 tokens"]["worst"] == 0.5
    assert abs(decode.floor_us(4096, 12288) - 12.98) < 0.01  # 52 MB at 4 TB/s
    args = argparse.Namespace(tune=False, before=False, rounds=1, no_stream_k=False,
                              lock=None, gate=None, workers=12, decode=True,
                              activation="mxfp8", rest_s=None)  # fmt: skip
    jobs = runs._jobs(args, list(decode.POINTS), lambda n, k: decode.POINTS[(n, k)][1],
                      Path("/tmp"), 0.0)  # fmt: skip
    by_shape = {}
    for job in jobs:
        by_shape.setdefault((job["n"], job["k"]), []).extend(job["tokens"])
    assert by_shape[(2048, 7168)] == [48, 64, 96, 128, 192, 256]
    assert by_shape[(4096, 12288)] == list(decode.DRAFTER_TOKENS)
    # --shapes with a shape outside the decode points: measured at the drafter token counts
    args.shapes, args.sweep_tokens = "1024,8192", None
    shapes, tokens_of = runs._points(args)
    assert shapes == [(1024, 8192)] and tokens_of(1024, 8192) == decode.DRAFTER_TOKENS


def test_the_committed_tables_are_the_ones_their_receipts_give():
    """Each table of kernels/gemm_sm90/tuning/table.json (the H200's W8A8 one, the H100's
    W8A16 one) is exactly what the table writer makes of the tune receipt it names, each its
    own (an SM count the first receipt predates: the H200's 132)."""
    from mxfp8_fusion.kernels.gemm_sm90.tuning import table

    committed = table.tables()
    assert [(t["device"], t.get("activation", "mxfp8")) for t in committed] == [
        ("NVIDIA H200", "mxfp8"), ("NVIDIA H100 80GB HBM3", "bf16")
    ]  # fmt: skip
    assert len({t["receipt"] for t in committed}) == len(committed)  # none overwrote another
    for measured in committed:
        receipt = json.loads((Path(__file__).parents[2] / measured["receipt"]).read_text())
        assert report.table_of({"sms": 132, **receipt}, measured["receipt"]) == measured


def test_w8a16_points_name_bf16_activation_configs_that_round_trip():
    """``--activation bf16``: every sweep and tune point's contenders are W8A16 configs, and
    each survives the table's round trip (schedule -> config_of)."""
    for n, k in points.SHAPES:
        for t in points.TOKENS:
            for mode in ("sweep", "tune"):
                job = {"mode": mode, "n": n, "k": k, "before": False, "leave_out": [],
                       "activation": "bf16"}  # fmt: skip
                found = points._configs(job, t, 132)
                assert found and all(c.activation == "bf16" for c in found.values())
                assert all(
                    select.config_of(select.schedule(cfg), t, 132) == cfg for cfg in found.values()
                ), (mode, n, k, t)


def test_a_w8a16_table_stands_beside_the_w8a8_one_and_is_chosen(tmp_path, monkeypatch):
    """A W8A16 tune's table is written beside its device's W8A8 table (keyed by activation)
    and the W8A16 choice takes it; the W8A8 choice is unchanged."""
    from mxfp8_fusion.kernels.gemm_sm90.tuning import table

    cfg = config.tiled_config(128, 64, 1, 1, activation="bf16")
    receipt = {
        "gpu": "NVIDIA H200", "sms": 132, "activation": "bf16", "nvidia_cutlass_dsl": "4.8.1",
        "torch": "2.11", "driver": "580", "git_revision": "test",
        "shapes": [{"n": 4096, "k": 12288, "points": [{"tokens": 512, "contenders": {
            "cublas_bf16": {"label": "torch.mm BF16", "ms": 1.0, "over_cublas_bf16": 1.0},
            config.label(cfg): {"label": config.label(cfg), "schedule": select.schedule(cfg),
                                "ms": 0.5, "over_cublas_bf16": 0.5, "rel_err_vs_dequant_cublas": 0.0},
        }}]}],
    }  # fmt: skip
    path = tmp_path / "table.json"
    path.write_text(table.PATH.read_text())
    report.write_table(receipt, str(path))
    written = json.loads(path.read_text())["tables"]
    assert [(t["device"][-4:], t.get("activation", "mxfp8")) for t in written] == [
        ("H200", "mxfp8"), ("HBM3", "bf16"), ("H200", "bf16")
    ]  # fmt: skip
    monkeypatch.setattr(table, "PATH", path)
    for cache in (table.tables, table.shapes, select.choose_config):
        cache.cache_clear()
    try:
        assert select.choose_config(512, 4096, 12288, activation="bf16") == cfg
        assert select.choose_config(512, 4096, 12288).activation == "mxfp8"
    finally:
        monkeypatch.undo()
        for cache in (table.tables, table.shapes, select.choose_config):
            cache.cache_clear()
