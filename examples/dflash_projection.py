"""A DFlash-style six-state projection, compiled with the ``mxfp8_fusion`` backend.

A DFlash drafter conditions on hidden states taken after several layers of the target
model: their concatenation is projected with ``fc`` (n x hidden -> hidden) and normalized
(``hidden_norm``) before the draft layers read it. The reference geometry is Kimi's six
target layers, 6 x 7168 -> 7168. Plain torch only (``torch.nn.RMSNorm``); after
:func:`mxfp8_fusion.convert` the six-slice concatenation is a site of the pass.

Weights are random. Run::

    python examples/dflash_projection.py            # small dims on CPU, real ones on a GPU
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from shared import command_line, convert_and_check, random_bf16
from torch import nn


@dataclass(frozen=True)
class DFlashConfig:
    """Geometry of the projection. ``real()`` is Kimi's (6 x 7168 -> 7168)."""

    hidden: int = 256
    states: int = 6

    @classmethod
    def real(cls) -> DFlashConfig:
        return cls(hidden=7168, states=6)


class DFlashProjection(nn.Module):
    """``hidden_norm(fc(cat(states, -1)))`` over ``[tokens, hidden]`` states.

    Returns ``(normed, projected)``: the context feature the draft layers read and ``fc``'s
    output.
    """

    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.states * cfg.hidden, cfg.hidden, bias=False)
        self.hidden_norm = nn.RMSNorm(cfg.hidden, eps=1e-6)

    def forward(self, *states):
        projected = self.fc(torch.cat(states, dim=-1))
        return self.hidden_norm(projected), projected


def build(cfg: DFlashConfig, device: torch.device | str = "cpu", seed: int = 0) -> DFlashProjection:
    """The projection with random weights, BF16, on ``device`` (not yet converted)."""
    torch.manual_seed(seed)
    return random_bf16(DFlashProjection(cfg), device)


def make_inputs(cfg: DFlashConfig, tokens: int, device: torch.device | str = "cpu", seed: int = 1):
    """``cfg.states`` hidden states ``[tokens, hidden]``."""
    gen = torch.Generator().manual_seed(seed)
    return tuple(
        torch.randn(tokens, cfg.hidden, generator=gen).to(device, torch.bfloat16)
        for _ in range(cfg.states)
    )


def token_dims(cfg: DFlashConfig) -> tuple[int, ...]:
    """The dynamic (token) dim of each input of :class:`DFlashProjection`."""
    return (0,) * cfg.states


def main() -> None:
    device, tokens, cfg, activation = command_line(__doc__, DFlashConfig)
    inputs = [make_inputs(cfg, t, device) for t in tokens]
    convert_and_check(build(cfg, device), inputs, token_dims(cfg), activation)


if __name__ == "__main__":
    main()
