"""The benchmarks' drafter fixture (benchmarks/common.py) runs on the CPU: its staged path
is bitwise the concatenated one, so the GPU receipts compare equal work."""

import common as drafter
import torch


def test_staged_equals_concatenated():
    model, hidden = drafter.make_drafter(tokens=5, hidden=256, slices=3, device=torch.device("cpu"))
    with torch.no_grad():
        concatenated = model(*hidden)
        staged = drafter.run_staged(model, hidden)
    assert concatenated.shape == (5, 256) and concatenated.dtype == torch.bfloat16
    assert torch.equal(concatenated.view(torch.int16), staged.view(torch.int16))
