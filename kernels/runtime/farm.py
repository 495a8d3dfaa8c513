"""Compile many kernel builds at once: the warm-up's compile farm.

Compiling is host CPU work (seconds per GEMM build), so :func:`compile_in_workers` spreads
builds over fresh interpreter processes that store them in the disk cache, while this
process compiles the longest one and reads each of the others back as its worker reports
it. What to compile is not decided here: the caller hands over the builds
(``kernels.dispatch.builds`` answers which a call launches).
"""

from __future__ import annotations

import os
import pickle
import queue
import subprocess
import sys
import tempfile
import threading
import warnings

from ...progress import Bar
from . import cache as kernel_cache
from . import launcher


def _cost(build: launcher.Build) -> int:
    """How long ``build`` takes to compile, roughly: tiled GEMMs (3-4 s on an H200's host)
    before swap-AB GEMMs (1-1.5 s) before the small launches."""
    if build.kind not in ("gemm", "gemm w8a16"):
        return 0
    return 1 if build.facts[0].kernel == "swap-ab" else 2


def compile_in_workers(builds, directory, workers: int, bar: Bar) -> None:
    """Compile ``builds`` in ``workers`` parallel compiles: this process takes the longest
    (it has the DSL loaded already) while fresh interpreter processes take the rest, spread
    round-robin, longest first; they store them in ``directory`` and each is read back here
    as its worker reports it. A build no worker reports (a worker failed) is compiled here.

    Workers are new interpreters, not forks or ``multiprocessing`` spawns: those would carry
    this process's CUDA state, or re-run the caller's script."""
    builds = sorted(builds, key=_cost, reverse=True)
    mine, rest = builds[0], builds[1:]
    env = {
        **os.environ,
        kernel_cache.ENV: str(directory),
        "CUTE_DSL_ARCH": mine.arch,  # the target of builds that do not name one
        "CUDA_VISIBLE_DEVICES": "",  # compiling needs no GPU: no CUDA context per worker
    }
    code = "from mxfp8_fusion.kernels.runtime.farm import worker_main; worker_main()"
    reports: queue.Queue = queue.Queue()
    threads = []
    processes = min(workers - 1, len(rest))
    for chunk in (rest[i::processes] for i in range(processes)):
        log = tempfile.TemporaryFile()  # a file, not a pipe: a chatty compile cannot block
        worker = subprocess.Popen(
            [sys.executable, "-c", code], env=env, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=log,
        )  # fmt: skip
        thread = threading.Thread(target=_relay, args=(worker, chunk, reports, log), daemon=True)
        thread.start()
        threads.append(thread)
    launcher.function(mine)
    bar.advance()
    failures = []
    for _ in range(len(rest)):
        build, failure = reports.get()
        launcher.function(build)  # read from disk; compiled here if its worker failed
        bar.advance()
        if failure and failure not in failures:
            failures.append(failure)
    for thread in threads:
        thread.join()
    for failure in failures:
        warnings.warn(
            f"mxfp8_fusion.warmup: a compile worker failed ({failure}); its kernels were "
            "compiled in this process instead",
            RuntimeWarning,
            stacklevel=3,
        )


def _relay(worker: subprocess.Popen, chunk: list, reports: queue.Queue, log) -> None:
    """Send ``chunk`` to ``worker`` and put each build on ``reports`` as the worker stores
    it; whatever it does not report is put there when it is gone, with the last line the
    worker wrote to ``log`` (its stderr)."""
    done = set()
    try:
        worker.stdin.write(pickle.dumps(chunk))
        worker.stdin.close()
        for line in worker.stdout:
            done.add(int(line))
            reports.put((chunk[int(line)], None))
    except (OSError, ValueError):  # a worker that died early or wrote something else
        worker.kill()
    finally:
        worker.wait()
        worker.stdout.close()
        log.seek(0)
        lines = [x for x in log.read().decode(errors="replace").splitlines() if x.strip()]
        log.close()
        why = lines[-1].strip() if lines else f"exit status {worker.returncode}"
        for index, build in enumerate(chunk):
            if index not in done:
                reports.put((build, why))


def worker_main() -> None:
    """A warm-up worker: compile and store each build of the pickled list on stdin, and
    print its index once it is on disk."""
    for index, build in enumerate(pickle.load(sys.stdin.buffer)):
        kernel_cache.build_and_store(build, lambda b=build: launcher.compile_build(b))
        print(index, flush=True)
