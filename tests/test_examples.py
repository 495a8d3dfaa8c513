"""The examples at small dims on CPU: every site rewritten (explain), and the compiled
output bitwise equal to plain Inductor's on the same converted model, at two token counts
from one compiled program."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import mxfp8_fusion as mf

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
sys.path.insert(0, str(EXAMPLES))

TOKENS = (48, 37)


def _converted(module, model):
    report: dict[str, str] = {}
    mf.convert(model, report=report)
    assert report and all(v == "converted" for v in report.values()), report
    return model


def _assert_sites(result, expected: list[tuple[int, int]]) -> None:
    """``expected``: (slices, GEMMs) of each site, in graph order; all rewritten."""
    sites = result.report.sites
    assert [(len(s.widths), s.consumers) for s in sites] == expected, str(result.report)
    assert all(s.rewritten for s in sites), str(result.report)
    assert all(result.output_bitwise), str(result)
    assert all(result.projection_bitwise), str(result)


def test_dflash_six_state_projection():
    import dflash_projection as ex
    from common import check

    cfg = ex.DFlashConfig()
    model = _converted(ex, ex.build(cfg))
    result = check(model, [ex.make_inputs(cfg, t) for t in TOKENS], ex.token_dims(cfg))
    _assert_sites(result, [(6, 1)])
    assert result.report.sites[0].widths == (cfg.hidden,) * 6


def test_mtp_block():
    pytest.importorskip("transformers")
    import mtp_block as ex
    from common import check

    cfg = ex.MTPConfig()
    model = _converted(ex, ex.build(cfg))
    result = check(model, [ex.make_inputs(cfg, t) for t in TOKENS], ex.TOKEN_DIMS)
    _assert_sites(result, [(2, 1)])


def test_eagle3_drafter():
    pytest.importorskip("transformers")
    import eagle3_drafter as ex
    from common import check

    cfg = ex.Eagle3Config()
    bf16 = ex.build(cfg)
    inputs = [ex.make_inputs(cfg, t) for t in TOKENS]
    with torch.no_grad():
        expected = bf16(*inputs[0])[0].float()
    model = _converted(ex, bf16)
    # fc's cat (three target states) and the attention input's (two normalized states,
    # read by q, k and v: quantized once)
    result = check(model, inputs, ex.TOKEN_DIMS)
    _assert_sites(result, [(3, 1), (2, 3)])
    # MXFP8 weights and activations through a whole layer: close to the BF16 drafter
    with torch.no_grad():
        got = model(*inputs[0])[0].float()
    assert (got - expected).norm() / expected.norm() < 0.1
