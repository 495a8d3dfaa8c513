"""Grad mode: the forward runs as under ``torch.no_grad()``, eager and compiled (every
backend, the fusion pass rewriting its site); any backward through an MXFP8 op raises a
``RuntimeError`` naming the op when it runs. Never a silently missing or zero gradient."""

from __future__ import annotations

import pytest
import torch
from helpers.passes import NO_CACHE, Capture, assert_bitwise, linear, randn
from torch import nn
from torch._dynamo.utils import counters

import mxfp8_fusion as mf
from mxfp8_fusion import ops, reference

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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


def _backward_graph(fn, *args):
    """The backward graph AOTAutograd traces for ``fn``, and ``fn``'s compiled output."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    graphs = []

    def keep(gm, _inputs):
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    def forward(gm, _inputs):
        return make_boxed_func(gm.forward)

    out = torch.compile(fn, backend=aot_autograd(fw_compiler=forward, bw_compiler=keep))(*args)
    return out, graphs


def _float8_arithmetic(graph) -> list[str]:
    """Nodes that compute on float8 tensors: anything but gradient_unavailable and the zero
    gradient of an overwritten buffer (a fill, which Triton builds; a sum it cannot)."""
    float8 = (torch.float8_e4m3fn, torch.float8_e8m0fnu)
    allowed = (mf.grad.gradient_unavailable, torch.ops.aten.zeros_like.default)
    found = []
    for node in graph.nodes:
        if node.op != "call_function" or node.target in allowed:
            continue
        vals = [a.meta.get("val") for a in node.all_input_nodes] + [node.meta.get("val")]
        if any(isinstance(v, torch.Tensor) and v.dtype in float8 for v in vals):
            found.append(str(node.target))
    return found


@pytest.mark.parametrize("tokens", [8, 5])
@pytest.mark.parametrize("storage", ["quantize", "staged", "staged into an argument"])
def test_compiled_backward_adds_no_float8_gradients(tokens, storage):
    """Two GEMMs reading one MXFP8 input: their gradients meet on a BF16 scalar, not on the
    float8 storage. Before: the backward added two float8 gradients (or a passed-in
    storage's tangent and theirs), which Triton cannot build: on CUDA the backward failed
    with a compiler error instead of raising ours."""
    w1, w2 = weight(seed=1), weight(seed=2)

    def two_gemms(x, dest=None):
        if storage == "quantize":
            q = mf.quantize(x * 2)
        else:
            q = mf.empty_input(8, 256) if dest is None else dest
            mf.quantize_input_slice(x[:, :128] * 2, q, 0)
            mf.quantize_input_slice(x[:, 128:], q, 128)
        return mf.mm_quantized(q, w1, tokens=tokens) + mf.mm_quantized(q, w2, tokens=tokens)

    x = randn(8, 256).requires_grad_()
    args = (x, mf.empty_input(8, 256)) if storage == "staged into an argument" else (x,)
    got, graphs = _backward_graph(two_gemms, *args)
    with torch.no_grad():
        assert_bitwise(got, two_gemms(x))
    backward_raises(got, r"mxfp8::mm \(mm_quantized\) has no gradient")
    assert x.grad is None
    assert len(graphs) == 1 and _float8_arithmetic(graphs[0].graph) == []


def test_autograd_grad_with_allow_unused_raises_instead_of_none():
    x = randn(8, 256).requires_grad_()
    y = mf.mm(x, weight())
    with pytest.raises(RuntimeError, match=INFERENCE_ONLY):
        torch.autograd.grad(y.float().sum(), [x], allow_unused=True)


def test_ops_in_grad_mode_record_a_backward_that_raises():
    """At op level: a functional op's output and a mutating op's written buffer carry a
    backward that raises; under no_grad nothing records."""
    x = torch.randn(40, 256).to(torch.bfloat16).requires_grad_()
    bv, bsc = reference.quantize(torch.randn(128, 256).to(torch.bfloat16))
    bsc = bsc.view(torch.uint8)
    y = ops.linear(x, bv, bsc, None)
    assert y.requires_grad
    backward_raises(y)
    av, asc = reference.quantize(x.detach())
    bias = nn.Parameter(torch.randn(128, dtype=torch.bfloat16))
    out = torch.empty(40, 128, dtype=torch.bfloat16)
    ops.mm_into(av, asc.view(torch.uint8), bv, bsc, bias, out)
    assert out.requires_grad
    backward_raises(out, r"mxfp8::mm_into \(mm_quantized_into\) has no gradient .* bias")
    with torch.no_grad():
        fresh = torch.empty(40, 128, dtype=torch.bfloat16)
        ops.mm_into(av, asc.view(torch.uint8), bv, bsc, bias, fresh)
        assert not ops.linear(x, bv, bsc, None).requires_grad
    assert not fresh.requires_grad
    assert torch.equal(fresh, out.detach())


# --- the staged API ------------------------------------------------------------------------


def stage_one_by_one(dest, a, b):
    mf.quantize_input_slice(a, dest, 0)
    mf.quantize_input_slice(b, dest, 128)


def stage_at_once(dest, a, b):
    mf.quantize_input_slices([a, b], dest)


@pytest.mark.parametrize("stage", [stage_one_by_one, stage_at_once])
def test_staged_source_that_requires_grad_gives_the_storage_a_raising_backward(stage):
    """Before: nothing was recorded, so a loss that also reaches the source through a
    differentiable path got that path's gradient alone, silently."""
    a, b = randn(8, 128).requires_grad_(), randn(8, 128, seed=1)
    w = weight()
    dest = mf.empty_input(8, 256)
    stage(dest, a, b)
    assert dest.values.requires_grad and not dest.scales.requires_grad
    y = mf.mm_quantized(dest, w, tokens=5)
    with torch.no_grad():
        plain = mf.empty_input(8, 256)
        stage(plain, a, b)
        assert_bitwise(y, mf.mm_quantized(plain, w, tokens=5))
        assert_bitwise(dest.values, plain.values)
        assert_bitwise(dest.scales, plain.scales)
    backward_raises(y.float().sum() + a.float().sum())
    assert a.grad is None
    name = "quantize_input_slices" if stage is stage_at_once else "quantize_input_slice"
    backward_raises(dest.values, rf"\({name}\) has no gradient with respect to source")


def test_mm_quantized_into_bias_that_requires_grad_gives_out_a_raising_backward():
    """Before: ``out`` was written without history; ``bias.grad`` came back as the other
    path's gradient alone."""
    w = weight()
    q = mf.quantize(randn(8, 256))
    bias = nn.Parameter(torch.randn(64, dtype=torch.bfloat16))
    out = torch.zeros(8, 64, dtype=torch.bfloat16)
    rows = mf.mm_quantized_into(q, w, out, tokens=5, bias=bias)
    assert rows.requires_grad and out.requires_grad
    with torch.no_grad():
        assert_bitwise(rows, mf.mm_quantized(q, w, tokens=5, bias=bias))
    assert (out[5:] == 0).all()
    backward_raises(rows.float().sum() + bias.float().sum(), r"mm_quantized_into.* bias")
    assert bias.grad is None
    backward_raises(out)


def test_written_leaf_that_requires_grad_is_refused_before_writing():
    out = nn.Parameter(torch.zeros(8, 64, dtype=torch.bfloat16))
    bias = nn.Parameter(torch.randn(64, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="out is a leaf tensor that requires grad"):
        mf.mm_quantized_into(mf.quantize(randn(8, 256)), weight(), out, bias=bias)
    assert (out == 0).all()


def test_mm_quantized_into_from_staged_storage_with_history():
    a = randn(8, 256).requires_grad_()
    dest = mf.empty_input(8, 256)
    mf.quantize_input_slice(a, dest, 0)
    out = torch.empty(8, 64, dtype=torch.bfloat16)
    mf.mm_quantized_into(dest, weight(), out, tokens=8)
    assert out.requires_grad
    backward_raises(out, r"mm_quantized_into.* a_values")


def test_mm_quantized_bias_that_requires_grad():
    bias = nn.Parameter(torch.randn(64, dtype=torch.bfloat16))
    y = mf.mm_quantized(mf.quantize(randn(8, 256)), weight(), bias=bias)
    backward_raises(y + bias, r"mxfp8::mm \(mm_quantized\) has no gradient with respect to bias")


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_no_grad_and_inference_mode_record_nothing(mode):
    a = randn(8, 256).requires_grad_()
    bias = nn.Parameter(torch.randn(64, dtype=torch.bfloat16))
    with mode():
        dest = mf.empty_input(8, 256)
        mf.quantize_input_slice(a, dest, 0)
        out = torch.empty(8, 64, dtype=torch.bfloat16)
        mf.mm_quantized_into(dest, weight(), out, tokens=5, bias=bias)
        y = mf.mm_quantized(dest, weight(), tokens=5, bias=bias)
        assert not ops._needs_dispatcher((a[:, :128], dest.values, bias))
    assert not (dest.values.requires_grad or out.requires_grad or y.requires_grad)


def test_storage_keeps_its_history_until_detached():
    """As for an in-place torch op: a later write from a plain source leaves the columns
    written before (and their history) in place; ``detach_`` drops it."""
    dest = mf.empty_input(8, 256)
    mf.quantize_input_slice(randn(8, 128).requires_grad_(), dest, 0)
    mf.quantize_input_slice(randn(8, 128, seed=1), dest, 128)
    assert dest.values.requires_grad
    backward_raises(mf.mm_quantized(dest, weight()))
    dest.values.detach_()
    mf.quantize_input_slice(randn(8, 128, seed=2), dest, 0)
    assert not mf.mm_quantized(dest, weight()).requires_grad


# --- the staged API, compiled ------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_staging_in_grad_mode(backend):
    w = weight()

    def staged(a, b):
        dest = mf.empty_input(8, 256, device=a.device)
        mf.quantize_input_slice(a, dest, 0)
        mf.quantize_input_slices([b], dest, 128)
        return mf.mm_quantized(dest, w, tokens=5)

    a, b = randn(8, 128).requires_grad_(), randn(8, 128, seed=1).requires_grad_()
    y = torch.compile(staged, backend=backend)(a, b)
    with torch.no_grad():
        assert_bitwise(y, staged(a, b))
    backward_raises(y)
    assert a.grad is None and b.grad is None


@pytest.mark.parametrize("backend", NO_SITE_BACKENDS)
def test_compiled_mm_quantized_into_with_bias_in_grad_mode(backend):
    w = weight()
    bias = nn.Parameter(torch.randn(64, dtype=torch.bfloat16))

    def into(x):
        out = torch.zeros(8, 64, dtype=torch.bfloat16, device=x.device)
        return mf.mm_quantized_into(mf.quantize(x), w, out, tokens=5, bias=bias)

    x = randn(8, 256)
    y = torch.compile(into, backend=backend)(x)
    with torch.no_grad():
        assert_bitwise(y, into(x))
    backward_raises(y)
    assert bias.grad is None


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_staging_into_a_dest_argument_keeps_its_history(backend):
    """The allocate-once pattern: AOTAutograd drops the history that ``mark_dirty`` gives a
    graph input, so the traced op writes copies and ``copy_`` carries the history back."""
    dest = mf.empty_input(8, 256)
    a = randn(8, 128).requires_grad_()
    torch.compile(lambda a, d: mf.quantize_input_slice(a, d, 0), backend=backend)(a, dest)
    with torch.no_grad():
        plain = mf.empty_input(8, 256)
        mf.quantize_input_slice(a, plain, 0)
    assert_bitwise(dest.values[:, :128], plain.values[:, :128])
    assert dest.values.requires_grad
    backward_raises(dest.values, r"\(quantize_input_slice\) has no gradient")


# --- CUDA ----------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["inductor", "mxfp8_fusion"])
def test_cuda_compiled_grad_mode(backend):
    """The CUDA kernels in grad mode: a compiled forward equal to eager, whose backward
    raises our message."""
    device = torch.device("cuda")
    model = NormCat(256).to(device)
    a, b = randn(64, 256).to(device), randn(64, 256, seed=1).to(device)
    y = torch.compile(model, backend=backend)(a, b)
    assert_bitwise(y, model(a, b))
    backward_raises(y)


@pytest.mark.gpu
@pytest.mark.parametrize("dest_argument", [False, True])
def test_cuda_compiled_backward_through_staged_storage(dest_argument):
    """Two slices staged into one storage (made in the graph, or passed in), two GEMMs of
    it: the compiled backward Triton builds raises ours."""
    device = torch.device("cuda")
    w1, w2 = weight(512, seed=1, device="cuda"), weight(512, seed=2, device="cuda")

    def step(x, dest=None):
        q = mf.empty_input(64, 512, "cuda") if dest is None else dest
        mf.quantize_input_slice(x[:, :256] * 2, q, 0)
        mf.quantize_input_slice(x[:, 256:], q, 256)
        return mf.mm_quantized(q, w1, tokens=40) + mf.mm_quantized(q, w2, tokens=40)

    x = randn(40, 512).to(device).requires_grad_()
    args = (x, mf.empty_input(64, 512, "cuda")) if dest_argument else (x,)
    got = torch.compile(step, backend="inductor")(*args)
    with torch.no_grad():
        assert_bitwise(got, step(x, mf.empty_input(64, 512, "cuda")))
    backward_raises(got)
    assert x.grad is None


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["inductor", "mxfp8_fusion"])
def test_cuda_compiled_backward_through_two_gemms_of_one_input(backend):
    """A compiled backward with float8 history (several GEMMs of one quantized input, fewer
    tokens) that Triton must build before it raises: it holds no float8 sum."""
    device = torch.device("cuda")
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
