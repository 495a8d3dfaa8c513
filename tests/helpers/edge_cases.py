"""Named edge-case blocks of 32 elements and the RCEIL scale byte each must get.

byte = clamp(ceil(log2(amax / 448)), -127, 127) + 127; NaN anywhere -> 0xFF; Inf -> 0xFE.
Blocks are written in FP32 and cast to the source dtype, so a value the dtype cannot hold
(BF16 449, FP16 2**-118) arrives rounded or flushed; the bytes below account for that.
Shared by the reference tests (checked against torchao) and the GPU kernel tests.
"""

import math

import torch

NAN = math.nan
INF = math.inf


def edge_blocks(dtype: torch.dtype) -> dict[str, tuple[list[float], int]]:
    """name -> (leading elements of the block, rest zero; expected scale byte for ``dtype``)."""
    bf16 = dtype == torch.bfloat16
    big = torch.finfo(dtype).max
    tiny = torch.finfo(dtype).smallest_normal
    sub = tiny * 2.0**-3  # a subnormal of the dtype
    return {
        # amax 0: log2(0) = -inf, clamped to -127 -> byte 0; all values zero.
        "zeros": ([0.0], 0),
        "negative_zeros": ([-0.0, -0.0], 0),
        # amax 448: descale exactly 1 -> byte 127; 448 stays 448 (no saturation).
        "e4m3_max": ([448.0, -448.0, 1.0], 127),
        # Values on E4M3 rounding ties under scale 1 (round to nearest even).
        "ties": ([448.0, 1.0625, 3.125, -0.0087890625, 11.5, 13.0, 208.0, 232.0], 127),
        # amax 450: descale just above 1 -> ceil(log2) = 1 -> byte 128.
        "just_above_448": ([450.0, -3.0], 128),
        # FP16 holds 449 (byte 128); BF16 rounds it to 448 (byte 127).
        "449": ([449.0, -2.0], 127 if bf16 else 128),
        # amax 56 = 448 * 2**-3: descale exactly 2**-3 -> byte 124; 57 -> ceil -2 -> 125.
        "power_of_two_boundary": ([56.0, 1.0, -0.5], 124),
        "just_above_boundary": ([57.0, 1.0], 125),
        # amax 1: log2(1/448) = -8.81 -> ceil -8 -> byte 119; 1.0 becomes 256.
        "ones": ([1.0] * 32, 119),
        # amax 100 with tiny neighbours: log2(100/448) = -2.16 -> ceil -2 -> byte 125.
        "mixed_magnitudes": ([100.0, 1e-3, -3.0, 0.25, 7e-5, -99.0], 125),
        # BF16 max 3.39e38: log2(max/448) = 119.19 -> byte 247; FP16 65504: 7.19 -> 135.
        "dtype_max": ([big, -big, 1.0], 247 if bf16 else 135),
        # BF16 2**-126: log2 = -134.8, clamped -> 0; FP16 2**-14: -22.8 -> ceil -22 -> 105.
        "dtype_min_normal": ([tiny, -tiny, sub], 0 if bf16 else 105),
        # amax tiny/4 (BF16 2**-128 -> 0; FP16 2**-16: -24.8 -> ceil -24 -> 103).
        "subnormals": ([sub, -sub, sub * 2, sub / 2], 0 if bf16 else 103),
        # amax 2**-20: log2(2**-20/448) = -28.8 -> ceil -28 -> byte 99 (FP16: subnormal).
        "fp16_subnormal": ([2.0**-20, 2.0**-22], 99),
        # amax 2**-24 (FP16's smallest subnormal): -32.8 -> ceil -32 -> byte 95.
        "fp16_smallest": ([2.0**-24, -(2.0**-24)], 95),
        # BF16 amax 2**-118: log2 = -126.8 -> ceil -126 -> byte 1 (recip 2**126); its
        # BF16-subnormal neighbours scale to normal E4M3 values, which a flush-to-zero
        # multiply would lose. FP16 flushes all of it to 0 -> byte 0.
        "byte_one": ([2.0**-118, 2.0**-127, -(2.0**-130), 2.0**-125], 1 if bf16 else 0),
        # 448 * 2**-127: descale exactly 2**-127 -> byte 0; 450 * 2**-127 -> byte 1.
        "byte_zero_edge": ([448.0 * 2.0**-127, 2.0**-133], 0),
        "above_byte_zero_edge": ([450.0 * 2.0**-127, 2.0**-128], 1 if bf16 else 0),
        # amax 2**-125: descale 2**-133.8 is an FP32 subnormal -> clamped -> byte 0.
        "fp32_subnormal_descale": ([2.0**-125, 2.0**-126], 0),
        # 2**-130 (BF16 subnormal): log2 = -138.8, clamped -> byte 0; values 0.
        "bf16_subnormal": ([2.0**-130, -(2.0**-131)], 0),
        # A NaN anywhere: amax is NaN -> byte 0xFF, and the block reads back as NaN.
        "nan": ([1.0, NAN, 3.0], 255),
        "negative_nan": ([1.0, -NAN, -2.0], 255),
        "only_nan": ([NAN] * 32, 255),
        "nan_and_inf": ([INF, NAN, -5.0], 255),
        # +-Inf (no NaN): descale Inf -> byte 0xFE; Inf saturates to +-448, the rest -> 0.
        "inf": ([INF, 1.0, -7.0], 254),
        "negative_inf": ([-INF, 5.0], 254),
        "inf_with_big_finite": ([INF, big, -big / 3, 1.0], 254),
    }


EDGE_BLOCK_NAMES = sorted(edge_blocks(torch.bfloat16))


def edge_block_tensor(name: str, dtype: torch.dtype) -> torch.Tensor:
    """The named block as a ``[1, 32]`` tensor of ``dtype``."""
    head = edge_blocks(dtype)[name][0]
    block = torch.zeros(1, 32, dtype=torch.float32)
    block[0, : len(head)] = torch.tensor(head, dtype=torch.float32)
    return block.to(dtype)


def expected_byte(name: str, dtype: torch.dtype) -> int:
    return edge_blocks(dtype)[name][1]
