"""Named edge-case blocks of 32 elements with their expected RCEIL scale bytes.

byte = clamp(ceil(log2(amax / 448)), -127, 127) + 127; NaN anywhere -> 0xFF; Inf -> 0xFE.
"""

import math

import torch

NAN = math.nan
INF = math.inf


def _block(*head: float, fill: float = 0.0) -> list[float]:
    return list(head) + [fill] * (32 - len(head))


# name -> (block, expected scale byte for BF16 input, expected scale byte for FP16 input)
EDGE_BLOCKS = {
    # amax 0: log2(0) = -inf, clamped to -127 -> byte 0; all values zero.
    "zeros": (_block(), 0, 0),
    # amax 448: descale exactly 1 -> exponent 0 -> byte 127; 448 stays 448 (no saturation).
    "e4m3_max": (_block(448.0, -448.0, 1.0), 127, 127),
    # amax 450 (BF16 rounds 449 to 448, so BF16 uses 450; FP16 449 is exact): descale just
    # above 1 -> ceil(log2) = 1 -> byte 128 (BF16 449 -> 448 -> byte 127).
    "just_above_448": (_block(450.0, 3.0), 128, 128),
    "fp16_449": (_block(449.0, -2.0), 127, 128),
    # amax 56 = 448 * 2**-3: descale exactly 2**-3 -> byte 124.
    "power_of_two_boundary": (_block(56.0, 1.0, -0.5), 124, 124),
    # amax 57: descale above 2**-3 -> ceil = -2 -> byte 125.
    "just_above_boundary": (_block(57.0, 1.0), 125, 125),
    # amax 1: log2(1/448) = -8.81 -> ceil -8 -> byte 119; 1.0 becomes 256.
    "ones": (_block(fill=1.0), 119, 119),
    # amax 100 with tiny neighbours: log2(100/448) = -2.16 -> ceil -2 -> byte 125.
    "mixed_magnitudes": (_block(100.0, 1e-3, -3.0, 0.25, 7e-5, -99.0), 125, 125),
    # BF16 max 3.3895e38: log2(3.3895e38/448) = 119.19 -> ceil 120 -> byte 247.
    # FP16 max 65504: log2(65504/448) = 7.19 -> ceil 8 -> byte 135.
    "dtype_max": ("max", 247, 135),
    # amax 2**-130 (BF16 subnormal): log2 = -138.8 -> clamped to -127 -> byte 0; values 0.
    # FP16 flushes 2**-130 to 0 -> byte 0 as well.
    "bf16_subnormal": (_block(2.0**-130, -(2.0**-131)), 0, 0),
    # amax 2**-20 (FP16 subnormal): log2(2**-20/448) = -28.8 -> ceil -28 -> byte 99.
    "fp16_subnormal": (_block(2.0**-20, 2.0**-22), 99, 99),
    # A NaN anywhere: amax is NaN -> byte 0xFF, and the block reads back as NaN.
    "nan": (_block(1.0, NAN, 3.0), 255, 255),
    "negative_nan": (_block(1.0, -NAN), 255, 255),
    # +-Inf (no NaN): descale Inf -> byte 0xFE; Inf saturates to +-448, the rest -> 0.
    "inf": (_block(INF, 1.0), 254, 254),
    "negative_inf": (_block(-INF, 5.0), 254, 254),
}


def edge_block_tensor(name: str, dtype: torch.dtype) -> torch.Tensor:
    """The named block as a ``[1, 32]`` tensor of ``dtype``."""
    block = EDGE_BLOCKS[name][0]
    if block == "max":
        block = _block(torch.finfo(dtype).max, -1.0)
    return torch.tensor([block], dtype=torch.float32).to(dtype)


def expected_byte(name: str, dtype: torch.dtype) -> int:
    return EDGE_BLOCKS[name][1 if dtype == torch.bfloat16 else 2]
