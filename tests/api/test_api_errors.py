"""The eager API refuses bad input before anything runs: a ``TypeError`` / ``ValueError``
naming the argument, and nothing written."""

import pytest
import torch

import mxfp8_fusion as mf


def make_weight(k: int, n: int = 128, seed: int = 0) -> mf.MXFP8Weight:
    gen = torch.Generator().manual_seed(seed)
    return mf.pack_weight((torch.randn(n, k, generator=gen) * k**-0.5).to(torch.bfloat16))


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int16)


def _dest() -> mf.MXFP8Input:
    dest = mf.empty_input(16, 512)
    dest.values.view(torch.uint8).fill_(0x11)
    dest.scales.view(torch.uint8).fill_(0x22)
    return dest


def _source(tokens=8, width=128, dtype=torch.bfloat16):
    return torch.randn(tokens, width).to(dtype)


BAD_SLICES = [
    ("width not a multiple of 128", lambda: _source(width=96), 0, ValueError, "source"),
    ("column not a multiple of 128", lambda: _source(), 64, ValueError, "destination_column"),
    ("negative column", lambda: _source(), -128, ValueError, "destination_column"),
    ("slice past in_features", lambda: _source(width=256), 384, ValueError, "source"),
    ("tokens above capacity", lambda: _source(tokens=17), 0, ValueError, "source"),
    ("float32 source", lambda: _source(dtype=torch.float32), 0, TypeError, "source"),
    ("float16 into bfloat16 storage", lambda: _source(dtype=torch.float16), 0, TypeError, "source"),
    ("3-D source", lambda: torch.randn(2, 4, 128, dtype=torch.bfloat16), 0, ValueError, "source"),
    ("not a tensor", lambda: [[1.0] * 128], 0, TypeError, "source"),
    ("meta device", lambda: _source().to("meta"), 0, ValueError, "source"),
    ("column not an int", lambda: _source(), 0.0, TypeError, "destination_column"),
]


@pytest.mark.parametrize(
    "make_source,column,error,argument",
    [case[1:] for case in BAD_SLICES],
    ids=[case[0] for case in BAD_SLICES],
)
def test_bad_slice_raises_and_writes_nothing(make_source, column, error, argument):
    _assert_raises_and_writes_nothing(mf.quantize_input_slice, make_source, column, error, argument)


def _assert_raises_and_writes_nothing(quantize, make_sources, column, error, argument):
    """``quantize(make_sources(), dest, column)`` raises ``error`` naming ``argument`` and
    leaves ``dest``'s bytes as they were."""
    dest = _dest()
    before = (dest.values.view(torch.uint8).clone(), dest.scales.view(torch.uint8).clone())
    with pytest.raises(error, match=f"^{argument}: expected"):
        quantize(make_sources(), dest, column)
    assert torch.equal(dest.values.view(torch.uint8), before[0])
    assert torch.equal(dest.scales.view(torch.uint8), before[1])


BAD_SLICE_LISTS = [
    ("empty list", lambda: [], 0, TypeError, "sources"),
    ("a tensor, not a list", lambda: _source(), 0, TypeError, "sources"),
    ("token counts differ", lambda: [_source(), _source(tokens=7)], 0, ValueError, r"sources\[1\]"),
    (
        "third slice past in_features",
        lambda: [_source(width=128)] * 3 + [_source(width=256)],
        0,
        ValueError,
        r"sources\[3\]",
    ),
    (
        "float32 second slice",
        lambda: [_source(), _source(dtype=torch.float32)],
        0,
        TypeError,
        r"sources\[1\]",
    ),
    (
        "float16 second slice into bfloat16 storage",
        lambda: [_source(), _source(dtype=torch.float16)],
        0,
        TypeError,
        r"sources\[1\]",
    ),
    ("not a tensor", lambda: [_source(), [[1.0] * 128]], 0, TypeError, r"sources\[1\]"),
    ("column not a multiple of 128", lambda: [_source()], 64, ValueError, "destination_column"),
]


@pytest.mark.parametrize(
    "make_sources,column,error,argument",
    [case[1:] for case in BAD_SLICE_LISTS],
    ids=[case[0] for case in BAD_SLICE_LISTS],
)
def test_bad_slice_list_raises_and_writes_nothing(make_sources, column, error, argument):
    _assert_raises_and_writes_nothing(
        mf.quantize_input_slices, make_sources, column, error, argument
    )


@pytest.mark.parametrize(
    "source_dtype,storage_dtype", [(torch.float16, torch.bfloat16), (torch.bfloat16, torch.float16)]
)
def test_staging_refuses_a_source_of_another_dtype_than_the_storage(source_dtype, storage_dtype):
    """The storage's dtype is the staged GEMM's output dtype: a source of the other 16-bit
    dtype would give a result in a dtype the concatenated path does not return, so it is
    refused, naming the source, before anything is written."""
    source = _source(dtype=source_dtype)
    dest = mf.empty_input(16, 256, dtype=storage_dtype)
    dest.values.view(torch.uint8).fill_(0x11)
    before = dest.values.view(torch.uint8).clone()
    with pytest.raises(TypeError, match=f"^source: expected dtype {storage_dtype}"):
        mf.quantize_input_slice(source, dest, 0)
    with pytest.raises(TypeError, match=r"^sources\[0\]: expected dtype"):
        mf.quantize_input_slices([source, source], dest)
    assert torch.equal(dest.values.view(torch.uint8), before)
    # storage of the source's dtype: the staged result is the concatenated one, bit for bit
    dest = mf.empty_input(8, 256, dtype=source_dtype)
    x = torch.cat([source, source], -1)
    mf.quantize_input_slices([source, source], dest)
    weight = make_weight(256)
    got, want = mf.mm_quantized(dest, weight), mf.mm(x, weight)
    assert got.dtype == want.dtype == source_dtype
    assert torch.equal(bits(got), bits(want))


def _expanded_rows():
    return torch.full((1, 128), 3.0, dtype=torch.bfloat16).expand(16, 128)


def _expanded_columns():
    return torch.full((16, 1), 3.0, dtype=torch.bfloat16).expand(16, 128)


def _overlapping_rows():
    return torch.full((16 * 64 + 64,), 3.0, dtype=torch.bfloat16).as_strided((16, 128), (64, 1))


def _overlapping_columns():
    return torch.full((16 * 128,), 3.0, dtype=torch.bfloat16).as_strided((16, 128), (1, 8))


@pytest.mark.parametrize(
    "make_out", [_expanded_rows, _expanded_columns, _overlapping_rows, _overlapping_columns]
)
def test_out_with_overlapping_elements_is_refused_before_writing(make_out):
    """An expanded (stride 0) or otherwise self-overlapping ``out`` cannot hold the result;
    it is refused, naming ``out``, and its memory is left as it was."""
    out = make_out()
    base = torch.as_strided(out, (out.untyped_storage().nbytes() // 2,), (1,), 0)
    before = base.clone()
    with pytest.raises(ValueError, match="^out: expected"):
        mf.mm_quantized_into(_dest(), make_weight(512), out, tokens=8)
    assert torch.equal(bits(base), bits(before))


def test_bias_overlapping_out_is_refused_before_writing():
    """The GEMM writes ``out`` while it reads ``bias``: a bias in ``out``'s memory would race
    on the GPU, so it is refused, naming ``bias``, and nothing is written. A bias from
    another part of the same buffer is fine."""
    weight = make_weight(512)  # N 128
    buffer = torch.full((17, 128), 3.0, dtype=torch.bfloat16)
    out, before = buffer[:16], buffer.clone()
    straddling = buffer.view(-1)[16 * 128 - 64 : 16 * 128 + 64]  # out's last row and beyond
    for bias in (out[0], out[3], straddling):
        with pytest.raises(ValueError, match="^bias: expected memory apart from out's"):
            mf.mm_quantized_into(_dest(), weight, out, tokens=8, bias=bias)
        assert torch.equal(bits(buffer), bits(before))
    got = mf.mm_quantized_into(_dest(), weight, out, tokens=8, bias=buffer[16])
    want = mf.mm_quantized(_dest(), weight, tokens=8, bias=buffer[16].clone())
    assert torch.equal(bits(got), bits(want))
    # meta tensors have no memory: only views of one storage share it
    meta_weight = mf.pack_weight(torch.empty(128, 512, dtype=torch.bfloat16, device="meta"))
    meta_dest = mf.empty_input(16, 512, "meta")
    meta_out = torch.empty(16, 128, dtype=torch.bfloat16, device="meta")
    meta_bias = torch.empty(128, dtype=torch.bfloat16, device="meta")
    assert mf.mm_quantized_into(meta_dest, meta_weight, meta_out, bias=meta_bias).shape == (16, 128)
    with pytest.raises(ValueError, match="^bias: expected memory apart from out's"):
        mf.mm_quantized_into(meta_dest, meta_weight, meta_out, bias=meta_out[2])


@pytest.mark.parametrize(
    "make_out",
    [
        lambda: torch.zeros(16, 256, dtype=torch.bfloat16)[:, 64:192],  # a column slice
        lambda: torch.zeros(128, 16, dtype=torch.bfloat16).t(),  # column-major
        lambda: torch.zeros(1, 128, dtype=torch.bfloat16),  # one row
    ],
    ids=["column slice", "column-major", "one row"],
)
def test_out_with_any_non_overlapping_layout_is_written(make_out):
    dest, weight = _dest(), make_weight(512)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(16, 512, generator=gen).to(torch.bfloat16)
    mf.quantize_input_slice(x, dest, 0)
    out = make_out()
    tokens = out.shape[0]
    got = mf.mm_quantized_into(dest, weight, out, tokens=tokens)
    assert got.data_ptr() == out.data_ptr()
    assert torch.equal(bits(out.contiguous()), bits(mf.mm(x[:tokens], weight)))


def test_bad_gemm_arguments_raise_and_leave_out_unchanged():
    dest = _dest()
    weight = make_weight(512)
    out = torch.full((16, 128), 3.0, dtype=torch.bfloat16)
    cases = [
        (dict(tokens=17), ValueError, "tokens"),
        (dict(tokens=-1), ValueError, "tokens"),
        (dict(tokens=2.0), TypeError, "tokens"),
        (dict(out=torch.empty(16, 64, dtype=torch.bfloat16)), ValueError, "out"),
        (dict(out=torch.empty(4, 128, dtype=torch.bfloat16), tokens=8), ValueError, "out"),
        (dict(out=torch.empty(16, 128, dtype=torch.float32)), TypeError, "out"),
        (dict(out=torch.empty(16, 128, dtype=torch.bfloat16, device="meta")), ValueError, "out"),
        (dict(out=torch.empty(16 * 128, dtype=torch.bfloat16)), ValueError, "out"),
        (dict(bias=torch.empty(64)), ValueError, "bias"),
        (dict(bias=torch.empty(128, dtype=torch.int32)), TypeError, "bias"),
        (dict(weight=make_weight(256)), ValueError, "weight"),
        (dict(weight=torch.empty(128, 512)), TypeError, "weight"),
    ]
    for overrides, error, argument in cases:
        kwargs = dict(inp=dest, weight=weight, out=out, tokens=8, bias=None) | overrides
        with pytest.raises(error, match=f"^{argument}: expected"):
            mf.mm_quantized_into(**kwargs)
        assert (out == 3.0).all()
    with pytest.raises(ValueError, match="^tokens: expected"):
        mf.mm_quantized(dest, weight, tokens=100)


@pytest.mark.parametrize(
    "call,error,argument",
    [
        (lambda: mf.pack_weight(torch.randn(8, 100, dtype=torch.bfloat16)), ValueError, "weight"),
        (lambda: mf.pack_weight(torch.randn(8, 128)), TypeError, "weight"),
        (lambda: mf.pack_weight(torch.randn(128, dtype=torch.bfloat16)), ValueError, "weight"),
        (
            lambda: mf.pack_weight(
                torch.zeros(8, 128, dtype=torch.float8_e4m3fn), torch.zeros(8, 3, dtype=torch.uint8)
            ),
            ValueError,
            "scales",
        ),
        (
            lambda: mf.pack_weight(
                torch.zeros(8, 128, dtype=torch.float8_e4m3fn), torch.zeros(8, 4, dtype=torch.int32)
            ),
            TypeError,
            "scales",
        ),
        (lambda: mf.empty_input(8, 100), ValueError, "in_features"),
        (lambda: mf.empty_input(-1, 128), ValueError, "capacity"),
        (lambda: mf.empty_input(8.0, 128), TypeError, "capacity"),
        (lambda: mf.empty_input(8, 128, dtype=torch.float32), TypeError, "dtype"),
        (lambda: mf.quantize(torch.randn(4, 100, dtype=torch.bfloat16)), ValueError, "x"),
        (lambda: mf.quantize(torch.randn(4, 128)), TypeError, "x"),
        (
            lambda: mf.mm(torch.randn(4, 256, dtype=torch.bfloat16), make_weight(512)),
            ValueError,
            "x",
        ),
        (
            lambda: mf.mm(torch.randn(2, 4, 512, dtype=torch.bfloat16), make_weight(512)),
            ValueError,
            "x",
        ),
        (lambda: mf.mm(torch.randn(4, 512, dtype=torch.bfloat16), "w"), TypeError, "weight"),
    ],
)
def test_bad_arguments_name_the_argument(call, error, argument):
    with pytest.raises(error, match=f"^{argument}: expected"):
        call()


@pytest.mark.parametrize(
    ("name", "required"),
    [
        ("mm", ("x", "weight")),
        ("mm_quantized", ("inp", "weight")),
        ("mm_quantized_into", ("inp", "weight", "out")),
        ("mm_slices", ("slices", "weight")),
        ("mm_slices_into", ("slices", "weight", "out")),
    ],
)
def test_the_gemms_optional_arguments_are_keyword_only(name, required):
    """bias was the fifth positional argument of mm_quantized_into and the fourth of
    mm_slices_into: one positional list for all, the operands, and keywords for the rest."""
    import inspect

    parameters = inspect.signature(getattr(mf, name)).parameters.values()
    positional = [p.name for p in parameters if p.kind is p.POSITIONAL_OR_KEYWORD]
    keyword = [p for p in parameters if p.kind is p.KEYWORD_ONLY]
    assert tuple(positional) == required
    assert keyword and all(p.default is None for p in keyword)


def test_mm_quantized_into_refuses_bias_where_tokens_go():
    weight = mf.pack_weight(torch.randn(64, 256, dtype=torch.bfloat16))
    dest = mf.empty_input(8, 256, "cpu")
    out = torch.empty(8, 64, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="positional"):
        mf.mm_quantized_into(dest, weight, out, torch.zeros(64, dtype=torch.bfloat16))
