"""CI (``.ci/run``) sees what a new user sees: each run installs into a virtual environment
of its own, made fresh, and a failing test command fails the run. Run here with a stand-in
``python3`` that logs each call instead of installing anything."""

import os
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# A python3 that writes each call to $CI_LOG; `-m venv DIR` makes DIR/bin with copies of
# itself, and `-m pytest` exits with $CI_PYTEST_STATUS.
_STAND_IN = """#!/usr/bin/env bash
echo "$0 $*" >> "$CI_LOG"
if [ "$1" = -m ] && [ "$2" = venv ]; then
  mkdir -p "$3/bin" && for tool in python python3 pip; do cp "$0" "$3/bin/$tool"; done
elif [ "$1" = -m ] && [ "$2" = pytest ]; then
  exit "${CI_PYTEST_STATUS:-0}"
elif [ "$1" = -VV ]; then
  echo "Python 3 (stand-in)"
fi
"""


def _run_ci(tmp_path: Path, pytest_status: int = 0) -> tuple[int, list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    stand_in = bin_dir / "python3"
    stand_in.write_text(_STAND_IN)
    stand_in.chmod(stand_in.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "calls.log"
    log.unlink(missing_ok=True)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "CI_LOG": str(log),
        "CI_PYTEST_STATUS": str(pytest_status),
        "TMPDIR": str(tmp_path),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }
    run = subprocess.run(["bash", str(ROOT / ".ci" / "run")], env=env, capture_output=True)
    return run.returncode, log.read_text().splitlines()


def _venv_python(calls: list[str]) -> str:
    (made,) = [c.split()[-1] for c in calls if " -m venv " in c and "vllm" not in c]
    return f"{made}/bin/python"


def test_each_run_installs_into_a_fresh_venv(tmp_path):
    status, calls = _run_ci(tmp_path)
    assert status == 0
    python = _venv_python(calls)
    assert not Path(python).exists()  # removed once the run is over
    main = [c.removeprefix(python + " ") for c in calls if c.startswith(python + " ")]
    assert main[:2] == ["-m pip install -q torch==2.13.0", "-m pip install -q -e .[test]"]
    assert {"-m ruff check .", "-m ruff format --check .", "-m pytest -q"} <= set(main)
    assert not [c for c in calls if " -m pip install" in c and not c.startswith(python)]
    # the vLLM step runs after the suite
    assert any("vllm" in c for c in calls[calls.index(f"{python} -m pytest -q") :])
    _, again = _run_ci(tmp_path)
    assert _venv_python(again) != python


@pytest.mark.parametrize("status", [1, 2, 5])
def test_a_failing_test_command_fails_the_run(tmp_path, status):
    """Failures (1), errors or an interrupt (2), no tests collected (5): the run fails with
    it, before the vLLM step."""
    code, calls = _run_ci(tmp_path, pytest_status=status)
    assert code == status
    assert calls[-1].endswith(" -m pytest -q")
