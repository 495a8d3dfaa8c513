"""W8A16 from slices on sm_90: the concat-free MXFP8-weight projection against vLLM's kernel.

Per shape (a projection of slices side by side) and token count, side by side in one
process, interleaved per round, as CUDA Graph replays cycling over copies of the weight
(beyond L2, so every call reads its weight from HBM):

* ours: ``mxfp8_fusion.mm_slices_into`` straight from the slices (W8A16: no concatenation,
  no activation quantization; kernels/gemm_sm90/host/w8a16.py);
* humming: Humming as vLLM 0.34 calls it on SM90 (W8A16) on the concatenated input, the
  kernel alone (each row names the Humming kernel its heuristic picked, each shape the
  token intervals of those kernels); humming_with_cat: the same with the ``torch.cat`` it
  needs, as vLLM runs it;
* cublas_bf16: cuBLAS BF16 (``F.linear``) on the concatenation and the weight dequantized
  once (twice the weight memory): the BF16 model's own GEMM.

Checked at every point before timing: ours within the FP32-accumulation bound of an FP64
oracle on the same operands, bitwise equal to our W8A16 on the concatenated input with the
same config, to its CUDA Graph replay and to 20 more eager runs; per shape, bitwise equal to
the compiled model (``backend="mxfp8_fusion"``). Humming's output at each point is checked
against the same bound and across 20 repeats too, and reported beside the targets
(``humming_numerics``: what the kernel we are timed against guarantees, not a target of
ours). The weight-read floor is the MXFP8 weight's
bytes at the copy rate measured at the start of the run. Then the memory at the reference
geometry (transient peak of one call: ours, W8A16 with the concatenation, W8A8 staged), and
the targets (met or MISSED, each with its numbers). Start-up is ``benchmarks/startup.py --activation bf16``'s receipt,
read here if present. Writes benchmarks/results/w8a16.json (after each shape).

    python benchmarks/w8a16.py [--shapes ...] [--tokens ...] [--rounds 15]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from common import capture_graph, environment, require_cuda, transient_peak, write_receipt
from vllm_linear import (
    calls_per_graph,
    dequantize,
    humming_kernels,
    median_replays,
    vllm_style_layer,
    weight_copies,
)
from w8a16_checks import REPEATS, check_point, compiled_bitwise, humming_numerics

SHAPES = {  # name -> (N, slice widths)
    "drafter_fc_3x4096_to_4096": (4096, (4096,) * 3),
    "mtp_eh_proj_2x7168_to_7168": (7168, (7168,) * 2),
    "reference_6x7168_to_7168": (7168, (7168,) * 6),
    "moe_gate_up_7168_to_2048": (2048, (7168,)),
    "mlp_up_4096_to_11008": (11008, (4096,)),
    "dflash_fc_5x4096_to_4096": (4096, (4096,) * 5),  # the shape of our choice: 5 slices
}
TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
CONTENDERS = ("ours", "humming", "humming_with_cat", "cublas_bf16")
REFERENCE = ("reference_6x7168_to_7168", 4096)
BIG_WEIGHT_BYTES = 50e6  # decode: from here on the floor rule, below it the Humming rule
TARGETS = {
    "every_point": "ours_us <= humming_us at every point",
    "geomean": "geometric mean of ours_us / humming_us <= 0.85",
    "prefill_vs_cublas": "ours_us <= 1.10 x cublas_bf16_us at 1024-4096 tokens",
    "decode_floor": "at 1-8 tokens: ours_us <= 1.25 x the weight-read floor (measured in the "
    "same run) on weights of 50 MB or more, ours_us <= 0.95 x humming_us on smaller ones",
    "memory": "transient peak at the reference geometry = the output alone",
    "numerics": "within the FP32 bound of the FP64 oracle; bitwise equal eager / compiled / "
    f"graph replay, across {REPEATS} repeats and to our W8A16 on the concatenation with the "
    "same config",
    "startup": "cold start with warm-up per projection shape <= 14 s (startup.json's W8A8)",
}
STARTUP_LIMIT_S = 14.0
COPY_BYTES = 1 << 30  # the copy that measures the floor's bandwidth: far beyond L2
COPY_ROUNDS = 9  # replays of that copy; the median is the rate
PREFILL = (1024, 4096)  # token range of the cuBLAS rule
DECODE_MAX_TOKENS = 8  # token range (from 1) of the floor / Humming rule


@dataclass
class Row:
    """One point of the sweep: a shape at a token count, each contender's time, the ratios
    the targets read, and ours' checks."""

    shape: str
    tokens: int
    n: int
    k: int
    slices: int
    config: str
    us: dict
    """Median microseconds per call of each contender."""
    floor_us: float
    """MXFP8 weight bytes (values and scales) at the copy rate measured in the run."""
    ours_over_humming_time: float
    ours_over_cublas_bf16_time: float
    ours_over_floor: float
    within_bound: bool
    bitwise_concatenated: bool
    bitwise_graph: bool
    bitwise_repeats: bool
    err_vs_oracle: float
    humming_kernel: str = ""
    """The Humming kernel that served the point (MMA, block shape, stages), from the
    intervals its heuristic picked."""
    humming_within_bound: bool | None = None
    """Humming's output within the bound ours is held to (None: not checked)."""
    humming_bitwise_repeats: bool | None = None
    """Humming's output the same bits across REPEATS more eager runs."""
    humming_err_vs_oracle: float | None = None


def weight_bytes(n: int, k: int) -> int:
    """An N x K MXFP8 weight's bytes: the E4M3 values and one E8M0 scale per 32."""
    return n * k + n * k // 32


def floor_us(n: int, k: int, bytes_per_s: float) -> float:
    """The weight-read floor: the weight's bytes at ``bytes_per_s`` (the copy rate)."""
    return weight_bytes(n, k) / bytes_per_s * 1e6


def make_row(shape, tokens, n, widths, config, us, checks, bytes_per_s, humming="") -> Row:
    """The row of ``shape`` (``n`` outputs, slices ``widths`` wide) at ``tokens``: ``us`` per
    contender, ``checks`` from :func:`check_point`, ``config`` ours' label, the floor at
    ``bytes_per_s``, ``humming`` Humming's kernel label."""
    floor = floor_us(n, sum(widths), bytes_per_s)
    return Row(
        shape=shape, tokens=tokens, n=n, k=sum(widths), slices=len(widths), config=config,
        us=us, floor_us=floor, ours_over_humming_time=us["ours"] / us["humming"],
        ours_over_cublas_bf16_time=us["ours"] / us["cublas_bf16"],
        ours_over_floor=us["ours"] / floor, humming_kernel=humming, **checks,
    )  # fmt: skip


def targets(rows: list[Row], memory: dict | None, compiled: dict, startup: dict | None) -> dict:
    """Each target of :data:`TARGETS`: its state (``met``, ``MISSED``, or ``not measured``
    with why) and the numbers that decide it."""
    ratios = [r.ours_over_humming_time for r in rows]
    slower = [
        [r.shape, r.tokens, r.ours_over_humming_time] for r in rows if r.ours_over_humming_time > 1
    ]
    geomean = math.exp(statistics.fmean(math.log(x) for x in ratios)) if ratios else None
    prefill = [[r.shape, r.tokens, r.ours_over_cublas_bf16_time] for r in rows
               if PREFILL[0] <= r.tokens <= PREFILL[1]]  # fmt: skip
    big = [[r.shape, r.tokens, r.ours_over_floor] for r in _decode(rows, True)]
    small = [[r.shape, r.tokens, r.ours_over_humming_time] for r in _decode(rows, False)]
    failing = [
        [r.shape, r.tokens]
        for r in rows
        if not (r.within_bound and r.bitwise_concatenated and r.bitwise_graph and r.bitwise_repeats)
    ]
    none = "no point was measured"
    found = {
        "every_point": _state(
            not slower, {"points": len(rows), "slower_points": slower}, bool(rows), none
        ),
        "geomean": _state(
            geomean is not None and geomean <= 0.85,
            {"points": len(rows), "geomean": geomean},
            bool(rows),
            none,
        ),
        "prefill_vs_cublas": _state(
            all(p[2] <= 1.10 for p in prefill),
            {"worst": max((p[2] for p in prefill), default=None), "points": prefill},
            bool(prefill),
            f"no point at {PREFILL[0]}-{PREFILL[1]} tokens",
        ),
        "decode_floor": _state(
            all(p[2] <= 1.25 for p in big) and all(p[2] <= 0.95 for p in small),
            {"big_weights_over_floor": big, "small_weights_over_humming": small},
            bool(big or small),
            f"no point at 1-{DECODE_MAX_TOKENS} tokens",
        ),
        "numerics": _state(
            not failing and bool(compiled) and all(compiled.values()),
            {"points_failing": failing, "compiled_bitwise": compiled},
            bool(rows),
            none,
        ),
        "memory": _state(memory["ours_peak_bytes"] <= memory["output_bytes"], memory)
        if memory
        else _absent(f"{REFERENCE[0]} at {REFERENCE[1]} was not run"),
        "startup": _state(max(startup.values()) <= STARTUP_LIMIT_S, {"cold_warmup_s": startup})
        if startup
        else _absent("no benchmarks/results/startup_w8a16.json"),
    }
    return {name: {"target": TARGETS[name], **found[name]} for name in TARGETS}


def _decode(rows: list[Row], big: bool) -> list[Row]:
    """The 1-8-token rows on weights of BIG_WEIGHT_BYTES or more (``big``), or fewer."""
    return [
        r for r in rows
        if r.tokens <= DECODE_MAX_TOKENS and (weight_bytes(r.n, r.k) >= BIG_WEIGHT_BYTES) == big
    ]  # fmt: skip


def _state(met: bool, numbers: dict, measured: bool = True, why: str = "") -> dict:
    """``met`` or ``MISSED`` with ``numbers``; ``not measured`` (``why``) where nothing the
    target reads was measured, so an empty sweep neither meets nor misses it."""
    if not measured:
        return _absent(why)
    return {"state": "met" if met else "MISSED", **numbers}


def _absent(why: str) -> dict:
    return {"state": "not measured", "why": why}


def startup_seconds(path: Path) -> dict | None:
    """Per projection shape, the cold start with warm-up (seconds to every capture size's
    first result) in ``startup.py --activation bf16``'s receipt, if there is one."""
    if not path.exists():
        return None
    results = json.loads(path.read_text())["results"]
    return {shape: r["cold_warmup"]["total_s"] for shape, r in results.items()}


# --- on the GPU -----------------------------------------------------------------------------


class Operands:
    """One shape's contenders over ``copies`` copies of one weight (the same bytes, each in
    its own memory), as vLLM's loader leaves an MXFP8 layer."""

    def __init__(self, n: int, k: int, copies: int):
        from humming_contender import HummingLinear

        import mxfp8_fusion as mf

        self.packed, self.hummings, self.dense = [], [], []
        for _ in range(copies):
            layer = vllm_style_layer(n, k)  # seeded: every copy holds the same bytes
            values, scales = layer.weight.data, layer.weight_scale.data
            self.hummings.append(HummingLinear(values.clone(), scales.clone()))
            self.dense.append(dequantize(values, scales))
            self.packed.append(mf.pack_weight(values, scales))
        self.w64 = self.dense[0].double()

    def call(self, name: str, copy: int, slices: list, x: torch.Tensor, out: torch.Tensor):
        """A no-argument callable running contender ``name`` on weight copy ``copy``."""
        import mxfp8_fusion as mf

        if name == "ours":
            return lambda: mf.mm_slices_into(slices, self.packed[copy], out)
        if name == "humming":
            return lambda: self.hummings[copy](x)
        if name == "humming_with_cat":
            return lambda: self.hummings[copy](torch.cat(slices, -1))
        return lambda: torch.nn.functional.linear(x, self.dense[copy])


def memory_at(ops: Operands, slices: list) -> dict:
    """Transient peak of one call (bytes above the start) at the reference geometry: ours,
    W8A16 with the concatenation (Humming as vLLM runs it) and our W8A8 staged path."""
    import mxfp8_fusion as mf

    packed = ops.packed[0]
    k = sum(s.shape[1] for s in slices)

    def staged(*s):
        dest = mf.empty_input(s[0].shape[0], k, s[0].device)
        mf.quantize_input_slices(list(s), dest)
        return mf.mm_quantized(dest, packed)

    ours, out = transient_peak(lambda *s: mf.mm_slices(list(s), packed), slices)
    with_cat, _ = transient_peak(lambda *s: ops.hummings[0](torch.cat(s, -1)), slices)
    w8a8, _ = transient_peak(staged, slices)
    return {
        "tokens": slices[0].shape[0], "slices": len(slices), "output_bytes": out.numel() * 2,
        "ours_peak_bytes": ours, "w8a16_with_cat_peak_bytes": with_cat,
        "w8a8_staged_peak_bytes": w8a8,
    }  # fmt: skip


def time_point(ops: Operands, slices, x, out, calls: int, rounds: int) -> dict:
    """Median microseconds per call of each contender: one graph each of ``calls`` calls
    cycling over the weight copies, replayed interleaved, the order rotated per round."""
    copies = len(ops.packed)
    graphs = {
        name: capture_graph([ops.call(name, i % copies, slices, x, out) for i in range(calls)])
        for name in CONTENDERS
    }
    return median_replays(graphs, calls, rounds)


def copy_bytes_per_s(rounds: int = COPY_ROUNDS) -> float:
    """The device-to-device copy rate (bytes read and written per second) of COPY_BYTES, far
    beyond L2: the median of ``rounds`` CUDA Graph replays of one copy."""
    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    graph = capture_graph([lambda: dst.copy_(src)])
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    seconds = []
    for _ in range(rounds):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        seconds.append(start.elapsed_time(end) / 1e3)
    return 2 * COPY_BYTES / statistics.median(seconds)


def bench_shape(
    shape: str, tokens: list[int], rounds: int, bytes_per_s: float
) -> tuple[list[Row], dict]:
    """Rows for ``shape`` at ``tokens``, and the shape's facts for the receipt; the floor at
    ``bytes_per_s``."""
    n, widths = SHAPES[shape]
    k = sum(widths)
    copies = weight_copies(n, k)
    ops = Operands(n, k, copies)
    inputs = {}
    for t in tokens:
        gen = torch.Generator(device="cuda").manual_seed(t)
        inputs[t] = [
            torch.randn(t, w, device="cuda", generator=gen).to(torch.bfloat16) for w in widths
        ]
    checks = {t: check_point(ops, s, torch.cat(s, -1)) for t, s in inputs.items()}
    labels, used = humming_kernels(ops.hummings[0], list(inputs))
    info = {"n": n, "widths": list(widths), "weight_copies": copies, "humming_kernels": used}
    info["compiled_bitwise"] = compiled_bitwise(ops, inputs)
    if (shape, REFERENCE[1]) == REFERENCE and REFERENCE[1] in inputs:
        info["memory"] = memory_at(ops, inputs[REFERENCE[1]])
    rows = []
    for t, slices in inputs.items():
        x = torch.cat(slices, -1)
        out = torch.empty(t, n, device="cuda", dtype=torch.bfloat16)
        us = time_point(ops, slices, x, out, calls_per_graph(t, n, k, copies), rounds)
        point, config = checks[t]
        rows.append(make_row(shape, t, n, widths, config, us, point, bytes_per_s, labels[t]))
        print_row(rows[-1])
    return rows, info


def print_row(r: Row) -> None:
    ok = r.within_bound and r.bitwise_concatenated and r.bitwise_graph and r.bitwise_repeats
    humming = "".join(
        flag for flag, bad in (("b", r.humming_within_bound is False),
                               ("v", r.humming_bitwise_repeats is False)) if bad
    ) or "-"  # fmt: skip
    print(
        f"{r.shape:28} {r.tokens:6d} {r.us['ours']:9.2f} {r.us['humming']:10.2f} "
        f"{r.us['cublas_bf16']:9.2f} {r.ours_over_humming_time:8.3f} {r.ours_over_floor:8.2f} "
        f"{'ok' if ok else 'FAIL'} {humming}",
        flush=True,
    )


def build_receipt(rows, shapes, machine, rounds, startup, bytes_per_s=None) -> dict:
    """The receipt: the sides, the mode, the machine, every point and the targets."""
    compiled = {
        name: info["compiled_bitwise"]
        for name, info in shapes.items()
        if "compiled_bitwise" in info
    }
    memory = next((info["memory"] for info in shapes.values() if "memory" in info), None)
    return {
        "what": "W8A16 MXFP8-weight projection straight from BF16 slices (mxfp8_fusion.mm_slices_into) "
        "against Humming as vLLM 0.34 calls it on SM90, and cuBLAS BF16",
        "sides": {
            "ours": "mm_slices_into(slices, weight, out): no concatenation, no quantization",
            "humming": "humming_forward as vLLM 0.34 calls it (W8A16) on the concatenated input",
            "humming_with_cat": "the same after torch.cat(slices, -1), as vLLM runs it",
            "cublas_bf16": "F.linear on the concatenation and the weight dequantized to BF16",
        },
        "mode": f"CUDA Graph replay of calls_per_graph calls cycling over weight copies (beyond L2), "
        f"CUDA events, median of {rounds} rounds, contenders interleaved, order rotated per round",
        "ratio": "ours_over_humming_time = ours_us / humming_us (below 1: ours faster); "
        "ours_over_cublas_bf16_time = ours_us / cublas_bf16_us; ours_over_floor = ours_us / "
        "floor_us, the weight-read floor: the MXFP8 weight bytes (E4M3 values and E8M0 scales) "
        f"at the copy rate measured in this run, copy_bytes_per_s = {_rate(bytes_per_s)}",
        "copy_bytes_per_s": bytes_per_s,
        "copy": f"median of {COPY_ROUNDS} CUDA Graph replays of one device-to-device copy of "
        f"{COPY_BYTES} bytes (far beyond L2), counted read plus write, measured once at the "
        "start of this run",
        "machine": machine,
        "shapes": shapes,
        "rows": [asdict(r) for r in rows],
        "targets": targets(rows, memory, compiled, startup),
        "humming_numerics": humming_numerics(rows),
    }


def _rate(bytes_per_s: float | None) -> str:
    return "not measured" if bytes_per_s is None else f"{bytes_per_s / 1e12:.3f} TB/s"


def main() -> int:
    """Measure the chosen shapes at the chosen token counts, writing the receipt after each
    shape; exit 1 if a shape failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS))
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--startup", default="benchmarks/results/startup_w8a16.json")
    parser.add_argument("--out", default="benchmarks/results/w8a16.json")
    args = parser.parse_args()
    require_cuda(__file__)
    machine = {**environment(), "sms": torch.cuda.get_device_properties(0).multi_processor_count}
    startup = startup_seconds(Path(args.startup))
    rate = copy_bytes_per_s()
    print(f"copy rate {rate / 1e12:.2f} TB/s (the floor's)", flush=True)
    print("shape, tokens, us: ours, humming, cublas_bf16; ours / humming, ours / floor; ours'"
          " checks; humming's (b: outside the bound, v: bits vary)", flush=True)  # fmt: skip
    rows, shapes = [], {name: {"error": "not reached"} for name in args.shapes}
    for name in args.shapes:
        start = time.perf_counter()
        try:
            shape_rows, shapes[name] = bench_shape(name, args.tokens, args.rounds, rate)
            rows += shape_rows
        except Exception as exc:  # the receipt keeps the shapes measured before
            shapes[name] = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"{name}: FAILED {shapes[name]['error']}", file=sys.stderr, flush=True)
        shapes[name]["wall_s"] = round(time.perf_counter() - start, 1)
        torch.cuda.empty_cache()
        receipt = build_receipt(rows, shapes, machine, args.rounds, startup, rate)
        write_receipt(args.out, receipt)
    for name, target in build_receipt(rows, shapes, machine, args.rounds, startup, rate)[
        "targets"
    ].items():
        print(f"{name:>13}: {target['state']}")
    return 1 if any("error" in info for info in shapes.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
