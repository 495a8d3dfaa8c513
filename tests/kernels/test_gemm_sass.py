"""The W8A16 tiled builds release no shared-memory stage before its loads have returned,
read from the SASS of CPU-compiled builds (tests/helpers/sass.py): one build of every W8A16
tiled schedule that may be picked (gemm_sm90/tuning/proven.json), from one slice and from three.

Their consumers move BF16 A words from shared memory into the wgmma fragment unconverted,
so only the wgmmas wait for those loads; the stages are released after the wgmmas issue
(the tiled W8A16 variant, gemm_sm90.tiled.w8a16). In the W8A8 builds the loaded bytes are converted before the
FP8 stage is released, and the 16-bit stage a consumer releases is not the one its pending
loads read, so they are not held to this rule.
"""

from __future__ import annotations

import pytest
from helpers.gemm import requires_cutlass
from helpers.sass import arrives_before_loads_return, compile_cubins, nvdisasm

from mxfp8_fusion.kernels.gemm_sm90.config import label
from mxfp8_fusion.kernels.gemm_sm90.tuning import proven, select

requires_nvdisasm = pytest.mark.skipif(nvdisasm() is None, reason="nvdisasm not installed")
TILED_W8A16 = [
    e for e in proven.entries() if e["kernel"] == "tiled" and e.get("activation") == "bf16"
]


def test_every_w8a16_tiled_schedule_is_covered():
    assert len(TILED_W8A16) >= 5


@pytest.mark.slow
@requires_cutlass
@requires_nvdisasm
@pytest.mark.parametrize("entry", TILED_W8A16, ids=lambda e: label(select.config_of(e, 1024)))
def test_no_stage_is_released_with_its_loads_in_flight(entry, tmp_path):
    widths = [(1024,), (512, 256, 256)]
    for width, cubin in zip(
        widths, compile_cubins(entry, 1024, 640, widths, tmp_path), strict=True
    ):
        assert arrives_before_loads_return(cubin) == [], width
