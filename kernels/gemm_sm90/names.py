"""Short names of GEMM configs for the tuning tools, receipts and tests (no call takes this
path: the measured table and the heuristic hold configs, not names).

A name is ``"swap-ab"`` with optional words ``cC`` (C consumer warpgroups), ``w128``
(``tile_w`` 128), ``bf16-tokens`` and after it ``mc2`` (``cluster`` 2); or ``"tiled MxN cC"``
with optional ``stream-k`` / ``stream-k-tail`` (``stream_k`` 1 / 2), ``sF+H`` (F FP8 and H
16-bit stages where not the tile's standard split) and ``bf16`` (``fp16_tiles`` False). The
receipts in benchmarks/results key their contenders by these names.
"""

from __future__ import annotations

from .config import GemmConfig, SwapABConfig, tiled_config
from .select import config_of, token_limit

SWAP_AB = SwapABConfig.kernel
TILED = "tiled"
_BF16_TOKENS = "bf16-tokens"
_STREAM_K_WORDS = ("stream-k", "stream-k-tail")
_W128 = "w128"
_MC2 = "mc2"


def schedule_of(name: str) -> dict:
    """The table entry (a config's schedule fields, without the ones the token count sets)
    that ``name`` stands for.

    Raises:
        ValueError: on a name of neither form.
    """
    parts = name.split()
    if parts[:1] == [SWAP_AB]:
        return _swap_ab_schedule(name, parts[1:])
    entry: dict = {"kernel": TILED}
    if len(parts) > 3 and parts[-1] == "bf16":
        parts.pop()
        entry["fp16_tiles"] = False
    if len(parts) > 3 and parts[-1][:1] == "s" and parts[-1][1:2].isdigit():
        counts = parts.pop()[1:].split("+")
        if len(counts) != 2 or not all(c.isdigit() for c in counts):
            raise ValueError(f"name: stages as sF+H, got {name!r}")
        entry["stages"] = [int(counts[0]), int(counts[1])]
    ok = len(parts) in (3, 4) and parts[0] == TILED and all(w in _STREAM_K_WORDS for w in parts[3:])
    dims = parts[1].split("x") if ok else []
    if not (ok and len(dims) == 2 and all(d.isdigit() for d in dims) and parts[2][1:].isdigit()):
        raise ValueError(
            f"name: 'swap-ab' or 'tiled MxN cC [stream-k|stream-k-tail] [sF+H] [bf16]', "
            f"got {name!r}"
        )
    entry.update(tile_m=int(dims[0]), tile_n=int(dims[1]), converters=int(parts[2][1:]))
    entry["stream_k"] = _STREAM_K_WORDS.index(parts[3]) + 1 if len(parts) == 4 else 0
    return entry


def _swap_ab_schedule(name: str, words: list[str]) -> dict:
    cluster = 2 if words[-1:] == [_MC2] else 1
    words = words[: len(words) - (cluster == 2)]
    bf16_tokens = words[-1:] == [_BF16_TOKENS]
    if cluster == 2 and not bf16_tokens:
        raise ValueError(f"name: {_MC2!r} follows {_BF16_TOKENS!r}, got {name!r}")
    words = words[: len(words) - bf16_tokens]
    wide = words == [_W128] and bf16_tokens
    if words not in ([], ["c2"], ["c3"], ["c4"]) and not wide:
        raise ValueError(
            f"name: 'swap-ab [cC] [{_BF16_TOKENS} [{_MC2}]]' or "
            f"'swap-ab {_W128} {_BF16_TOKENS} [{_MC2}]', got {name!r}"
        )
    entry: dict = {"kernel": SWAP_AB, "consumers": 2 if wide else int(words[0][1:]) if words else 3}
    entry.update(bf16_tokens=bf16_tokens, tile_w=128 if wide else 64, cluster=cluster)
    return entry


def config_from_spec(name: str, tokens: int, num_sms: int = 132) -> GemmConfig:
    """The config ``name`` stands for at ``tokens`` (see the module docstring).

    Raises:
        ValueError: on a name of neither form, or swap-AB above its token limit.
    """
    entry = schedule_of(name)
    limit = token_limit(entry)
    if limit is not None and tokens > limit:
        raise ValueError(f"name: {name!r} serves at most {limit} tokens, got {tokens}")
    return config_of(entry, tokens, num_sms)


def swap_ab_limit(name: str) -> int:
    """The most tokens the swap-AB name ``name`` serves (0 for a tiled name)."""
    return token_limit(schedule_of(name)) or 0


def spec_of(cfg: GemmConfig) -> str:
    """The name of ``cfg`` (stage counts only where not the tile's standard split)."""
    if cfg.kernel == SWAP_AB:
        mc = f" {_MC2}" if cfg.cluster == 2 else ""
        if cfg.tile_w == 128:
            return f"{SWAP_AB} {_W128} {_BF16_TOKENS}{mc}"
        name = SWAP_AB if cfg.consumers == 3 else f"{SWAP_AB} c{cfg.consumers}"
        return name + (f" {_BF16_TOKENS}" if cfg.bf16_tokens else "") + mc
    sk = f" {_STREAM_K_WORDS[cfg.stream_k - 1]}" if cfg.stream_k else ""
    name = f"{TILED} {cfg.tile_m}x{cfg.tile_n} c{cfg.converters}{sk}"
    standard = tiled_config(cfg.tile_m, cfg.tile_n, cfg.converters, cfg.stream_k, cfg.num_ctas)
    if (standard.stages, standard.stages16) != (cfg.stages, cfg.stages16):
        name += f" s{cfg.stages}+{cfg.stages16}"
    return name + ("" if cfg.fp16_tiles else " bf16")
