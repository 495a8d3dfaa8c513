"""The Blackwell GEMM (cuBLAS through torch), checked on the CPU.

No Blackwell GPU runs here, so the tests check what can be checked without one:

* the exact ``scaled_mm`` arguments, against torch's own shape and layout rules: its meta
  kernels for ``_scaled_mm`` and ``_scaled_mm_v2`` validate block-scaled inputs as the CUDA
  op does (meta tensors count as CUDA there), for token counts around the 128-row blocks,
  capacities, weight widths and outputs that are column slices of wider buffers;
* the bytes those arguments hold, read by cuBLAS's documented rules (an emulator decoding
  the blocked scales with the closed-form offset of ``format.scale_offset``): exactly the
  operands the reference GEMM multiplies, and the whole path through the public API with the
  emulator in cuBLAS's place (bias, strided outputs, refusals, staged == one-shot).
"""

from types import SimpleNamespace

import pytest
import torch

import mxfp8_fusion as mf
from mxfp8_fusion import format as fmt
from mxfp8_fusion import reference
from mxfp8_fusion.kernels import dispatch, gemm_cublas

E8M0 = torch.float8_e8m0fnu
TOKENS = [1, 127, 128, 129, 300]
# _scaled_mm_v2 (torch.nn.functional.scaled_mm) is newer than the oldest torch supported
HAS_V2 = hasattr(torch.ops.aten, "_scaled_mm_v2") and hasattr(torch.nn.functional, "ScalingType")
requires_v2 = pytest.mark.skipif(not HAS_V2, reason="this torch has no _scaled_mm_v2")


def _is_blackwell() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] in (10, 12)


requires_blackwell = pytest.mark.skipif(not _is_blackwell(), reason="needs a Blackwell GPU")


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int16)


def _storage(capacity: int, k: int, device: str = "cpu"):
    values = torch.empty(capacity, k, dtype=fmt.VALUE_DTYPE, device=device)
    scales = torch.empty(fmt.scale_bytes(capacity, k), dtype=torch.uint8, device=device)
    return values, scales


def _plan(tokens, capacity, k, n, out_rows, out_cols=None, column=0, bias=None, device="meta"):
    """Plan the GEMM of ``tokens`` live rows of a ``capacity``-row storage with an [n, k]
    weight into ``out`` (``out_rows`` rows, columns ``[column, column + n)`` of an
    ``out_cols``-wide buffer)."""
    a_values, a_scales = _storage(capacity, k, device)
    b_values, b_scales = _storage(n, k, device)
    wide = torch.empty(out_rows, out_cols or n, dtype=torch.bfloat16, device=device)
    out = wide[:, column : column + n]
    call = gemm_cublas.plan(a_values[:tokens], a_scales, b_values, b_scales, bias, out)
    return call, (a_values, a_scales, b_values, b_scales, out)


def _meta_scaled_mm_v1(call):
    return torch.ops.aten._scaled_mm.default(
        call.mat_a, call.mat_b, call.scale_a, call.scale_b, call.bias, None, call.out_dtype, False
    )


def _meta_scaled_mm_v2(call):
    gemm, reason = gemm_cublas.resolve(
        SimpleNamespace(_scaled_mm_v2=torch.ops.aten._scaled_mm_v2),
        torch.__version__,
        "12.8",
        torch.nn.functional,
    )
    assert reason is None
    return gemm(call.mat_a, call.mat_b, call.scale_a, call.scale_b, call.bias, call.out_dtype, None)


def _check_against_torch(call, tokens, n):
    """torch's meta kernels accept the call and give the [tokens, n] result ``call`` writes."""
    for meta_call in (_meta_scaled_mm_v1, _meta_scaled_mm_v2) if HAS_V2 else (_meta_scaled_mm_v1,):
        result = meta_call(call)
        assert result.shape == (tokens, n) and result.dtype == call.out_dtype
        if call.result is not None:  # the out= overload writes it with no resize and no copy
            assert call.result.shape == result.shape and call.result.dtype == result.dtype
            assert call.result.is_contiguous()
    assert call.dest.shape == (tokens, n)


# --- which torch API, and what a missing one does -----------------------------------------


@requires_v2
def test_resolve_prefers_scaled_mm_then_v2_and_names_what_is_missing():
    aten, functional = torch.ops.aten, torch.nn.functional
    gemm, reason = gemm_cublas.resolve(aten, "2.13", "12.8", functional)
    assert reason is None and gemm.__qualname__.startswith("_v1")
    only_v2 = SimpleNamespace(_scaled_mm_v2=aten._scaled_mm_v2)
    gemm, reason = gemm_cublas.resolve(only_v2, "2.13", "13.0", functional)
    assert reason is None and gemm.__qualname__.startswith("_v2")
    no_enums = SimpleNamespace()
    assert gemm_cublas.resolve(only_v2, "2.13", "13.0", no_enums)[0] is None
    no_out = SimpleNamespace(_scaled_mm=SimpleNamespace(overloads=lambda: ["default"]))
    gemm, reason = gemm_cublas.resolve(no_out, "2.11", "12.9", functional)
    assert gemm is None and "aten._scaled_mm.out" in reason and "2.11" in reason
    gemm, reason = gemm_cublas.resolve(aten, "2.11", "12.6", functional)
    assert gemm is None and "CUDA 12.6" in reason and "12.8 or newer" in reason
    gemm, reason = gemm_cublas.resolve(aten, "2.13+cpu", None, functional)
    assert gemm is None and "not a CUDA build" in reason


def test_missing_api_falls_back_with_the_reason(monkeypatch):
    monkeypatch.setattr(gemm_cublas, "_backend", (None, "torch 2.11 has neither ..."))
    _, args = _plan(5, 5, 256, 128, 5, device="cpu")
    assert gemm_cublas.run_if_served(*args[:4], None, args[4]) == "torch 2.11 has neither ..."


# --- the arguments, against torch's rules (meta tensors) ----------------------------------


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("extra_capacity", [0, 1, 200])
@pytest.mark.parametrize("k,n", [(1024, 256), (128, 16), (1056, 208), (7168, 384)])
def test_arguments_pass_torchs_checks(tokens, extra_capacity, k, n):
    capacity = tokens + extra_capacity
    call, _ = _plan(tokens, capacity, k, n, capacity)
    assert not isinstance(call, str), call
    _check_against_torch(call, tokens, n)
    # views of the storage, nothing copied: the live rows and the live rows' scale chunks
    assert call.mat_a.shape == (tokens, k) and call.mat_a.stride() == (k, 1)
    assert call.mat_b.shape == (k, n) and call.mat_b.stride() == (1, k)
    assert call.scale_a.numel() == fmt.padded_rows(tokens) * -(-k // 128) * 4
    assert call.scale_a.dtype == E8M0 == call.scale_b.dtype
    assert call.result is not None and call.result.shape == (tokens, n)


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("column", [0, 128, 256])
def test_column_slice_of_a_wider_output(tokens, column):
    """``out`` is columns [column, column + N) of a wider buffer: the same call writes a
    fresh [tokens, N] result (torch would change it for a strided out), copied in."""
    call, _ = _plan(tokens, 512, 1024, 128, 600, out_cols=512, column=column)
    _check_against_torch(call, tokens, 128)
    assert call.result is None and call.dest.stride() == (512, 1)


@pytest.mark.parametrize("tokens", [1, 129])
def test_bias_in_the_epilogue_or_after_an_fp32_gemm(tokens):
    fused_bias = torch.empty(128, dtype=torch.bfloat16, device="meta")
    call, _ = _plan(tokens, 300, 512, 128, 300, bias=fused_bias)
    _check_against_torch(call, tokens, 128)
    assert call.bias is fused_bias and call.out_dtype == torch.bfloat16 and call.bias_after is None
    for other in (
        torch.empty(128, dtype=torch.float32, device="meta"),
        torch.empty(128, dtype=torch.float16, device="meta"),
        torch.empty(256, dtype=torch.bfloat16, device="meta")[::2],
    ):
        call, _ = _plan(tokens, 300, 512, 128, 300, bias=other)
        _check_against_torch(call, tokens, 128)  # torch rejects these as a fused bias
        assert call.bias is None and call.out_dtype == torch.float32
        assert call.bias_after is other and call.result is None


def test_torch_rejects_what_plan_avoids():
    """The meta check is a real check: the whole capacity's scales, the weight untransposed
    or a row-major FP32 bias are refused, as plan() never passes them."""
    call, (_, a_scales, b_values, _, _) = _plan(129, 512, 1024, 256, 512)
    with pytest.raises(RuntimeError, match="scale_a"):
        _meta_scaled_mm_v1(call._replace(scale_a=a_scales.view(E8M0)))
    with pytest.raises(RuntimeError, match="col_major"):
        _meta_scaled_mm_v1(call._replace(mat_b=b_values.view(1024, 256)))
    if HAS_V2:
        with pytest.raises(RuntimeError, match="scale_b"):
            _meta_scaled_mm_v2(call._replace(scale_b=call.scale_b[:-1]))


def test_plan_refuses_what_cublas_cannot_take():
    call, _ = _plan(5, 5, 256, 200, 5)  # N not a multiple of 16
    assert isinstance(call, str) and "N=200" in call
    a_values, a_scales = _storage(200, 256)
    a_values = a_values[:8]
    b_values, b_scales = _storage(128, 256)
    out = torch.empty(8, 128, dtype=torch.bfloat16)
    assert gemm_cublas.plan(a_values, a_scales, b_values, b_scales, None, out.float()) == (
        "output dtype torch.float32 is not bfloat16 or float16"
    )
    assert "aligned" in gemm_cublas.plan(a_values, a_scales[8:], b_values, b_scales, None, out)
    short = gemm_cublas.plan(a_values, a_scales[:511], b_values, b_scales, None, out)
    assert "shorter" in short
    strided = torch.empty(8, 512, dtype=fmt.VALUE_DTYPE)[:, :256]  # not the storage's layout
    assert "contiguous" in gemm_cublas.plan(strided, a_scales, b_values, b_scales, None, out)


# --- the bytes, read by cuBLAS's rules: an emulated scaled_mm ------------------------------


def _decode_scales(scale: torch.Tensor, rows: int, k: int) -> torch.Tensor:
    """FP32 factors [rows, K/32] of a VEC32_UE8M0 operand, by the closed-form blocked offset;
    the buffer must hold exactly the padded tiles (128 rows x 4 groups), as cuBLAS reads."""
    groups = k // fmt.GROUP
    assert scale.dtype == E8M0 and scale.dim() == 1
    assert scale.numel() == fmt.padded_rows(rows) * -(-groups // 4) * 4
    r = torch.arange(rows)[:, None]
    g = torch.arange(groups)[None, :]
    return scale[fmt.scale_offset(r, g, k)].float()


class _EmulatedScaledMM:
    """Stands in for the resolved scaled_mm: computes D = dequant(A) @ dequant(B) (+ bias)
    in FP32 from the arguments alone, records them, optionally raises."""

    def __init__(self, error: str | None = None):
        self.calls = []
        self.error = error

    def dequantized(self, mat_a, mat_b, scale_a, scale_b):
        m, k = mat_a.shape
        n = mat_b.shape[1]
        assert mat_b.stride() == (1, k)  # column-major [K, N]: row n of the weight
        a = mat_a.float().view(m, k // 32, 32) * _decode_scales(scale_a, m, k)[..., None]
        bt = mat_b.t().float().view(n, k // 32, 32) * _decode_scales(scale_b, n, k)[..., None]
        return a.view(m, k), bt.view(n, k).t()

    def __call__(self, mat_a, mat_b, scale_a, scale_b, bias, out_dtype, out):
        self.calls.append(SimpleNamespace(
            mat_a=mat_a, mat_b=mat_b, scale_a=scale_a, scale_b=scale_b, bias=bias,
            out_dtype=out_dtype, out=out,
        ))  # fmt: skip
        if self.error:
            raise RuntimeError(self.error)
        a, b = self.dequantized(mat_a, mat_b, scale_a, scale_b)
        acc = a @ b
        if bias is not None:
            acc += bias.float()
        if out is None:
            return acc.to(out_dtype)
        out.copy_(acc)
        return out


@pytest.fixture
def blackwell(monkeypatch):
    """CPU tensors take the cuBLAS path with the emulator: capability 12.0, no DSL (the slice
    quantizer then runs the reference, as it must on the CPU)."""
    emulator = _EmulatedScaledMM()
    monkeypatch.setattr(dispatch, "_device_capability", lambda device: (12, 0))
    monkeypatch.setattr(dispatch, "cute_dsl_installed", lambda: False)
    monkeypatch.setattr(gemm_cublas, "_backend", (emulator, None))
    monkeypatch.setattr(gemm_cublas, "_rejected", {})
    return emulator


def _weight(k: int, n: int, seed: int = 0) -> mf.MXFP8Weight:
    gen = torch.Generator().manual_seed(seed)
    return mf.pack_weight((torch.randn(n, k, generator=gen) * k**-0.5).to(torch.bfloat16))


def _staged(tokens: int, capacity: int, widths: list[int], seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    slices = [
        (torch.randn(tokens, w, generator=gen) * (i + 1)).to(torch.bfloat16)
        for i, w in enumerate(widths)
    ]
    dest = mf.empty_input(capacity, sum(widths), "cpu")
    column = 0
    for s in slices:
        mf.quantize_input_slice(s, dest, column)
        column += s.shape[1]
    return slices, dest


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("capacity_extra", [0, 77])
def test_passed_bytes_are_the_reference_operands(blackwell, tokens, capacity_extra):
    """Decoded as cuBLAS reads them, the operands passed are bitwise the FP32 operands the
    reference GEMM multiplies; the emulated product matches the reference GEMM."""
    _, staged = _staged(tokens, tokens + capacity_extra, [128, 384, 256])
    weight = _weight(768, 208)
    out = torch.full((tokens + capacity_extra, 208), 7.0, dtype=torch.bfloat16)
    got = mf.mm_quantized_into(staged, weight, out, tokens=tokens)
    (call,) = blackwell.calls
    a, b = blackwell.dequantized(call.mat_a, call.mat_b, call.scale_a, call.scale_b)
    want_a = reference.dequantize(staged.values[:tokens], staged.scales)
    want_b = reference.dequantize(weight.values, weight.scales)
    assert torch.equal(a, want_a) and torch.equal(b, want_b.t())
    assert call.out is not None and call.out.data_ptr() == out.data_ptr()  # in place
    assert got.data_ptr() == out.data_ptr() and got.shape == (tokens, 208)
    assert torch.all(out[tokens:] == 7.0)  # rows past the live ones untouched
    want = reference.mm(
        staged.values[:tokens], staged.scales, weight.values, weight.scales, None, torch.bfloat16
    )
    # FP32 sums in another order than the reference's K-chunks: a rounding step apart at most
    torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("tokens", [1, 129])
def test_staged_and_one_shot_make_the_same_call(blackwell, tokens):
    """The staged path (slices quantized into a larger storage, mm_quantized) and the
    one-shot path (mm of the concatenation) pass the same bytes, shapes, strides and dtypes:
    the same cuBLAS call, so bitwise-identical outputs."""
    slices, staged = _staged(tokens, tokens + 100, [256, 128, 384])
    weight = _weight(768, 128)
    bias = torch.randn(128).to(torch.bfloat16)
    staged_out = mf.mm_quantized(staged, weight, tokens=tokens, bias=bias)
    one_shot_out = mf.mm(torch.cat(slices, dim=-1), weight, bias=bias)
    first, second = blackwell.calls
    for name in ("mat_a", "mat_b", "scale_a", "scale_b", "bias", "out"):
        x, y = getattr(first, name), getattr(second, name)
        assert (x.shape, x.stride(), x.dtype) == (y.shape, y.stride(), y.dtype), name
        assert torch.equal(_bits(x), _bits(y)) or name == "out", name
    assert first.out_dtype == second.out_dtype == torch.bfloat16
    assert torch.equal(_bits(staged_out), _bits(one_shot_out))


@pytest.mark.parametrize("bias_dtype", [torch.float32, torch.float16])
def test_other_bias_is_added_in_fp32_and_rounded_once(blackwell, bias_dtype):
    _, staged = _staged(40, 64, [256])
    weight = _weight(256, 128)
    bias = (torch.randn(128) * 3).to(bias_dtype)
    got = mf.mm_quantized(staged, weight, tokens=40, bias=bias)
    (call,) = blackwell.calls
    assert call.bias is None and call.out_dtype == torch.float32 and call.out is None
    a, b = blackwell.dequantized(call.mat_a, call.mat_b, call.scale_a, call.scale_b)
    assert torch.equal(_bits(got), _bits(((a @ b) + bias.float()).to(torch.bfloat16)))


def test_strided_output_gets_the_same_call_and_a_copy(blackwell):
    _, staged = _staged(129, 200, [512])
    weight = _weight(512, 128)
    wide = torch.full((200, 384), 5.0, dtype=torch.bfloat16)
    out = wide[:, 128:256]
    mf.mm_quantized_into(staged, weight, out, tokens=129)
    fresh = mf.mm_quantized(staged, weight, tokens=129)
    strided_call, fresh_call = blackwell.calls
    assert strided_call.out is None and fresh_call.out.is_contiguous()
    assert torch.equal(_bits(wide[:129, 128:256]), _bits(fresh))
    assert torch.all(wide[:, :128] == 5.0) and torch.all(wide[:, 256:] == 5.0)
    assert torch.all(wide[129:] == 5.0)


def test_cublas_refusal_runs_the_reference_and_is_remembered(blackwell, monkeypatch):
    monkeypatch.setattr(
        blackwell,
        "error",
        "CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling `cublasLtMatmulAlgoGetHeuristic(...)`",
    )
    _, staged = _staged(1, 8, [256])
    weight = _weight(256, 128)
    bias = torch.randn(128).to(torch.bfloat16)
    out = torch.zeros(8, 128, dtype=torch.bfloat16)
    mf.mm_quantized_into(staged, weight, out, tokens=1, bias=bias)
    want = reference.mm(
        staged.values[:1], staged.scales, weight.values, weight.scales, bias, torch.bfloat16
    )
    assert torch.equal(_bits(out[:1]), _bits(want))
    (reason,) = gemm_cublas._rejected.values()
    assert "no MXFP8 kernel for M=1 N=128 K=256" in reason
    mf.mm_quantized_into(staged, weight, out, tokens=1, bias=bias)
    assert len(blackwell.calls) == 1  # not asked again for that shape
    mf.mm_quantized_into(staged, weight, out, tokens=2, bias=bias)
    assert len(blackwell.calls) == 2


def test_other_errors_are_not_swallowed(blackwell, monkeypatch):
    monkeypatch.setattr(blackwell, "error", "CUDA error: an illegal memory access was encountered")
    _, staged = _staged(3, 8, [256])
    with pytest.raises(RuntimeError, match="illegal memory access"):
        mf.mm_quantized(staged, _weight(256, 128), tokens=3)


def test_unserved_shape_runs_the_reference(blackwell):
    _, staged = _staged(3, 8, [256])
    weight = _weight(256, 200)  # N not a multiple of 16
    got = mf.mm_quantized(staged, weight, tokens=3)
    assert blackwell.calls == []
    want = reference.mm(
        staged.values[:3], staged.scales, weight.values, weight.scales, None, torch.bfloat16
    )
    assert torch.equal(_bits(got), _bits(want))
    out = torch.empty(3, 200, dtype=torch.bfloat16)
    reason = gemm_cublas.run_if_served(
        staged.values[:3], staged.scales, weight.values, weight.scales, None, out
    )
    assert "N=200" in reason


# --- on a Blackwell GPU (none here: these skip) --------------------------------------------


@pytest.mark.gpu
@requires_blackwell
@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_on_blackwell_cublas_serves_and_matches_the_reference(tokens, dtype, monkeypatch):
    served = []
    real = gemm_cublas.run_if_served
    monkeypatch.setattr(
        gemm_cublas, "run_if_served", lambda *a: served.append(real(*a)) or served[-1]
    )
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    slices = [torch.randn(tokens, w, generator=gen, device="cuda").to(dtype) for w in (512, 256)]
    weight = mf.pack_weight(torch.randn(384, 768, device="cuda").to(dtype) * 0.04)
    bias = torch.randn(384, device="cuda").to(dtype)
    staged = mf.empty_input(tokens + 64, 768, "cuda", dtype)
    mf.quantize_input_slices(slices, staged)
    out = torch.full((tokens + 64, 384), 3.0, dtype=dtype, device="cuda")
    mf.mm_quantized_into(staged, weight, out, tokens=tokens, bias=bias)
    one_shot = mf.mm(torch.cat(slices, dim=-1), weight, bias=bias)
    assert served == [None, None]
    assert torch.equal(_bits(out[:tokens]), _bits(one_shot))  # the same cuBLAS call
    assert torch.all(out[tokens:] == 3.0)
    want = reference.mm(
        staged.values[:tokens], staged.scales, weight.values, weight.scales, bias, dtype
    )
    torch.testing.assert_close(out[:tokens], want, rtol=1e-2, atol=1e-2)
