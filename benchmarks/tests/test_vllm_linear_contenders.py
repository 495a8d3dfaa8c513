"""benchmarks/vllm_linear.py's pieces on the CPU: its layer is vLLM's layout, and its
dequantize-then-BF16 contender computes what ours does, up to the input's quantization."""

import torch
import vllm_linear as bench

from mxfp8_fusion import reference
from mxfp8_fusion.vllm import linear


def test_receipt_contenders_compute_the_same_product_on_cpu():
    """benchmarks/vllm_linear.py's pieces: its layer is vLLM's layout, and its
    dequantize-then-BF16 contender computes what ours does, up to the input's quantization."""
    layer = bench.vllm_style_layer(256, 512, device="cpu")
    values, scales = layer.weight.data.clone(), layer.weight_scale.data.clone()
    w = bench.dequantize(values, scales)
    assert torch.equal(w.float(), reference.dequantize(values, reference.to_blocked(scales)))
    linear.process_weights(layer)
    x = torch.randn(8, 512).to(torch.bfloat16)
    got = linear.apply_weights(layer, x).float()
    dense = torch.nn.functional.linear(x, w).float()
    assert torch.allclose(got, dense, rtol=0.1, atol=0.1 * dense.abs().max().item())
