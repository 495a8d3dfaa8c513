"""Shared test setup: GPU tests are marked ``gpu`` and skipped where CUDA is absent; the
shared helpers are importable as ``helpers.*`` (tests/helpers) from every test folder."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="gpu test: no CUDA device here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
