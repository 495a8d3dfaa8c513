"""The GEMM tune's orchestration (benchmarks/gemm_sweep.py) on the CPU: a worker whose
contender never returns is killed, and its spec is left out by the other workers; the table
writer's choice per point (benchmarks/gemm_report.py)."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

_BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture
def sweep(monkeypatch):
    monkeypatch.syspath_prepend(str(_BENCH))
    import gemm_sweep

    return gemm_sweep


def test_a_hung_contender_is_killed_and_left_out(sweep, monkeypatch, tmp_path):
    hung_file = tmp_path / "hung.txt"
    job = {"n": 8, "k": 32, "out": str(tmp_path / "w.json"), "hung": str(hung_file)}
    # the worker's state as it stands while the first launch of a spec never returns
    state = {"status": "timing", "since": time.time() - 10, "point": 32,
             "checking": "tiled 64x128 c2 stream-k s7+3"}  # fmt: skip
    Path(job["out"]).write_text(json.dumps(state))
    monkeypatch.setattr(sweep, "POINT_TIMEOUT_S", 1.0)
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    popen = subprocess.Popen
    monkeypatch.setattr(sweep.subprocess, "Popen", lambda cmd, **kw: popen(sleeper, **kw))
    t0 = time.time()
    states = sweep._run_workers([job], deadline=time.time() + 60)
    assert time.time() - t0 < 30 and states[0]["returncode"] != 0  # killed, not waited for
    assert hung_file.read_text().splitlines() == ["tiled 64x128 c2 stream-k s7+3"]


def test_workers_skip_specs_that_hung(sweep):
    """A worker reads the hung specs before each point; the tune's configs leave them out."""
    job = {"mode": "tune", "n": 7168, "k": 43008, "leave_out": [],
           "hung_specs": ["tiled 128x128 c2 stream-k"]}  # fmt: skip
    names = set(sweep._configs(job, 64, 132))
    assert "tiled 128x128 c2 stream-k" not in names and "tiled 64x128 c2 stream-k" in names


def test_table_keeps_a_neighbours_spec_only_within_one_kernel(sweep):
    """The table writer keeps the previous point's spec within 3% of the fastest (fewer
    switch points), but not across kernels: the swap-AB kernel's time grows faster with
    tokens than the tiled one's."""
    import gemm_report

    names = ("swap-ab w128 bf16-tokens", "tiled 128x128 c2", "tiled 192x128 c1")

    def point(tokens, *times):
        contenders = {
            n: {"ms": t, "over_cublas_bf16": t} for n, t in zip(names, times, strict=True)
        }
        return {"tokens": tokens, "contenders": contenders}

    shape = {"points": [
        point(64, 1.00, 1.10, 1.20),
        point(96, 1.02, 1.00, 1.20),  # swap-AB within 3%, but of another kernel
        point(128, 1.50, 1.02, 1.00),  # the tiled neighbour within 3%: it sticks
        point(192, 2.00, 1.10, 1.00),
    ]}  # fmt: skip
    specs = [spec for _t, spec, _ms, _r in gemm_report.best_specs(shape)]
    assert specs == [names[0], names[1], names[1], names[2]]
