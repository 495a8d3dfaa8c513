"""The benchmarks' drafter fixture (benchmarks/drafter.py) runs on the CPU: its staged path
is bitwise the concatenated one, so the GPU receipts compare equal work."""

import importlib.util
from pathlib import Path

import torch

_DRAFTER = Path(__file__).resolve().parents[2] / "benchmarks" / "drafter.py"


def _load():
    spec = importlib.util.spec_from_file_location("benchmarks_drafter", _DRAFTER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_staged_equals_concatenated():
    drafter = _load()
    model, hidden = drafter.make_drafter(tokens=5, hidden=256, slices=3, device=torch.device("cpu"))
    with torch.no_grad():
        concatenated = model(*hidden)
        staged = drafter.run_staged(model, hidden)
    assert concatenated.shape == (5, 256) and concatenated.dtype == torch.bfloat16
    assert torch.equal(concatenated.view(torch.int16), staged.view(torch.int16))
