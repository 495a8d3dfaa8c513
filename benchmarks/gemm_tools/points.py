"""One worker process of ``benchmarks/gemm.py --sweep`` / ``--tune``: one weight shape at
some token counts.

Each point times CUDA Graph replays (GPU time only) of our GEMM and of cuBLAS BF16
``torch.mm`` on the same shape, interleaved per round (the order rotated each round), and
takes medians. A graph holds several launches; where the weight is small enough to stay in
L2 the launches rotate over copies of it (at least ``L2_ROTATE_BYTES`` of FP8 weight), for
cuBLAS likewise, so neither side reads its weight from L2 as no served model would.

* sweep: ``mm_quantized_into`` with the config ``choose_config`` picks (the measured table),
  and with ``--before`` also the pre-table heuristic (``main_heuristic``) through
  ``gemm_sm90.run``;
* tune: the candidate configs of each point (``candidates``) through ``gemm_sm90.run``
  (``gemm_sm90.host.w8a16.run`` on the BF16 tokens with ``--activation bf16``).

Every (config, N, K) is its own compile (5-20 s of CPU), so a worker compiles all of its
configs first, in parallel with the other workers, and takes the GPU only under a file lock
(data, capture and timing happen only while holding it). It checks every contender's output
against cuBLAS on the dequantized operands before timing it.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import statistics
import time
from pathlib import Path

from mxfp8_fusion.kernels.gemm_sm90.config import label
from mxfp8_fusion.kernels.gemm_sm90.tuning import select as gemm_select
from mxfp8_fusion.kernels.gemm_sm90.tuning.search import candidates, main_heuristic

# (N, K): the projection it is
SHAPES = {
    (7168, 43008): "six-slice drafter fc (the reference geometry)",
    (4096, 12288): "EAGLE-3 drafter fc of an 8B model (3 x 4096)",
    (7168, 14336): "DeepSeek-V3 / Kimi MTP eh_proj (2 x 7168)",
    (7168, 18432): "dense MLP down_proj (DeepSeek-V3 dense layers)",
    (18432, 7168): "dense MLP gate / up_proj (DeepSeek-V3 dense layers)",
    (2048, 7168): "MoE expert gate / up_proj (DeepSeek-V3)",
}
TOKENS = (1, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 1024, 2048, 4096, 8192, 16384)
L2_ROTATE_BYTES = 200e6
MAX_INNER = 50  # launches per graph
CHECK_REL = 1e-2  # relative Frobenius error against cuBLAS on the dequantized operands
SPIN_CYCLES = 50_000  # GPU busy while the host enqueues the timed replay


# ---------------------------------------------------------------------------------------
# worker: one shape, some token counts


def _replay_ms(graph, inner: int, rest_s: float) -> float:
    import torch

    torch.cuda.synchronize()
    time.sleep(rest_s)
    graph.replay()  # warm-up: every contender starts from the same clock state
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(SPIN_CYCLES)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / inner


class _Data:
    """One shape's operands for up to ``rows`` tokens, with weight copies for L2 rotation."""

    def __init__(self, n: int, k: int, rows: int):
        import torch

        from mxfp8_fusion import api, reference
        from mxfp8_fusion.format import MXFP8Weight

        gen = torch.Generator(device="cuda").manual_seed(n * 7 + k)
        self.x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16, generator=gen)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02
        self.inp = api.quantize(self.x)
        wq = api.pack_weight(w)
        self.copies = max(1, math.ceil(L2_ROTATE_BYTES / (n * k)))
        self.wq = [wq] + [
            MXFP8Weight(wq.values.clone(), wq.scales.clone()) for _ in range(self.copies - 1)
        ]
        self.w = [w] + [w.clone() for _ in range(self.copies - 1)]
        self.xd = reference.dequantize(self.inp.values, self.inp.scales).to(torch.bfloat16)
        self.wd = reference.dequantize(wq.values, wq.scales).to(torch.bfloat16)
        self.out = torch.empty(rows, n, device="cuda", dtype=torch.bfloat16)


def _device_name() -> str:
    """The GPU's name (a table is its measured device's only); without one (the tooling's
    CPU tests) the device the table was measured on."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return gemm_select.table.MEASURED_DEVICE


def _configs(job, t, num_sms) -> dict:
    """name -> config of our contenders at ``t`` tokens (not cuBLAS): the sweep's by role
    (``ours``, ``before``), the tune's by their labels. A tune leaves out the configs whose
    schedule hung in a worker (``job["hung_schedules"]``)."""

    n, k = job["n"], job["k"]
    activation = job.get("activation", "mxfp8")
    if job["mode"] == "sweep":
        ours = gemm_select.choose_config(t, n, k, num_sms, _device_name(), activation)
        found = {"ours": ours}
        if job["before"]:
            found["before"] = main_heuristic(t, n, k, num_sms)
    else:
        hung = job.get("hung_schedules", ())
        found = {
            label(cfg): cfg
            for cfg in candidates(t, n, k, num_sms, job["leave_out"], activation)
            if gemm_select.schedule(cfg) not in hung
        }
    return {name: cfg for name, cfg in found.items() if cfg not in _FAILED}


def _contenders(job, data, t, num_sms) -> dict:
    """name -> (launch i -> None, what it is: its label and our configs' schedule): ours
    through the configs of :func:`_configs` (``mm_quantized_into`` for the sweep's own
    choice), and cuBLAS."""
    import torch

    from mxfp8_fusion import api
    from mxfp8_fusion.kernels.gemm_sm90.host import gemm as g
    from mxfp8_fusion.kernels.gemm_sm90.host import w8a16

    out = data.out[:t]
    a_values = data.inp.values[:t]

    def run_cfg(cfg):
        weight = data.wq
        if cfg.activation == "bf16":  # W8A16: the BF16 tokens as one slice
            return lambda i: w8a16.run(
                [data.x[:t]], weight[i % data.copies].values, weight[i % data.copies].scales,
                None, out, config=cfg,
            )  # fmt: skip
        return lambda i: g.run(
            a_values, data.inp.scales, weight[i % data.copies].values,
            weight[i % data.copies].scales, None, out, config=cfg,
        )  # fmt: skip

    found = {}
    for name, cfg in _configs(job, t, num_sms).items():
        what = {"label": label(cfg), "schedule": gemm_select.schedule(cfg)}
        if name == "ours" and cfg.activation != "bf16":
            found[name] = (
                lambda i: api.mm_quantized_into(
                    data.inp, data.wq[i % data.copies], data.out, tokens=t
                ),
                what,
            )
        else:
            found[name] = (run_cfg(cfg), what)
    x = data.x[:t]
    found["cublas_bf16"] = (
        lambda i: torch.mm(x, data.w[i % data.copies].t(), out=out),
        {"label": "torch.mm BF16"},
    )
    return found


_FAILED: dict = {}  # config -> why its compile failed (the tune leaves it out)


def _compile(cfg, n, k, compile_s):
    """Compile outside the GPU lock; records seconds per config label and token tile (and
    failures)."""
    import torch

    from mxfp8_fusion.kernels.gemm_sm90.host import gemm as g
    from mxfp8_fusion.kernels.runtime import launcher

    t0 = time.perf_counter()
    a = k if cfg.activation.quantized else (k,)  # W8A16: the tokens as one slice
    build = g.gemm_build(cfg, n, a, n, torch.bfloat16, None)
    try:  # made ready in this process (compiled, or read from the kernel cache)
        launcher.function(build)
    except Exception as e:  # recorded in the receipt; the other configs go on
        _FAILED[cfg] = f"{type(e).__name__}: {e}"[:300]
    tile = f" t{cfg.tokens_tile}" if cfg.kernel == "swap-ab" else ""
    compile_s.setdefault(label(cfg) + tile, time.perf_counter() - t0)


def worker(job: dict) -> None:
    """Time ``job``'s points, writing ``job['out']`` after each one."""
    import torch

    from mxfp8_fusion.kernels.gemm_sm90.host import buffers
    from mxfp8_fusion.kernels.runtime import launcher

    n, k = job["n"], job["k"]
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    state = {"n": n, "k": k, "points": [], "compile_s": {}, "status": "compiling"}
    out_path = Path(job["out"])

    def save():
        tmp = out_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, out_path)

    # every config of the job first, outside the lock (CPU only, in parallel with the
    # other workers and with whatever holds the GPU)
    launcher.function(buffers.refs_build(k))
    for t in job["tokens"]:
        for cfg in _configs(job, t, num_sms).values():
            _compile(cfg, n, k, state["compile_s"])
    state["compile_failures"] = {label(c): why for c, why in _FAILED.items()}
    from mxfp8_fusion import api

    api.quantize(torch.zeros(1, k, device="cuda", dtype=torch.bfloat16))  # its compile
    save()
    data = None
    lock = open(job["lock"], "a")
    for t in job["tokens"]:
        if time.time() > job["deadline"]:
            state["status"] = "deadline"
            break
        fcntl.flock(lock, fcntl.LOCK_EX)
        gate = Path(job["gate"]) if job["gate"] else None
        if gate is not None and gate.exists():
            # partial schedules whose GPU tests failed: time only the other configs
            job["leave_out"] = [*job["leave_out"], *json.loads(gate.read_text())]
        hung = Path(job["hung"])
        if hung.exists():  # schedules another worker hung on (see runs._run_workers)
            job["hung_schedules"] = [json.loads(s) for s in hung.read_text().splitlines()]
        try:
            state["status"], state["since"], state["point"] = "timing", time.time(), t
            save()
            try:
                if data is None:
                    data = _Data(n, k, max(job["tokens"]))
                state["points"].append(_point(job, data, t, num_sms, state, save))
            except Exception as e:  # recorded; a broken context fails the later points too
                state.setdefault("errors", {})[str(t)] = f"{type(e).__name__}: {e}"[:500]
            state["status"] = "idle"
            save()
        finally:
            try:
                torch.cuda.synchronize()
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        if state["points"] and state["points"][-1]["tokens"] == t:
            p = state["points"][-1]["contenders"]
            print(
                f"N {n} K {k} tokens {t}: " + ", ".join(f"{c} {v['ms']:.4f}" for c, v in p.items()),
                flush=True,
            )
        else:
            print(f"N {n} K {k} tokens {t}: {state['errors'][str(t)]}", flush=True)
    if state["status"] != "deadline":
        state["status"] = "done"
    save()


def _point(job, data, t, num_sms, state, save) -> dict:
    """One token count: each contender checked, then timed. ``state["checking"]`` holds
    the label and schedule of the contender whose first launch is running, so a hang can be
    pinned on its config."""
    import torch
    from common import capture_graph

    n, k = job["n"], job["k"]
    flops = 2.0 * t * n * k
    inner = min(MAX_INNER, max(data.copies, int(2e13 // flops), 1))
    # W8A16 multiplies the BF16 tokens themselves, W8A8 their MXFP8 values
    tokens = data.x if job.get("activation", "mxfp8") == "bf16" else data.xd
    ref = torch.mm(tokens[:t], data.wd.t())
    contenders = _contenders(job, data, t, num_sms)
    result = {"tokens": t, "inner": inner, "weight_copies": data.copies, "contenders": {}}
    graphs = {}
    for name, (fn, what) in contenders.items():
        data.out.fill_(float("nan"))
        state["checking"] = what
        save()
        fn(0)
        got = data.out[:t].float()
        rel = ((got - ref.float()).norm() / ref.float().norm()).item()
        valid = math.isfinite(rel) and rel < CHECK_REL
        result["contenders"][name] = {**what, "rel_err_vs_dequant_cublas": rel}
        if valid or name == "cublas_bf16":
            graphs[name] = capture_graph([lambda i=i, fn=fn: fn(i) for i in range(inner)])
        else:
            result["contenders"][name]["ms"] = float("nan")
    samples = {name: [] for name in graphs}
    names = list(graphs)
    for r in range(job["rounds"]):
        for j in range(len(names)):
            name = names[(r + j) % len(names)]
            samples[name].append(_replay_ms(graphs[name], inner, job["rest_s"]))
    cub = statistics.median(samples["cublas_bf16"])
    for name, times in samples.items():
        ms = statistics.median(times)
        entry = result["contenders"][name]
        entry.update(ms=ms, samples_ms=times, over_cublas_bf16=ms / cub)
    del graphs
    state.pop("checking", None)
    return result
