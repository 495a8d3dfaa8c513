"""Tiny models for the vLLM engine test, made here with random weights (no model hub).

- a Llama target, saved as a ModelOpt MXFP8 checkpoint: every decoder linear as E4M3
  ``weight`` plus row-major uint8 E8M0 ``weight_scale`` (RCEIL, the bytes
  ``mxfp8_fusion.pack_weight`` makes), embeddings, norms and ``lm_head`` in BF16;
- an EAGLE-3 draft for it (``fc`` ``[H, 3H]`` and the mid layer MXFP8, the same format).

No test here; ``test_vllm_engine.py`` and ``vllm_engine_run.py`` import it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from mxfp8_fusion import reference

HIDDEN = 256
LAYERS = 4
AUX_LAYERS = (0, 1, 3)  # the target layers whose outputs the EAGLE-3 draft reads
VOCAB = 512
HEADS, KV_HEADS = 4, 2
INTERMEDIATE = 512
QUANT_CONFIG = {"quant_method": "modelopt", "quant_algo": "MXFP8", "ignore": ["lm_head"]}


def llama_config(**extra):
    """The target's transformers ``LlamaConfig``."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
        **extra,
    )


def target_model(seed: int) -> nn.Module:
    """The BF16 HF Llama target with random weights (``seed``)."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(llama_config()).to(torch.bfloat16).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif "embed" in name:
                p.copy_(torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * p.shape[-1] ** -0.5 * _gain(name))
    return model


def _gain(name: str) -> float:
    """Weight scale over unit variance. The layers' residual updates are kept small and
    attention soft, so the logits are mostly the (BF16) lm_head of the embedding, well
    spread, and what the MXFP8 layers add moves them by a fraction of a nat: a difference
    of rounding between two correct implementations stays far below their spread, while a
    wrong MXFP8 layer (its whole contribution off) does not."""
    if "o_proj" in name or "down_proj" in name:
        return 0.25
    if "q_proj" in name or "k_proj" in name:
        return 0.5
    if "lm_head" in name:
        return 3.0
    return 1.0


def _mxfp8_tensors(state: dict[str, torch.Tensor], quantized) -> dict[str, torch.Tensor]:
    """``state`` with every ``<linear>.weight`` named by ``quantized`` as MXFP8 bytes."""
    out = {}
    for name, tensor in state.items():
        if name.endswith(".weight") and quantized(name):
            values, scales = reference.quantize_rows(tensor.to(torch.bfloat16))
            out[name] = values.contiguous()
            out[name[: -len("weight")] + "weight_scale"] = scales.contiguous()
        else:
            out[name] = tensor.contiguous()
    return out


def _is_decoder_linear(name: str) -> bool:
    return "_proj." in name or name.startswith("fc.")


def save_target(model: nn.Module, path: Path, zero_lm_head: bool = False) -> Path:
    """Save ``model`` as a ModelOpt MXFP8 checkpoint at ``path``."""
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if zero_lm_head:
        state["lm_head.weight"].zero_()
    save_file(_mxfp8_tensors(state, _is_decoder_linear), str(path / "model.safetensors"))
    config = llama_config(architectures=["LlamaForCausalLM"]).to_dict()
    config["quantization_config"] = QUANT_CONFIG
    (path / "config.json").write_text(json.dumps(config, indent=1))
    return path


def save_eagle3_draft(path: Path, seed: int) -> Path:
    """Save an EAGLE-3 draft (one mid layer, ``fc`` over three target layers) as MXFP8."""
    path.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)

    def linear(n: int, k: int) -> torch.Tensor:
        return (torch.randn(n, k, generator=gen) * k**-0.5).to(torch.bfloat16)

    def norm() -> torch.Tensor:
        return (1 + 0.1 * torch.randn(HIDDEN, generator=gen)).to(torch.bfloat16)

    head_dim = HIDDEN // HEADS
    state = {
        "fc.weight": linear(HIDDEN, 3 * HIDDEN),
        "midlayer.input_layernorm.weight": norm(),
        "midlayer.hidden_norm.weight": norm(),
        "midlayer.post_attention_layernorm.weight": norm(),
        "midlayer.self_attn.q_proj.weight": linear(HEADS * head_dim, 2 * HIDDEN),
        "midlayer.self_attn.k_proj.weight": linear(KV_HEADS * head_dim, 2 * HIDDEN),
        "midlayer.self_attn.v_proj.weight": linear(KV_HEADS * head_dim, 2 * HIDDEN),
        "midlayer.self_attn.o_proj.weight": linear(HIDDEN, HIDDEN),
        "midlayer.mlp.gate_proj.weight": linear(INTERMEDIATE, HIDDEN),
        "midlayer.mlp.up_proj.weight": linear(INTERMEDIATE, HIDDEN),
        "midlayer.mlp.down_proj.weight": linear(HIDDEN, INTERMEDIATE),
        "norm.weight": norm(),
    }
    save_file(_mxfp8_tensors(state, _is_decoder_linear), str(path / "model.safetensors"))
    config = llama_config(architectures=["LlamaForCausalLMEagle3"]).to_dict()
    config.update(
        num_hidden_layers=1,
        target_hidden_size=HIDDEN,
        draft_vocab_size=VOCAB,
        eagle_config={"eagle_aux_hidden_state_layer_ids": list(AUX_LAYERS)},
        quantization_config=QUANT_CONFIG,
    )
    (path / "config.json").write_text(json.dumps(config, indent=1))
    return path
