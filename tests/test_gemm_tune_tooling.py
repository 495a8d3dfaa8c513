"""The GEMM tune's orchestration (benchmarks/gemm_sweep.py) on the CPU: a worker whose
contender never returns is killed, and its spec is left out by the other workers."""

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
