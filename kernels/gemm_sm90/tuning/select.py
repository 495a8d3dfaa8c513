"""Which SM90 GEMM kernel and tile serve a call: the measured table, else a heuristic.

:func:`choose_config` is the one place a call's config comes from. The table
(``table.json``, read by ``table``, written by ``benchmarks/gemm.py --tune`` from the
receipt it names) holds, per device, toolchain and weight shape (N, K) measured, the fastest
schedule at each measured token count. Shapes it does not hold take
:func:`heuristic_config`, whose rules follow what won in the table's shapes. No torch, no cutlass: everything here runs on a CPU.
"""

from __future__ import annotations

import functools

from ....format import Activation, ceil_div, fail
from ..config import (
    SWAP_AB_MAX_TOKENS,
    GemmConfig,
    SwapABConfig,
    TiledConfig,
    own_stages,
    swap_ab_config,
    swap_ab_token_limit,
    tiled_config,
)
from . import proven, table

# Time of a 192-row tile over a 128-row one (tile N 128, 4096 tokens: 0.394 vs 0.281 ms per
# round of 132 tiles). Three consumer warpgroups keep the tensor pipe busier than two, so a
# row costs 7% less, but the tile is coarser: at 512 tokens 128-row tiles win (0.557 vs
# 0.690 ms), at 4096 and 16384 192-row ones (3.727 vs 3.939, 17.4 vs 18.9 ms).
_TALL_TILE_COST = 1.4
# The heuristic's model of the tiled schedules: stream-K's units cost this much more than
# whole tiles' (the fixups, a segment's start and end), and the units of a stream-K tail
# after whole waves (stream_k 2) _TAIL_COST. Fitted to the measured table's six shapes
# (benchmarks/results/gemm_tune.json): over the 64 points the model decides, its choice
# takes 1.005 of the fastest measured config's time (geometric mean), at most 1.061.
# Without the tail candidates the same receipt scores 1.019, at most 1.12.
_STREAM_K_COST = 1.15
_TAIL_COST = 1.4
# The swap-AB range: at 48 and 64 tokens the tiled kernel's stream-K schedule beat it on
# every measured shape (0.75 vs 1.11 of cuBLAS BF16's time at N 7168, K 43008)
_HEURISTIC_SWAP_AB_TOKENS = 32
# From here on the swap-AB kernel converts the tokens once before the GEMM (bf16_tokens): at
# 32 tokens 0.61-0.69 of cuBLAS BF16's time on five measured shapes against 0.73-0.80 when
# every CTA converts them (docs/gemm_log.md)
_HEURISTIC_BF16_TOKENS = 17
# ... on CTA pairs sharing each stage's token tile (cluster 2, where the SM count is even):
# at 32 tokens it won on five of six measured shapes by 1-5% (0.58-0.78 of cuBLAS BF16's
# time). With pairs from 9 tokens (a 16-token tile) on weights of at least this many rows:
# at 16 tokens 1.002-1.082x as fast as plain swap-AB on the five measured shapes with
# N >= 4096 (tied at N 4096), 0.90x at N 2048 (benchmarks/results/gemm_tune.json)
_HEURISTIC_PAIRS_16_MIN_N = 4096
# 33-64 tokens on weights of at least this many rows take swap-AB with tile_w 128: 0.69-0.84
# of cuBLAS BF16's time at 48-64 tokens on the four measured shapes with N >= 7168, against
# 0.75-0.97 for the tiled kernel; it lost on N 4096 and 2048 (docs/gemm_log.md)
_HEURISTIC_W128_MIN_N = 7168


# the fields an entry holds only where they are not the default
_TILED_OPTIONAL = ("stages", "fp16_tiles")
_SWAP_AB_OPTIONAL = ("token_tiles", "split_tail", "tile_aligned")


def config_of(entry: dict, tokens: int, num_sms: int = 132) -> GemmConfig:
    """The config a table entry gives ``tokens`` on ``num_sms`` SMs. An entry holds a
    schedule's fields: ``kernel`` ``"swap-ab"`` with ``consumers``, ``bf16_tokens``,
    ``tile_w`` and ``cluster`` (the token tile and stage count follow from ``tokens``;
    optionally ``token_tiles``, ``split_tail`` and ``tile_aligned``), or
    ``"tiled"`` with ``tile_m``, ``tile_n``, ``converters``, ``stream_k`` and optionally
    ``stages`` (FP8, 16-bit) and ``fp16_tiles``; either optionally ``activation`` (``"bf16"``:
    W8A16; without it W8A8).

    Raises:
        ValueError: naming ``entry`` where it holds a field its kernel has not; naming the
            field where the config refuses it (a swap-AB entry's ``tokens`` where it cannot
            hold them).
    """
    swap_ab = entry["kernel"] == SwapABConfig.kernel
    fields = SwapABConfig.schedule_fields if swap_ab else TiledConfig.schedule_fields
    optional = _SWAP_AB_OPTIONAL if swap_ab else _TILED_OPTIONAL
    known = {"kernel", "activation", *fields, *optional}
    if not known.issuperset(entry):
        fail(ValueError, "entry", f"only the fields {sorted(known)}", sorted(set(entry) - known))
    activation = Activation.of(entry.get("activation", Activation.W8A8))
    if swap_ab:
        return swap_ab_config(
            tokens, num_sms, **{k: entry[k] for k in fields}, activation=activation,
            token_tiles=entry.get("token_tiles", 0), split_tail=entry.get("split_tail", False),
            tile_aligned=entry.get("tile_aligned", False),
        )  # fmt: skip
    stages = entry.get("stages")
    return tiled_config(
        entry["tile_m"], entry["tile_n"], entry["converters"], entry["stream_k"], num_sms,
        tuple(stages) if stages else None, entry.get("fp16_tiles", True), activation,
    )  # fmt: skip


def schedule(cfg: GemmConfig) -> dict:
    """The table entry of ``cfg`` (:func:`config_of`'s inverse): its schedule fields, without
    those the token count sets; a tiled entry holds ``stages`` only where they are not the
    tile's standard split and ``fp16_tiles`` only where False. The tools' contenders carry
    it in their receipts, and the table is written from it."""
    entry: dict = {"kernel": cfg.kernel}
    if not cfg.activation.quantized:
        entry["activation"] = cfg.activation.value
    if isinstance(cfg, SwapABConfig):
        if cfg.token_tiles:
            entry["token_tiles"] = cfg.token_tiles
        if cfg.split_tail:
            entry["split_tail"] = True
        if cfg.tile_aligned:
            entry["tile_aligned"] = True
        return {**entry, **{f: getattr(cfg, f) for f in cfg.schedule_fields}}
    if not cfg.fp16_tiles and cfg.activation.quantized:  # W8A16: always, said by activation
        entry["fp16_tiles"] = False
    if own_stages(cfg):
        entry["stages"] = [cfg.stages, cfg.stages16]
    return {**entry, **{f: getattr(cfg, f) for f in cfg.schedule_fields}}


def token_limit(entry: dict) -> int | None:
    """The most tokens a swap-AB entry serves (None for a tiled one or a token-tiled one:
    any count)."""
    if entry["kernel"] != SwapABConfig.kernel or entry.get("token_tiles"):
        return None
    return swap_ab_token_limit(entry["tile_w"], entry.get("activation", Activation.W8A8))


def table_entry(
    tokens: int,
    n: int,
    k: int,
    num_sms: int = 132,
    device: str | None = table.MEASURED_DEVICE,
    activation: Activation = Activation.W8A8,
) -> dict | None:
    """The measured table's entry for ``tokens`` at (N, K) on ``device`` (its name as CUDA
    reports it) with ``num_sms`` SMs and ``activation``, or None where no such table holds
    the shape. The entry is that of the smallest measured token count at or above ``tokens``
    (the largest one past the end)."""
    rows = table.shapes(device, num_sms, activation).get((n, k))
    if not rows:
        return None
    for bucket, entry in rows:
        if bucket >= tokens:
            return entry
    return rows[-1][1]


@functools.lru_cache(maxsize=4096)
def choose_config(
    tokens: int,
    n: int,
    k: int,
    num_sms: int = 132,
    device: str | None = table.MEASURED_DEVICE,
    activation: Activation = Activation.W8A8,
) -> GemmConfig:
    """Kernel and tile by (tokens, N, K) on ``device`` with ``num_sms`` SMs (by default the
    H200 the table was measured on): the measured table where it has the shape (and the
    entry's kernel holds ``tokens``), else :func:`heuristic_config`.

    ``activation`` W8A16 (the A operand read as BF16 from its slices; its string ``"bf16"``
    is taken too): the measured W8A16 table where it has the shape, else 256-token tiles
    where they fill most SMs, else the schedule the W8A8 choice makes, for that activation
    (:func:`for_activation`).

    Only a schedule proven on a GPU (gemm_sm90.tuning.proven) is chosen; any other gives way to
    :data:`PROVEN_FALLBACK`, whole 128 x 128 tiles, which serve every token count."""
    activation = Activation.of(activation)
    cfg = _choice(tokens, n, k, num_sms, device, activation)
    if proven.holds(schedule(cfg)):
        return cfg
    return tiled_config(*PROVEN_FALLBACK, num_sms=num_sms, activation=activation)


PROVEN_FALLBACK = (128, 128, 2, 0)
"""(tile M, tile N, converters, stream-K) of the config that takes the place of an unproven
choice: the tiled kernel's first schedule, whole tiles (tests hold it proven)."""


def _choice(tokens, n, k, num_sms, device, activation: Activation) -> GemmConfig:
    """:func:`choose_config` before the proven-schedule rule."""
    entry = table_entry(tokens, n, k, num_sms, device, activation)
    if entry is not None and tokens <= (token_limit(entry) or tokens):
        return config_of(entry, tokens, num_sms)
    if not activation.quantized:
        if _w8a16_token_tiles(tokens, n, num_sms):
            return swap_ab_config(
                tokens, num_sms, 2, True, 128, 1, activation, token_tiles=_W8A16_TOKEN_TILE
            )  # fmt: skip
        w8a8 = choose_config(tokens, n, k, num_sms, device)
        return for_activation(w8a8, tokens, activation)
    return heuristic_config(tokens, n, k, num_sms)


# W8A16 without a measured table: 256-token tiles (swap_ab.token_tiles) where they fill at
# least this share of the SMs, else the W8A8 choice's schedule. In the H100 W8A16 tune
# (benchmarks/results/gemm_tune_w8a16.json) they were the fastest at every point of 1024
# tokens and more but one (N 2048: 64 tiles), and at 512 tokens on N 7168 (112 tiles);
# where fewer tiles fill the SMs other schedules won.
_W8A16_TOKEN_TILE = 256
_W8A16_TOKEN_TILES_FILL = 0.8


def _w8a16_token_tiles(tokens: int, n: int, num_sms: int) -> bool:
    tiles = ceil_div(tokens, _W8A16_TOKEN_TILE) * ceil_div(n, 128)
    return tokens > 256 and tiles >= _W8A16_TOKEN_TILES_FILL * num_sms


def for_activation(cfg: GemmConfig, tokens: int, activation: Activation) -> GemmConfig:
    """``cfg``'s schedule for ``activation``: the one mapping from a W8A8 schedule (the
    choice's, the tune's candidates) to the config that serves the same call.

    W8A8: ``cfg`` itself. W8A16 (BF16 activations): swap-AB reads the tokens through TMA
    as ``bf16_tokens`` does; tiled takes the BF16 path with the stage counts that fit BF16
    A stages (config.tiled_config). 192-row tiles become 128-row ones: they won W8A8
    points by spreading A's conversion over three consumers, which W8A16 does not have,
    and with BF16 A only two FP8 stages of them fit. 64-row tiles (two consumers splitting
    K) become 128-row stream-K tiles of the same width: their W8A16 builds gave varying
    bits on an H100 (docs/gemm_log.md), so they are not proven."""
    activation = Activation.of(activation)
    if activation.quantized:
        return cfg
    if isinstance(cfg, SwapABConfig):
        return swap_ab_config(
            tokens, cfg.num_ctas, cfg.consumers, True, cfg.tile_w, cfg.cluster, activation
        )
    if cfg.tile_m == 192:
        return tiled_config(128, 128, 2, cfg.stream_k, cfg.num_ctas, activation=activation)
    if cfg.tile_m == 64:
        converters = 2 if cfg.tile_n == 128 else 1
        return tiled_config(128, cfg.tile_n, converters, 1, cfg.num_ctas, activation=activation)
    return tiled_config(
        cfg.tile_m, cfg.tile_n, cfg.converters, cfg.stream_k, cfg.num_ctas, activation=activation
    )


def heuristic_config(tokens: int, n: int, k: int, num_sms: int = 132) -> GemmConfig:
    """Kernel and tile heuristic by (tokens, N, K), for shapes the table does not hold.

    Up to 32 tokens the swap-AB kernel (it streams the weight once), from 17 tokens on with
    the tokens converted once before the GEMM and on CTA pairs (from 9 tokens on weights of
    4096 rows or more, where the SM count allows pairs); up to 64 tokens on weights of
    7168 rows or more, with two consumers sharing 128-row weight stages (``tile_w`` 128).
    Otherwise the tiled kernel: on narrow weights (fewer than 24 column tiles of 128) up to
    256 tokens in 128 x 64 tiles whose (tile, K stage) units are split over all CTAs
    (stream-K); else the schedule :func:`_tiled_schedule` models as fastest.
    """
    if tokens <= _HEURISTIC_SWAP_AB_TOKENS:
        pairs_16 = tokens > 8 and n >= _HEURISTIC_PAIRS_16_MIN_N and num_sms % 2 == 0
        if tokens < _HEURISTIC_BF16_TOKENS and not pairs_16:
            return swap_ab_config(tokens, num_sms)
        return swap_ab_config(tokens, num_sms, bf16_tokens=True, cluster=2 - num_sms % 2)
    if tokens <= SWAP_AB_MAX_TOKENS and n >= _HEURISTIC_W128_MIN_N:
        return swap_ab_config(tokens, num_sms, 2, bf16_tokens=True, tile_w=128)
    if _narrow(tokens, n):
        return tiled_config(128, 64, 1, stream_k=1, num_sms=num_sms)
    return _tiled_schedule(tokens, n, k, num_sms)


def _narrow(tokens: int, n: int) -> bool:
    """The heuristic's narrow-weight rule: fewer than 24 column tiles of 128, at most 256
    tokens (128 x 64 tiles, stream-K)."""
    return ceil_div(n, 128) < 24 and tokens <= 256


def _tiled_schedule(tokens: int, n: int, k: int, num_sms: int) -> GemmConfig:
    """The tiled schedule with the least modeled time, in 128 x 128 tile times, over 128-row
    tiles (two B-converter warpgroups: 3% faster at 512 tokens, docs/gemm_log.md) and
    192-row ones: whole tiles per CTA, where the busiest CTA sets the time
    (:func:`_busiest`); stream-K, where every CTA streams an equal share of the units, each
    _STREAM_K_COST times a whole tile's (in 192-row tiles only where they pad no more rows
    than 128-row ones); or whole waves and a stream-K tail, _TAIL_COST per unit (where there
    is a whole wave). Ties go to the first modeled."""
    times = {}
    for tile_m, converters in ((128, 2), (192, 1)):
        costs = _tile_costs(tokens, n, tile_m)
        times[(tile_m, converters, 0)] = _busiest(costs, num_sms)
        if tile_m == 128 or ceil_div(tokens, 192) * 192 <= ceil_div(tokens, 128) * 128:
            times[(tile_m, converters, 1)] = _STREAM_K_COST * sum(costs) / num_sms
        whole = whole_waves(len(costs), ceil_div(k, 128), num_sms) * num_sms
        if whole:
            tail = _TAIL_COST * sum(costs[whole:]) / num_sms
            times[(tile_m, converters, 2)] = _busiest(costs[:whole], num_sms) + tail
    tile_m, converters, stream_k = min(times, key=times.get)
    return tiled_config(tile_m, 128, converters, stream_k, num_sms)


def whole_waves(tiles: int, k_tiles: int, num_sms: int) -> int:
    """The full waves a stream_k 2 launch runs as whole tiles (the kernel's own count:
    gemm_sm90.tiled.schedule._waves)."""
    grid = min(tiles * k_tiles, num_sms)
    waves, rest = divmod(tiles, grid)
    return waves - 1 if waves and (rest * 8 < grid or rest * k_tiles < grid) else waves


def _tile_costs(tokens: int, n: int, tile_m: int) -> list[float]:
    """Each output tile's work in 128 x 128 tile times, in the tiled kernel's order: full row
    tiles first, the partial one last. A partial tile is charged a third (its B conversion)
    plus two thirds times its share of live consumer warpgroups: an estimate, not a
    measurement."""
    n_tiles = ceil_div(n, 128)
    full_m, rest = divmod(tokens, tile_m)
    cost = _TALL_TILE_COST if tile_m == 192 else 1.0
    costs = [cost] * (full_m * n_tiles)
    if rest:
        live = ceil_div(rest, 64) * 64 / tile_m
        costs += [cost * (1 + 2 * live) / 3] * n_tiles
    return costs


def _busiest(costs: list[float], num_sms: int) -> float:
    """The largest sum of the ``costs`` that one of ``num_sms`` CTAs takes round-robin."""
    return max(sum(costs[c::num_sms]) for c in range(min(num_sms, len(costs))))
