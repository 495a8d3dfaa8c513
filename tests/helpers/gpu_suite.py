"""Run the GPU tests (``-m gpu``) in two groups, each under ten minutes on one H200, and
record them, with each group's pytest summary line, in ``benchmarks/results/gpu_tests.json``:

    python tests/helpers/gpu_suite.py --group 1    # the GEMM kernels and the quantizer
    python tests/helpers/gpu_suite.py --group 2    # everything else

A test dependency (the ``test`` extra) missing on the machine is printed and recorded with
the group: the modules that import it fail to collect, which are errors of the machine, not
of the kernels.

A group merges into the receipt when the receipt is for the same git revision
(``$MXFP8_GIT_REV``, else ``git rev-parse``); a receipt for another revision moves under
``earlier`` (its totals only).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RECEIPT = ROOT / "benchmarks/results/gpu_tests.json"
GROUP_1 = [
    "tests/kernels/test_gemm_kernel.py",
    "tests/kernels/test_gemm_swap_ab.py",
    "tests/kernels/test_gemm_determinism.py",
    "tests/kernels/test_quantize_kernel.py",
    "tests/kernels/test_quantize_kernel_cpu.py",
    "tests/kernels/test_quantize_ops.py",
]
GROUPS = {"1": GROUP_1, "2": ["tests", "benchmarks/tests", *(f"--ignore={p}" for p in GROUP_1)]}
_COUNTS = ("passed", "failed", "skipped", "xfailed", "error")


def _machine() -> dict:
    import torch

    rev = (
        os.environ.get("MXFP8_GIT_REV")
        or subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    )
    try:
        import cutlass

        dsl = cutlass.__version__
    except ImportError:
        dsl = None
    return {
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "cutlass_dsl": dsl,
        "git_revision": rev or "unknown",
    }


def _missing_test_dependencies() -> list[str]:
    """The test extra's requirements (pyproject.toml) not installed here: a test module that
    imports one fails to collect, which the receipt should say rather than count as a
    failure of the kernels."""
    from importlib import metadata

    from packaging.requirements import Requirement

    try:
        import tomllib
    except ImportError:  # Python 3.10: not checked
        return []

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    missing = []
    for line in project["optional-dependencies"]["test"]:
        requirement = Requirement(line)
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        try:
            metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            missing.append(requirement.name)
    return missing


def _summary(output: str) -> dict:
    last = [line for line in output.splitlines() if re.search(r"\d+ \w+.* in [\d.]+s", line)]
    counts = dict.fromkeys(_COUNTS, 0)
    for number, word in re.findall(r"(\d+) (passed|failed|skipped|xfailed|error)", last[-1:][0]
                                   if last else ""):  # fmt: skip
        counts[word] = int(number)
    failed = sorted(set(re.findall(r"^(?:FAILED|ERROR) (\S+)", output, flags=re.M)))
    return {"counts": counts, "summary": last[-1].strip("= ") if last else "", "failed": failed}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--group", choices=sorted(GROUPS), required=True)
    parser.add_argument(
        "--workers", type=int, default=0, help="pytest-xdist processes (kernel builds are CPU)"
    )
    args = parser.parse_args()
    paths = GROUPS[args.group]
    missing = _missing_test_dependencies()
    if missing:
        print(f"missing test dependencies (pip install -e '.[test]'): {', '.join(missing)}")
    workers = ["-n", str(args.workers)] if args.workers else []
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-rfE", *workers, *paths]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    print(run.stdout[-6000:], run.stderr[-2000:], sep="\n")
    result = _summary(run.stdout)
    machine = _machine()
    receipt = json.loads(RECEIPT.read_text()) if RECEIPT.exists() else {}
    if receipt.get("git_revision") != machine["git_revision"]:
        earlier = receipt.pop("earlier", [])
        if receipt:
            earlier.insert(0, {k: receipt.get(k) for k in ("git_revision", *_COUNTS[:3])})
        receipt = {"what": "python tests/helpers/gpu_suite.py --group 1, then --group 2",
                   **machine, "groups": {}, "earlier": earlier}  # fmt: skip
    receipt["groups"][args.group] = {"paths": paths, **result}
    if missing:  # the test modules that import them are collection errors
        receipt["groups"][args.group]["missing_test_dependencies"] = missing
    for key in _COUNTS:
        receipt[key] = sum(g["counts"][key] for g in receipt["groups"].values())
    receipt["failed_tests"] = sorted(t for g in receipt["groups"].values() for t in g["failed"])
    RECEIPT.write_text(json.dumps(receipt, indent=1) + "\n")
    print(f"group {args.group}: {result['summary']} -> {RECEIPT.relative_to(ROOT)}")
    return run.returncode


if __name__ == "__main__":
    sys.exit(main())
