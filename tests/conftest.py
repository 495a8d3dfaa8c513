"""Shared test setup: GPU tests are marked ``gpu`` and skipped where CUDA is absent."""

import pytest
import torch

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="gpu test: no CUDA device here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
