"""The quantizer's bytes against torchao's to_mx (RCEIL) and to_blocked, bit for bit."""

import pytest
import torch
from helpers.edge_cases import EDGE_BLOCK_NAMES, edge_block_tensor, expected_byte

from mxfp8_fusion import format as fmt
from mxfp8_fusion import reference

to_mx_module = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
torchao_utils = pytest.importorskip("torchao.prototype.mx_formats.utils")

DTYPES = [torch.bfloat16, torch.float16]


def torchao_rceil(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """torchao's (values bytes, scale bytes); FP16 goes in upcast to FP32 (torchao takes no FP16)."""
    src = x.float() if x.dtype == torch.float16 else x
    scale, values = to_mx_module.to_mx(
        src, torch.float8_e4m3fn, fmt.GROUP, to_mx_module.ScaleCalculationMode.RCEIL
    )
    return values.view(torch.uint8), scale.view(torch.uint8)


def random_wide_range(rows: int, k: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    lo, hi = (-60, 60) if dtype == torch.bfloat16 else (-14, 14)
    exponents = torch.randint(lo, hi, (rows, k // fmt.GROUP, 1), generator=gen).float()
    x = torch.randn(rows, k // fmt.GROUP, fmt.GROUP, generator=gen) * torch.exp2(exponents)
    return x.reshape(rows, k).to(dtype)


@pytest.mark.parametrize("dtype", [*DTYPES, torch.float32])  # FP32: MXFP8Linear.float()
@pytest.mark.parametrize("shape", [(1, 32), (7, 96), (129, 256), (300, 1024)])
def test_random_data_matches_torchao(dtype, shape):
    x = random_wide_range(*shape, dtype, seed=shape[0])
    values, scales = reference.quantize_rows(x)
    ref_values, ref_scales = torchao_rceil(x)
    assert torch.equal(values.view(torch.uint8), ref_values)
    assert torch.equal(scales, ref_scales)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", EDGE_BLOCK_NAMES)
def test_edge_blocks(name, dtype):
    x = edge_block_tensor(name, dtype)
    values, scales = reference.quantize_rows(x)
    ref_values, ref_scales = torchao_rceil(x)
    assert scales.item() == expected_byte(name, dtype)
    assert torch.equal(scales, ref_scales)
    assert torch.equal(values.view(torch.uint8), ref_values)


def test_edge_block_semantics():
    """What the table promises beyond bytes: NaN blocks read back NaN, Inf saturates."""
    nan_block = edge_block_tensor("nan", torch.bfloat16)
    nan_values, nan_scale = reference.quantize_rows(nan_block)
    assert torch.isnan(reference.dequantize(*reference.quantize(nan_block))).all()
    inf_values, _ = reference.quantize_rows(edge_block_tensor("inf", torch.bfloat16))
    assert inf_values.float()[0, 0].item() == fmt.E4M3_MAX
    zero_values, _ = reference.quantize_rows(edge_block_tensor("zeros", torch.float16))
    assert not zero_values.float().any()
    assert nan_scale.item() == 0xFF and nan_values.shape == (1, 32)


@pytest.mark.parametrize("rows", [1, 127, 128, 129, 300])
@pytest.mark.parametrize("groups", [1, 3, 4, 9])
def test_blocked_layout_matches_torchao(rows, groups):
    gen = torch.Generator().manual_seed(rows * 100 + groups)
    scales = torch.randint(1, 255, (rows, groups), generator=gen, dtype=torch.uint8)
    ours = reference.to_blocked(scales)
    theirs = torchao_utils.to_blocked(scales)  # pads with 0 where ours pads with 127
    assert ours.numel() == theirs.numel() == fmt.scale_bytes(rows, groups * fmt.GROUP)
    live = theirs != 0
    assert torch.equal(ours[live], theirs[live])
    assert (ours[~live] == fmt.SCALE_PAD).all()
    assert int(live.sum()) == rows * groups
    assert torch.equal(reference.from_blocked(ours, rows, groups), scales)


def test_scale_offset_formula_matches_layout():
    rows, k = 300, 9 * fmt.GROUP
    grid = torch.arange(rows * 9, dtype=torch.int64).view(rows, 9)
    r = torch.arange(rows).view(-1, 1).expand(rows, 9)
    g = torch.arange(9).view(1, -1).expand(rows, 9)
    offsets = fmt.scale_offset(r, g, k)
    flat = torch.full((fmt.scale_bytes(rows, k),), -1, dtype=torch.int64)
    flat[offsets.flatten()] = grid.flatten()
    padded = torch.full((384, 12), -1, dtype=torch.int64)
    padded[:rows, :9] = grid
    blocked = padded.view(3, 4, 32, 3, 4).permute(0, 3, 2, 1, 4).flatten()
    assert torch.equal(flat, blocked)


def test_dequantize_roundtrip_is_close():
    x = torch.randn(64, 256, dtype=torch.bfloat16)
    values, scales = reference.quantize(x)
    back = reference.dequantize(values, scales)
    # E4M3 keeps 3 mantissa bits (relative error <= 2**-4 for normals); elements far below
    # their group's max land on the subnormal grid, whose half step is 2**-10 * scale.
    scale = reference.from_blocked(scales, 64, 8).view(fmt.SCALE_DTYPE).float()
    scale = scale.repeat_interleave(fmt.GROUP, dim=1)
    bound = x.float().abs() * 2**-4 + scale * 2**-10
    assert ((back - x.float()).abs() <= bound).all()


NAN_AND_INF = [n for n in EDGE_BLOCK_NAMES if "nan" in n or "inf" in n]


@pytest.mark.parametrize("dtype", [*DTYPES, torch.float32])
@pytest.mark.parametrize("name", NAN_AND_INF)
def test_nan_and_inf_blocks_match_the_installed_torchao(name, dtype):
    """The contract the README states: torchao's to_mx (RCEIL) bit for bit, from torchao
    0.18 on, NaN and Inf blocks included. A block holding a NaN is NaN throughout: scale byte
    0xFF and every value E4M3 NaN (torchao 0.17 still wrote the block's other values, scaled
    by 2**-128). A block with an Inf and no NaN: scale byte 0xFE, the Inf saturated to 448."""
    x = edge_block_tensor(name, dtype)
    values, scales = reference.quantize_rows(x)
    ref_values, ref_scales = torchao_rceil(x)
    assert torch.equal(scales, ref_scales) and torch.equal(values.view(torch.uint8), ref_values)
    if "nan" in name:
        assert scales.item() == 0xFF and ((values.view(torch.uint8) & 0x7F) == 0x7F).all()
    else:
        assert scales.item() == 0xFE and values.float().abs().max().item() == fmt.E4M3_MAX
