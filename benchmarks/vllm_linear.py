"""vLLM MXFP8 linear receipt (sm_90): the plugin's kernel class against vLLM's own choice.

The layer is built as vLLM's MXFP8 linear methods build it (E4M3 ``weight`` ``[N, K]`` and
uint8 E8M0 ``weight_scale`` ``[N, K/32]``); no vLLM is needed. Per token count, measured
side by side in one process, interleaved per round, as CUDA Graph replays:

* ours: ``mxfp8_fusion.vllm.linear.apply_weights`` on a layer packed by ``process_weights``
  (the plugin kernel class's call: input quantized to MXFP8, MXFP8 GEMM; W8A8)
* humming: Humming as vLLM 0.34 calls it on SM90 for an MXFP8 checkpoint
  (``humming_contender.HummingLinear``: BF16 activations, W8A16), vLLM's kernel there
* cublas_bf16: cuBLAS BF16 (``F.linear``) on the weight dequantized once: a reference

Each graph rotates over copies of the weight (together at least ``L2_ROTATE_BYTES``), so
every call reads its weight from HBM, as in a model's forward. Every token count is run once
(compiling) before any is timed. Numerics per point: max |out - ref| / max |ref| against FP64
products: the BF16 model (BF16 input x dequantized weight) for all three, and for ours also
its own W8A8 reference (the input quantized to MXFP8 first).

The receipt's ``rule`` block says whether ours may go ahead of vLLM's choice on this arch:
only if ours takes at most Humming's time at every measured point of every shape. Writes
benchmarks/results/vllm_linear.json (after each shape, so a stopped run keeps what it has).

    python benchmarks/vllm_linear.py [--shapes ...] [--tokens ...] [--trimmed] [--rounds 15]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import torch
from common import capture_graph, environment, require_cuda, write_receipt
from torch import nn

from mxfp8_fusion.vllm import linear

SHAPES = {  # name -> (N, K)
    "drafter_fc_3x4096_to_4096": (4096, 12288),
    "mtp_eh_proj_2x7168_to_7168": (7168, 14336),
    "reference_6x7168_to_7168": (7168, 43008),
    "moe_gate_up_7168_to_2048": (2048, 7168),
    "mlp_up_4096_to_11008": (11008, 4096),
    "o_proj_4096_to_4096": (4096, 4096),
}
CAPTURE_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)  # vLLM's default capture sizes
PREFILL_TOKENS = (1024, 2048, 4096)  # eager in vLLM; measured as graph replay here too
TOKENS = CAPTURE_TOKENS + PREFILL_TOKENS
TRIMMED_TOKENS = (1, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
CONTENDERS = ("ours", "humming", "cublas_bf16")
L2_ROTATE_BYTES = 200e6  # weight bytes a graph cycles through (H200 L2: 60 MB)
MAX_CALLS = 50  # calls per graph at the smallest points
SPIN_CYCLES = 50_000  # GPU busy while the host enqueues the timed replay
VLLM_CHOICE_SM90 = "Humming (vLLM 0.34 HummingMxfp8LinearKernel; W8A16: BF16 activations)"


@dataclass
class Row:
    shape: str
    tokens: int
    n: int
    k: int
    regime: str
    weight_copies: int
    calls_per_graph: int
    ours_us: float
    humming_us: float
    cublas_bf16_us: float
    ours_over_humming_time: float
    ours_over_cublas_bf16_time: float
    humming_over_cublas_bf16_time: float
    ours_at_least_as_fast_as_humming: bool
    humming_kernel: str
    ours_tflops: float
    humming_err_vs_bf16_model: float
    ours_err_vs_w8a8_reference: float
    ours_err_vs_bf16_model: float
    cublas_bf16_err_vs_bf16_model: float
    ours_bitwise_equal_to_mm: bool
    ours_first_call_s: float
    humming_first_call_s: float


# --- pure logic: what is measured where, and what the numbers decide ----------------------


def regime(tokens: int) -> str:
    if tokens in CAPTURE_TOKENS:
        return "decode: a vLLM CUDA-graph capture size"
    return "prefill: eager in vLLM, measured here as graph replay"


def weight_copies(n: int, k: int) -> int:
    """Copies of an N x K MXFP8 weight a graph cycles through: L2_ROTATE_BYTES of E4M3."""
    return max(1, math.ceil(L2_ROTATE_BYTES / (n * k)))


def calls_per_graph(tokens: int, n: int, k: int, copies: int) -> int:
    """About 4 TFLOP of work per graph (at most MAX_CALLS calls), rounded up to whole
    passes over the ``copies`` weights."""
    wanted = max(1, min(MAX_CALLS, int(4e12 // (2.0 * tokens * n * k))))
    return math.ceil(wanted / copies) * copies


def make_row(shape, tokens, n, k, copies, calls, us, errors, first_s, bitwise, kernel) -> Row:
    """One receipt row from the medians ``us`` (contender -> microseconds per call), the
    errors (Row's ``*_err_*`` fields), the first-call seconds and the Humming kernel label."""
    return Row(
        shape=shape,
        tokens=tokens,
        n=n,
        k=k,
        regime=regime(tokens),
        weight_copies=copies,
        calls_per_graph=calls,
        ours_us=us["ours"],
        humming_us=us["humming"],
        cublas_bf16_us=us["cublas_bf16"],
        ours_over_humming_time=us["ours"] / us["humming"],
        ours_over_cublas_bf16_time=us["ours"] / us["cublas_bf16"],
        humming_over_cublas_bf16_time=us["humming"] / us["cublas_bf16"],
        ours_at_least_as_fast_as_humming=bool(us["ours"] <= us["humming"]),
        humming_kernel=kernel,
        ours_tflops=2.0 * tokens * n * k / (us["ours"] * 1e-6) / 1e12,
        ours_bitwise_equal_to_mm=bool(bitwise),
        ours_first_call_s=first_s["ours"],
        humming_first_call_s=first_s["humming"],
        **errors,
    )


def verdict(rows: list[Row]) -> dict:
    """Whether ours takes at most Humming's time at every point of ``rows``, with counts."""
    ratios = [r.ours_over_humming_time for r in rows]
    slower = [r for r in rows if not r.ours_at_least_as_fast_as_humming]
    return {
        "ours_at_least_as_fast_as_humming_at_every_point": "yes" if rows and not slower else "no",
        "points": len(rows),
        "points_ours_at_least_as_fast": len(rows) - len(slower),
        "points_ours_slower": len(slower),
        "ours_slower_at_tokens": [r.tokens for r in slower],
        "ours_over_humming_min": min(ratios, default=None),
        "ours_over_humming_median": statistics.median(ratios) if ratios else None,
        "ours_over_humming_max": max(ratios, default=None),
    }


def rule(rows: list[Row], arch: str, shapes_not_measured=()) -> dict:
    """The receipt's decision for ``arch``: ours may go ahead of vLLM's choice only where it
    takes at most that kernel's time at every measured point of every shape; a shape that
    was asked for but not measured, or no rows at all, means no."""
    slower = [
        {
            "shape": r.shape,
            "tokens": r.tokens,
            "ours_us": r.ours_us,
            "humming_us": r.humming_us,
            "ours_over_humming_time": r.ours_over_humming_time,
        }
        for r in rows
        if not r.ours_at_least_as_fast_as_humming
    ]
    may = bool(rows) and not slower and not list(shapes_not_measured)
    overall = verdict(rows)
    return {
        "arch": arch,
        "vllm_choice": VLLM_CHOICE_SM90 if arch == "sm_90" else "not measured here",
        "condition": "ours goes ahead of vLLM's choice only if ours_us <= humming_us "
        "(medians) at every measured point of every shape",
        "ours_may_go_ahead_of_vllm_choice": may,
        "answer": "yes" if may else "no",
        "points": overall["points"],
        "points_ours_at_least_as_fast": overall["points_ours_at_least_as_fast"],
        "points_ours_slower": overall["points_ours_slower"],
        "ours_over_humming_min": overall["ours_over_humming_min"],
        "ours_over_humming_median": overall["ours_over_humming_median"],
        "ours_over_humming_max": overall["ours_over_humming_max"],
        "shapes_not_measured": list(shapes_not_measured),
        "slower_points": slower,
    }


def build_receipt(rows: list[Row], shapes: dict, machine: dict, rounds: int, humming: dict):
    """The receipt: both sides and the reference, the mode, the machine, the ratios with their
    direction, per-shape and overall verdicts and the rule for the measured arch."""
    failed = [name for name, info in shapes.items() if "error" in info]
    return {
        "what": "vLLM MXFP8 linear: the mxfp8_fusion plugin kernel class (apply_weights) vs "
        "vLLM's own kernel on this arch (Humming, as vLLM 0.34 calls it), cuBLAS BF16 for "
        "reference",
        "sides": {
            "ours": "mxfp8_fusion.vllm.linear.apply_weights on a layer packed by process_weights "
            "(BF16 input quantized to MXFP8 per call, MXFP8 GEMM: W8A8)",
            "humming": "humming_forward as vLLM 0.34 HummingMxfp8LinearKernel calls it "
            "(weight E4M3 as int32 [N, K/4], E8M0 scales, padded N to 256 / K to 128; input "
            "schema kMxfp8Dynamic after check_and_fallback_input_schema: see humming)",
            "cublas_bf16": "torch.nn.functional.linear on the weight dequantized to BF16 once "
            "(reference; twice the weight memory)",
        },
        "mode": f"CUDA Graph replay of calls_per_graph back-to-back calls cycling over "
        f"weight_copies weight copies (>= {L2_ROTATE_BYTES / 1e6:.0f} MB of E4M3, beyond L2), "
        f"timed by CUDA events; median of {rounds} rounds, contenders interleaved and their "
        "order rotated per round; every token count run once (compiled) before timing",
        "tokens": {
            "decode": list(CAPTURE_TOKENS),
            "prefill": list(PREFILL_TOKENS),
            "note": "decode counts are vLLM's default CUDA-graph capture sizes; prefill "
            "counts run eager in vLLM but are measured here as graph replay too",
        },
        "ratio": "ours_over_humming_time = ours_us / humming_us, ours_over_cublas_bf16_time = "
        "ours_us / cublas_bf16_us, humming_over_cublas_bf16_time likewise (below 1: the first "
        "named is faster)",
        "numerics": "*_err_* = max |out - ref| / max |ref| over the output; refs in FP64: "
        "bf16_model = BF16 input x dequantized weight; w8a8_reference = the input quantized "
        "to MXFP8 (RCEIL, mxfp8_fusion.reference) x dequantized weight",
        "machine": machine,
        "humming": humming,
        "shapes": shapes,
        "rows": [asdict(r) for r in rows],
        "verdict": verdict(rows),
        "rule": rule(rows, machine.get("arch", "unknown"), failed),
    }


# --- on the GPU -----------------------------------------------------------------------------


def vllm_style_layer(n: int, k: int, seed: int = 0, device: str = "cuda") -> nn.Module:
    """Parameters as vLLM's loader leaves them: created empty, the checkpoint bytes copied in."""
    gen = torch.Generator(device=device).manual_seed(seed)
    layer = nn.Module()
    layer.weight = nn.Parameter(
        torch.empty(n, k, dtype=torch.float8_e4m3fn, device=device), requires_grad=False
    )
    layer.weight_scale = nn.Parameter(
        torch.empty(n, k // 32, dtype=torch.uint8, device=device), requires_grad=False
    )
    w = torch.randn(n, k, device=device, generator=gen) * 64 * k**-0.5
    layer.weight.data.copy_(w.clamp(-448, 448).to(torch.float8_e4m3fn))
    layer.weight_scale.data.copy_(
        torch.randint(118, 126, (n, k // 32), device=device, dtype=torch.uint8, generator=gen)
    )
    return layer


def dequantize(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """MXFP8 ``[N, K]`` with row-major E8M0 ``[N, K/32]`` to BF16 (exact: powers of two)."""
    n, k = values.shape
    factors = torch.exp2(scales.float() - 127).to(torch.bfloat16)
    return (values.to(torch.bfloat16).view(n, k // 32, 32) * factors[..., None]).view(n, k)


def relative_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """max |got - ref| / max |ref| (``ref`` FP64)."""
    return ((got.double() - ref).abs().max() / ref.abs().max()).item()


class Operands:
    """One shape's three contenders over ``copies`` copies of one weight (same bytes, own
    memory), and what the checks need: the packed weight and the FP64 dequantized weight."""

    def __init__(self, n: int, k: int, copies: int):
        from humming_contender import HummingLinear

        import mxfp8_fusion as mf

        self.layers, self.hummings, self.weights_bf16 = [], [], []
        for _ in range(copies):
            layer = vllm_style_layer(n, k)  # seeded: every copy holds the same bytes
            values, scales = layer.weight.data.clone(), layer.weight_scale.data.clone()
            self.hummings.append(HummingLinear(values, scales))
            self.weights_bf16.append(dequantize(values, scales))
            linear.process_weights(layer, f"{n}x{k}")
            self.layers.append(layer)
        self.packed = mf.pack_weight(values, scales)
        self.w64 = self.weights_bf16[0].double()

    def call(self, name: str, copy: int, x: torch.Tensor):
        """A no-argument callable running contender ``name`` on weight copy ``copy``."""
        if name == "ours":
            return lambda: linear.apply_weights(self.layers[copy], x)
        if name == "humming":
            return lambda: self.hummings[copy](x)
        return lambda: torch.nn.functional.linear(x, self.weights_bf16[copy])


def first_calls(ops: Operands, x: torch.Tensor) -> tuple[dict, dict, bool]:
    """(first-call seconds per contender, the errors, ours bitwise equal to ``mf.mm``): the
    first call at a token count compiles what it needs, so it runs before any timing."""
    import mxfp8_fusion as mf
    from mxfp8_fusion import reference

    seconds, outs = {}, {}
    for name in CONTENDERS:
        fn = ops.call(name, 0, x)
        torch.cuda.synchronize()
        start = time.perf_counter()
        outs[name] = fn()
        torch.cuda.synchronize()
        seconds[name] = time.perf_counter() - start
    bf16_model = x.double() @ ops.w64.T
    w8a8 = reference.dequantize(*reference.quantize(x)).double() @ ops.w64.T
    errors = {
        "humming_err_vs_bf16_model": relative_error(outs["humming"], bf16_model),
        "ours_err_vs_w8a8_reference": relative_error(outs["ours"], w8a8),
        "ours_err_vs_bf16_model": relative_error(outs["ours"], bf16_model),
        "cublas_bf16_err_vs_bf16_model": relative_error(outs["cublas_bf16"], bf16_model),
    }
    expected = mf.mm(x, ops.packed)
    bitwise = torch.equal(outs["ours"].view(torch.int16), expected.view(torch.int16))
    return seconds, errors, bool(bitwise)


def replay_us(graph: torch.cuda.CUDAGraph, calls: int) -> float:
    graph.replay()  # warm: clocks as in steady decoding
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(SPIN_CYCLES)  # the events bracket GPU work, not the host's enqueueing
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / calls


def time_point(ops: Operands, x: torch.Tensor, calls: int, rounds: int) -> dict:
    """Median microseconds per call of each contender: one graph each of ``calls`` calls
    cycling over the weight copies, replayed interleaved, the order rotated per round."""
    copies = len(ops.layers)
    graphs = {
        name: capture_graph([ops.call(name, i % copies, x) for i in range(calls)])
        for name in CONTENDERS
    }
    return median_replays(graphs, calls, rounds)


def median_replays(graphs: dict, calls: int, rounds: int) -> dict:
    """Median microseconds per call of each graph of ``calls`` calls: replayed interleaved,
    one sample each per round, the order rotated by one each round."""
    samples = {name: [] for name in graphs}
    names = list(graphs)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            samples[name].append(replay_us(graphs[name], calls))
    return {name: statistics.median(v) for name, v in samples.items()}


def humming_kernels(humming, tokens: list[int]) -> tuple[dict, list]:
    """(token count -> kernel label, the intervals serving the measured counts)."""
    from humming_contender import config_label, interval_for

    try:
        intervals = humming.intervals
    except Exception as exc:  # the label is a note: the timing stands without it
        return {t: f"unknown ({type(exc).__name__}: {exc})" for t in tokens}, []
    labels, used = {}, {}
    for t in tokens:
        low, high, cfg = interval_for(intervals, t)
        labels[t] = config_label(cfg)
        used.setdefault((low, high), {"rows": [low, high], "tokens": [], "config": cfg})
        used[(low, high)]["tokens"].append(t)
    return labels, list(used.values())


def bench_shape(shape: str, tokens: list[int], rounds: int) -> tuple[list[Row], dict]:
    """Rows for ``shape`` at ``tokens``, and the shape's facts for the receipt."""
    n, k = SHAPES[shape]
    copies = weight_copies(n, k)
    ops = Operands(n, k, copies)
    xs = {}
    for t in tokens:
        gen = torch.Generator(device="cuda").manual_seed(t)
        xs[t] = torch.randn(t, k, device="cuda", generator=gen).to(torch.bfloat16)
    checks = {t: first_calls(ops, xs[t]) for t in tokens}  # every count compiled first
    labels, used = humming_kernels(ops.hummings[0], tokens)
    rows = []
    for t in tokens:
        calls = calls_per_graph(t, n, k, copies)
        us = time_point(ops, xs[t], calls, rounds)
        seconds, errors, bitwise = checks[t]
        rows.append(
            make_row(shape, t, n, k, copies, calls, us, errors, seconds, bitwise, labels[t])
        )
        print_row(rows[-1])
    info = {
        "n": n,
        "k": k,
        "weight_copies": copies,
        "first_calls_s": {
            name: round(sum(checks[t][0][name] for t in tokens), 2) for name in CONTENDERS
        },
        "humming_input_schema": ops.hummings[0].decision,
        "humming_kernels": used,
        "verdict": verdict(rows),
    }
    return rows, info


HEADER = (
    f"{'shape':28} {'tokens':>6} {'ours us':>9} {'humming us':>10} {'cuBLAS us':>9} "
    f"{'ours/hum':>8} {'ours/cub':>8} {'hum err':>8} {'ours err':>8}  humming kernel"
)


def print_row(r: Row) -> None:
    print(
        f"{r.shape:28} {r.tokens:6d} {r.ours_us:9.2f} {r.humming_us:10.2f} "
        f"{r.cublas_bf16_us:9.2f} {r.ours_over_humming_time:8.3f} "
        f"{r.ours_over_cublas_bf16_time:8.3f} {r.humming_err_vs_bf16_model:8.1e} "
        f"{r.ours_err_vs_bf16_model:8.1e}  {r.humming_kernel}",
        flush=True,
    )


def _machine() -> dict:
    major, minor = torch.cuda.get_device_capability()
    props = torch.cuda.get_device_properties(0)
    return {
        **environment(),
        "arch": f"sm_{major}{minor}",
        "sms": props.multi_processor_count,
        "l2_bytes": getattr(props, "L2_cache_size", None),
    }


def _humming_facts() -> dict:
    import importlib.metadata

    import humming_contender as hc

    try:
        version = importlib.metadata.version("humming-kernels")
    except importlib.metadata.PackageNotFoundError:  # on PYTHONPATH, no metadata
        import humming

        version = humming.__version__
    return {
        "package": f"humming-kernels {version}",
        "weight_config": hc.WEIGHT_CONFIG,
        "compute_config": hc.COMPUTE_CONFIG,
        "pad_n_to_multiple": hc.PAD_N,
        "pad_k_to_multiple": hc.PAD_K,
        "locks": f"zeros(SMs * {hc.LOCKS_PER_SM}, int32)",
        "requested_input_schema": "kMxfp8Dynamic: E4M3, E8M0 scale per 32, dynamic group",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS))
    parser.add_argument("--trimmed", action="store_true", help="tokens: " + str(TRIMMED_TOKENS))
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", default="benchmarks/results/vllm_linear.json")
    args = parser.parse_args()
    require_cuda(__file__)
    tokens = list(TRIMMED_TOKENS) if args.trimmed else args.tokens
    machine, humming = _machine(), _humming_facts()
    rows, shapes = [], {name: {"error": "not reached"} for name in args.shapes}
    print(HEADER, flush=True)
    for name in args.shapes:
        start = time.perf_counter()
        try:
            shape_rows, shapes[name] = bench_shape(name, tokens, args.rounds)
            rows += shape_rows
        except Exception as exc:  # the receipt keeps the shapes measured before
            shapes[name] = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"{name}: FAILED {shapes[name]['error']}", file=sys.stderr, flush=True)
        shapes[name]["wall_s"] = round(time.perf_counter() - start, 1)
        torch.cuda.empty_cache()
        write_receipt(args.out, build_receipt(rows, shapes, machine, args.rounds, humming))
    print(rule(rows, machine["arch"], [s for s, i in shapes.items() if "error" in i]))
    return 1 if any("error" in info for info in shapes.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
