"""A DeepSeek-V3-style multi-token-prediction (MTP) block, compiled with the
``mxfp8_fusion`` backend.

DeepSeek-V3's MTP module (and Kimi's and GLM's, which share it) joins the embedding of the
next token with the main model's hidden state at that position:
``eh_proj(cat([enorm(embeds), hnorm(hidden)], -1))`` (2 x hidden -> hidden), then runs one
transformer layer and a final norm. Here the layer is HF transformers' DeepSeek-V3 decoder
layer (multi-head latent attention and the dense feed-forward of DeepSeek-V3's first
layers); the norms are its ``DeepseekV3RMSNorm``. After :func:`mxfp8_fusion.convert` the
``eh_proj`` concatenation is a site of the pass.

Weights are random (a config, no download). Needs transformers (``pip install -e
".[examples]"``). Run::

    python examples/mtp_block.py            # small dims on CPU, real ones on a GPU
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from shared import command_line, convert_and_check, random_bf16, sequence_inputs
from torch import nn
from transformers import DeepseekV3Config
from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
    DeepseekV3DecoderLayer,
    DeepseekV3RMSNorm,
    DeepseekV3RotaryEmbedding,
)


@dataclass(frozen=True)
class MTPConfig:
    """Geometry of the block. ``real()`` is DeepSeek-V3's (7168 wide, 128 heads)."""

    hidden: int = 256
    heads: int = 4
    q_lora_rank: int = 128
    kv_lora_rank: int = 64
    rope_head_dim: int = 32
    nope_head_dim: int = 32
    v_head_dim: int = 32
    intermediate: int = 512

    @classmethod
    def real(cls) -> MTPConfig:
        return cls(
            hidden=7168,
            heads=128,
            q_lora_rank=1536,
            kv_lora_rank=512,
            rope_head_dim=64,
            nope_head_dim=128,
            v_head_dim=128,
            intermediate=18432,
        )

    def deepseek(self) -> DeepseekV3Config:
        return DeepseekV3Config(
            hidden_size=self.hidden,
            num_attention_heads=self.heads,
            num_key_value_heads=self.heads,
            q_lora_rank=self.q_lora_rank,
            kv_lora_rank=self.kv_lora_rank,
            qk_rope_head_dim=self.rope_head_dim,
            qk_nope_head_dim=self.nope_head_dim,
            v_head_dim=self.v_head_dim,
            intermediate_size=self.intermediate,
            num_hidden_layers=1,
            first_k_dense_replace=1,  # layer 0 is dense, as DeepSeek-V3's first layers
            max_position_embeddings=163840,
            rope_scaling=None,
            attn_implementation="sdpa",
        )


class MTPBlock(nn.Module):
    """``eh_proj(cat([enorm(embeds), hnorm(hidden)], -1))``, a decoder layer, a norm.

    ``forward(embeds, hidden, position_ids)`` takes ``[batch, tokens, hidden]`` states and
    ``[batch, tokens]`` positions and returns ``(normed, projected)``: the block's output and
    ``eh_proj``'s output.
    """

    def __init__(self, config: DeepseekV3Config):
        super().__init__()
        hidden = config.hidden_size
        self.enorm = DeepseekV3RMSNorm(hidden, eps=config.rms_norm_eps)
        self.hnorm = DeepseekV3RMSNorm(hidden, eps=config.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * hidden, hidden, bias=False)
        self.layer = DeepseekV3DecoderLayer(config, layer_idx=0)
        self.norm = DeepseekV3RMSNorm(hidden, eps=config.rms_norm_eps)
        self.rotary = DeepseekV3RotaryEmbedding(config)

    def forward(self, embeds, hidden, position_ids):
        projected = self.eh_proj(torch.cat([self.enorm(embeds), self.hnorm(hidden)], dim=-1))
        position_embeddings = self.rotary(projected, position_ids)
        out = self.layer(projected, position_embeddings=position_embeddings)
        return self.norm(out), projected


def build(cfg: MTPConfig, device: torch.device | str = "cpu", seed: int = 0) -> MTPBlock:
    """The block with random weights, BF16, on ``device`` (not yet converted)."""
    torch.manual_seed(seed)
    return random_bf16(MTPBlock(cfg.deepseek()), device)


def make_inputs(cfg: MTPConfig, tokens: int, device: torch.device | str = "cpu", seed: int = 1):
    """``(embeds, hidden, position_ids)`` for one sequence of ``tokens``."""
    return sequence_inputs(2, cfg.hidden, tokens, device, seed)


TOKEN_DIMS = (1, 1, 1)
"""The dynamic (token) dim of each input of :class:`MTPBlock`."""


def main() -> None:
    device, tokens, cfg, activation = command_line(__doc__, MTPConfig)
    inputs = [make_inputs(cfg, t, device) for t in tokens]
    convert_and_check(build(cfg, device), inputs, TOKEN_DIMS, activation)


if __name__ == "__main__":
    main()
