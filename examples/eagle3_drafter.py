"""An EAGLE-3 drafter built from HF transformers' Llama modules, compiled with the
``mxfp8_fusion`` backend.

The drafter reads three hidden states of the target model (a low, a middle and a high
layer), projects their concatenation with ``fc`` (3 x hidden -> hidden), and runs one Llama
decoder layer whose attention reads ``cat([input_layernorm(embeds), hidden_norm(h)])``
(2 x hidden wide), as the EAGLE-3 drafters of vLLM and SGLang do. After
:func:`mxfp8_fusion.convert` both concatenations are sites of the pass: ``fc``'s, and the
attention input's, which feeds three MXFP8 GEMMs (q, k and v) and is quantized once.

Weights are random (a config, no download). Needs transformers (``pip install -e
".[examples]"``). Run::

    python examples/eagle3_drafter.py            # small dims on CPU, real ones on a GPU
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from shared import command_line, convert_and_check, random_bf16, sequence_inputs
from torch import Tensor, nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (
    LlamaDecoderLayer,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
)


@dataclass(frozen=True)
class Eagle3Config:
    """Geometry of the drafter. ``real()`` is the Llama-3.1-8B drafter's."""

    hidden: int = 256
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 512

    @classmethod
    def real(cls) -> Eagle3Config:
        return cls(hidden=4096, heads=32, kv_heads=8, intermediate=14336)

    def llama(self) -> LlamaConfig:
        return LlamaConfig(
            hidden_size=self.hidden,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads,
            intermediate_size=self.intermediate,
            num_hidden_layers=1,
            max_position_embeddings=131072,
            attn_implementation="sdpa",
        )


class Eagle3DecoderLayer(LlamaDecoderLayer):
    """HF's ``LlamaDecoderLayer`` with EAGLE-3's first-layer input: the attention reads the
    normalized token embeddings and the normalized projected hidden state side by side, so
    q, k and v take 2 x hidden input features; the residual is the projected state."""

    def __init__(self, config: LlamaConfig):
        super().__init__(config, layer_idx=0)
        attn, hidden = self.self_attn, config.hidden_size
        for name in ("q_proj", "k_proj", "v_proj"):
            old = getattr(attn, name)
            setattr(attn, name, nn.Linear(2 * hidden, old.out_features, bias=old.bias is not None))
        self.hidden_norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)

    def forward(self, embeds: Tensor, hidden: Tensor, position_embeddings) -> Tensor:
        residual = hidden
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        x, _ = self.self_attn(x, position_embeddings=position_embeddings, attention_mask=None)
        x = residual + x
        residual = x
        return residual + self.mlp(self.post_attention_layernorm(x))


class Eagle3Drafter(nn.Module):
    """``fc(cat([h_low, h_mid, h_high], -1))``, one EAGLE-3 decoder layer, the final norm.

    ``forward(embeds, h_low, h_mid, h_high, position_ids)`` takes ``[batch, tokens, hidden]``
    states and ``[batch, tokens]`` positions and returns ``(normed, projected)``: the
    layer's normalized output and ``fc``'s output.
    """

    def __init__(self, config: LlamaConfig):
        super().__init__()
        hidden = config.hidden_size
        self.fc = nn.Linear(3 * hidden, hidden, bias=False)
        self.layer = Eagle3DecoderLayer(config)
        self.norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.rotary = LlamaRotaryEmbedding(config)

    def forward(self, embeds, h_low, h_mid, h_high, position_ids):
        projected = self.fc(torch.cat([h_low, h_mid, h_high], dim=-1))
        position_embeddings = self.rotary(projected, position_ids)
        out = self.layer(embeds, projected, position_embeddings)
        return self.norm(out), projected


def build(cfg: Eagle3Config, device: torch.device | str = "cpu", seed: int = 0) -> Eagle3Drafter:
    """The drafter with random weights, BF16, on ``device`` (not yet converted)."""
    torch.manual_seed(seed)
    return random_bf16(Eagle3Drafter(cfg.llama()), device)


def make_inputs(cfg: Eagle3Config, tokens: int, device: torch.device | str = "cpu", seed: int = 1):
    """``(embeds, h_low, h_mid, h_high, position_ids)`` for one sequence of ``tokens``."""
    return sequence_inputs(4, cfg.hidden, tokens, device, seed)


TOKEN_DIMS = (1, 1, 1, 1, 1)
"""The dynamic (token) dim of each input of :class:`Eagle3Drafter`."""


def main() -> None:
    device, tokens, cfg, activation = command_line(__doc__, Eagle3Config)
    inputs = [make_inputs(cfg, t, device) for t in tokens]
    convert_and_check(build(cfg, device), inputs, TOKEN_DIMS, activation)


if __name__ == "__main__":
    main()
