"""Every shipped kernel build compiles on the CPU to the PTX recorded in
``tests/helpers/ptx_hashes.json``: a change to kernel code that changes a binary fails here,
and is re-recorded (``python tests/helpers/ptx_hashes.py --write``) only with a GPU
re-measurement."""

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "helpers" / "ptx_hashes.py"


@pytest.mark.slow
def test_ptx_of_every_shipped_build_is_the_recorded_one(tmp_path):
    """Also: the PTX files the DSL dumps go to a temporary folder, not the caller's."""
    pytest.importorskip("cutlass")
    run = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=1800, cwd=tmp_path
    )
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == []
