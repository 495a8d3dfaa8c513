"""The W8A16 swap-AB forms beyond one 128-token tile, on a CPU: 128-row stages holding up to
256 tokens in one tile, and token tiles (gemm_sm90.swap_ab.token_tiles) serving any count.
Their configs check their fields, fit shared memory, have no stream-K workspace (token
tiles), round-trip through the table's schedule form, are searched by the W8A16 tune and
chosen without a table where 256-token tiles fill the SMs; the builds compile for sm_90a
with the consumers' register share, the token-tile ones without spilling."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from helpers.gemm import W128, config_of, requires_cutlass, swap_ab
from helpers.sass import compile_cubins, local_memory_accesses, nvdisasm, sets_register_counts

from mxfp8_fusion.format import Activation
from mxfp8_fusion.kernels.gemm_sm90 import config as gemm_config
from mxfp8_fusion.kernels.gemm_sm90 import workspace
from mxfp8_fusion.kernels.gemm_sm90.config import TOKEN_TILES, label
from mxfp8_fusion.kernels.gemm_sm90.tuning import proven, search
from mxfp8_fusion.kernels.gemm_sm90.tuning import select as gemm_select

W8A16 = Activation.W8A16
SMEM = 227 * 1024
requires_nvdisasm = pytest.mark.skipif(nvdisasm() is None, reason="nvdisasm not installed")


def _tiles(tile: int, tokens: int = 4096, split_tail: bool = False):
    return gemm_config.swap_ab_config(
        tokens, 132, 2, True, 128, 1, W8A16, token_tiles=tile, split_tail=split_tail
    )


def test_token_tile_configs_fit_shared_memory_at_k_64_per_stage():
    for tile, stages in zip(TOKEN_TILES, (13, 9, 6, 5), strict=True):
        cfg = _tiles(tile)
        assert (cfg.tokens_tile, cfg.stages) == (tile, stages)
        per_stage = 128 * 64 + tile * 64 * 2 + 512
        assert cfg.stages * per_stage < SMEM
        assert workspace.floats(cfg) is None  # whole tiles: nothing published
        # a split tail publishes a part per consumer and CTA
        assert workspace.floats(_tiles(tile, split_tail=True)) == 132 * 2 * 2 * 64 * max(64, tile)
    assert _tiles(256, tokens=1).tokens_tile == 256  # the tile is the schedule's, not M's


def test_w8a16_128_row_stages_hold_up_to_256_tokens_in_one_tile():
    for tokens, tile in [(128, 128), (129, 192), (192, 192), (193, 256), (256, 256)]:
        cfg = config_of({**swap_ab(**W128), "activation": "bf16"}, tokens)
        assert (cfg.tokens_tile, cfg.token_tiles) == (tile, 0)
        assert 2 <= cfg.stages and cfg.stages * (128 * 128 + tile * 256 + 512) < SMEM
    with pytest.raises(ValueError, match="^tokens:"):
        gemm_config.swap_ab_config(257, 132, 2, True, 128, 1, W8A16)
    with pytest.raises(ValueError, match="^tokens:"):  # W8A8 keeps its 128-token limit
        gemm_config.swap_ab_config(129, 132, 2, True, 128)


def test_token_tiles_refuse_what_they_have_no_form_for():
    base = dict(tokens_tile=256, stages=5, consumers=2, bf16_tokens=True, tile_w=128)
    gemm_config.SwapABConfig(**base, activation=W8A16, token_tiles=256)
    for bad, field in [
        (dict(base, token_tiles=256), "token_tiles"),  # W8A8
        (dict(base, activation=W8A16, token_tiles=32), "token_tiles"),
        (dict(base, activation=W8A16, split_tail=True), "split_tail"),  # without token tiles
        (dict(base, activation=W8A16, token_tiles=256, tile_w=64, consumers=3), "token_tiles"),
        (dict(base, activation=W8A16, token_tiles=128), "tokens_tile"),  # the tile is it
    ]:
        with pytest.raises(ValueError, match=f"^{field}:"):
            gemm_config.SwapABConfig(**bad)


def test_token_tile_schedules_round_trip_and_serve_any_count():
    for tile, pairs in itertools.product(TOKEN_TILES, (1, 2)):
        for split_tail, text in [(False, ""), (True, " split-tail")]:
            cfg = replace(_tiles(tile, split_tail=split_tail), cluster=pairs)
            schedule = gemm_select.schedule(cfg)
            assert schedule["token_tiles"] == tile and proven.holds(schedule)
            assert schedule.get("split_tail", False) == split_tail
            assert schedule["cluster"] == pairs
            assert gemm_select.config_of(schedule, 4096) == cfg
            assert gemm_select.token_limit(schedule) is None
            mc2 = " mc2" if pairs == 2 else ""
            assert label(cfg) == f"swap-ab w128 token-tiles {tile}{text}{mc2} w8a16"
    plain = gemm_select.schedule(config_of({**swap_ab(**W128), "activation": "bf16"}, 200))
    assert "token_tiles" not in plain and gemm_select.token_limit(plain) == 256


def test_the_w8a16_tune_times_token_tiles_from_64_tokens():
    def labels(tokens):
        return {label(c) for c in search.candidates(tokens, 7168, 43008, 132, activation=W8A16)}

    tiles = {
        f"swap-ab w128 token-tiles {t}{s}{p} w8a16"
        for t in TOKEN_TILES
        for s in ("", " split-tail")
        for p in ("", " mc2")
    }
    assert not tiles & labels(32) and tiles <= labels(64) and tiles <= labels(4096)
    assert "swap-ab w128 bf16-tokens w8a16" in labels(200)  # one 256-token tile
    assert not any(
        "token-tiles" in text for text in map(label, search.candidates(4096, 7168, 43008, 132))
    )


def test_without_a_table_w8a16_takes_256_token_tiles_where_they_fill_the_sms():
    def choice(tokens, n):
        return gemm_select.choose_config(tokens, n, 8192, 132, "no such GPU", W8A16)

    assert choice(4096, 2048).token_tiles == 256  # 16 x 16 tiles
    assert choice(512, 7168).token_tiles == 256  # 2 x 56: 85% of the SMs
    assert not getattr(choice(512, 4096), "token_tiles", 0)  # 2 x 32: other schedules won
    assert not getattr(choice(256, 11008), "token_tiles", 0)  # one tile holds them


@pytest.mark.slow
@requires_cutlass
@requires_nvdisasm
@pytest.mark.parametrize("tokens", [4096, 256])
def test_the_builds_move_registers_to_the_consumers_and_do_not_spill(tokens, tmp_path):
    """Compiled for sm_90a on this machine: each consumer's accumulator (up to 128 FP32
    registers) takes the producer's registers (setmaxnreg, which ptxas had dropped where both
    roles' code joined), and the token-tile builds, on single CTAs and on pairs, keep
    everything in registers (the stream-K fixup of one 256-token tile spills a few words)."""
    if tokens == 256:
        entries = [{**swap_ab(**W128), "activation": "bf16"}]
    else:
        entries = [
            gemm_select.schedule(_tiles(tile, split_tail=split))
            for tile in TOKEN_TILES
            for split in (False, True)
        ]
        # and on CTA pairs (the half-tile multicast and the pairs' split tail)
        entries += [
            gemm_select.schedule(replace(_tiles(tile, split_tail=split), cluster=2))
            for tile, split in [(128, True), (256, False)]
        ]
    for entry in entries:
        (cubin,) = compile_cubins(entry, tokens, 640, [(512, 256)], tmp_path)
        assert sets_register_counts(cubin), entry
        if entry.get("token_tiles"):
            assert local_memory_accesses(cubin) == [], entry
