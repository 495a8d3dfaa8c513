"""The model the benchmarks measure: a speculative-decoding drafter's input projection
``fc(cat([h1, ..., hn], -1))`` with an MXFP8 ``fc``, its random inputs, and the staged
eager path that replaces the concatenation."""

from __future__ import annotations

import torch
from torch import Tensor, nn

import mxfp8_fusion as mf


class Drafter(nn.Module):
    """``fc(cat([h1, ..., hn], -1))``."""

    def __init__(self, fc: nn.Module):
        super().__init__()
        self.fc = fc

    def forward(self, *hidden: Tensor) -> Tensor:
        return self.fc(torch.cat(hidden, dim=-1))


def make_drafter(
    tokens: int,
    hidden: int,
    slices: int,
    device: torch.device,
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
) -> tuple[Drafter, list[Tensor]]:
    """A drafter projecting ``slices`` x ``hidden`` features to ``hidden`` with a random
    MXFP8 weight and bias, and ``slices`` random ``[tokens, hidden]`` inputs (seeded)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    k = hidden * slices
    linear = nn.Linear(k, hidden, bias=True, dtype=dtype)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(hidden, k, generator=gen) * k**-0.5)
        linear.bias.copy_(torch.randn(hidden, generator=gen) * 0.1)
    fc = mf.MXFP8Linear.from_linear(linear.to(device))
    inputs = [
        torch.randn(tokens, hidden, generator=gen).to(device=device, dtype=dtype)
        for _ in range(slices)
    ]
    return Drafter(fc).eval(), inputs


def run_staged(model: Drafter, hidden: list[Tensor]) -> Tensor:
    """``model(*hidden)`` without the concatenation: ``empty_input``, one
    ``quantize_input_slice`` per slice, then ``mm_quantized_into`` a fresh output."""
    fc = model.fc
    tokens, device, dtype = hidden[0].shape[0], hidden[0].device, hidden[0].dtype
    staged = mf.empty_input(tokens, fc.in_features, device, dtype)
    column = 0
    for h in hidden:
        mf.quantize_input_slice(h, staged, column)
        column += h.shape[1]
    out = torch.empty(tokens, fc.out_features, dtype=dtype, device=device)
    return mf.mm_quantized_into(staged, fc.weight, out, bias=fc.bias)
