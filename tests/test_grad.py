"""Grad mode: the forward runs as under ``torch.no_grad()``, eager and compiled (every
backend, the fusion pass rewriting its site); any backward through an MXFP8 op raises a
``RuntimeError`` naming the op when it runs. Never a silently missing or zero gradient."""

from __future__ import annotations

import pytest
import torch
from test_pass_support import NO_CACHE, Capture, assert_bitwise, linear, randn
from torch import nn
from torch._dynamo.utils import counters

import mxfp8_fusion as mf

BACKENDS = ["aot_eager", "inductor", "mxfp8_fusion"]
# graphs without a cat: the mxfp8_fusion backend would compile them exactly as Inductor does
NO_SITE_BACKENDS = ["aot_eager", "inductor"]
INFERENCE_ONLY = r"has no gradient.*inference-only.*torch\.no_grad\(\)"


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    with torch._inductor.config.patch(NO_CACHE):
        yield
    torch._dynamo.reset()


class NormCat(nn.Module):
    """A LayerNorm (trainable: its parameters require grad) on one slice, then cat ->
    MXFP8Linear: the ordinary model that grad mode reaches without the user asking."""

    def __init__(self, width: int = 128):
        super().__init__()
        self.norm = nn.LayerNorm(width, dtype=torch.bfloat16)
        self.fc = linear(2 * width)

    def forward(self, a, b):
        return self.fc(torch.cat([self.norm(a), b], -1))


def weight(k: int = 256, seed: int = 0, device: str = "cpu") -> mf.MXFP8Weight:
    fc = linear(k, seed=seed).to(device)
    return mf.MXFP8Weight(fc.weight_values, fc.weight_scales)


def backward_raises(loss: torch.Tensor, match: str = INFERENCE_ONLY) -> None:
    with pytest.raises(RuntimeError, match=match):
        loss.float().sum().backward()


def run(fn, backend, *args):
    return fn(*args) if backend == "eager" else torch.compile(fn, backend=backend)(*args)


# --- the one-shot path (MXFP8Linear) and the compiled fusion site --------------------------


@pytest.mark.parametrize("backend", ["eager", *BACKENDS])
def test_grad_mode_forward_is_bitwise_and_backward_raises_when_it_runs(backend):
    """Before: every backend failed to compile ("has no gradient") in grad mode."""
    model = NormCat()
    a, b = randn(8, 128), randn(8, 128, seed=1)
    with torch.no_grad():
        expected = model(a, b)
    y = run(model, backend, a, b)
    assert_bitwise(y, expected)
    assert y.requires_grad
    backward_raises(y, r"mxfp8::linear \(MXFP8Linear / mm\) has no gradient with respect to x")
    assert model.norm.weight.grad is None and model.norm.bias.grad is None


def test_pass_rewrites_the_site_when_inputs_require_grad():
    """The partitioned forward still holds the site: the cat is not saved for backward (the
    backward needs only shapes), so the pass rewrites it and no BF16 concatenation is made."""
    model = NormCat()
    a, b = randn(8, 128), randn(8, 128, seed=1)
    cap = Capture()
    y = torch.compile(model, backend=cap)(a, b)
    assert_bitwise(y, model(a, b))
    forward = cap.after[0][1]
    assert cap.fusion.matches == 1
    assert forward["aten.cat"] == 0 and forward["staged slices"] == 2
    backward_raises(y)  # the backward is compiled when it first runs
    assert [c["mxfp8.gradient_unavailable"] for _, c in cap.after] == [0, 1]
    report = mf.explain(NormCat(), a, b)
    assert [site.rewritten for site in report.sites] == [True]


def test_compiled_dynamic_tokens_in_grad_mode():
    model = NormCat()
    compiled = torch.compile(model, backend="mxfp8_fusion", dynamic=True)
    for tokens in (8, 5):
        a, b = randn(tokens, 128, seed=tokens), randn(tokens, 128, seed=tokens + 1)
        y = compiled(a, b)
        assert_bitwise(y, model(a, b))
        backward_raises(y)
    assert counters["mxfp8_fusion"]["sites_rewritten"] >= 1


def test_nothing_is_saved_for_backward():
    """Only shapes are kept: a saved input would hold the BF16 activations alive."""
    packed = []
    x = randn(8, 256).requires_grad_()
    w = weight()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
        mf.mm(x, w)
        q = mf.quantize(x)
        mf.mm_quantized(q, w, tokens=5)
        dest = mf.empty_input(8, 256)
        mf.quantize_input_slice(x[:, :128], dest, 0)
        mf.mm_quantized_into(dest, w, torch.empty(8, 64, dtype=torch.bfloat16), tokens=3)
    assert packed == []


@pytest.mark.parametrize("backend", ["eager", *NO_SITE_BACKENDS])
def test_quantize_then_fewer_token_gemms_backward_raises(backend):
    """The float8 storage's history crosses row views and several GEMMs; the compiled
    backward holds no float8 slice (which Inductor cannot lower) and reaches the raise."""
    w1, w2 = weight(seed=1), weight(seed=2)

    def two_gemms(x):
        q = mf.quantize(x * 2)
        return mf.mm_quantized(q, w1, tokens=5), mf.mm_quantized(q, w2, tokens=3)

    x = randn(8, 256).requires_grad_()
    got = run(two_gemms, backend, x)
    with torch.no_grad():
        assert_bitwise(got, two_gemms(x))
    backward_raises(got[0] + got[1].sum(), r"mxfp8::mm \(mm_quantized\) has no gradient")
    assert x.grad is None


def test_autograd_grad_with_allow_unused_raises_instead_of_none():
    x = randn(8, 256).requires_grad_()
    y = mf.mm(x, weight())
    with pytest.raises(RuntimeError, match=INFERENCE_ONLY):
        torch.autograd.grad(y.float().sum(), [x], allow_unused=True)


def test_mm_quantized_bias_that_requires_grad():
    bias = nn.Parameter(torch.randn(64, dtype=torch.bfloat16))
    y = mf.mm_quantized(mf.quantize(randn(8, 256)), weight(), bias=bias)
    backward_raises(y + bias, r"mxfp8::mm \(mm_quantized\) has no gradient with respect to bias")


# --- CUDA ----------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["inductor", "mxfp8_fusion"])
def test_cuda_compiled_grad_mode(backend):
    """The CUDA kernels in grad mode, and a compiled backward with float8 history (several
    GEMMs of one quantized input, fewer tokens) that Triton must build before it raises."""
    device = torch.device("cuda")
    model = NormCat(256).to(device)
    a, b = randn(64, 256).to(device), randn(64, 256, seed=1).to(device)
    y = torch.compile(model, backend=backend)(a, b)
    assert_bitwise(y, model(a, b))
    backward_raises(y)
    w1, w2 = weight(512, seed=1, device="cuda"), weight(512, seed=2, device="cuda")

    def two_gemms(x):
        q = mf.quantize(x * 2)
        return mf.mm_quantized(q, w1, tokens=40) + mf.mm_quantized(q, w2, tokens=40)

    x = randn(64, 512).to(device).requires_grad_()
    got = torch.compile(two_gemms, backend=backend)(x)
    with torch.no_grad():
        assert_bitwise(got, two_gemms(x))
    backward_raises(got)
    assert x.grad is None
