"""The eager staged API: bitwise equal to the concatenated path, and bad input rejected."""

import pytest
import torch

import mxfp8_fusion as mf
from mxfp8_fusion import format as fmt

DTYPES = [torch.bfloat16, torch.float16]
WIDTH_CYCLE = [128, 256, 384]


def make_slices(n: int, tokens: int, dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(tokens, WIDTH_CYCLE[i % 3], generator=gen) * (i + 1)).to(dtype)
        for i in range(n)
    ]


def make_weight(k: int, n: int = 128, seed: int = 0) -> mf.MXFP8Weight:
    gen = torch.Generator().manual_seed(seed)
    return mf.pack_weight((torch.randn(n, k, generator=gen) * k**-0.5).to(torch.bfloat16))


def stage(slices: list[torch.Tensor], capacity: int) -> mf.MXFP8Input:
    k = sum(s.shape[1] for s in slices)
    dest = mf.empty_input(capacity, k, "cpu", slices[0].dtype)
    column = 0
    for s in slices:
        mf.quantize_input_slice(s, dest, column)
        column += s.shape[1]
    return dest


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int16)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("tokens", [1, 127, 129, 1000])
@pytest.mark.parametrize("n_slices", range(1, 9))
def test_staged_equals_concatenated(n_slices, tokens, with_bias, dtype):
    slices = make_slices(n_slices, tokens, dtype, seed=n_slices * 7 + tokens)
    x = torch.cat(slices, dim=-1)
    weight = make_weight(x.shape[1])
    bias = torch.randn(weight.out_features).to(dtype) if with_bias else None
    capacity = tokens + 37
    staged = stage(slices, capacity)

    one_shot = mf.quantize(x)
    assert torch.equal(bits(staged.values[:tokens]), bits(one_shot.values))
    live = fmt.scale_bytes(tokens, x.shape[1])  # whole 128-row blocks, padding included
    assert torch.equal(bits(staged.scales[:live]), bits(one_shot.scales))

    expected = mf.mm(x, weight, bias=bias)
    assert expected.dtype == dtype
    got = mf.mm_quantized(staged, weight, tokens=tokens, bias=bias)
    assert torch.equal(bits(got), bits(expected))

    out = torch.full((capacity + 5, weight.out_features), 7.0, dtype=dtype)
    written = mf.mm_quantized_into(staged, weight, out, tokens=tokens, bias=bias)
    assert written.data_ptr() == out.data_ptr() and written.shape == expected.shape
    assert torch.equal(bits(out[:tokens]), bits(expected))
    assert (out[tokens:] == 7.0).all()


def test_strided_views_are_staged():
    wide = torch.randn(50, 1024, dtype=torch.bfloat16)
    views = [wide[:, 0:256], wide[:, 512:640], wide[:, 640:1024]]
    assert not views[0].is_contiguous()
    staged = stage(views, 50)
    x = torch.cat(views, dim=-1)
    weight = make_weight(x.shape[1])
    assert torch.equal(bits(mf.mm_quantized(staged, weight)), bits(mf.mm(x, weight)))


def test_slices_in_any_order_and_other_columns_untouched():
    slices = make_slices(3, 20, torch.bfloat16, seed=3)
    dest = mf.empty_input(20, 768, "cpu")
    dest.values.view(torch.uint8).fill_(0xAB)
    mf.quantize_input_slice(slices[1], dest, 128)  # width 256 at columns [128, 384)
    v = dest.values.view(torch.uint8)
    assert (v[:, :128] == 0xAB).all() and (v[:, 384:] == 0xAB).all()
    assert not (v[:, 128:384] == 0xAB).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", [1, 129])
@pytest.mark.parametrize("widths", [[256] * 6, [128, 256, 384], [128] * 9])
def test_quantize_input_slices_equals_one_call_per_slice(widths, tokens, dtype):
    """Several slices in one call write the bytes of one quantize_input_slice per slice, from
    destination_column on, and nothing else (equal shapes: one launch on the GPU; mixed
    widths or more than 8 slices: one launch per slice)."""
    gen = torch.Generator().manual_seed(tokens + len(widths))
    slices = [torch.randn(tokens, w, generator=gen).to(dtype) for w in widths]
    k = 128 + sum(widths) + 128
    dests = []
    for _ in range(2):
        dest = mf.empty_input(tokens + 3, k, "cpu", dtype)
        dest.values.view(torch.uint8).fill_(0xAB)
        dest.scales.view(torch.uint8).fill_(0xCD)
        dests.append(dest)
    mf.quantize_input_slices(slices, dests[0], 128)
    column = 128
    for s in slices:
        mf.quantize_input_slice(s, dests[1], column)
        column += s.shape[1]
    assert torch.equal(bits(dests[0].values), bits(dests[1].values))
    assert torch.equal(bits(dests[0].scales), bits(dests[1].scales))
    assert (dests[0].values.view(torch.uint8)[:, :128] == 0xAB).all()


def test_quantize_input_slices_in_a_compiled_function():
    """The multi-slice call traces under torch.compile (its op is functionalized) and gives
    eager's result."""
    slices = make_slices(3, 40, torch.bfloat16, seed=5)
    k = sum(s.shape[1] for s in slices)
    weight = make_weight(k)

    def staged(*xs):
        dest = mf.empty_input(xs[0].shape[0], k, xs[0].device)
        mf.quantize_input_slices(list(xs), dest)
        return mf.mm_quantized(dest, weight)

    expected = mf.mm(torch.cat(slices, -1), weight)
    assert torch.equal(bits(staged(*slices)), bits(expected))
    assert torch.equal(bits(torch.compile(staged, fullgraph=True)(*slices)), bits(expected))


def test_weight_from_checkpoint_matches_quantized_weight():
    w = torch.randn(256, 512, dtype=torch.bfloat16)
    packed = mf.pack_weight(w)
    from mxfp8_fusion import reference

    values, scale_rows = reference.quantize_rows(w)
    for scales in (scale_rows, scale_rows.view(torch.float8_e8m0fnu)):
        again = mf.pack_weight(values, scales)
        assert torch.equal(bits(again.values), bits(packed.values))
        assert torch.equal(bits(again.scales), bits(packed.scales))


def test_checkpoint_nan_value_gets_the_nan_scale():
    """A NaN E4M3 value in a checkpoint block: the packed block's scale becomes 255 and the
    GEMM's output row stays NaN for every token (as the values say), the rest unchanged."""
    from mxfp8_fusion import reference

    w = torch.randn(128, 256, dtype=torch.bfloat16)
    values, scale_rows = reference.quantize_rows(w)
    values.view(torch.uint8)[5, 70] = 0x7F  # row 5, block 2
    packed = mf.pack_weight(values, scale_rows)
    # the same from a non-contiguous view of the values
    assert torch.equal(
        bits(mf.pack_weight(values.t().contiguous().t(), scale_rows).scales), bits(packed.scales)
    )
    want_rows = scale_rows.clone()
    want_rows[5, 2] = 255
    assert torch.equal(bits(packed.scales), bits(reference.to_blocked(want_rows)))
    x = torch.randn(3, 256, dtype=torch.bfloat16)
    out = mf.mm(x, packed).float()
    assert out[:, 5].isnan().all() and not out[:, [0, 4, 6]].isnan().any()


def test_empty_token_count():
    weight = make_weight(256)
    dest = mf.empty_input(8, 256)
    out = mf.mm_quantized(dest, weight, tokens=0)
    assert out.shape == (0, 128)
    assert mf.mm(torch.empty(0, 256, dtype=torch.bfloat16), weight).shape == (0, 128)


@pytest.mark.slow
def test_compiled_eager_api_matches_eager():
    weight = make_weight(512)
    bias = torch.randn(128, dtype=torch.bfloat16)

    def staged(a, b, out):
        dest = mf.empty_input(a.shape[0], 512, a.device)
        mf.quantize_input_slice(a, dest, 0)
        mf.quantize_input_slice(b, dest, 256)
        y = mf.mm_quantized(dest, weight, bias=bias)
        mf.mm_quantized_into(dest, weight, out, tokens=a.shape[0], bias=bias)
        return y

    def one_shot(a, b):
        return mf.mm_quantized(mf.quantize(torch.cat([a, b], -1)), weight, bias=bias)

    a, b = (torch.randn(33, 256, dtype=torch.bfloat16) for _ in range(2))
    out_eager = torch.zeros(40, 128, dtype=torch.bfloat16)
    out_compiled = torch.zeros(40, 128, dtype=torch.bfloat16)
    expected = staged(a, b, out_eager)
    got = torch.compile(staged, fullgraph=True)(a, b, out_compiled)
    assert torch.equal(bits(got), bits(expected))
    assert torch.equal(bits(out_compiled), bits(out_eager))
    assert torch.equal(bits(torch.compile(one_shot, fullgraph=True)(a, b)), bits(expected))


def test_weight_shape_and_dequantize_as_torchao_users_expect():
    """``MXFP8Weight.shape`` and ``.dequantize()``, the names torchao's MXTensor has: the
    exact E4M3 x E8M0 values, a NaN block reading back as NaN."""
    from mxfp8_fusion import reference

    w = torch.randn(64, 96, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    w[3, 40] = float("nan")
    weight = mf.pack_weight(w)
    assert weight.shape == torch.Size([64, 96])
    exact = weight.dequantize()
    assert exact.dtype == torch.float32 and exact.shape == (64, 96)
    same = reference.dequantize(weight.values, weight.raw_scales)
    assert torch.equal(exact.view(torch.int32), same.view(torch.int32))  # NaN too
    assert torch.isnan(exact[3, 32:64]).all() and not torch.isnan(exact[3, :32]).any()
    assert torch.equal(
        weight.dequantize(torch.bfloat16).view(torch.int16),
        exact.to(torch.bfloat16).view(torch.int16),
    )
    finite = torch.isfinite(exact)
    error = (exact[finite] - w.float()[finite]).norm() / w.float()[finite].norm()
    assert error < 2**-4  # E4M3: 3 mantissa bits
    with pytest.raises(TypeError, match="^dtype:"):
        weight.dequantize(torch.int8)
    assert mf.empty_input(16, 128, "cpu").shape == (16, 128)
