"""The W8A16 GEMM from slices (``mm_slices`` / ``mm_slices_into``): the activations used as
they are, never concatenated, and the same bits as on their concatenation.

Tolerance against the FP64 oracle, and why: every product of a 16-bit activation and an
E4M3 value times its power-of-two scale is exact in FP32 (at most 11 + 4 significant bits),
so the FP32 result differs from the exact sum by FP32 accumulation (bound
``K * 2**-24 * sum |x w|``, far above the ~sqrt(K) seen on random data) and one rounding to
the output dtype (half an ulp of it).
"""

import re

import pytest
import torch

import mxfp8_fusion as mf
from mxfp8_fusion import reference

DTYPES = [torch.bfloat16, torch.float16]


def _slices(widths, tokens, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(tokens, w, generator=gen) * (i + 1)).to(dtype) for i, w in enumerate(widths)
    ]


def _weight(k, n=256, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return mf.pack_weight((torch.randn(n, k, generator=gen) * k**-0.5).to(torch.bfloat16))


def _oracle(slices, weight, bias=None):
    """FP64 ``cat(slices) @ dequant(W).T (+ bias)`` and the bound of an FP32-accumulated result."""
    x = torch.cat(slices, -1).double()
    w = reference.dequantize(weight.values, weight.scales).double()
    exact = x @ w.t()
    magnitude = x.abs() @ w.abs().t()
    if bias is not None:
        exact += bias.double()
    return exact, x.shape[1] * 2.0**-24 * magnitude


def _within(got, exact, accumulation):
    ulp = torch.finfo(got.dtype).eps * exact.abs() + torch.finfo(got.dtype).tiny
    return ((got.double() - exact).abs() <= accumulation + ulp).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("widths", [[384], [128, 256], [128] * 8, [256, 128, 1024, 128]])
@pytest.mark.parametrize("tokens", [1, 17, 300])
def test_within_the_fp32_bound_of_the_fp64_oracle(widths, tokens, with_bias, dtype):
    slices = _slices(widths, tokens, dtype, seed=len(widths) + tokens)
    weight = _weight(sum(widths))
    bias = torch.randn(weight.out_features).to(dtype) if with_bias else None
    got = mf.mm_slices(slices, weight, bias=bias)
    assert got.dtype == dtype and got.shape == (tokens, weight.out_features)
    assert _within(got, *_oracle(slices, weight, bias))


@pytest.mark.parametrize("deterministic", [False, True])
def test_any_split_of_k_gives_the_bits_of_the_concatenation(deterministic):
    """The pass rewrites ``linear_w8a16(cat(slices))`` to ``mm_slices(slices)``: compiled and
    eager must agree to the bit, so the reference's sum cannot depend on the split."""
    slices = _slices([128, 1024, 256, 1152], 33, torch.bfloat16)
    x = torch.cat(slices, -1)
    weight = _weight(x.shape[1])
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic)
    try:
        whole = mf.mm_slices([x], weight)
        assert torch.equal(mf.mm_slices(slices, weight), whole)
        assert torch.equal(mf.mm_slices(list(x.split(128, -1)), weight), whole)
        op = torch.ops.mxfp8.linear_w8a16(x, weight.values, weight.raw_scales, None)
        assert torch.equal(op, whole)
    finally:
        torch.use_deterministic_algorithms(previous)


def test_views_are_read_where_they_are():
    wide = torch.randn(40, 2048, dtype=torch.bfloat16)
    views = [wide[:, 0:256], wide[:, 512:640], wide[:, 1024:1408]]
    assert not views[0].is_contiguous()
    weight = _weight(768)
    assert torch.equal(mf.mm_slices(views, weight), mf.mm_slices([torch.cat(views, -1)], weight))


@pytest.mark.parametrize("dtype", DTYPES)
def test_into_writes_the_live_rows_only(dtype):
    slices = _slices([128, 256], 20, dtype)
    weight = _weight(384)
    bias = torch.randn(weight.out_features).to(dtype)
    out = torch.full((31, weight.out_features), 7.0, dtype=dtype)
    written = mf.mm_slices_into(slices, weight, out, bias=bias)
    assert written.data_ptr() == out.data_ptr() and written.shape == (20, weight.out_features)
    assert torch.equal(written, mf.mm_slices(slices, weight, bias=bias))
    assert (out[20:] == 7.0).all()


def test_zero_tokens_writes_nothing():
    weight = _weight(256)
    out = torch.full((4, weight.out_features), 7.0, dtype=torch.bfloat16)
    empty = [torch.empty(0, 128, dtype=torch.bfloat16)] * 2
    assert mf.mm_slices_into(empty, weight, out).shape == (0, weight.out_features)
    assert (out == 7.0).all()
    assert mf.mm_slices(empty, weight).shape == (0, weight.out_features)


def test_w8a16_is_closer_to_the_bf16_model_than_w8a8():
    """W8A16 keeps the activations: against the BF16 linear holding the dequantized weight it
    differs by output rounding only, where W8A8 adds the activations' quantization error."""
    slices = _slices([512, 512], 64, torch.bfloat16)
    weight = _weight(1024)
    x = torch.cat(slices, -1)
    model = x.double() @ reference.dequantize(weight.values, weight.scales).double().t()
    w8a16 = (mf.mm_slices(slices, weight).double() - model).norm()
    w8a8 = (mf.mm(x, weight).double() - model).norm()
    assert w8a16 * 4 < w8a8


def _bad_calls():
    good = _slices([128, 256], 8, torch.bfloat16)
    weight = _weight(384)
    out = torch.empty(8, weight.out_features, dtype=torch.bfloat16)
    yield "slices", TypeError, lambda: mf.mm_slices(good[0], weight)
    yield "slices", TypeError, lambda: mf.mm_slices([], weight)
    yield "slices[1]", TypeError, lambda: mf.mm_slices([good[0], "x"], weight)
    yield "slices[0]", TypeError, lambda: mf.mm_slices([good[0].float(), good[1]], weight)
    yield "slices[1]", TypeError, lambda: mf.mm_slices([good[0], good[1].half()], weight)
    yield "slices[1]", ValueError, lambda: mf.mm_slices([good[0], good[1][:4]], weight)
    yield "slices[1]", ValueError, lambda: mf.mm_slices([good[0], good[1][:, :200]], weight)
    yield "slices[0]", ValueError, lambda: mf.mm_slices([good[0][0], good[1]], weight)
    yield "slices", ValueError, lambda: mf.mm_slices(good[:1], weight)
    yield "weight", TypeError, lambda: mf.mm_slices(good, weight.values)
    yield "bias", ValueError, lambda: mf.mm_slices(good, weight, bias=torch.zeros(3))
    yield "out", ValueError, lambda: mf.mm_slices_into(good, weight, out[:4])
    yield "out", TypeError, lambda: mf.mm_slices_into(good, weight, out.float())
    yield "out", ValueError, lambda: mf.mm_slices_into(good, weight, out[:, :100])
    wide = torch.empty(8, 384 + weight.out_features, dtype=torch.bfloat16)
    aliased = [wide[:, :128], wide[:, 128:384]]
    yield "slices[0]", ValueError, lambda: mf.mm_slices_into(aliased, weight, wide[:, 384:])


@pytest.mark.parametrize("case", range(len(list(_bad_calls()))))
def test_bad_input_names_the_argument_and_writes_nothing(case):
    argument, error, call = list(_bad_calls())[case]
    with pytest.raises(error, match="^" + re.escape(argument) + ":"):
        call()


def test_compiles_fullgraph_with_the_same_bits():
    slices = _slices([128, 256], 24, torch.bfloat16)
    weight = _weight(384)
    bias = torch.randn(weight.out_features).to(torch.bfloat16)

    def f(a, b):
        return mf.mm_slices([a, b], weight, bias=bias) * 2

    compiled = torch.compile(f, fullgraph=True, backend="inductor")
    assert torch.equal(compiled(*slices), f(*slices))


def test_grad_mode_runs_the_forward_and_refuses_the_backward():
    slices = [s.requires_grad_() for s in _slices([128, 256], 4, torch.bfloat16)]
    weight = _weight(384)
    y = mf.mm_slices(slices, weight)
    with torch.no_grad():
        assert torch.equal(y, mf.mm_slices([s.detach() for s in slices], weight))
    with pytest.raises(RuntimeError, match=r"mxfp8::mm_slices \(mm_slices\) has no gradient"):
        y.sum().backward()
