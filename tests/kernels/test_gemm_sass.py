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

import json
import os
import subprocess
import sys
import textwrap

import pytest
from helpers.gemm import requires_cutlass
from helpers.sass import arrives_before_loads_return, nvdisasm

from mxfp8_fusion.kernels.gemm_sm90.config import label
from mxfp8_fusion.kernels.gemm_sm90.tuning import proven, select

requires_nvdisasm = pytest.mark.skipif(nvdisasm() is None, reason="nvdisasm not installed")
TILED_W8A16 = [
    e for e in proven.entries() if e["kernel"] == "tiled" and e.get("activation") == "bf16"
]


def test_every_w8a16_tiled_schedule_is_covered():
    assert len(TILED_W8A16) >= 5


# The DSL reads CUTE_DSL_KEEP once, when it is first loaded: an earlier test of the session
# that compiled in this process would leave the cubin unkept, so each entry's builds are
# compiled in a fresh interpreter, which writes their cubins where it is told.
_COMPILE = textwrap.dedent(
    """
    import json, sys, torch
    from mxfp8_fusion.kernels.gemm_sm90.host import gemm as host
    from mxfp8_fusion.kernels.gemm_sm90.tuning import select
    entry, cases = json.loads(sys.argv[1]), json.loads(sys.argv[2])
    cfg = select.config_of(entry, 1024)
    for widths, path in cases:
        build = host.compile_gemm(cfg, 640, tuple(widths), 640, torch.bfloat16, None)
        with open(path, "wb") as f:
            f.write(build.__cubin__)
    """
)


@pytest.mark.slow
@requires_cutlass
@requires_nvdisasm
@pytest.mark.parametrize("entry", TILED_W8A16, ids=lambda e: label(select.config_of(e, 1024)))
def test_no_stage_is_released_with_its_loads_in_flight(entry, tmp_path):
    cases = [
        (widths, str(tmp_path / f"{i}.cubin"))
        for i, widths in enumerate([(1024,), (512, 256, 256)])
    ]
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", CUTE_DSL_KEEP="cubin")
    run = subprocess.run(
        [sys.executable, "-c", _COMPILE, json.dumps(entry), json.dumps(cases)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    for widths, path in cases:
        with open(path, "rb") as f:
            assert arrives_before_loads_return(f.read()) == [], widths
