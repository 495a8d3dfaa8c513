"""Runs of ``benchmarks/gemm.py --sweep`` / ``--tune``: the workers (:mod:`.points`) started
one per shape and token group, watched for a hang and for the deadline, and their results
merged into the receipt, which :mod:`.report` then prints, plots or writes the table from.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import decode
from .points import CHECK_REL, SHAPES, TOKENS
from .report import merge_base, merge_states, plot, summary, write_table

# the script whose ``--worker JSON`` runs one job (points.worker) in its own process
GEMM_SCRIPT = Path(__file__).resolve().parents[1] / "gemm.py"
REPO = GEMM_SCRIPT.parents[1]
POINT_TIMEOUT_S = 60.0  # a worker holding the GPU longer on one point is killed (a hang)
# --no-stream-k: the tune leaves out the configs of these (partial) schedules
STREAM_K_SCHEDULES = [{"kernel": "tiled", "stream_k": 1}, {"kernel": "tiled", "stream_k": 2}]
LATE_KILL_S = 30.0  # workers still running this long past the deadline are killed


def _jobs(args, shapes, tokens_of, tmp: Path, deadline: float) -> list[dict]:
    mode = "tune" if args.tune else "sweep"
    jobs = []
    for n, k in shapes:
        tokens = tokens_of(n, k)
        groups = [[t for t in tokens if t <= 128], [t for t in tokens if t > 128]]
        if args.workers < 2 * len(shapes):
            groups = [list(tokens)]
        for i, group in enumerate(g for g in groups if g):
            jobs.append(
                {
                    "mode": mode,
                    "n": n,
                    "k": k,
                    "tokens": group,
                    "rounds": args.rounds,
                    "rest_s": _rest_s(args),
                    "before": args.before,
                    "leave_out": STREAM_K_SCHEDULES if args.no_stream_k else [],
                    "out": str(tmp / f"{n}x{k}_{i}.json"),
                    "lock": args.lock or str(tmp / "gpu.lock"),
                    "gate": args.gate,
                    "hung": str(tmp / "hung.txt"),
                    "deadline": deadline,
                    "activation": args.activation,
                }
            )
    return jobs


def _rest_s(args) -> float:
    """Seconds idle before each timed replay: ``--rest-s``, else 0.01 for a tune and 0.02
    for a sweep."""
    if args.rest_s is not None:
        return args.rest_s
    return 0.01 if args.tune else 0.02


def _run_workers(jobs: list[dict], deadline: float) -> list[dict]:
    procs = []
    for job in jobs:
        cmd = [sys.executable, str(GEMM_SCRIPT), "--worker", json.dumps(job)]
        procs.append((job, subprocess.Popen(cmd, start_new_session=True)))
    while any(p.poll() is None for _, p in procs):
        time.sleep(2.0)
        for job, p in procs:
            if p.poll() is not None:
                continue
            state = _read(job["out"])
            hung = (
                state.get("status") == "timing"
                and time.time() - state.get("since", time.time()) > POINT_TIMEOUT_S
            )
            checking = state.get("checking", {})
            if hung and "schedule" in checking:
                # the first launch of this config never returned: the other workers skip it
                with open(job["hung"], "a") as f:
                    f.write(json.dumps(checking["schedule"]) + "\n")
                print(f"leaving out (hung): {checking['label']}", flush=True)
            if hung or time.time() > deadline + LATE_KILL_S:
                print(f"killing worker {job['n']}x{job['k']} ({state.get('point')})", flush=True)
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return [{**_read(job["out"]), "returncode": p.returncode} for job, p in procs]


def _read(path: str) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def _points(args):
    """(shapes, tokens_of(n, k)) that ``args`` asks for: the listed shapes (``--shapes``, else
    the sweep's or the decode points') at ``--sweep-tokens``, else each shape's own counts."""
    shapes = list(decode.POINTS if args.decode else SHAPES)
    if args.shapes:
        shapes = [tuple(int(v) for v in s.split(",")) for s in args.shapes.split(";")]
    tokens = tuple(args.sweep_tokens or TOKENS)

    def tokens_of(n, k):
        if args.decode and not args.sweep_tokens:
            # a listed shape outside the decode points: the drafter token counts
            return decode.POINTS.get((n, k), ("", decode.DRAFTER_TOKENS))[1]
        return tokens

    return shapes, tokens_of


def _sm_count() -> dict:
    """The GPU's SM count, which keys the measured table the tune writes (none without one)."""
    import torch

    if not torch.cuda.is_available():
        return {}
    return {"sms": torch.cuda.get_device_properties(0).multi_processor_count}


def _in_repo(path: str) -> str:
    """``path`` relative to the repository where it lies inside it (as a table names its
    receipt, wherever the tune ran from), else as given."""
    resolved = Path(path).resolve()
    return str(resolved.relative_to(REPO)) if resolved.is_relative_to(REPO) else path


def run(args) -> None:
    """``--sweep`` / ``--tune`` / ``--plot`` / ``--decode`` of benchmarks/gemm.py (``args``: its
    command line)."""
    if args.plot:
        plot(json.loads(Path(args.plot).read_text()), Path(args.plot).with_suffix(".png"))
        return
    import torch
    from common import environment, write_receipt

    shapes, tokens_of = _points(args)
    deadline = time.time() + args.deadline_s
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        jobs = _jobs(args, shapes, tokens_of, Path(tmp), deadline)
        states = _run_workers(jobs, deadline)
        hung_file = Path(tmp) / "hung.txt"
        hung = hung_file.read_text().splitlines() if hung_file.exists() else []
        hung = [json.loads(schedule) for schedule in hung]
    by_shape = merge_states(states)
    mode = "tune" if args.tune else "sweep"
    base_note = {}
    if mode == "tune" and args.tune_base:
        base_note = merge_base(by_shape, json.loads(Path(args.tune_base).read_text()))
        # a tune of some shapes keeps the base's others (the table is written from all)
        shapes = list(shapes) + [shape for shape in by_shape if shape not in shapes]
    receipt = {
        "what": f"MXFP8 GEMM {mode}: ours (SM90 CuTe DSL, "
        + (
            "mm_quantized_into with the config choose_config picks; 'before' = the pre-table "
            "heuristic through gemm_sm90.run"
            if mode == "sweep"
            else "gemm_sm90.run with each candidate config"
        )
        + ") vs cublas_bf16 (torch.mm on BF16 operands of the same shape), BF16 output, no bias",
        **environment(args.git_rev),
        "mode": "CUDA Graph replay: one graph per contender and point, `inner` launches "
        "rotating over `weight_copies` copies of the weight (so that at least 200 MB of FP8 "
        f"weight is streamed; cuBLAS likewise); per sample {_rest_s(args) * 1e3:g} ms idle, "
        "one untimed replay, "
        "a GPU spin while the host enqueues, then one timed replay (CUDA events); medians over "
        f"{args.rounds} interleaved rounds, contender order rotated each round",
        "ratio_direction": "over_cublas_bf16 = ours time / cuBLAS BF16 time; below 1 ours is "
        "faster",
        "check": f"every contender's output against torch.mm of the dequantized operands "
        f"(relative Frobenius error < {CHECK_REL}); failing contenders are not timed",
        "activation": args.activation,
        "wall_s": time.time() - t0,
        "hung_schedules": hung,
        **base_note,
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "unknown",
        **_sm_count(),
        "shapes": [
            {
                "n": n,
                "k": k,
                "what": SHAPES.get((n, k)) or decode.POINTS.get((n, k), ("",))[0],
                **{
                    key: v
                    for key, v in by_shape.get((n, k), {}).items()
                    if key in ("compile_s", "worker_status", "errors", "compile_failures")
                },
                "points": sorted(
                    by_shape.get((n, k), {}).get("points", []), key=lambda p: p["tokens"]
                ),
            }
            for n, k in shapes
        ],
    }
    if args.decode:
        receipt["what"] = "MXFP8 GEMM at decode: " + receipt["what"]
        decode.annotate(receipt)
    write_receipt(args.out, receipt)
    if mode == "tune" and args.write_table:
        write_table(receipt, args.write_table, _in_repo(args.out))
    if mode == "sweep" and not args.decode:
        summary(receipt)
        try:
            plot(receipt, Path(args.out).with_suffix(".png"))
        except ImportError as e:  # matplotlib is optional (the bench extra)
            print("no PNG:", e)
