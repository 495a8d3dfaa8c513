"""Every benchmark script that measures on a GPU says so in one line where none is, instead
of failing with a traceback (``common.require_cuda``)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1]
SCRIPTS = [
    "end_to_end.py",
    "examples.py",
    "gemm.py",
    "launch.py",
    "quantize_slice.py",
    "startup.py",
    "vllm_linear.py",
    "w8a16.py",
]


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_gpu_benchmark_without_a_gpu_says_so_in_one_line(script, tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no GPU, on any machine
    run = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--out", str(tmp_path / "receipt.json")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,  # a receipt written by mistake would land here
        timeout=300,
    )
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert run.returncode == 1
    assert lines == [f"{script} measures on a CUDA device (sm_90); none is here"]
