"""The pass tests' shared setup: every test starts and ends with Dynamo reset and its
counters cleared, so no compile leaks into the next test's counts or caches."""

import pytest
import torch
from torch._dynamo.utils import counters


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()
