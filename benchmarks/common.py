"""What the benchmarks share: the machine and code facts every receipt records, the model
they measure (a speculative-decoding drafter's input projection
``fc(cat([h1, ..., hn], -1))`` with an MXFP8 ``fc``, its random inputs, and the staged eager
path that replaces the concatenation), how they time a call, and how they trace where its
time and memory go."""

from __future__ import annotations

import importlib.metadata
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

import torch
from torch import Tensor, nn

import mxfp8_fusion as mf
from mxfp8_fusion.demo import Drafter, run_staged  # noqa: F401  (the fixture's staged path)

# --- receipts ------------------------------------------------------------------------------


def require_cuda(script: str) -> None:
    """Exit with one line, not a traceback, where no CUDA device is: ``script`` (its
    ``__file__``) measures on one."""
    if not torch.cuda.is_available():
        raise SystemExit(f"{Path(script).name} measures on a CUDA device (sm_90); none is here")


def git_revision(given: str | None = None) -> str:
    """``given``, else ``$MXFP8_GIT_REV``, else ``git rev-parse HEAD`` (``-dirty`` when the
    tree has changes), else ``"unknown"`` (a copy of the tree without .git)."""
    if given or os.environ.get("MXFP8_GIT_REV"):
        return given or os.environ["MXFP8_GIT_REV"]
    try:
        rev = subprocess.check_output(
            ["git", "rev-parse", "HEAD"], text=True, stderr=subprocess.DEVNULL
        ).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    dirty = subprocess.run(["git", "diff", "--quiet"], check=False).returncode != 0
    return rev + ("-dirty" if dirty else "")


def cutlass_dsl_version() -> str:
    try:
        return importlib.metadata.version("nvidia-cutlass-dsl")
    except importlib.metadata.PackageNotFoundError:  # unpacked on PYTHONPATH, no metadata
        import cutlass

        return getattr(cutlass, "__version__", "unknown")


def gpu_driver() -> str:
    result = subprocess.run(
        ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=False,
    )
    return result.stdout.strip() or "unknown"


def environment(git_rev: str | None = None) -> dict:
    """GPU, driver, torch, nvidia-cutlass-dsl and git revision, for a receipt."""
    return {
        "gpu": torch.cuda.get_device_name(),
        "driver": gpu_driver(),
        "torch": torch.__version__,
        "nvidia_cutlass_dsl": cutlass_dsl_version(),
        "git_revision": git_revision(git_rev),
    }


def write_receipt(path: str, receipt: dict) -> None:
    """``receipt`` as indented JSON at ``path`` (folders made as needed)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(receipt, indent=2) + "\n")
    print("wrote", path)


# --- the drafter projection --------------------------------------------------------------


def make_drafter(
    tokens: int,
    hidden: int,
    slices: int,
    device: torch.device,
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
) -> tuple[Drafter, list[Tensor]]:
    """A drafter projecting ``slices`` x ``hidden`` features to ``hidden`` with a random
    MXFP8 weight and bias, and ``slices`` random ``[tokens, hidden]`` inputs (seeded)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    k = hidden * slices
    linear = nn.Linear(k, hidden, bias=True, dtype=dtype)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(hidden, k, generator=gen) * k**-0.5)
        linear.bias.copy_(torch.randn(hidden, generator=gen) * 0.1)
    fc = mf.MXFP8Linear.from_linear(linear.to(device))
    inputs = [
        torch.randn(tokens, hidden, generator=gen).to(device=device, dtype=dtype)
        for _ in range(slices)
    ]
    return Drafter(fc).eval(), inputs


# --- timing and memory -------------------------------------------------------------------


def transient_peak(fn, hidden) -> tuple[int, object]:
    """(bytes allocated above the start at the peak of one call of ``fn``, its output); 0 on
    a CPU (the smoke runs)."""
    if not torch.cuda.is_initialized():
        return 0, fn(*hidden)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = fn(*hidden)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before, out


# Long enough (about 3 ms at H200 clocks) that the host finishes launching a whole call
# while the GPU still sleeps: the "queued" timing then holds only GPU work, as in a serving
# loop where the host runs ahead of the GPU.
QUEUE_CYCLES = 6_000_000


def time_interleaved(
    fns: dict, hidden, rounds: int, queued: bool, before_each=None
) -> dict[str, float]:
    """Median ms of each callable, timed A B A B with CUDA events around one call, the
    order rotated by one each round (wall clock on a CPU, the smoke runs).

    ``queued=False``: the GPU is idle when the call starts, so host launch time before each
    kernel is on the clock. ``queued=True``: a sleep kernel runs first and the events bracket
    the call's kernels only, so the time is GPU work plus the gaps the GPU cannot hide.
    ``before_each`` runs before every call, off the clock (a barrier across ranks).
    """
    samples = {name: [] for name in fns}
    names = list(fns)
    cuda = hidden[0].device.type == "cuda"
    for r in range(rounds):
        # each round starts at the next variant, so none always follows the same one (the
        # previous call's power draw changes the clock the next one starts at)
        for name in names[r % len(names) :] + names[: r % len(names)]:
            fn = fns[name]
            if before_each is not None:
                before_each()
            if not cuda:
                t0 = time.perf_counter()
                fn(*hidden)
                samples[name].append((time.perf_counter() - t0) * 1e3)
                continue
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if queued:
                torch.cuda._sleep(QUEUE_CYCLES)
            start.record()
            fn(*hidden)
            end.record()
            end.synchronize()
            samples[name].append(start.elapsed_time(end))
    return {name: statistics.median(v) for name, v in samples.items()}


def capture_graph(fns) -> torch.cuda.CUDAGraph:
    """A CUDA Graph of the calls ``fns`` in order, after one warm-up call of the first on the
    capture stream (its first launch compiles and allocates outside the graph)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fns[0]()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in fns:
            fn()
    return graph


# --- where a call's time and memory go ---------------------------------------------------


def allocation_trace(fn, hidden) -> list[tuple[float, int]]:
    """(time in µs from the first event, bytes allocated above the start) per allocator event."""
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    try:
        fn(*hidden)
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    events = snapshot["device_traces"][torch.cuda.current_device()]
    level, trace = 0, [(0.0, 0)]
    t0 = events[0]["time_us"] if events else 0
    for e in events:
        if e["action"] == "alloc":
            level += e["size"]
        elif e["action"] == "free_completed":
            level -= e["size"]
        else:
            continue
        trace.append((float(e["time_us"] - t0), level))
    return trace


def host_ms(fn, hidden, calls: int = 10) -> float:
    """Median host ms a call takes to return, with the GPU busy so no launch waits on it."""
    samples = []
    for _ in range(calls):
        torch.cuda._sleep(QUEUE_CYCLES)
        start = time.perf_counter()
        fn(*hidden)
        samples.append((time.perf_counter() - start) * 1e3)
        torch.cuda.synchronize()
    return statistics.median(samples)


def kernel_breakdown(
    fns: dict, hidden, calls: int = 5, top: int = 8
) -> dict[str, dict[str, float]]:
    """Per variant: mean GPU ms per call of its ``top`` longest kernels (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    result = {}
    for name, fn in fns.items():
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn(*hidden)
            torch.cuda.synchronize()
        kernels = {}
        for event in prof.key_averages():
            if event.device_type == torch.autograd.DeviceType.CUDA:
                # builds of one kernel share their name's first 80 characters: summed
                key = event.key[:80]
                kernels[key] = kernels.get(key, 0.0) + event.device_time_total / 1e3 / calls
        kernels = {key: round(ms, 4) for key, ms in kernels.items()}
        longest = dict(sorted(kernels.items(), key=lambda kv: -kv[1])[:top])
        result[name] = {"gpu_ms_per_kernel": longest, "gpu_ms_all_kernels": sum(kernels.values())}
        print(f"{name}: kernels " + ", ".join(f"{k[:48]} {v:.3f}" for k, v in longest.items()))
    return result


def isolated_timeline(fns: dict, hidden, rounds: int = 8) -> dict[str, dict[str, float]]:
    """Where an isolated call's time goes: the GPU timeline of ``rounds`` isolated calls per
    variant (the order rotated as in :func:`time_interleaved`) under torch.profiler.

    Per variant, medians in us from the call's start on the host: when its first kernel and
    its GEMM (its longest kernel) start, the GPU time of the kernels before the GEMM, the
    GEMM's duration and when the last kernel ends. The profiler adds host time per op, so
    the start offsets are larger than in the untraced timing; the kernels' durations are not.
    """
    import tempfile

    from torch.profiler import ProfilerActivity, profile, record_function

    names = list(fns)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                torch.cuda.synchronize()
                with record_function(f"call:{name}"):
                    fns[name](*hidden)
                torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as trace:
        prof.export_chrome_trace(trace.name)
        events = json.loads(Path(trace.name).read_text())["traceEvents"]
    calls = sorted(
        (e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("call:")),
        key=lambda e: e["ts"],
    )
    kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    rows = {name: [] for name in names}
    for i, call in enumerate(calls):
        t0 = call["ts"]
        t1 = calls[i + 1]["ts"] if i + 1 < len(calls) else float("inf")
        ks = [k for k in kernels if t0 <= k["ts"] < t1]
        if not ks:
            continue
        gemm = max(ks, key=lambda k: k["dur"])
        rows[call["name"][len("call:") :]].append(
            {
                "first_kernel_start_us": ks[0]["ts"] - t0,
                "gemm_start_us": gemm["ts"] - t0,
                "kernels_before_gemm_us": sum(k["dur"] for k in ks if k["ts"] < gemm["ts"]),
                "gemm_us": gemm["dur"],
                "last_kernel_end_us": max(k["ts"] + k["dur"] for k in ks) - t0,
            }
        )
    return {
        name: {key: round(statistics.median(r[key] for r in rs), 1) for key in rs[0]}
        for name, rs in rows.items()
        if rs
    }


def host_us_per_call(fn, calls: int = 300) -> float:
    """Host wall time per call of ``fn`` (after one untimed call), in us, over ``calls``
    back-to-back calls; the device is synchronized before and after."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6
