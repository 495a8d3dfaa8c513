"""Shared test setup: GPU tests are marked ``gpu`` and skipped where CUDA is absent; the
shared helpers are importable as ``helpers.*`` (tests/helpers) from every test folder; the
kernel cache is a fresh directory per test session, never the user's."""

import os
import sys
import tempfile
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("MXFP8_FUSION_CACHE_DIR", tempfile.mkdtemp(prefix="mxfp8-test-kernels-"))

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="gpu test: no CUDA device here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
