"""The GEMM tune's search space: the configs ``benchmarks/gemm.py --tune`` times at each
point (:func:`candidates`, by name: ``names``), and the config choice from before the
measured table (:func:`main_heuristic`, the sweep's ``--before``). Beside the validity
rules (``config``), the choice (``select``) and the measured table (``table``) it shapes.
No call takes this path; no torch, no cutlass.
"""

from __future__ import annotations

from .config import SWAP_AB_MAX_TOKENS, SWAP_AB_WIDE_MAX_TOKENS, swap_ab_config
from .names import config_from_spec, spec_of
from .select import _busiest, _tile_costs


def main_heuristic(tokens: int, n: int, k: int, num_sms: int):
    """The config choice before the measured table existed: swap-AB up to 64
    tokens, else whole tiles per CTA, 128 x 64 below one round of 128 x 128 tiles, 192 x 128
    where the round-robin model favours it."""

    if tokens <= SWAP_AB_MAX_TOKENS:
        return swap_ab_config(tokens, num_sms)
    if -(-tokens // 128) * -(-n // 128) < num_sms:
        return config_from_spec("tiled 128x64 c1", tokens, num_sms)
    busiest = {m: _busiest(_tile_costs(tokens, n, m), num_sms) for m in (128, 192)}
    if busiest[192] < busiest[128]:
        return config_from_spec("tiled 192x128 c1", tokens, num_sms)
    return config_from_spec("tiled 128x128 c2", tokens, num_sms)


def candidates(tokens: int, n: int, k: int, num_sms: int, leave_out=()) -> list[str]:
    """Specs (config_from_spec) the tune times at one point: swap-AB up to 64
    tokens (converting the tokens in every CTA or once before the GEMM) and with 128-row
    weight stages from 9 to 128 tokens, the two with BF16 tokens also on CTA pairs (``mc2``)
    from 9 tokens on; the pre-table heuristic's; the others where they won
    anywhere in an earlier full tune (whole tiles of 128 or 192 rows from 256 tokens on,
    stream-K up to 1024 with 192 rows, any count with 128; 64-row k-split tiles up to 128
    tokens); whole waves with a stream-K tail from 192 tokens on (128 x 64 tiles up to
    1024); and up to 256 tokens deeper FP8 pipelines and the stream-K specs without the
    reference scan (``bf16``). Specs containing a string of ``leave_out`` are dropped."""

    specs = ["swap-ab"] if tokens <= SWAP_AB_MAX_TOKENS else []
    if tokens <= SWAP_AB_MAX_TOKENS:
        specs.append("swap-ab bf16-tokens")  # tokens converted once, before the GEMM
    if 8 < tokens <= SWAP_AB_MAX_TOKENS:
        specs.append("swap-ab bf16-tokens mc2")  # multicast to CTA pairs
    if 8 < tokens <= SWAP_AB_WIDE_MAX_TOKENS:
        # shared by two 64-row consumers, alone and on CTA pairs
        specs += ["swap-ab w128 bf16-tokens", "swap-ab w128 bf16-tokens mc2"]
    specs.append(spec_of(main_heuristic(tokens, n, k, num_sms)))
    if tokens >= 256:
        specs += ["tiled 128x128 c2", "tiled 192x128 c1"]
    if 256 <= tokens <= 512:
        specs.append("tiled 128x64 c1")
    specs.append("tiled 128x128 c2 stream-k")
    if tokens >= 192:
        # whole waves and a stream-K tail (below a wave of tiles the same as stream-K)
        specs += ["tiled 128x128 c2 stream-k-tail", "tiled 192x128 c1 stream-k-tail"]
    if 192 <= tokens <= 1024:
        specs.append("tiled 128x64 c1 stream-k-tail")
    if SWAP_AB_MAX_TOKENS < tokens <= 1024:
        specs.append("tiled 192x128 c1 stream-k")
    if tokens <= 256:
        specs.append("tiled 128x64 c1 stream-k")
    if tokens <= 128:
        specs.append("tiled 64x128 c2 stream-k")
    if tokens <= 256:
        # deeper FP8 pipelines (variant 36; these two won somewhere, 128 x 128 at 5 + 3 and
        # 192 x 128 at 4 + 3 nowhere)
        specs.append("tiled 128x64 c1 stream-k s7+4")
        if tokens <= 128:
            specs.append("tiled 64x64 c1 stream-k s11+4")
        # every tile on the BF16 path, no reference scan before the GEMM (variant 37)
        specs += [s + " bf16" for s in specs if s.startswith("tiled") and s.endswith("stream-k")]
    specs = [s for s in specs if not any(part in s for part in leave_out)]
    return list(dict.fromkeys(specs))
