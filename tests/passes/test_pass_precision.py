"""What is bitwise equal to what, between the rewritten program and plain Inductor's.

The rewrite stores each slice in BF16 before quantizing it, as eager does. Plain Inductor may
instead fuse a slice's producer (a residual sum, say) into its other consumers, which then
read the unrounded FP32 value. So:

- the projection (the GEMM of the site) is bitwise plain Inductor's whenever its slices are:
  both quantize the same BF16 bytes;
- every output is bitwise plain Inductor's with ``emulate_precision_casts=True``, which
  makes Inductor round where eager rounds;
- without it, an output downstream of a fused producer can differ in its last bits.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from helpers.passes import assert_bitwise, linear, randn

import mxfp8_fusion as mf

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))


class ResidualSite(torch.nn.Module):
    """A residual sum that feeds both the cat and an RMSNorm."""

    def __init__(self):
        super().__init__()
        self.fc = linear(512, 256)
        self.weight = torch.nn.Parameter(torch.rand(256, dtype=torch.bfloat16) + 0.5)

    def forward(self, x, r, e):
        h = x + r
        projected = self.fc(torch.cat([e, h], -1))
        v = h.float()
        normed = (v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + 1e-6)).bfloat16()
        return projected, normed * self.weight


def _both(model, inputs, emulate: bool):
    outs = []
    for backend in ("mxfp8_fusion", "inductor"):
        torch._dynamo.reset()
        patch = {"fx_graph_cache": False, "emulate_precision_casts": emulate}
        with torch.no_grad(), torch._inductor.config.patch(patch):
            outs.append(torch.compile(model, backend=backend, fullgraph=True)(*inputs))
    torch._dynamo.reset()
    return outs


def test_residual_sum_beside_the_site():
    inputs = [randn(64, 256, seed=i) for i in range(3)]
    fused, plain = _both(ResidualSite(), inputs, emulate=True)
    assert_bitwise(fused, plain)
    fused, plain = _both(ResidualSite(), inputs, emulate=False)
    assert_bitwise(fused[0], plain[0])  # the projection: the same BF16 slices quantized


class TargetAndDrafter(torch.nn.Module):
    """A small Llama target whose layers' outputs (residual sums, read by the next layer's
    norm too) feed an EAGLE-3 drafter's ``fc(cat(...))``, all in one compiled step."""

    def __init__(self, cfg, layers: int = 3):
        super().__init__()
        from eagle3_drafter import Eagle3Drafter
        from transformers.models.llama.modeling_llama import (
            LlamaDecoderLayer,
            LlamaRotaryEmbedding,
        )

        llama = cfg.llama()
        self.layers = torch.nn.ModuleList(LlamaDecoderLayer(llama, i) for i in range(layers))
        self.rotary = LlamaRotaryEmbedding(llama)
        self.drafter = Eagle3Drafter(llama)

    def forward(self, embeds, position_ids):
        position_embeddings = self.rotary(embeds, position_ids)
        h, aux = embeds, []
        for layer in self.layers:
            out = layer(h, position_embeddings=position_embeddings)
            h = out[0] if isinstance(out, tuple) else out
            aux.append(h)
        normed, projected = self.drafter(embeds, *aux, position_ids)
        return h, normed, projected


@pytest.mark.slow
def test_llama_target_feeding_an_eagle3_drafter():
    pytest.importorskip("transformers")
    from eagle3_drafter import Eagle3Config
    from shared import random_bf16, sequence_inputs

    torch.manual_seed(0)
    cfg = Eagle3Config()
    model = mf.convert(random_bf16(TargetAndDrafter(cfg), "cpu"))
    embeds, positions = sequence_inputs(1, cfg.hidden, 40, "cpu", seed=1)
    report = mf.explain(model, embeds, positions)
    assert [s.rewritten for s in report.sites] == [True, True], str(report)
    fused, plain = _both(model, (embeds, positions), emulate=True)
    assert_bitwise(fused, plain)
