"""The main job runs end to end on the CPU reference and reports bitwise equality; a device
it cannot use is a one-line usage error."""

import subprocess
import sys

import pytest
import torch

from mxfp8_fusion.__main__ import main


@pytest.mark.slow
def test_demo_runs_and_paths_are_bitwise_equal():
    result = subprocess.run(
        [sys.executable, "-m", "mxfp8_fusion", "demo", "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "bitwise: True" in result.stdout
    # every row says how its bytes were found, and the table says what that means
    rows = [line for line in result.stdout.splitlines() if line.endswith(("measured", "computed"))]
    assert len(rows) == 4 and "how: measured = the CUDA allocator's peak" in result.stdout
    assert "W8A16 from the slices == W8A16 on the concatenation, bitwise: True" in result.stdout


@pytest.mark.slow
def test_bogus_device_is_a_one_line_usage_error():
    result = subprocess.run(
        [sys.executable, "-m", "mxfp8_fusion", "demo", "--device", "bogus"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1] == (
        "python -m mxfp8_fusion demo: error: argument --device: device 'bogus' is not a device "
        "name: use cpu or cuda"
    )


@pytest.mark.parametrize(
    ("device", "message"),
    [
        (
            "cuda",
            "device 'cuda': no CUDA device here (this torch has no CUDA, or no GPU is visible); use cpu",
        ),
        (
            "cuda:0",
            "device 'cuda:0': no CUDA device here (this torch has no CUDA, or no GPU is visible); use cpu",
        ),
        ("cpu:x", "device 'cpu:x' is not a device name: use cpu or cuda"),
        ("meta", "device 'meta': the demo runs on cpu or cuda, not meta"),
    ],
    ids=["cuda", "cuda:0", "cpu:x", "meta"],
)
def test_device_the_demo_cannot_use_is_a_usage_error(device, message, monkeypatch, capsys):
    """On a machine without CUDA (simulated, so that this runs on GPU machines too)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as info:
        main(["demo", "--device", device])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert (
        err.splitlines()[-1] == f"python -m mxfp8_fusion demo: error: argument --device: {message}"
    )


def test_demo_main_names_a_bad_device():
    from mxfp8_fusion import demo

    with pytest.raises(TypeError, match="device must be a str or torch.device, got int"):
        demo.main(5)
    with pytest.raises(ValueError, match="device 'gpu' is not a device name"):
        demo.main("gpu")


def test_demo_is_the_only_command(capsys):
    """The benchmarks run by path from a checkout (``python benchmarks/end_to_end.py``)."""
    with pytest.raises(SystemExit) as info:
        main(["bench"])
    assert info.value.code == 2
    assert "invalid choice: 'bench'" in capsys.readouterr().err
