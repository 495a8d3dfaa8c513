"""The SM90 GEMM kernels' compile-time configs: one frozen class per kernel (no torch, no
cutlass), and the constructors that give each tile its standard stage counts.

Which config serves a call is chosen in ``select``; the kernels read these fields in
their constructors (``tiled.kernel``, ``swap_ab.kernel``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...format import CHUNK_BYTES, Activation, fail
from .constants import TILE_K8, TILE_K16

# The swap-AB kernel's token tiles (its wgmma N): each thread of a consumer warpgroup loads
# whole 16-byte units of the tile's tokens (8 per token and stage).
SWAP_AB_TILES = (8, 16, 32, 64, 128, 192, 256)
# The most tokens a swap-AB launch serves, by tile_w: it streams the weight once, converting
# it in registers, while every CTA converts all tokens (so its cost grows with them). The
# 128-token tile only with tile_w 128 (BF16 tokens through TMA; a 64 x 128 accumulator per
# consumer). The one statement of the limit: everything else reads it here. W8A16 goes
# further (tile_w 128 up to 256 tokens; token_tiles any count): see swap_ab_token_limit.
SWAP_AB_TOKEN_LIMIT = {64: 64, 128: 128}
# W8A16 row-split tiles (tile_w 64 per consumer): the most tokens in one token tile (a wgmma
# N), and the token tiles a token_tiles schedule takes
W8A16_TOKEN_LIMIT = 256
TOKEN_TILES = (64, 128, 192, 256)
SWAP_AB_MAX_TOKENS = SWAP_AB_TOKEN_LIMIT[64]
SWAP_AB_WIDE_MAX_TOKENS = SWAP_AB_TOKEN_LIMIT[128]
_SMEM_BYTES = 227 * 1024


@dataclass(frozen=True)
class TiledConfig:
    """The tiled kernel (gemm_sm90.tiled): persistent CTAs over output tiles, or their
    (tile, K stage) units split evenly (stream-K).

    Raises:
        ValueError: naming ``stream_k`` where the tile does not allow it.
    """

    tile_m: int = 128
    """Output tile rows: 128 (two consumer warpgroups), 192 (three, one converter) or 64
    (two consumer warpgroups splitting K; stream-K only)."""
    tile_n: int = 128
    """Output tile columns: 128 or 64."""
    converters: int = 1
    """B-converter warpgroups: 1, or 2 with tile N 128."""
    stream_k: int = 0
    """0: whole tiles per CTA; 1: the (tile, K stage) units split evenly over the CTAs;
    2 (tile M 128 or 192): whole tiles for the full waves, the last wave's units split."""
    stages: int = 4
    """FP8 stages of K 128 (A, B and their scale chunks)."""
    stages16: int = 4
    """16-bit weight stages of K 64."""
    num_ctas: int = 132
    """Persistent CTAs (the SM count)."""
    fp16_tiles: bool = True
    """Tiles whose rows' scales allow it take the FP16 path, found by a scan launch before
    the GEMM (gemm_sm90.device.refs); False: every tile takes the BF16 path and nothing runs
    before the GEMM (the same compiled kernel)."""
    activation: Activation = Activation.W8A8
    """W8A16: A is BF16, read from its slices into BF16 stages (twice the FP8 stage's
    bytes), every tile on the BF16 path (``fp16_tiles`` False). Its string is taken too."""

    kernel = "tiled"
    schedule_fields = ("tile_m", "tile_n", "converters", "stream_k")
    """The fields of its schedule (select.schedule: the measured table's form), besides
    ``stages`` and ``fp16_tiles``, which it holds only where they are not the default."""

    def __post_init__(self):
        if self.stream_k not in (0, 1, 2) or (self.stream_k == 2 and self.tile_m == 64):
            fail(ValueError, "stream_k", "0, 1 or 2 (2: tile_m 128 or 192)", self.stream_k)
        object.__setattr__(self, "activation", Activation.of(self.activation))
        if not self.activation.quantized:
            if self.fp16_tiles:
                fail(ValueError, "fp16_tiles", "False with BF16 activations", self.fp16_tiles)
            if tiled_smem_bytes(self) > _SMEM_BYTES:
                fail(ValueError, "stages", f"stages that fit {_SMEM_BYTES} bytes of shared "
                     f"memory, {tiled_smem_bytes(self)} with BF16 A", (self.stages, self.stages16))  # fmt: skip


@dataclass(frozen=True)
class SwapABConfig:
    """The swap-AB kernel (gemm_sm90.swap_ab): the weight is the wgmma M operand, the tokens
    a small N tile; the (64-row weight tile, K stage) units are split evenly over the CTAs.

    Raises:
        ValueError: naming ``tokens_tile``, ``tile_w`` or ``cluster`` where they do not go
            together.
    """

    tokens_tile: int
    """The most tokens a launch serves (the wgmma N): 8, 16, 32 or 64; 128 with tile_w 128;
    192 or 256 with W8A16 row-split tiles; with ``token_tiles`` the token tile."""
    stages: int
    """FP8 weight stages."""
    consumers: int = 3
    """Consumer warpgroups, converting alternate stages."""
    bf16_tokens: bool = False
    """A launch before the GEMM converts the tokens to BF16 once (gemm_sm90.device.tokens) and the
    kernel reads them through TMA instead of converting them in every CTA."""
    tile_w: int = 64
    """Weight rows per stage. 128 (with bf16_tokens and two consumers): each consumer
    converts 64 of them and both read the stage's one token tile, so the tokens cross L2
    half as often per weight byte."""
    cluster: int = 1
    """2 (with bf16_tokens): CTA pairs take adjacent weight tiles over the same K stages, and
    each loads half of every stage's token tile for both (TMA multicast): one K half, or
    with ``token_tiles`` half the tile's tokens."""
    num_ctas: int = 132
    """CTAs sharing the units (the SM count; even with cluster 2)."""
    activation: Activation = Activation.W8A8
    """W8A16: the tokens are BF16 read straight from their slices through TMA, as
    ``bf16_tokens`` reads converted ones (which it therefore requires)."""
    token_tiles: int = 0
    """0: every token in one tile, the (weight tile, K stage) units split over the CTAs
    (stream-K). 64, 128, 192 or 256 (W8A16 row-split tiles): the tokens in tiles of
    that many, each persistent CTA taking whole (token tile, weight tile) pairs over all of
    K, so the launch serves any token count."""
    split_tail: bool = False
    """With ``token_tiles``: the tiles of the last, partial wave are split over K among the
    CTAs that wave would leave idle, and each tile's parts summed in a fixed order by the
    CTA of its last K part (swap_ab.token_tiles). Without it those CTAs wait."""
    tile_aligned: bool = False
    """Without ``token_tiles``: the units split over the most CTAs, up to ``num_ctas``, whose
    ranges each lie inside one weight tile (a tile in equal K parts) or cover whole tiles
    (:func:`aligned_groups`), so that no CTA's stages cross from one tile into the next and
    each split tile's parts are alike; some SMs may then stay idle. Without it, one CTA per
    SM, some of them spanning two tiles."""

    kernel = "swap-ab"
    schedule_fields = ("consumers", "bf16_tokens", "tile_w", "cluster")
    """The fields of its schedule (select.schedule): the token tile and stages follow from
    the token count (``token_tiles``, where not 0, is held too)."""

    def __post_init__(self):
        object.__setattr__(self, "activation", Activation.of(self.activation))
        if not self.activation.quantized and not self.bf16_tokens:
            fail(ValueError, "bf16_tokens", "True with BF16 activations", self.bf16_tokens)
        if self.cluster != 1 and not (
            self.cluster == 2 and self.bf16_tokens and self.num_ctas % 2 == 0
        ):
            fail(ValueError, "cluster", "1, or 2 with bf16_tokens and an even num_ctas",
                 self.cluster)  # fmt: skip
        w8a16 = not self.activation.quantized
        if self.tile_w != 64 and not (
            self.tile_w == 128 and self.bf16_tokens and self.consumers == 2
        ):
            fail(ValueError, "tile_w", "64, or 128 with bf16_tokens and 2 consumers", self.tile_w)
        if self.token_tiles and not (
            self.token_tiles in TOKEN_TILES and w8a16 and self.tile_w == 128
        ):
            fail(ValueError, "token_tiles", f"0, or one of {TOKEN_TILES} with BF16 activations "
                 "and tile_w 128", self.token_tiles)  # fmt: skip
        if self.split_tail and not self.token_tiles:
            fail(ValueError, "split_tail", "False without token_tiles", self.split_tail)
        if self.tile_aligned and self.token_tiles:
            fail(ValueError, "tile_aligned", "False with token_tiles", self.tile_aligned)
        limit = swap_ab_token_limit(self.tile_w, self.activation)
        if (
            self.tokens_tile not in SWAP_AB_TILES
            or self.tokens_tile > limit
            or (self.token_tiles and self.tokens_tile != self.token_tiles)
        ):
            fail(ValueError, "tokens_tile", f"one of {SWAP_AB_TILES} up to {limit} for this "
                 "schedule (token_tiles: that tile)", self.tokens_tile)  # fmt: skip


GemmConfig = TiledConfig | SwapABConfig


def swap_ab_token_limit(tile_w: int = 64, activation: Activation | str = Activation.W8A8) -> int:
    """The most tokens one token tile of a swap-AB launch with ``tile_w`` weight rows per
    stage holds (a ``token_tiles`` launch serves any count, in tiles)."""
    if tile_w > 64 and not Activation.of(activation).quantized:
        return W8A16_TOKEN_LIMIT
    return SWAP_AB_TOKEN_LIMIT.get(tile_w, SWAP_AB_MAX_TOKENS)


# FP8 + 16-bit stages of the tiled kernel: an FP8 stage holds A and B (128 + tile N rows x K
# 128) and their scale chunks, a 16-bit stage B only (tile N x K 64). 4 + 4 was the fastest
# split at 4096 tokens (docs/gemm_log.md, 'Numbers behind the kernel sources').
_TILED_STAGES = (4, 4)
# 192-row tiles: 4 + 4 stages overflow shared memory; 3 + 4 was the fastest split that fits
# (docs/gemm_log.md, 'Numbers behind the kernel sources')
_TALL_STAGES = (3, 4)
# W8A16: a stage's A tile is BF16, twice its FP8 bytes, so fewer FP8 stages fit beside the
# four 16-bit ones (tiled_smem_bytes); the most that fit, until a W8A16 tune says otherwise
_W8A16_STAGES = {64: (4, 4), 128: (3, 4), 192: (2, 4)}
_W8A16_NARROW_STAGES = (4, 4)  # 128 x 64 tiles


def tiled_smem_bytes(cfg: TiledConfig) -> int:
    """Shared memory of the tiled kernel's stages for ``cfg`` (its pipelines and rings are a
    few kilobytes more): per FP8 stage A (FP8, or BF16 with BF16 activations) and B of K
    128 and their scale chunks, per 16-bit stage B of K 64."""
    a_bytes = cfg.activation.input_bytes
    a_chunks = (1 if cfg.tile_m <= 128 else 2) if cfg.activation.quantized else 0
    stage8 = (cfg.tile_m * a_bytes + cfg.tile_n) * TILE_K8 + (a_chunks + 1) * CHUNK_BYTES
    return cfg.stages * stage8 + cfg.stages16 * cfg.tile_n * TILE_K16 * 2 + _TILED_FIXED_BYTES


_TILED_FIXED_BYTES = 4096  # barriers, the reference ring, alignment


def tiled_config(
    tile_m: int,
    tile_n: int,
    converters: int,
    stream_k: int = 0,
    num_sms: int = 132,
    stages: tuple[int, int] | None = None,
    fp16_tiles: bool = True,
    activation: Activation | str = Activation.W8A8,
) -> TiledConfig:
    """The tiled config of that tile and schedule on ``num_sms`` CTAs, with the tile's
    standard (FP8, 16-bit) stage counts unless ``stages`` gives them. With ``activation``
    W8A16: BF16 A stages, every tile on the BF16 path."""
    activation = Activation.of(activation)
    if not activation.quantized:
        fp16_tiles = False
    stages8, stages16 = stages or _standard_stages(tile_m, tile_n, activation)
    return TiledConfig(
        tile_m=tile_m, tile_n=tile_n, converters=converters, stream_k=stream_k,
        stages=stages8, stages16=stages16, num_ctas=num_sms, fp16_tiles=fp16_tiles,
        activation=activation,
    )  # fmt: skip


def swap_ab_config(
    tokens: int,
    num_sms: int = 132,
    consumers: int = 3,
    bf16_tokens: bool = False,
    tile_w: int = 64,
    cluster: int = 1,
    activation: Activation | str = Activation.W8A8,
    token_tiles: int = 0,
    split_tail: bool = False,
    tile_aligned: bool = False,
) -> SwapABConfig:
    """The swap-AB config for ``tokens`` <= SWAP_AB_MAX_TOKENS (SWAP_AB_WIDE_MAX_TOKENS
    with ``tile_w`` 128; 256 with W8A16 row-split tiles; any count with ``token_tiles``):
    wgmma N = the next power of two >= tokens (at least 8; 192 between 129 and 192 tokens;
    ``token_tiles`` where given), as many FP8 stages (up to 16) as shared memory holds.

    By default three consumer warpgroups (512 threads, 128 registers each). Four (640
    threads, 96 registers) fit up to 32 tokens but measured slower at 1 and 16 tokens
    with the stream-K split (docs/gemm_log.md). ``bf16_tokens``, ``tile_w``, ``cluster``:
    see :class:`SwapABConfig`. ``activation`` W8A16 reads BF16 tokens from
    their slices as ``bf16_tokens`` reads converted ones (so it sets ``bf16_tokens``).

    Raises:
        ValueError: naming ``tokens`` above that limit, or ``consumers`` other than
            2 or 3 (or 4 up to 32 tokens), or ``tile_w`` as :class:`SwapABConfig` does.
    """
    activation = Activation.of(activation)
    limit = swap_ab_token_limit(tile_w, activation)
    if tokens > limit and not token_tiles:
        fail(ValueError, "tokens", f"at most {limit} for this swap-AB schedule", tokens)
    tokens_tile = 8
    while tokens_tile < tokens:
        tokens_tile *= 2
    if 128 < tokens <= 192:  # a wgmma N of 192 (24 x 8): a quarter fewer padded tokens
        tokens_tile = 192
    tokens_tile = token_tiles or tokens_tile
    if consumers not in (2, 3) and not (consumers == 4 and tokens_tile <= 32):
        fail(ValueError, "consumers", "2 or 3 (or 4 up to 32 tokens)", consumers)
    bf16_tokens = bf16_tokens or not activation.quantized
    if bf16_tokens:
        # per stage (of K 128; of 64 with token tiles) the weight, its scales and the BF16
        # token tile; consumers 2..: an FP32 partial-sum tile (not with tile_w 128: each
        # consumer finishes its own rows)
        stage_k = TILE_K16 if token_tiles else TILE_K8
        per_stage = tile_w * stage_k + tokens_tile * stage_k * 2 + CHUNK_BYTES + 16
        fixed = (consumers - 1) * 64 * tokens_tile * 4 * (tile_w == 64) + 6144
    else:
        per_stage = (64 + tokens_tile) * TILE_K8 + 2 * CHUNK_BYTES + 16
        # per consumer: two BF16 token half-tiles; consumers 2..: an FP32 partial-sum tile
        fixed = consumers * (2 * tokens_tile * TILE_K16 * 2 + 64 * tokens_tile * 4) + 4096
    stages = min(16, (_SMEM_BYTES - fixed) // per_stage)
    return SwapABConfig(
        tokens_tile=tokens_tile, stages=stages, consumers=consumers,
        bf16_tokens=bool(bf16_tokens), tile_w=tile_w, cluster=cluster, num_ctas=num_sms,
        activation=activation, token_tiles=token_tiles, split_tail=split_tail,
        tile_aligned=tile_aligned,
    )  # fmt: skip


def label(cfg: GemmConfig) -> str:
    """How ``cfg`` reads in the tools' printed tables and receipts, e.g. ``"tiled 128x128 c2
    stream-k"`` or ``"swap-ab w128 bf16-tokens mc2"`` (stage counts only where not the
    tile's standard split). Display only: nothing reads a config back from it (the tools and
    the measured table hold configs and their schedule fields)."""
    w8a16 = "" if cfg.activation.quantized else " w8a16"
    if isinstance(cfg, SwapABConfig):
        pairs = " mc2" if cfg.cluster == 2 else ""
        if cfg.token_tiles:
            split = " split-tail" if cfg.split_tail else ""
            return f"swap-ab w{cfg.tile_w} token-tiles {cfg.token_tiles}{split}{pairs}{w8a16}"
        if cfg.tile_w > 64:
            return f"swap-ab w{cfg.tile_w} bf16-tokens{pairs}{w8a16}"
        text = "swap-ab" if cfg.consumers == 3 else f"swap-ab c{cfg.consumers}"
        aligned = " tile-aligned" if cfg.tile_aligned else ""
        return text + (" bf16-tokens" if cfg.bf16_tokens else "") + pairs + aligned + w8a16
    tail = ("", " stream-k", " stream-k-tail")[cfg.stream_k]
    text = f"tiled {cfg.tile_m}x{cfg.tile_n} c{cfg.converters}{tail}"
    if own_stages(cfg):
        text += f" s{cfg.stages}+{cfg.stages16}"
    if w8a16:  # every tile on the BF16 path, which the W8A8 label says with " bf16"
        return text + w8a16
    return text + ("" if cfg.fp16_tiles else " bf16")


def aligned_groups(tiles: int, k_tiles: int, cap: int) -> int:
    """The most CTA groups, up to ``cap``, over which ``tiles`` weight tiles of ``k_tiles``
    units each split so that every group's units lie inside one tile or cover whole tiles:
    ``tiles`` times a divisor of ``k_tiles`` (each tile in that many equal parts), else a
    divisor of ``tiles`` (whole tiles per group). ``SwapABConfig.tile_aligned``'s grid."""
    for groups in range(min(cap, tiles * k_tiles), 0, -1):
        if groups % tiles == 0 and k_tiles % (groups // tiles) == 0:
            return groups
        if groups < tiles and tiles % groups == 0:
            return groups
    return 1


def own_stages(cfg: TiledConfig) -> bool:
    """Whether ``cfg``'s (FP8, 16-bit) stage counts differ from its tile's standard split
    (:func:`tiled_config`)."""
    return (cfg.stages, cfg.stages16) != _standard_stages(cfg.tile_m, cfg.tile_n, cfg.activation)


def _standard_stages(tile_m: int, tile_n: int, activation: Activation) -> tuple[int, int]:
    if not activation.quantized:
        return _W8A16_NARROW_STAGES if tile_n == 64 else _W8A16_STAGES[tile_m]
    return _TALL_STAGES if tile_m == 192 else _TILED_STAGES
