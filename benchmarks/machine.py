"""What every benchmark receipt records about the machine and the code it measured."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
from pathlib import Path

import torch


def git_revision(given: str | None = None) -> str:
    """``given``, else ``$MXFP8_GIT_REV``, else ``git rev-parse HEAD`` (``-dirty`` when the
    tree has changes), else ``"unknown"`` (a copy of the tree without .git)."""
    if given or os.environ.get("MXFP8_GIT_REV"):
        return given or os.environ["MXFP8_GIT_REV"]
    try:
        rev = subprocess.check_output(
            ["git", "rev-parse", "HEAD"], text=True, stderr=subprocess.DEVNULL
        ).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    dirty = subprocess.run(["git", "diff", "--quiet"], check=False).returncode != 0
    return rev + ("-dirty" if dirty else "")


def cutlass_dsl_version() -> str:
    try:
        return importlib.metadata.version("nvidia-cutlass-dsl")
    except importlib.metadata.PackageNotFoundError:  # unpacked on PYTHONPATH, no metadata
        import cutlass

        return getattr(cutlass, "__version__", "unknown")


def gpu_driver() -> str:
    result = subprocess.run(
        ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=False,
    )
    return result.stdout.strip() or "unknown"


def environment(git_rev: str | None = None) -> dict:
    """GPU, driver, torch, nvidia-cutlass-dsl and git revision, for a receipt."""
    return {
        "gpu": torch.cuda.get_device_name(),
        "driver": gpu_driver(),
        "torch": torch.__version__,
        "nvidia_cutlass_dsl": cutlass_dsl_version(),
        "git_revision": git_revision(git_rev),
    }


def write_receipt(path: str, receipt: dict) -> None:
    """``receipt`` as indented JSON at ``path`` (folders made as needed)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(receipt, indent=2) + "\n")
    print("wrote", path)
