"""The GEMM tune's search space: the configs ``benchmarks/gemm.py --tune`` times at each
point (:func:`candidates`), and the config choice from before the measured table
(:func:`main_heuristic`, the sweep's ``--before``). Beside the validity rules (``config``),
the choice (``select``) and the measured table (``table``) it shapes. No call takes this
path; no torch, no cutlass.
"""

from __future__ import annotations

from dataclasses import replace

from ....format import Activation
from ..config import (
    SWAP_AB_MAX_TOKENS,
    SWAP_AB_WIDE_MAX_TOKENS,
    TOKEN_TILES,
    W8A16_TOKEN_LIMIT,
    GemmConfig,
    own_stages,
    swap_ab_config,
    tiled_config,
)
from . import proven
from .select import _busiest, _tile_costs, for_activation, schedule


def main_heuristic(tokens: int, n: int, k: int, num_sms: int) -> GemmConfig:
    """The config choice before the measured table existed: swap-AB up to 64
    tokens, else whole tiles per CTA, 128 x 64 below one round of 128 x 128 tiles, 192 x 128
    where the round-robin model favours it."""

    if tokens <= SWAP_AB_MAX_TOKENS:
        return swap_ab_config(tokens, num_sms)
    if -(-tokens // 128) * -(-n // 128) < num_sms:
        return tiled_config(128, 64, 1, num_sms=num_sms)
    busiest = {m: _busiest(_tile_costs(tokens, n, m), num_sms) for m in (128, 192)}
    if busiest[192] < busiest[128]:
        return tiled_config(192, 128, 1, num_sms=num_sms)
    return tiled_config(128, 128, 2, num_sms=num_sms)


def candidates(
    tokens: int,
    n: int,
    k: int,
    num_sms: int,
    leave_out=(),
    activation: Activation = Activation.W8A8,
) -> list[GemmConfig]:
    """The configs the tune times at one point: swap-AB up to 64 tokens (converting the
    tokens in every CTA or once before the GEMM) and with 128-row weight stages from 9 to 128
    tokens, the two with BF16 tokens also on CTA pairs (``cluster`` 2) from 9 tokens on; the
    pre-table heuristic's; the others where they won anywhere in an earlier full tune (whole
    tiles of 128 or 192 rows from 256 tokens on, stream-K up to 1024 with 192 rows, any count
    with 128; 64-row k-split tiles up to 128 tokens); whole waves with a stream-K tail from
    192 tokens on (128 x 64 tiles up to 1024); and up to 256 tokens deeper FP8 pipelines and
    the stream-K configs without the reference scan (``fp16_tiles`` False). A config whose
    schedule (``select.schedule``) holds every field of one of the partial schedules in
    ``leave_out`` (e.g. ``{"kernel": "tiled", "stream_k": 1}``) is dropped, and so is one
    not proven on a GPU (gemm_sm90.tuning.proven).

    ``activation`` W8A16: the same schedules as the choice maps them for BF16 activations
    (``select.for_activation``: every tile on the BF16 path, the stage counts that fit BF16
    A stages, 192-row tiles as 128-row ones), each once, and those only W8A16 has
    (:func:`_w8a16_only`)."""

    def tiled(tile_m, tile_n, converters, stream_k=0, stages=None):
        return tiled_config(tile_m, tile_n, converters, stream_k, num_sms, stages)

    found = []
    if tokens <= SWAP_AB_MAX_TOKENS:
        found.append(swap_ab_config(tokens, num_sms))
        # the tokens converted once, before the GEMM
        found.append(swap_ab_config(tokens, num_sms, bf16_tokens=True))
    if 8 < tokens <= SWAP_AB_MAX_TOKENS:  # multicast to CTA pairs
        found.append(swap_ab_config(tokens, num_sms, bf16_tokens=True, cluster=2))
    if 8 < tokens <= SWAP_AB_WIDE_MAX_TOKENS:
        # shared by two 64-row consumers, alone and on CTA pairs
        found += [
            swap_ab_config(tokens, num_sms, 2, True, tile_w=128, cluster=pairs) for pairs in (1, 2)
        ]
    found.append(main_heuristic(tokens, n, k, num_sms))
    if tokens >= 256:
        found += [tiled(128, 128, 2), tiled(192, 128, 1)]
    if 256 <= tokens <= 512:
        found.append(tiled(128, 64, 1))
    found.append(tiled(128, 128, 2, 1))
    if tokens >= 192:
        # whole waves and a stream-K tail (below a wave of tiles the same as stream-K)
        found += [tiled(128, 128, 2, 2), tiled(192, 128, 1, 2)]
    if 192 <= tokens <= 1024:
        found.append(tiled(128, 64, 1, 2))
    if SWAP_AB_MAX_TOKENS < tokens <= 1024:
        found.append(tiled(192, 128, 1, 1))
    if tokens <= 256:
        found.append(tiled(128, 64, 1, 1))
    if tokens <= 128:
        found.append(tiled(64, 128, 2, 1))
    if tokens <= 256:
        # deeper FP8 pipelines (variant 36; these two won somewhere, 128 x 128 at 5 + 3 and
        # 192 x 128 at 4 + 3 nowhere)
        found.append(tiled(128, 64, 1, 1, (7, 4)))
        if tokens <= 128:
            found.append(tiled(64, 64, 1, 1, (11, 4)))
        # every tile on the BF16 path, no reference scan before the GEMM (variant 37), for
        # the stream-K configs with the tile's standard stages
        found += [
            replace(cfg, fp16_tiles=False)
            for cfg in found
            if cfg.kernel == "tiled" and cfg.stream_k == 1 and not own_stages(cfg)
        ]
    activation = Activation.of(activation)
    found = [for_activation(cfg, tokens, activation) for cfg in found]
    if not activation.quantized:
        found += _w8a16_only(tokens, num_sms)
    found = [cfg for cfg in found if not any(_holds(cfg, part) for part in leave_out)]
    return [cfg for cfg in dict.fromkeys(found) if proven.holds(schedule(cfg))]


def _w8a16_only(tokens: int, num_sms: int) -> list[GemmConfig]:
    """The W8A16 schedules no W8A8 one maps to: from 9 to 64 tokens 64-row weight stages
    shared by two consumers, alone and on CTA pairs; 128-row weight stages holding up to 256
    tokens in one tile (stream-K over the weight, alone and on CTA pairs), and from 64
    tokens on the token-tiled ones, at each token tile, with and without the last wave split
    over K, alone and on CTA pairs (swap_ab.token_tiles). Up to 64 tokens also the 64-row
    decode schedules on a grid aligned to the weight tiles (``tile_aligned``, variant 70):
    three consumers, and from 9 tokens two, alone and on CTA pairs."""
    found = []
    if tokens <= SWAP_AB_MAX_TOKENS:
        found += [
            swap_ab_config(tokens, num_sms, consumers, True, 64, pairs, Activation.W8A16,
                           tile_aligned=True)
            for consumers in ((3,) if tokens <= 8 else (2, 3))
            for pairs in ((1,) if tokens <= 8 else (1, 2))
        ]  # fmt: skip
    if 8 < tokens <= SWAP_AB_MAX_TOKENS:
        # 64-row stages shared by two consumers instead of three (variant 67), alone and
        # on CTA pairs
        found += [
            swap_ab_config(tokens, num_sms, 2, True, 64, pairs, Activation.W8A16)
            for pairs in (1, 2)
        ]
    if SWAP_AB_WIDE_MAX_TOKENS < tokens <= W8A16_TOKEN_LIMIT:
        found += [
            swap_ab_config(tokens, num_sms, 2, True, 128, pairs, Activation.W8A16)
            for pairs in (1, 2)
        ]
    if tokens >= 64:
        found += [
            swap_ab_config(tokens, num_sms, 2, True, 128, pairs, Activation.W8A16, tile, split)
            for tile in TOKEN_TILES
            for split in (False, True)
            for pairs in (1, 2)
        ]
    return found


def _holds(cfg: GemmConfig, part: dict) -> bool:
    """Whether ``cfg``'s schedule holds every field of the partial schedule ``part``."""
    entry = schedule(cfg)
    return all(key in entry and entry[key] == value for key, value in part.items())
