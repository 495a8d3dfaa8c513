"""The numerics checks of the W8A16 sweep (``benchmarks/w8a16.py``): ours at each point
against the FP32-accumulation bound of an FP64 oracle and bit for bit (the concatenation,
a graph replay, repeats, the compiled model), and Humming's output against the same bound
and across the same repeats."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from common import capture_graph

if TYPE_CHECKING:
    from w8a16 import Operands, Row

REPEATS = 20  # eager runs of each point compared bit for bit


def check_point(ops: Operands, slices: list, x: torch.Tensor) -> tuple[dict, str]:
    """Ours at one point (its first call compiles): within the bound of the FP64 oracle,
    bitwise equal to the same config on the concatenation, to a graph replay and to
    REPEATS more eager runs."""
    import mxfp8_fusion as mf
    from mxfp8_fusion.kernels.gemm_sm90.host import gemm as host
    from mxfp8_fusion.kernels.gemm_sm90.host import w8a16
    from mxfp8_fusion.kernels.gemm_sm90.tuning.select import choose_config

    packed = ops.packed[0]
    got = mf.mm_slices(slices, packed)
    tokens, n = got.shape
    cfg = choose_config(tokens, n, x.shape[1], *host.gpu_of(0), activation="bf16")
    whole = torch.empty_like(got)
    w8a16.run([x], packed.values, packed.raw_scales, None, whole, config=cfg)
    replayed = torch.empty_like(got)
    capture_graph([lambda: mf.mm_slices_into(slices, packed, replayed)]).replay()
    repeats = [mf.mm_slices(slices, packed) for _ in range(REPEATS)]
    humming = [ops.hummings[0](x).clone() for _ in range(1 + REPEATS)]
    torch.cuda.synchronize()
    exact = x.double() @ ops.w64.T
    bound = (
        torch.finfo(got.dtype).eps * exact.abs()
        + torch.finfo(got.dtype).tiny
        + 2.0**-14 * (x.double().abs() @ ops.w64.abs().T)
    )

    def err(out):
        return ((out.double() - exact).abs().max() / exact.abs().max()).item()

    checks = {
        "within_bound": bool(((got.double() - exact).abs() <= bound).all()),
        "bitwise_concatenated": torch.equal(got.view(torch.int16), whole.view(torch.int16)),
        "bitwise_graph": torch.equal(got.view(torch.int16), replayed.view(torch.int16)),
        "bitwise_repeats": all(
            torch.equal(got.view(torch.int16), r.view(torch.int16)) for r in repeats
        ),
        "err_vs_oracle": err(got),
        "humming_within_bound": bool(((humming[0].double() - exact).abs() <= bound).all()),
        "humming_bitwise_repeats": all(
            torch.equal(humming[0].view(torch.int16), h.view(torch.int16)) for h in humming[1:]
        ),
        "humming_err_vs_oracle": err(humming[0]),
    }
    return checks, repr(cfg)


def compiled_bitwise(ops: Operands, inputs: dict) -> bool:
    """The compiled model (``backend="mxfp8_fusion"``: the pass reads the slices) gives the
    eager bits at every token count, with one compile for them all (dynamic tokens)."""
    import mxfp8_fusion as mf

    packed = ops.packed[0]
    layer = mf.MXFP8Linear(packed.values, packed.scales, activation="bf16")
    compiled = torch.compile(
        lambda *s: layer(torch.cat(s, -1)), backend="mxfp8_fusion", dynamic=True
    )
    same = True
    for slices in inputs.values():
        with torch.no_grad():
            got = compiled(*slices)
        same &= torch.equal(got.view(torch.int16), mf.mm_slices(slices, packed).view(torch.int16))
    return bool(same)


def humming_numerics(rows: list[Row]) -> dict:
    """What Humming's outputs showed at the checked points: those outside the bound ours is
    held to, those whose bits varied across repeats, and the largest error (not a target)."""
    checked = [r for r in rows if r.humming_within_bound is not None]
    return {
        "what": "Humming's output at each point against the FP32-accumulation bound of the "
        f"FP64 oracle that ours is held to, and bit for bit across {REPEATS} repeats; "
        "not a target: what the kernel ours is timed against guarantees",
        "points_checked": len(checked),
        "outside_bound": [[r.shape, r.tokens] for r in checked if not r.humming_within_bound],
        "bits_vary": [[r.shape, r.tokens] for r in checked if not r.humming_bitwise_repeats],
        "max_err_vs_oracle": max((r.humming_err_vs_oracle for r in checked), default=None),
        "ours_max_err_vs_oracle": max((r.err_vs_oracle for r in checked), default=None),
    }
