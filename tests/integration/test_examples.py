"""The examples at small dims: every site rewritten (explain), and the compiled output
bitwise equal to plain Inductor's on the same converted model, at two token counts from one
compiled program. On CPU in CI; on a GPU too (marked ``gpu``), where the layer's output is
checked in a test of its own, since Inductor generates different code there."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import mxfp8_fusion as mf

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))

TOKENS = (48, 37)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _run(name: str, device: str, activation: str = "mxfp8"):
    """(check result, expected sites) of example ``name`` at small dims on ``device``, its
    layers converted for ``activation``."""
    from shared import check

    if name == "dflash":
        import dflash_projection as ex

        cfg = ex.DFlashConfig()
        dims, sites = ex.token_dims(cfg), [(6, 1)]
    else:
        pytest.importorskip("transformers")
        if name == "eagle3":
            import eagle3_drafter as ex

            # fc's cat (three target states) and the attention input's (two normalized
            # states read by q, k and v: quantized once)
            cfg, dims, sites = ex.Eagle3Config(), ex.TOKEN_DIMS, [(3, 1), (2, 3)]
        else:
            import mtp_block as ex

            cfg, dims, sites = ex.MTPConfig(), ex.TOKEN_DIMS, [(2, 1)]
    model = ex.build(cfg, device)
    report: dict[str, str] = {}
    mf.convert(model, report=report, activation=activation)
    assert report and all(v == "converted" for v in report.values()), report
    return check(model, [ex.make_inputs(cfg, t, device) for t in TOKENS], dims), sites


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["dflash", "mtp", "eagle3"])
def test_sites_rewritten_and_projection_bitwise(name, device):
    result, sites = _run(name, device)
    report = result.report
    assert [(len(s.widths), s.consumers) for s in report.sites] == sites, str(report)
    assert all(s.rewritten for s in report.sites), str(report)
    assert all(result.projection_bitwise), str(result)
    if device == "cpu":
        assert all(result.output_bitwise), str(result)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dflash", "mtp", "eagle3"])
def test_w8a16_sites_read_the_slices_and_match_plain_inductor(name):
    """The examples' W8A16 option (``--activation bf16``): every site's GEMMs read the
    slices as they are, and the compiled output is plain Inductor's, bit for bit."""
    result, sites = _run(name, "cpu", activation="bf16")
    report = result.report
    assert [(len(s.widths), s.consumers) for s in report.sites] == sites, str(report)
    assert all(s.rewritten and s.w8a16 == s.consumers for s in report.sites), str(report)
    assert all(result.projection_bitwise) and all(result.output_bitwise), str(result)


@pytest.mark.slow
def test_an_example_takes_the_activation_on_its_command_line():
    import subprocess

    run = subprocess.run(
        [sys.executable, str(EXAMPLES / "dflash_projection.py"), "--activation", "bf16"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "rewritten (W8A16: the GEMM(s) read the slices, no storage)" in run.stdout
    assert run.stdout.count("bitwise equal to plain Inductor: output True, projection True") == 2


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["dflash", "mtp", "eagle3"])
def test_gpu_layer_output_bitwise(name):
    result, _ = _run(name, "cuda")
    assert all(result.output_bitwise), str(result)


def test_eagle3_close_to_the_bf16_drafter():
    pytest.importorskip("transformers")
    import eagle3_drafter as ex

    cfg = ex.Eagle3Config()
    model = ex.build(cfg)
    inputs = ex.make_inputs(cfg, TOKENS[0])
    with torch.no_grad():
        expected = model(*inputs)[0].float()
        mf.convert(model)
        got = model(*inputs)[0].float()
    # MXFP8 weights and activations through a whole layer (E4M3: ~2**-4 per element)
    assert (got - expected).norm() / expected.norm() < 0.1
