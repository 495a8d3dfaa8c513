"""The main job runs end to end on the CPU reference and reports bitwise equality."""

import subprocess
import sys


def test_demo_runs_and_paths_are_bitwise_equal():
    result = subprocess.run(
        [sys.executable, "-m", "mxfp8_fusion", "demo", "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "bitwise: True" in result.stdout
