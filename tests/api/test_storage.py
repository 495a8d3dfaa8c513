"""MXFP8Input / MXFP8Weight built by hand and by empty_input: bad tensors, devices and sizes
are refused where the storage is built, and storage made outside a compiled function can be
staged into and read inside it."""

import pytest
import torch

import mxfp8_fusion as mf
from mxfp8_fusion import format as fmt

E4M3, E8M0 = torch.float8_e4m3fn, torch.float8_e8m0fnu


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int16)


def values(rows: int = 200, k: int = 256, dtype=E4M3) -> torch.Tensor:
    return torch.zeros(rows, k, dtype=dtype)


def scales(rows: int = 200, k: int = 256, dtype=E8M0) -> torch.Tensor:
    return torch.zeros(fmt.scale_bytes(rows, k), dtype=dtype)


# (name, values, scales, error, argument); each is wrong in one way only
BAD_OPERANDS = [
    ("uint8 values", lambda: values(dtype=torch.uint8), scales, TypeError, "values"),
    ("bfloat16 values", lambda: values(dtype=torch.bfloat16), scales, TypeError, "values"),
    ("values not a tensor", lambda: [[0.0] * 256], scales, TypeError, "values"),
    ("1-D values", lambda: torch.zeros(256, dtype=E4M3), scales, ValueError, "values"),
    ("K not a multiple of 32", lambda: values(k=100), lambda: scales(k=128), ValueError, "values"),
    ("K not contiguous", lambda: values(256, 200).t(), scales, ValueError, "values"),
    ("expanded rows", lambda: values(1).expand(200, 256), scales, ValueError, "values"),
    ("scales of another capacity", values, lambda: scales(rows=100), ValueError, "scales"),
    ("scales of another K", values, lambda: scales(k=512), ValueError, "scales"),
    ("2-D scales", values, lambda: scales().view(-1, 16), ValueError, "scales"),
    ("int32 scales", values, lambda: scales(dtype=torch.int32), TypeError, "scales"),
    ("bfloat16 scales", values, lambda: scales(dtype=torch.bfloat16), TypeError, "scales"),
    ("strided scales", values, lambda: scales().repeat(2)[::2], ValueError, "scales"),
    ("scales on another device", values, lambda: scales().to("meta"), ValueError, "scales"),
    ("scales not a tensor", values, lambda: None, TypeError, "scales"),
]


@pytest.mark.parametrize("kind", [mf.MXFP8Input, mf.MXFP8Weight])
@pytest.mark.parametrize(
    "make_values,make_scales,error,argument",
    [case[1:] for case in BAD_OPERANDS],
    ids=[case[0] for case in BAD_OPERANDS],
)
def test_hand_built_operand_is_checked_where_it_is_built(
    kind, make_values, make_scales, error, argument
):
    with pytest.raises(error, match=f"^{argument}: expected"):
        kind(make_values(), make_scales())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float8_e4m3fn, "bfloat16", None])
def test_input_dtype_is_named_as_dtype(dtype):
    with pytest.raises(TypeError, match="^dtype: expected"):
        mf.MXFP8Input(values(), scales(), dtype=dtype)


@pytest.mark.parametrize("kind", [mf.MXFP8Input, mf.MXFP8Weight])
@pytest.mark.parametrize("scale_dtype", [E8M0, torch.uint8])
def test_operand_shares_its_tensors_and_shows_scales_as_e8m0(kind, scale_dtype):
    """Scales given as e8m0 or as their uint8 bytes are the same buffer: ``raw_scales`` (the
    bytes the ops take) and ``scales`` (e8m0) are views of it, nothing is copied."""
    v, s = values(), scales(dtype=scale_dtype)
    operand = kind(v, s)
    assert operand.values is v
    assert operand.raw_scales.dtype == torch.uint8 and operand.scales.dtype == E8M0
    assert operand.raw_scales.data_ptr() == s.data_ptr() == operand.scales.data_ptr()
    s.view(torch.uint8)[7] = 131
    assert operand.scales.view(torch.uint8)[7] == 131


def test_hand_built_operands_give_the_packed_result():
    """A weight and an input rebuilt by hand from packed tensors run the same GEMM (a
    column slice of a wider values buffer, K contiguous, is a valid input)."""
    gen = torch.Generator().manual_seed(0)
    w = mf.pack_weight(torch.randn(128, 256, generator=gen).to(torch.bfloat16))
    x = torch.randn(40, 256, generator=gen).to(torch.bfloat16)
    q = mf.quantize(x)
    wide = torch.zeros(40, 512, dtype=E4M3)
    wide[:, 128:384] = q.values
    by_hand = mf.MXFP8Input(wide[:, 128:384], q.scales.view(torch.uint8), torch.bfloat16)
    weight = mf.MXFP8Weight(w.values, w.scales)
    assert torch.equal(bits(mf.mm_quantized(by_hand, weight)), bits(mf.mm(x, w)))


def test_mismatched_capacities_fail_before_anything_is_written():
    """Values for 200 rows and scales for 100 used to fail inside the slice op, after the
    values were written; now the storage itself is refused."""
    with pytest.raises(ValueError, match="^scales: expected"):
        mf.MXFP8Input(values(200), scales(100))


# --- empty_input: device and capacity ---------------------------------------------------


_ACCELERATOR = torch.accelerator.current_accelerator(check_available=True)
_COUNT = torch.accelerator.device_count() if _ACCELERATOR is not None else 0
# devices this machine lacks: CUDA where torch sees no accelerator, else an index past the
# last device; and an accelerator kind other than this machine's
_ABSENT = "cuda" if _ACCELERATOR is None else f"{_ACCELERATOR.type}:{_COUNT}"
_ABSENT_INDEX = 5 if _COUNT <= 5 else _COUNT
_OTHER_KIND = "mps" if _ACCELERATOR is not None and _ACCELERATOR.type == "xpu" else "xpu"

BAD_DEVICES = [
    # (ids must not contain "gpu": conftest skips tests whose keywords do)
    ("unknown type", "gpu", ValueError),
    ("bad index", "cpu:x", ValueError),
    ("an absent index", _ABSENT_INDEX, ValueError),
    ("an absent accelerator", _ABSENT, ValueError),
    ("an absent torch.device", torch.device(_ABSENT), ValueError),
    ("another accelerator kind", _OTHER_KIND, ValueError),
    ("a float", 0.0, TypeError),
    ("a bool", True, TypeError),
    ("a list", ["cpu"], TypeError),
]


@pytest.mark.parametrize(
    "device,error", [case[1:] for case in BAD_DEVICES], ids=[case[0] for case in BAD_DEVICES]
)
def test_empty_input_names_a_bad_device(device, error):
    with pytest.raises(error, match="^device: expected"):
        mf.empty_input(8, 128, device=device)


@pytest.mark.parametrize("device", [None, "cpu", "cpu:0", torch.device("cpu"), "meta"])
def test_empty_input_on_good_devices(device):
    dest = mf.empty_input(8, 128, device=device)
    assert dest.values.shape == (8, 128) and dest.scales.shape == (512,)
    assert dest.device.type == torch.device(device or "cpu").type


@pytest.mark.parametrize("device", [None, "cpu", torch.device("cpu")])
def test_empty_input_in_a_compiled_graph(device):
    """Storage made inside ``fullgraph=True`` code. Before: the default device's look-up
    (``device=None``) broke the graph."""

    def stage(x):
        dest = mf.empty_input(8, 256, device)
        mf.quantize_input_slice(x, dest, 0)
        return dest.values.view(torch.uint8), dest.raw_scales

    x = torch.randn(8, 256).to(torch.bfloat16)
    got = torch.compile(stage, fullgraph=True, backend="aot_eager")(x)
    want = mf.quantize(x)
    assert torch.equal(got[0], want.values.view(torch.uint8))
    assert torch.equal(got[1], want.raw_scales)


@pytest.mark.parametrize("capacity", [2**62, 2**56])
def test_empty_input_names_a_capacity_too_large(capacity):
    with pytest.raises(ValueError, match="^capacity: expected"):
        mf.empty_input(capacity, 128)


# --- storage allocated outside a compiled function ------------------------------------


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("backend", ["inductor", "mxfp8_fusion"])
def test_compiled_staging_into_passed_in_storage(backend, device):
    """The allocate-once serving pattern: storage and output made once, outside; the compiled
    step stages into them, runs both GEMMs and reads the scales, with the token count
    changing per call. Bytes of the storage, of ``out`` and the results equal eager's."""
    gen = torch.Generator().manual_seed(1)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(device, torch.bfloat16)

    weight = mf.pack_weight(randn(128, 512, scale=0.05))
    bias = randn(128)

    def step(a, b, dest, out):
        mf.quantize_input_slice(a, dest, 0)
        mf.quantize_input_slices([b], dest, 256)
        tokens = a.shape[0]
        y = mf.mm_quantized(dest, weight, tokens=tokens, bias=bias)
        z = mf.mm_quantized_into(dest, weight, out, tokens=tokens)
        return y, z, dest.scales.view(torch.uint8)[:512].sum(dtype=torch.int32)

    def allocate():
        dest = mf.empty_input(64, 512, device)
        dest.values.view(torch.uint8).fill_(0x11)
        dest.scales.view(torch.uint8).fill_(0x22)
        return dest, torch.full((64, 128), 5.0, dtype=torch.bfloat16, device=device)

    torch._dynamo.reset()
    compiled = torch.compile(step, backend=backend, fullgraph=True)
    (dest_e, out_e), (dest_c, out_c) = allocate(), allocate()
    for tokens in (3, 40, 17, 64):
        a, b = randn(tokens, 256), randn(tokens, 256)
        want = step(a, b, dest_e, out_e)
        got = compiled(a, b, dest_c, out_c)
        assert torch.equal(bits(want[0]), bits(got[0]))
        assert torch.equal(bits(want[1]), bits(got[1])) and got[1].data_ptr() == out_c.data_ptr()
        assert torch.equal(want[2], got[2])
        assert torch.equal(bits(out_e), bits(out_c))
        assert torch.equal(bits(dest_e.values), bits(dest_c.values))
        assert torch.equal(bits(dest_e.scales), bits(dest_c.scales))


def test_compiled_quantize_returns_an_input_with_raw_scales():
    """An MXFP8Input made inside a compiled function comes out like eager's."""
    x = torch.randn(40, 256).to(torch.bfloat16)
    got = torch.compile(mf.quantize, fullgraph=True)(x)
    want = mf.quantize(x)
    assert isinstance(got, mf.MXFP8Input) and got.dtype == torch.bfloat16
    assert got.raw_scales.dtype == torch.uint8
    assert torch.equal(got.raw_scales, want.raw_scales)
    assert torch.equal(bits(got.values), bits(want.values))


def test_storage_shows_its_shape_not_its_bytes():
    """A fresh empty_input holds uninitialised memory (NaNs, say): its repr shows what it
    is, in one line."""
    dest = mf.empty_input(64, 384, "cpu", dtype=torch.float16)
    assert repr(dest) == (
        "MXFP8Input(capacity=64, in_features=384, dtype=torch.float16, device=cpu)"
    )
    weight = mf.pack_weight(torch.randn(256, 384, dtype=torch.bfloat16))
    assert repr(weight) == "MXFP8Weight(out_features=256, in_features=384, device=cpu)"
