"""Plain-torch MXFP8 quantize, dequantize and GEMM.

These are the oracle every kernel is checked against and the implementation on devices
without a kernel (the CPU included). They run on any device.
"""

from __future__ import annotations

import torch

from .format import (
    E4M3_MAX,
    GROUP,
    GROUP_BLOCK,
    ROW_BLOCK,
    SCALE_BIAS,
    SCALE_DTYPE,
    SCALE_INF_BYTE,
    SCALE_NAN_BYTE,
    SCALE_PAD,
    VALUE_DTYPE,
    blocked_view,
    dequantize,
    from_blocked,
    padded_groups,
    padded_rows,
    scale_bytes,
)

# Columns dequantized per step of the reference GEMM. FP32 chunks of A and B of this width
# bound the GEMM's transient memory; a full BF16 copy of either operand is never made.
_GEMM_K_CHUNK = 1024


def rceil_scale_bytes(amax: torch.Tensor) -> torch.Tensor:
    """E8M0 scale bytes (``uint8``) for per-group absolute maxima, by the RCEIL rule.

    ``scale = 2 ** ceil(log2(amax / 448))`` computed in FP32 as torchao does it: a NaN amax
    gives 0xFF, an infinite one 0xFE, and exponents are clamped to [-127, 127].
    """
    descale = amax.float() / E4M3_MAX
    exponent = torch.clamp(torch.ceil(torch.log2(descale)), -SCALE_BIAS, SCALE_BIAS) + SCALE_BIAS
    exponent = torch.where(torch.isinf(descale), float(SCALE_INF_BYTE), exponent)
    exponent = torch.where(torch.isnan(descale), float(SCALE_NAN_BYTE), exponent)
    return exponent.to(torch.uint8)


def _reciprocal_scales(exponent: torch.Tensor) -> torch.Tensor:
    """FP32 multipliers that map a group onto the E4M3 grid, matching torchao's RCEIL."""
    e = exponent.float()
    recip = torch.exp2(SCALE_BIAS - e)
    recip = torch.where(exponent == 0, 1.0, recip)
    recip = torch.where(exponent == SCALE_INF_BYTE, 2.0**-127, recip)
    return torch.where(exponent == SCALE_NAN_BYTE, float("nan"), recip)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``x`` ``[rows, K]`` (K a multiple of 32) group by group.

    Returns ``(values, scale_bytes)``: ``[rows, K]`` ``float8_e4m3fn`` and the row-major
    ``[rows, K/32]`` ``uint8`` scale bytes (not yet in the blocked layout).
    """
    rows, k = x.shape
    groups = x.reshape(rows, k // GROUP, GROUP).float()
    amax = groups.abs().amax(dim=-1)
    exponent = rceil_scale_bytes(amax)
    scaled = groups * _reciprocal_scales(exponent).unsqueeze(-1)
    values = torch.clamp(scaled, -E4M3_MAX, E4M3_MAX).to(VALUE_DTYPE)
    return values.reshape(rows, k), exponent


def to_blocked(scale_rows: torch.Tensor) -> torch.Tensor:
    """Row-major ``[rows, G]`` scale bytes -> flat blocked ``uint8`` buffer, padded with 127."""
    rows, groups = scale_rows.shape
    padded = torch.full(
        (padded_rows(rows), padded_groups(groups)),
        SCALE_PAD,
        dtype=torch.uint8,
        device=scale_rows.device,
    )
    padded[:rows, :groups] = scale_rows.view(torch.uint8)
    rb, gb = padded.shape[0] // ROW_BLOCK, padded.shape[1] // GROUP_BLOCK
    # [rb, 4 (r//32), 32 (r%32), gb, 4 (g%4)] -> [rb, gb, r%32, r//32, g%4]
    blocked = padded.view(rb, 4, 32, gb, 4).permute(0, 3, 2, 1, 4)
    return blocked.contiguous().flatten()


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``x`` ``[rows, K]`` to MXFP8: ``(values, blocked scales as float8_e8m0fnu)``."""
    values, exponent = quantize_rows(x)
    return values, to_blocked(exponent).view(SCALE_DTYPE)


def quantize_slice_(
    source: torch.Tensor, values: torch.Tensor, scales: torch.Tensor, column: int
) -> None:
    """Quantize ``source`` ``[tokens, width]`` into ``values[:tokens, column:column+width]``.

    Its scales go into the matching groups of the blocked buffer ``scales``; the padding rows
    up to the next multiple of 128 get scale byte 127 in those groups. Nothing else is written.
    ``width`` and ``column`` are multiples of 128, so the slice owns whole 512-byte chunks.
    """
    tokens, width = source.shape
    slice_values, exponent = quantize_rows(source)
    values[:tokens, column : column + width] = slice_values
    blocked = to_blocked(exponent)
    src = blocked_view(blocked, width // GROUP)
    dst = blocked_view(scales, values.shape[1] // GROUP)
    g0 = column // (GROUP * GROUP_BLOCK)
    dst[: src.shape[0], g0 : g0 + src.shape[1]] = src


def _row_scale_factors(scales: torch.Tensor, rows: int, k: int) -> torch.Tensor:
    return from_blocked(scales, rows, k // GROUP).view(SCALE_DTYPE).float()


def mm_into(
    a_values: torch.Tensor,
    a_scales: torch.Tensor,
    b_values: torch.Tensor,
    b_scales: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
) -> None:
    """``out[:M] = dequant(A) @ dequant(B).T (+ bias)``, accumulated in FP32.

    ``A`` is ``[M, K]`` and ``B`` ``[N, K]``, both with blocked scales. Operands are
    dequantized ``_GEMM_K_CHUNK`` columns at a time, so no full-width copy is made. Rows of
    ``out`` past M are not touched.

    The sums run through torch's matrix multiply, whose order of additions depends on the
    thread count and the BLAS library: results can differ in the last bits between thread
    counts (blocks of very different scales make that likelier). Under
    ``torch.use_deterministic_algorithms(True)`` the sum has a fixed order instead (see
    :func:`_mm_fixed_order`): the same bits for any thread count, at several times the cost.
    """
    m, k = a_values.shape
    n = b_values.shape[0]
    a_factors = _row_scale_factors(a_scales, m, k)
    b_factors = _row_scale_factors(b_scales, n, k)
    if torch.are_deterministic_algorithms_enabled():
        acc = _mm_fixed_order(a_values, a_factors, b_values, b_factors)
        if bias is not None:
            acc += bias.float()
        out[:m].copy_(acc)
        return
    acc = torch.zeros(m, n, dtype=torch.float32, device=a_values.device)
    for k0 in range(0, k, _GEMM_K_CHUNK):
        k1 = min(k, k0 + _GEMM_K_CHUNK)
        g0, g1 = k0 // GROUP, k1 // GROUP
        a = a_values[:, k0:k1].float().view(m, g1 - g0, GROUP) * a_factors[:, g0:g1, None]
        b = b_values[:, k0:k1].float().view(n, g1 - g0, GROUP) * b_factors[:, g0:g1, None]
        acc.addmm_(a.view(m, k1 - k0), b.view(n, k1 - k0).t())
    if bias is not None:
        acc += bias.float()
    out[:m].copy_(acc)


def _mm_fixed_order(
    a_values: torch.Tensor,
    a_factors: torch.Tensor,
    b_values: torch.Tensor,
    b_factors: torch.Tensor,
) -> torch.Tensor:
    """``A @ B.T`` in FP32, summed in an order no thread count changes.

    Per 32-column group the dot products of the E4M3 values are exact in FP64 (each product
    is a multiple of 2**-18 below 2**18, so 32 of them fit in 41 bits): any order gives the
    same sum. Scaled by the two power-of-two block scales (exact in FP64's range), the groups
    are then added in K order, elementwise, and the total is rounded to FP32 once.
    """
    m, k = a_values.shape
    n = b_values.shape[0]
    acc = torch.zeros(m, n, dtype=torch.float64, device=a_values.device)
    for g in range(k // GROUP):
        columns = slice(g * GROUP, (g + 1) * GROUP)
        exact = a_values[:, columns].double() @ b_values[:, columns].double().t()
        acc += exact * (a_factors[:, g, None].double() * b_factors[None, :, g].double())
    return acc.float()


def mm_slices_into(
    slices: list[torch.Tensor],
    b_values: torch.Tensor,
    b_scales: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
) -> None:
    """``out[:M] = cat(slices, -1) @ dequant(B).T (+ bias)``, accumulated in FP32: the W8A16
    product, the activations as they are (BF16, FP16 or FP32), the weight's E4M3 values
    times their scales (exact in FP32).

    Each slice is ``[M, width]`` (a view is fine) and starts at a multiple of 32 columns.
    The concatenation is never made: the sum runs over K in chunks of ``_GEMM_K_CHUNK``
    columns, each chunk's activations gathered in FP32 from the slices it spans and its
    weight dequantized, so transient memory stays bounded and the result does not depend on
    how K is split into slices (the same bits as for the concatenation). Rows of ``out``
    past M are not touched.

    torch's matrix multiply chooses the order of each chunk's sums (see :func:`mm_into`).
    Under ``torch.use_deterministic_algorithms(True)`` the order is fixed instead: per
    32-column group in FP64 (32 products of 16-bit values and scaled E4M3 values: exact
    unless their magnitudes span about 2**40), the groups added in K order, rounded to FP32
    once.
    """
    m = slices[0].shape[0]
    n, k = b_values.shape
    b_factors = _row_scale_factors(b_scales, n, k)
    fixed = torch.are_deterministic_algorithms_enabled()
    dtype = torch.float64 if fixed else torch.float32
    acc = torch.zeros(m, n, dtype=dtype, device=out.device)
    step = GROUP if fixed else _GEMM_K_CHUNK
    for k0 in range(0, k, step):
        k1 = min(k, k0 + step)
        g0, g1 = k0 // GROUP, k1 // GROUP
        b = b_values[:, k0:k1].float().view(n, g1 - g0, GROUP) * b_factors[:, g0:g1, None]
        acc.addmm_(_columns(slices, k0, k1, dtype), b.view(n, k1 - k0).t().to(dtype))
    if bias is not None:
        acc += bias.to(dtype)
    out[:m].copy_(acc)


def _columns(slices: list[torch.Tensor], k0: int, k1: int, dtype: torch.dtype) -> torch.Tensor:
    """Columns ``[k0, k1)`` of ``cat(slices, -1)`` in ``dtype``, from the slices they span."""
    pieces, first = [], 0
    for source in slices:
        width = source.shape[1]
        lo, hi = max(k0, first), min(k1, first + width)
        if lo < hi:
            pieces.append(source[:, lo - first : hi - first].to(dtype))
        first += width
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=1)


def mm(
    a_values: torch.Tensor,
    a_scales: torch.Tensor,
    b_values: torch.Tensor,
    b_scales: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """Allocating form of :func:`mm_into`: returns ``[M, N]`` in ``out_dtype``."""
    out = torch.empty(a_values.shape[0], b_values.shape[0], dtype=out_dtype, device=a_values.device)
    mm_into(a_values, a_scales, b_values, b_scales, bias, out)
    return out


__all__ = [
    "dequantize",
    "from_blocked",
    "mm",
    "mm_into",
    "mm_slices_into",
    "quantize",
    "quantize_rows",
    "quantize_slice_",
    "rceil_scale_bytes",
    "scale_bytes",
    "to_blocked",
]
