"""Until a schedule is proven on a GPU, nothing picks it: the choice (measured table or
heuristic, on the measured device and on others), the tune's search space and warm-up's plan
only produce schedules of ``gemm_sm90/tuning/proven.json``, which the GPU suite's determinism test
runs (tests/kernels/test_gemm_determinism.py). On a CPU: no build, no GPU."""

from __future__ import annotations

import itertools

import pytest
import torch

from mxfp8_fusion.kernels.gemm_sm90 import config as gemm_config
from mxfp8_fusion.kernels.gemm_sm90.tuning import proven, search
from mxfp8_fusion.kernels.gemm_sm90.tuning import select as gemm_select

ACTIVATIONS = ("mxfp8", "bf16")
DEVICES = ("NVIDIA H200", "NVIDIA H100 80GB HBM3", "another GPU")
# the table's shapes, the heuristic's narrow, odd and small ones, and the examples'
SHAPES = [
    (7168, 43008), (4096, 12288), (7168, 14336), (7168, 18432), (18432, 7168), (2048, 7168),
    (11008, 4096), (4096, 11008), (200, 512), (640, 4160), (1024, 8192), (4096, 4096),
]  # fmt: skip
TOKENS = [1, 3, 8, 9, 16, 17, 32, 33, 48, 64, 65, 96, 128, 129, 192, 256, 300, 512, 1024, 4096]


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_the_choice_takes_proven_schedules_only(activation):
    for (n, k), tokens, device in itertools.product(SHAPES, TOKENS, DEVICES):
        cfg = gemm_select.choose_config(tokens, n, k, 132, device, activation)
        assert proven.holds(gemm_select.schedule(cfg)), (tokens, n, k, device, cfg)


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_the_tune_times_proven_schedules_only(activation):
    for (n, k), tokens in itertools.product(SHAPES[:6], TOKENS):
        for cfg in search.candidates(tokens, n, k, 132, activation=activation):
            assert proven.holds(gemm_select.schedule(cfg)), (tokens, n, k, cfg)


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_warm_up_plans_proven_schedules_only(activation):
    from mxfp8_fusion.kernel_warmup import Projection, builds_for

    for n, widths in [(4096, (4096, 4096, 4096)), (7168, (7168, 7168)), (2048, (7168,))]:
        projection = Projection(n, sum(widths), widths, torch.bfloat16, None, activation)
        builds = builds_for(projection, TOKENS, (9, 0), 132, "NVIDIA H100 80GB HBM3")
        configs = [b.facts[0] for b in builds if isinstance(b.facts[0], gemm_config.GemmConfig)]
        assert configs, builds
        for cfg in configs:
            assert proven.holds(gemm_select.schedule(cfg)), cfg


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_an_unproven_schedule_gives_way_and_leaves_the_search(activation, monkeypatch):
    """With the schedule the choice would make left out of the list, the choice takes the
    proven fallback (whole 128 x 128 tiles, held proven here) and the tune drops it."""
    tokens, n, k = 1024, 7168, 43008
    chosen = gemm_select.schedule(gemm_select.choose_config(tokens, n, k, activation=activation))
    fallback = gemm_config.tiled_config(
        *gemm_select.PROVEN_FALLBACK, num_sms=132, activation=activation
    )
    assert proven.holds(gemm_select.schedule(fallback))
    assert chosen != gemm_select.schedule(fallback)
    kept = tuple(e for e in proven.entries() if e != chosen)
    monkeypatch.setattr(proven, "_keys", lambda: frozenset(map(proven.key, kept)))
    gemm_select.choose_config.cache_clear()
    try:
        assert gemm_select.choose_config(tokens, n, k, activation=activation) == fallback
        found = search.candidates(tokens, n, k, 132, activation=activation)
        assert chosen not in [gemm_select.schedule(c) for c in found]
    finally:
        gemm_select.choose_config.cache_clear()


def test_the_list_holds_each_schedule_once_and_every_entry_is_a_config():
    keys = [proven.key(e) for e in proven.entries() + proven.pending()]
    assert len(keys) == len(set(keys))
    for entry in proven.entries() + proven.pending():
        cfg = gemm_select.config_of(entry, 40)
        assert gemm_select.schedule(cfg) == entry


def test_a_pending_schedule_is_one_the_tune_offers_once_proven(monkeypatch):
    """A pending schedule is not dead data: the search space offers it somewhere as soon as
    it joins the list (and, until then, nowhere: the tune test above). An empty pending list
    holds nothing to check."""
    for entry in proven.pending():
        keys = frozenset(map(proven.key, (*proven.entries(), entry)))
        monkeypatch.setattr(proven, "_keys", lambda keys=keys: keys)
        activation = entry.get("activation", "mxfp8")
        offered = {
            proven.key(gemm_select.schedule(cfg))
            for (n, k), tokens in itertools.product(SHAPES[:6], TOKENS)
            for cfg in search.candidates(tokens, n, k, 132, activation=activation)
        }
        assert proven.key(entry) in offered, entry
