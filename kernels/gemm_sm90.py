"""CuTe DSL MXFP8 GEMM for sm_90a: ``out[:M] = dequant(A) @ dequant(B).T (+ bias)``.

Hopper's wgmma has no block scales. An E4M3 value times its power-of-two E8M0 scale is
exactly a BF16 value, so both kernels scale the FP8 operands into BF16 and run BF16 wgmma
with FP32 accumulation: the result differs from the exact-FP32 reference only by summation
order (gemm_sm90_common). (FP8 wgmma per 32-K group plus an FP32 promotion ``acc += tmp *
sa * sb`` was slower and its FP8 tensor-core group sums truncate small products;
docs/gemm_log.md.)

* gemm_sm90_tiled: 128 x 128, 128 x 64, 192 x 128 or 64 x 128 output tiles, whole tiles
  per persistent CTA or (stream-K) the (tile, K stage) units split evenly over the CTAs;
  consumer warpgroups convert their A rows straight into RS-wgmma register fragments,
  converter warpgroups turn the weight tile into 16-bit shared memory. Tiles whose rows'
  scales span at most 21 binades take FP16 wgmma with per-row reference exponents (half
  the conversion work, gemm_sm90_f16), found by a scan launch before the GEMM
  (gemm_sm90_refs); the others BF16.
* gemm_sm90_swap_ab (up to 64 tokens): the operands swap, the weight is the wgmma M operand
  converted into register fragments, the tokens the N operand; the (64-row weight tile, K
  stage) units are split evenly over all SMs (stream-K, a small per-stream workspace for
  the partial sums). The GEMM then streams the weight once, at half of BF16's bytes. With
  ``bf16_tokens`` (measured faster at 32 tokens on five of six shapes; the heuristic takes it
  from 17 tokens on) a launch before it converts the tokens to BF16 once
  (gemm_sm90_tokens), so that no CTA converts all of them; with ``tile_w`` 128 two
  consumer warpgroups share each stage's token tile, on 64 weight rows each; with
  ``cluster`` 2 CTA pairs share it through TMA multicast.

Which kernel and tile serve a call comes from a table measured on the H200 per (tokens, N,
K) (gemm_sm90_table, written by ``benchmarks/gemm.py --tune``), else from a heuristic.

This module holds the host side: the config, the table lookup and the heuristic, the
support predicate (a call it refuses is the caller's to serve: the ops run the reference,
with a one-time warning naming the reason), the compile cache (keyed on compile-time facts;
the token count M is a runtime value) and the launch (integer arguments through a reusable
buffer: see launcher.py). gemm_sm90_buffers holds the per-stream workspaces and the small
launches that run before a GEMM.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch

from mxfp8_fusion.format import CHUNK_BYTES, GROUP, ceil_div, fail, padded_rows

from . import gemm_sm90_buffers as buffers
from .constants import TILE_K8, TILE_K16
from .launcher import compile_for_scalars, launch, raw_stream

# The two kernels, by the name their table specs and ``GemmConfig.kernel`` give them.
SWAP_AB = "swap-ab"
TILED = "tiled"
# The swap-AB kernel's token tiles (its wgmma N): each thread of a consumer warpgroup loads
# whole 16-byte units of the tile's tokens (8 per token and stage). 128 only with tile_w
# 128 (BF16 tokens through TMA; a 64 x 128 accumulator per consumer).
_SWAP_AB_TILES = (8, 16, 32, 64, 128)


@dataclass(frozen=True)
class GemmConfig:
    """Compile-time tiling, and which kernel it is for.

    ``kernel`` ``"tiled"`` (gemm_sm90_tiled): output tile ``tile_m`` (128; 192 with three
    consumer warpgroups and one converter; 64 with two consumer warpgroups splitting K) x
    ``tile_n`` (128 or 64), ``stages`` FP8 stages of K 128, ``stages16`` 16-bit (BF16 or
    FP16) weight stages of K 64, and the persistent CTA count. ``converters``: its
    B-converter warpgroups (2 needs tile N 128). ``stream_k`` 1: it splits the (output
    tile, K stage) units evenly over its CTAs instead of giving each CTA whole tiles; 2
    (tile M 128 or 192): whole tiles for the full waves over its CTAs, and the units of the
    last, partial wave split evenly (a thin last wave takes one full wave along).
    ``f16`` 1: tiles whose rows' scales allow it take the FP16 path, found by a scan launch
    before the GEMM (gemm_sm90_refs); 0: every tile takes the BF16 path and nothing runs
    before the GEMM.

    ``kernel`` ``"swap-ab"`` (gemm_sm90_swap_ab), for at most ``tokens_tile`` tokens (8, 16,
    32 or 64; 0 for the tiled kernel): ``num_ctas`` CTAs sharing the (64-row weight tile, K
    stage) units, ``stages`` FP8 stages, ``consumers`` warpgroups converting alternate
    stages. ``bf16_tokens`` 1: a launch before the GEMM converts the tokens to BF16 once
    (gemm_sm90_tokens) and the kernel reads them through TMA instead of converting them in
    every CTA. ``tile_w`` 128 (with ``bf16_tokens`` and two consumers): a stage holds 128
    weight rows, each consumer converts 64 of them, and both read the stage's one token
    tile, so the tokens cross L2 half as often per weight byte. ``cluster`` 2 (with
    ``bf16_tokens``): CTA pairs take adjacent weight tiles over the same K stages, and each
    CTA loads one K half of every stage's token tile for both (TMA multicast), which halves
    the tokens' L2 traffic again.

    Raises:
        ValueError: naming ``kernel``, ``tokens_tile``, ``f16``, ``bf16_tokens``,
            ``tile_w`` or ``cluster`` where they do not go together.
    """

    kernel: str = TILED
    tile_n: int = 128
    stages: int = 4
    stages16: int = 4
    num_ctas: int = 132
    tokens_tile: int = 0
    consumers: int = 3
    converters: int = 1
    tile_m: int = 128
    stream_k: int = 0
    f16: int = 1
    bf16_tokens: int = 0
    tile_w: int = 64
    cluster: int = 1

    def __post_init__(self):
        if self.cluster != 1 and not (
            self.cluster == 2 and self.kernel == SWAP_AB and self.bf16_tokens
            and self.num_ctas % 2 == 0
        ):  # fmt: skip
            fail(ValueError, "cluster", "1, or 2 with swap-AB, bf16_tokens and an even num_ctas",
                 self.cluster)  # fmt: skip
        if self.tile_w != 64 and not (
            self.tile_w == 128 and self.kernel == SWAP_AB and self.bf16_tokens
            and self.consumers == 2
        ):  # fmt: skip
            fail(ValueError, "tile_w", "64, or 128 with swap-AB, bf16_tokens and 2 consumers",
                 self.tile_w)  # fmt: skip
        if self.bf16_tokens not in (0, 1) or (self.bf16_tokens and self.kernel != SWAP_AB):
            fail(ValueError, "bf16_tokens", "0, or 1 with the swap-AB kernel", self.bf16_tokens)
        if self.stream_k not in (0, 1, 2) or (self.stream_k and self.kernel != TILED) or (
            self.stream_k == 2 and self.tile_m == 64
        ):  # fmt: skip
            fail(ValueError, "stream_k", "0, 1 or 2 with the tiled kernel (2: tile_m 128 or 192)",
                 self.stream_k)  # fmt: skip
        if self.f16 not in (0, 1) or (self.f16 == 0 and self.kernel != TILED):
            fail(ValueError, "f16", "1, or 0 with the tiled kernel", self.f16)
        if self.kernel == SWAP_AB:
            if self.tokens_tile not in _SWAP_AB_TILES or (
                self.tokens_tile > SWAP_AB_MAX_TOKENS and self.tile_w == 64
            ):
                fail(ValueError, "tokens_tile", "8, 16, 32 or 64 (swap-AB; 128 with tile_w 128)",
                     self.tokens_tile)  # fmt: skip
        elif self.kernel == TILED:
            if self.tokens_tile != 0:
                fail(ValueError, "tokens_tile", "0 (the tiled kernel has none)", self.tokens_tile)
        else:
            fail(ValueError, "kernel", f"{SWAP_AB!r} or {TILED!r}", repr(self.kernel))


# FP8 + 16-bit stages of the tiled kernel: an FP8 stage holds A and B (128 + tile N rows x K
# 128) and their scale chunks, a 16-bit stage B only (tile N x K 64). At 4096 tokens 4 + 4
# was the fastest split, 6% ahead of 3 + 6 (docs/gemm_log.md).
_TILED_STAGES = {128: (4, 4), 64: (4, 4)}
# 192-row tiles: 4 + 4 stages overflow shared memory; 3 + 4 was the fastest split that fits
# (3.73 ms at 4096 tokens; docs/gemm_log.md)
_TALL_STAGES = (3, 4)
# Time of a 192-row tile over a 128-row one (tile N 128, 4096 tokens: 0.394 vs 0.281 ms per
# round of 132 tiles). Three consumer warpgroups keep the tensor pipe busier than two, so a
# row costs 7% less, but the tile is coarser: at 512 tokens 128-row tiles win (0.557 vs
# 0.690 ms), at 4096 and 16384 192-row ones (3.727 vs 3.939, 17.4 vs 18.9 ms).
_TALL_TILE_COST = 1.4


# Tokens up to this many take the swap-AB kernel: it streams the weight once, converting
# it in registers, while every CTA converts all tokens (so its cost grows with them).
SWAP_AB_MAX_TOKENS = 64
# ... and with tile_w 128 (two consumers sharing each stage's BF16 token tile)
SWAP_AB_WIDE_MAX_TOKENS = _SWAP_AB_TILES[-1]
_SMEM_BYTES = 227 * 1024
# heuristic_config's model of the tiled schedules: stream-K's units cost this much more than
# whole tiles' (the fixups, a segment's start and end), and the units of a stream-K tail
# after whole waves (stream_k 2) _TAIL_COST. Fitted to the measured table's six shapes
# (benchmarks/results/gemm_tune.json, with the tail and the 192-row stream-K kernel at its
# whole-tile register split): over the 64 points the model decides, its choice takes 1.005
# of the fastest measured config's time (geometric mean), at most 1.061. Without the tail
# candidates the same receipt scores 1.019, at most 1.12.
_STREAM_K_COST = 1.15
_TAIL_COST = 1.4
# heuristic_config's swap-AB range: at 48 and 64 tokens the tiled kernel's stream-K schedule
# beat it on every measured shape (0.75 vs 1.11 of cuBLAS BF16's time at N 7168, K 43008)
_HEURISTIC_SWAP_AB_TOKENS = 32
# From here on the swap-AB kernel converts the tokens once before the GEMM (bf16_tokens): at
# 32 tokens 0.61-0.69 of cuBLAS BF16's time on five measured shapes against 0.73-0.80 when
# every CTA converts them (docs/gemm_log.md, variant 38)
_HEURISTIC_BF16_TOKENS = 17
# ... on CTA pairs sharing each stage's token tile (cluster 2, where the SM count is even): at
# 32 tokens it won on five of six measured shapes by 1-5% (0.58-0.78 of cuBLAS BF16's time;
# docs/gemm_log.md, variant 40)
# With pairs (an even SM count) from 9 tokens (a 16-token tile) on weights of at least this
# many rows: at 16 tokens 1.002-1.082x as fast as plain swap-AB on the five measured shapes
# with N >= 4096 (tied at N 4096), 0.90x at N 2048 (benchmarks/results/gemm_tune.json)
_HEURISTIC_PAIRS_16_MIN_N = 4096
# 33-64 tokens on weights of at least this many rows take swap-AB with tile_w 128: 0.69-0.84
# of cuBLAS BF16's time at 48-64 tokens on the four measured shapes with N >= 7168, against
# 0.75-0.97 for the tiled kernel; it lost on N 4096 and 2048 (docs/gemm_log.md, variant 39)
_HEURISTIC_W128_MIN_N = 7168


def swap_ab_config(
    tokens: int,
    num_sms: int = 132,
    consumers: int = 3,
    bf16_tokens: int = 0,
    tile_w: int = 64,
    cluster: int = 1,
) -> GemmConfig:
    """The swap-AB config for ``tokens`` <= SWAP_AB_MAX_TOKENS (SWAP_AB_WIDE_MAX_TOKENS
    with ``tile_w`` 128): wgmma N = the next power of two >= tokens (at least 8), as many
    FP8 stages (up to 16) as shared memory holds.

    By default three consumer warpgroups (512 threads, 128 registers each). Four (640
    threads, 96 registers) fit up to 32 tokens but measured 2-4% slower at 1 and 16 tokens
    with the stream-K split (docs/gemm_log.md). ``bf16_tokens``, ``tile_w``, ``cluster``:
    see :class:`GemmConfig`.

    Raises:
        ValueError: naming ``tokens`` above that limit, or ``consumers`` other than
            2 or 3 (or 4 up to 32 tokens), or ``tile_w`` as :class:`GemmConfig` does.
    """
    limit = SWAP_AB_WIDE_MAX_TOKENS if tile_w == 128 else SWAP_AB_MAX_TOKENS
    if tokens > limit:
        fail(ValueError, "tokens", f"at most {limit} for this swap-AB schedule", tokens)
    tokens_tile = 8
    while tokens_tile < tokens:
        tokens_tile *= 2
    if consumers not in (2, 3) and not (consumers == 4 and tokens_tile <= 32):
        fail(ValueError, "consumers", "2 or 3 (or 4 up to 32 tokens)", consumers)
    if bf16_tokens:
        # per stage the weight, its scales and the BF16 token tile; consumers 2..: an FP32
        # partial-sum tile (not with tile_w 128: each consumer finishes its own rows)
        per_stage = tile_w * TILE_K8 + tokens_tile * TILE_K8 * 2 + CHUNK_BYTES + 16
        fixed = (consumers - 1) * 64 * tokens_tile * 4 * (tile_w == 64) + 6144
    else:
        per_stage = (64 + tokens_tile) * TILE_K8 + 2 * CHUNK_BYTES + 16
        # per consumer: two BF16 token half-tiles; consumers 2..: an FP32 partial-sum tile
        fixed = consumers * (2 * tokens_tile * TILE_K16 * 2 + 64 * tokens_tile * 4) + 4096
    stages = min(16, (_SMEM_BYTES - fixed) // per_stage)
    return GemmConfig(
        kernel=SWAP_AB,
        stages=stages,
        num_ctas=num_sms,
        tokens_tile=tokens_tile,
        consumers=consumers,
        bf16_tokens=bf16_tokens,
        tile_w=tile_w,
        cluster=cluster,
    )


def config_from_spec(spec: str, tokens: int, num_sms: int = 132) -> GemmConfig:
    """The config a table entry names: ``"swap-ab"`` (:func:`swap_ab_config` for ``tokens``;
    ``"swap-ab cC"`` with C consumer warpgroups, ``" bf16-tokens"`` with ``bf16_tokens``;
    ``"swap-ab w128 bf16-tokens"`` with ``tile_w`` 128; after bf16-tokens an optional
    ``" mc2"`` for ``cluster`` 2) or ``"tiled MxN cC"`` with an optional ``" stream-k"``
    (``stream_k`` 1) or ``" stream-k-tail"`` (2), an optional ``" sF+H"`` and an optional
    ``" bf16"`` (tile M x N, C B-converter warpgroups, F FP8 and H 16-bit stages, by default
    the standard split of that tile; M 64 is the k-split tile, two consumer warpgroups on
    alternate K halves of the same 64 rows; bf16: every tile on the BF16 path, no reference
    scan).

    Raises:
        ValueError: on a spec of neither form, or swap-AB above SWAP_AB_MAX_TOKENS.
    """
    parts = spec.split()
    if parts[:1] == [SWAP_AB]:
        return _swap_ab_spec(spec, parts[1:], tokens, num_sms)
    f16 = 1
    if len(parts) > 3 and parts[-1] == "bf16":
        parts.pop()
        f16 = 0
    stage_split = None
    if len(parts) > 3 and parts[-1][:1] == "s" and parts[-1][1:2].isdigit():
        counts = parts.pop()[1:].split("+")
        if len(counts) != 2 or not all(c.isdigit() for c in counts):
            raise ValueError(f"spec: stages as sF+H, got {spec!r}")
        stage_split = (int(counts[0]), int(counts[1]))
    ok = len(parts) in (3, 4) and parts[0] == TILED and all(w in _STREAM_K_WORDS for w in parts[3:])
    dims = parts[1].split("x") if ok else []
    if not (ok and len(dims) == 2 and all(d.isdigit() for d in dims) and parts[2][1:].isdigit()):
        raise ValueError(
            f"spec: 'swap-ab' or 'tiled MxN cC [stream-k|stream-k-tail] [sF+H] [bf16]', "
            f"got {spec!r}"
        )
    tile_m, tile_n = int(dims[0]), int(dims[1])
    stages, stages16 = _TALL_STAGES if tile_m == 192 else _TILED_STAGES.get(tile_n, (4, 4))
    if stage_split is not None:
        stages, stages16 = stage_split
    return GemmConfig(
        kernel=TILED,
        tile_m=tile_m,
        tile_n=tile_n,
        converters=int(parts[2][1:]),
        stages=stages,
        stages16=stages16,
        num_ctas=num_sms,
        stream_k=_STREAM_K_WORDS.index(parts[3]) + 1 if len(parts) == 4 else 0,
        f16=f16,
    )


_BF16_TOKENS = "bf16-tokens"  # the swap-AB spec word for bf16_tokens
_STREAM_K_WORDS = ("stream-k", "stream-k-tail")  # the tiled spec words for stream_k 1 and 2
_W128 = "w128"  # the swap-AB spec word for tile_w 128 (two consumers, bf16_tokens)
_MC2 = "mc2"  # the swap-AB spec word for cluster 2 (the token tile multicast to CTA pairs)


def _swap_ab_spec(spec: str, words: list[str], tokens: int, num_sms: int) -> GemmConfig:
    """``"swap-ab [cC] [bf16-tokens]"`` or ``"swap-ab w128 bf16-tokens"``, either with
    bf16-tokens optionally followed by ``" mc2"``."""
    cluster = 2 if words[-1:] == [_MC2] else 1
    words = words[: len(words) - (cluster == 2)]
    bf16_tokens = int(words[-1:] == [_BF16_TOKENS])
    if cluster == 2 and not bf16_tokens:
        raise ValueError(f"spec: {_MC2!r} follows {_BF16_TOKENS!r}, got {spec!r}")
    words = words[: len(words) - bf16_tokens]
    wide = words == [_W128] and bf16_tokens
    if words not in ([], ["c2"], ["c3"], ["c4"]) and not wide:
        raise ValueError(
            f"spec: 'swap-ab [cC] [{_BF16_TOKENS} [{_MC2}]]' or "
            f"'swap-ab {_W128} {_BF16_TOKENS} [{_MC2}]', got {spec!r}"
        )
    limit = swap_ab_limit(spec)
    if tokens > limit:
        raise ValueError(f"spec: {spec!r} serves at most {limit} tokens, got {tokens}")
    if wide:
        return swap_ab_config(tokens, num_sms, 2, 1, tile_w=128, cluster=cluster)
    consumers = int(words[0][1:]) if words else 3
    return swap_ab_config(tokens, num_sms, consumers, bf16_tokens, cluster=cluster)


def swap_ab_limit(spec: str) -> int:
    """The most tokens the swap-AB spec ``spec`` serves (0 for a tiled spec)."""
    words = spec.split()
    if words[:1] != [SWAP_AB]:
        return 0
    return SWAP_AB_WIDE_MAX_TOKENS if _W128 in words else SWAP_AB_MAX_TOKENS


def spec_of(cfg: GemmConfig) -> str:
    """The :func:`config_from_spec` spec of ``cfg`` (stage counts only where not standard)."""
    if cfg.kernel == SWAP_AB:
        mc = f" {_MC2}" if cfg.cluster == 2 else ""
        if cfg.tile_w == 128:
            return f"{SWAP_AB} {_W128} {_BF16_TOKENS}{mc}"
        spec = SWAP_AB if cfg.consumers == 3 else f"{SWAP_AB} c{cfg.consumers}"
        return spec + (f" {_BF16_TOKENS}" if cfg.bf16_tokens else "") + mc
    sk = f" {_STREAM_K_WORDS[cfg.stream_k - 1]}" if cfg.stream_k else ""
    spec = f"{TILED} {cfg.tile_m}x{cfg.tile_n} c{cfg.converters}{sk}"
    standard = config_from_spec(spec, 1, cfg.num_ctas)
    if (standard.stages, standard.stages16) != (cfg.stages, cfg.stages16):
        spec += f" s{cfg.stages}+{cfg.stages16}"
    return spec + ("" if cfg.f16 else " bf16")


def table_spec(tokens: int, n: int, k: int, num_sms: int = 132) -> str | None:
    """The measured table's spec for ``tokens`` at (N, K), or None where the table has no
    such shape (or was measured on another SM count). The entry is that of the smallest
    measured token count at or above ``tokens`` (the largest one past the end), so a
    swap-AB entry always has a tile that holds ``tokens``."""
    from . import gemm_sm90_table as table

    rows = table.TABLE.get((n, k)) if num_sms == table.NUM_SMS else None
    if not rows:
        return None
    for bucket, spec in rows:
        if bucket >= tokens:
            return spec
    return rows[-1][1]


@functools.lru_cache(maxsize=4096)
def choose_config(tokens: int, n: int, k: int, num_sms: int = 132) -> GemmConfig:
    """Kernel and tile by (tokens, N, K): the measured table (gemm_sm90_table) where it has
    the shape, else :func:`heuristic_config`."""
    spec = table_spec(tokens, n, k, num_sms)
    if spec is not None and not (spec.split()[0] == SWAP_AB and tokens > swap_ab_limit(spec)):
        return config_from_spec(spec, tokens, num_sms)
    return heuristic_config(tokens, n, k, num_sms)


def heuristic_config(tokens: int, n: int, k: int, num_sms: int = 132) -> GemmConfig:
    """Kernel and tile heuristic by (tokens, N, K), for shapes the table does not hold; its
    rules follow what won in the measured table's shapes (gemm_sm90_table, docs/gemm_log.md).

    Up to 32 tokens the swap-AB kernel (it streams the weight once), from 17 tokens on with
    the tokens converted once before the GEMM and on CTA pairs (from 9 tokens on weights of
    4096 rows or more, where the SM count allows pairs); up to 64 tokens on weights of
    7168 rows or more, with two consumers sharing 128-row weight stages (``tile_w`` 128).
    Otherwise the tiled kernel: on narrow weights (fewer than 24 column tiles of 128) up to 256
    tokens in 128 x 64 tiles whose (tile, K stage) units are split over all CTAs (stream-K);
    else the schedule :func:`_tiled_schedule` models as fastest.
    """
    if tokens <= _HEURISTIC_SWAP_AB_TOKENS:
        pairs_16 = tokens > 8 and n >= _HEURISTIC_PAIRS_16_MIN_N and num_sms % 2 == 0
        if tokens < _HEURISTIC_BF16_TOKENS and not pairs_16:
            return swap_ab_config(tokens, num_sms)
        return swap_ab_config(tokens, num_sms, bf16_tokens=1, cluster=2 - num_sms % 2)
    if tokens <= SWAP_AB_MAX_TOKENS and n >= _HEURISTIC_W128_MIN_N:
        return config_from_spec(f"{SWAP_AB} {_W128} {_BF16_TOKENS}", tokens, num_sms)
    if _narrow(tokens, n):
        return config_from_spec("tiled 128x64 c1 stream-k", tokens, num_sms)
    return config_from_spec(_tiled_schedule(tokens, n, k, num_sms), tokens, num_sms)


def _narrow(tokens: int, n: int) -> bool:
    """The heuristic's narrow-weight rule: fewer than 24 column tiles of 128, at most 256
    tokens (128 x 64 tiles, stream-K)."""
    return ceil_div(n, 128) < 24 and tokens <= 256


def _tiled_schedule(tokens: int, n: int, k: int, num_sms: int) -> str:
    """The tiled schedule with the least modeled time, in 128 x 128 tile times, over 128-row
    tiles (two B-converter warpgroups: 3% faster at 512 tokens, docs/gemm_log.md) and
    192-row ones: whole tiles per CTA, where the busiest CTA sets the time
    (:func:`_busiest`); stream-K, where every CTA streams an equal share of the units, each
    _STREAM_K_COST times a whole tile's (in 192-row tiles only where they pad no more rows
    than 128-row ones); or whole waves and a stream-K tail, _TAIL_COST per unit (where there
    is a whole wave)."""
    times = {}
    for tile_m, spec in ((128, "tiled 128x128 c2"), (192, "tiled 192x128 c1")):
        costs = _tile_costs(tokens, n, tile_m)
        times[spec] = _busiest(costs, num_sms)
        if tile_m == 128 or ceil_div(tokens, 192) * 192 <= ceil_div(tokens, 128) * 128:
            times[f"{spec} stream-k"] = _STREAM_K_COST * sum(costs) / num_sms
        whole = _whole_waves(len(costs), ceil_div(k, 128), num_sms) * num_sms
        if whole:
            tail = _TAIL_COST * sum(costs[whole:]) / num_sms
            times[f"{spec} stream-k-tail"] = _busiest(costs[:whole], num_sms) + tail
    return min(times, key=times.get)


def _whole_waves(tiles: int, k_tiles: int, num_sms: int) -> int:
    """The full waves a stream_k 2 launch runs as whole tiles (gemm_sm90_tiled._waves)."""
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


_TORCH_TO_CUTLASS = {
    torch.bfloat16: "BFloat16",
    torch.float16: "Float16",
    torch.float32: "Float32",
}


def _served(a_values, a_scales, b_values, b_scales, bias, out):
    """``(M, N, K)`` where this kernel serves the call, else a sentence saying why not
    (cheap: no compile, no sync; one read of each tensor fact). The kernels read every
    tensor through 16-byte aligned loads (TMA for the values and the scale chunks) and the
    bias as a contiguous vector of a dtype they are compiled for; other calls are left to
    the caller's fallback."""
    if a_values.dim() != 2 or b_values.dim() != 2 or out.dim() != 2:
        return "values and out must be 2-D"
    m, k = a_values.shape
    n = b_values.shape[0]
    if a_values.dtype != torch.float8_e4m3fn or b_values.dtype != torch.float8_e4m3fn:
        return "values must be float8_e4m3fn"
    if out.dtype not in (torch.bfloat16, torch.float16):
        return f"out dtype {out.dtype} is neither BF16 nor FP16"
    if k % GROUP != 0 or k == 0 or n == 0 or b_values.shape[1] != k:
        return f"K={k} must be a positive multiple of {GROUP} in both operands, N={n} positive"
    if a_values.stride(1) != 1 or a_values.stride(0) != k:
        return "A's rows must be K contiguous bytes"
    if not b_values.is_contiguous() or out.stride(1) != 1 or out.shape[1] != n:
        return "B must be contiguous, out N contiguous columns"
    if (out.stride(0) * out.element_size()) % 16 != 0 or out.shape[0] < m:
        return "out's rows must start 16-byte aligned and be at least M"
    if a_values.data_ptr() % 16 or b_values.data_ptr() % 16 or out.data_ptr() % 16:
        return "values and out must be 16-byte aligned"
    if a_scales.data_ptr() % 16 or b_scales.data_ptr() % 16:
        return "scale buffers must be 16-byte aligned"
    if bias is not None and (bias.dtype not in _TORCH_TO_CUTLASS or bias.stride(-1) != 1):
        return "bias must be a contiguous BF16, FP16 or FP32 vector"
    return m, n, k


def refusal(a_values, a_scales, b_values, b_scales, bias, out) -> str | None:
    """Why these kernels do not serve the call, None where they do (cheap: no compile, no
    sync)."""
    shape = _served(a_values, a_scales, b_values, b_scales, bias, out)
    return shape if isinstance(shape, str) else None


# Launch arguments after the six addresses (A, A scales, B, B scales, bias, out): the token
# count, the A scale chunk count, then more addresses: the swap-AB kernel's stream-K
# workspace (partial sums, flags); the tiled kernel's per-row FP16 references of A and of B
# (gemm_sm90_refs), then its stream-K workspace (partial sums, flags).
_KINDS = "qqqqqqiiqq"
_TILED_KINDS = "qqqqqqiiqqqq"


def kinds(cfg: GemmConfig) -> str:
    """The launch-argument kinds of ``cfg``'s kernel (see launcher.Launcher)."""
    return _KINDS if cfg.kernel == SWAP_AB else _TILED_KINDS


def compiled_config(cfg: GemmConfig) -> GemmConfig:
    """The config ``cfg``'s kernel is compiled for: ``f16`` only decides what the host runs
    before the launch, so both values share one compile (no new config on the common path)."""
    return cfg if cfg.f16 else replace(cfg, f16=1)


@functools.cache
def _compiled(cfg: GemmConfig, n: int, k: int, ld_out: int, out_dtype, bias_dtype):
    """Compile for the compile-time facts only; the token count M stays a runtime value."""
    import cutlass

    out_ty = getattr(cutlass, _TORCH_TO_CUTLASS[out_dtype])
    bias_ty = getattr(cutlass, _TORCH_TO_CUTLASS[bias_dtype]) if bias_dtype else None
    if cfg.kernel == SWAP_AB:
        from .gemm_sm90_swap_ab import MXFP8SwapABGemmSm90 as kernel_class
    else:
        from .gemm_sm90_tiled import MXFP8TiledGemmSm90 as kernel_class

    kernel = kernel_class(cfg, n, k, ld_out, bias_ty, out_ty)
    return compile_for_scalars(kernel, kinds(cfg))


@functools.cache
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def run(a_values, a_scales, b_values, b_scales, bias, out, config: GemmConfig | None = None):
    """``out[:M] = dequant(A) @ dequant(B).T (+ bias)`` on the current stream; no sync.

    ``config`` overrides the heuristic (tests, benchmarks). Compiles once per (config, N, K,
    out row stride, out dtype, bias dtype).

    Raises:
        ValueError: where :func:`refusal` gives a reason (saying it), or ``config`` is a
            swap-AB config whose token tile is below M; nothing is launched.
    """
    shape = _served(a_values, a_scales, b_values, b_scales, bias, out)
    if isinstance(shape, str):
        raise ValueError(f"the SM90 GEMM does not serve this call: {shape}")
    _run(*shape, a_values, a_scales, b_values, b_scales, bias, out, config)


def run_if_served(a_values, a_scales, b_values, b_scales, bias, out) -> str | None:
    """:func:`run` where :func:`refusal` has no reason: None once launched, else the reason
    (nothing launched). The ops' one entry point: checks and launches in one pass over the
    call's facts."""
    shape = _served(a_values, a_scales, b_values, b_scales, bias, out)
    if isinstance(shape, str):
        return shape
    _run(*shape, a_values, a_scales, b_values, b_scales, bias, out, None)
    return None


def _run(m, n, k, a_values, a_scales, b_values, b_scales, bias, out, config) -> None:
    if m == 0:
        return
    device = a_values.device
    dev = device.index if device.index is not None else 0
    cfg = config or choose_config(m, n, k, _num_sms(dev))
    if cfg.kernel == SWAP_AB and m > cfg.tokens_tile:
        raise ValueError(f"config tokens_tile={cfg.tokens_tile} is below the {m} tokens")
    out_ptr = out.data_ptr()
    a_scales_ptr, b_scales_ptr = a_scales.data_ptr(), b_scales.data_ptr()
    args = (
        a_values.data_ptr(),
        a_scales_ptr,
        b_values.data_ptr(),
        b_scales_ptr,
        bias.data_ptr() if bias is not None else out_ptr,
        out_ptr,
        m,
        a_scales.numel() // CHUNK_BYTES,
    )
    stream = raw_stream(dev)
    if cfg.kernel == SWAP_AB:
        if cfg.bf16_tokens:
            tokens = buffers.convert_tokens(args[0], a_scales_ptr, m, k, device, dev, stream)
            args = (tokens.data_ptr(), *args[1:])
        partials, flags = buffers.stream_buffers(
            "stream-K", device, dev, stream, buffers.swap_ab_workspace_slots(cfg),
            lambda slots: buffers.fresh_workspace(device, slots),
        )  # fmt: skip
        args += (partials.data_ptr(), flags.data_ptr())
    else:
        if cfg.f16:
            refs = buffers.launch_row_references(
                a_scales_ptr, b_scales_ptr, m, n, k, device, dev, stream
            )
        else:
            refs = buffers.bf16_references(m, n, device, dev, stream)
        refs_ptr = refs.data_ptr()
        args += (refs_ptr, refs_ptr + 4 * padded_rows(m))
        if cfg.stream_k:
            partials, flags = buffers.stream_buffers(
                "tiled stream-K", device, dev, stream, buffers.tiled_workspace_floats(cfg),
                lambda size: buffers.fresh_tiled_workspace(device, size),
            )  # fmt: skip
            args += (partials.data_ptr(), flags.data_ptr())
        else:
            args += (out_ptr, out_ptr)  # unused
    key = (
        compiled_config(cfg), n, k, out.stride(0), out.dtype,
        bias.dtype if bias is not None else None, dev,
    )  # fmt: skip
    launch(key, lambda: _compiled(*key[:-1]), kinds(cfg), (*args, stream), dev)
