"""The stream-K workspaces the host makes for the SM90 GEMM (gemm_sm90.host.buffers), on a CPU: for
every config the measured table, the heuristic and the tune's search space can produce, the
partial sums and flags allocated are the ones recorded in
``tests/helpers/gemm_workspaces.json`` (written by the host code as it stood before the
workspace rule moved to one module)."""

from __future__ import annotations

import json
from pathlib import Path

from helpers.ptx_hashes import config_fields

from mxfp8_fusion.kernels.gemm_sm90 import workspace
from mxfp8_fusion.kernels.gemm_sm90.constants import WG_THREADS
from mxfp8_fusion.kernels.gemm_sm90.host import buffers
from mxfp8_fusion.kernels.gemm_sm90.tuning import search, select, table

GOLDEN = Path(__file__).resolve().parents[1] / "helpers" / "gemm_workspaces.json"
# shapes beyond the table's: the decode points, narrow and odd weights the heuristic serves
_SHAPES = ((4096, 11008), (11008, 4096), (200, 512), (640, 4160), (1024, 2048), (256, 256))
_TOKENS = (1, 8, 9, 16, 17, 32, 33, 48, 64, 65, 96, 128, 192, 256, 300, 384, 512, 1024, 4096)
_SMS = (132, 131, 114, 8)  # the tune's CTA pairs only where the count is even


def produced_configs() -> list:
    """Every distinct config (by its fields) that the table, the heuristic, the pre-table
    heuristic and the tune's candidates give at the listed points."""
    found = {}
    for num_sms in _SMS:
        for n, k in (*table.measured_shapes(), *_SHAPES):
            for tokens in _TOKENS:
                configs = [
                    select.choose_config(tokens, n, k, num_sms),
                    select.heuristic_config(tokens, n, k, num_sms),
                    search.main_heuristic(tokens, n, k, num_sms),
                ]
                if num_sms % 2 == 0:
                    configs += search.candidates(tokens, n, k, num_sms)
                for cfg in configs:
                    found.setdefault(json.dumps(config_fields(cfg), sort_keys=True), cfg)
    return list(found.values())


def host_workspace(cfg) -> tuple[int, int] | None:
    """(FP32 partial sums, flags) the host allocates for a launch of ``cfg``; None where it
    passes no workspace."""
    floats = workspace.floats(cfg)
    if floats is None:
        return None
    partials, flags = buffers.fresh_workspace("cpu", floats)
    return partials.numel(), flags.numel()


def test_host_workspaces_are_the_recorded_ones():
    golden = {
        json.dumps(row["fields"], sort_keys=True): row for row in json.loads(GOLDEN.read_text())
    }
    configs = produced_configs()
    assert len(configs) > 100
    for cfg in configs:
        key = json.dumps(config_fields(cfg), sort_keys=True)
        assert key in golden, key
        want = golden[key]["workspace"]
        assert host_workspace(cfg) == (None if want is None else tuple(want)), key


def test_kernel_layouts_fit_the_host_workspace():
    """What a kernel indexes (gemm_sm90.workspace: its slots per CTA, two parts each of
    ``frag`` values per thread, and a flag per slot) lies inside what the host allocates."""
    for cfg in produced_configs():
        floats = workspace.floats(cfg)
        if floats is None:
            assert cfg.kernel == "tiled" and not cfg.stream_k
            continue
        slots = cfg.num_ctas * workspace.slots_per_cta(cfg)
        part = workspace.frag(cfg) * WG_THREADS
        assert slots * workspace.PARTS_PER_SLOT * part <= floats
        assert slots <= workspace.flags(floats)
