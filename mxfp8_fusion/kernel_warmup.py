"""Compile the kernels a model will launch before its first call: :func:`warmup`.

A kernel build is compiled the first time a process launches it (seconds each; a GEMM
projection meets several builds across a serving engine's CUDA graph capture sizes), then
kept on disk (``MXFP8_FUSION_CACHE_DIR``) for every later process. :func:`warmup` makes
those builds ready up front: it reads the ones already on disk and compiles the rest in
parallel worker processes (compiling is host CPU work), with a progress bar.
"""

from __future__ import annotations

import os
import pickle
import queue
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from .format import (
    GROUP,
    SCALE_DTYPE,
    SOURCE_DTYPES,
    VALUE_DTYPE,
    check_activation,
    scale_bytes,
)
from .kernels import dispatch
from .kernels.capability import kernels_of
from .kernels.runtime import cache as kernel_cache
from .kernels.runtime import launcher
from .progress import Bar, notice


def capture_sizes(max_tokens: int = 512) -> list[int]:
    """A serving engine's usual CUDA graph capture sizes up to ``max_tokens``: 1, 2, 4, then
    8 to ``max_tokens`` in steps of 8 (vLLM's default)."""
    return [t for t in (1, 2, 4) if t <= max_tokens] + list(range(8, max_tokens + 1, 8))


_STAGED_WIDTH = 128  # what quantize_input_slice takes: widths and columns multiples of this
_BIAS_DTYPES = (None, torch.bfloat16, torch.float16, torch.float32)


def _is_size(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


@dataclass(frozen=True)
class Projection:
    """One MXFP8 projection: ``out_features`` x ``in_features`` weight, its input given as
    ``slices`` (widths side by side, summing to ``in_features``; one slice for a plain
    input), computed in ``dtype`` with a bias of ``bias_dtype`` (None: no bias). With
    ``activation`` ``"mxfp8"`` (W8A8) the slices are quantized into MXFP8 storage; with
    ``"bf16"`` (W8A16) the GEMM reads them as they are.

    Raises ``ValueError`` / ``TypeError`` for a projection the calls would refuse: sizes
    that are not positive ints, several slices whose widths are not multiples of 128 (the
    rule of staged and W8A16 slices), ``in_features`` not a multiple of 32 (an MXFP8
    weight's rule), an activation that is neither.
    """

    out_features: int
    in_features: int
    slices: tuple[int, ...]
    dtype: torch.dtype = torch.bfloat16
    bias_dtype: torch.dtype | None = None
    activation: str = "mxfp8"

    def __post_init__(self) -> None:
        sizes = (self.out_features, self.in_features, *self.slices)
        if not self.slices or not all(_is_size(v) for v in sizes):
            raise ValueError("sizes must be positive ints, with at least one slice")
        if sum(self.slices) != self.in_features:
            raise ValueError(f"the slice widths {list(self.slices)} must sum to in_features")
        check_activation(self.activation)
        # the width rule first: it is the one a wrong slice breaks (widths that keep it sum
        # to a multiple of 32)
        if len(self.slices) > 1:
            self._check_widths()
        if self.in_features % GROUP:
            raise ValueError(f"in_features {self.in_features} must be a multiple of {GROUP}")
        _check_dtypes(self.dtype, self.bias_dtype)

    def _check_widths(self) -> None:
        for i, width in enumerate(self.slices):
            if width % _STAGED_WIDTH:
                how = (
                    "W8A16 slices (the GEMM reads each where it is)"
                    if self.activation == "bf16"
                    else "staged slices (W8A8: each is quantized into its columns)"
                )
                raise ValueError(
                    f"slice {i} has width {width}: {how} must be multiples of {_STAGED_WIDTH} wide"
                )


def _check_dtypes(dtype, bias_dtype) -> None:
    if dtype not in SOURCE_DTYPES:
        raise TypeError(f"dtype: expected torch.bfloat16 or torch.float16, got {dtype}")
    if bias_dtype not in _BIAS_DTYPES:
        raise TypeError(
            f"bias_dtype: expected None or a BF16, FP16 or FP32 dtype, got {bias_dtype}"
        )


@dataclass(frozen=True)
class WarmupReport:
    """What :func:`warmup` did: ``builds`` kernel builds needed, of which ``ready`` were
    already loaded in this process, ``from_disk`` read from the kernel cache, ``compiled``
    compiled now; in ``seconds``."""

    builds: int
    ready: int
    from_disk: int
    compiled: int
    seconds: float


def projections_of(model: nn.Module, dtype: torch.dtype) -> list[Projection]:
    """Every :class:`~mxfp8_fusion.MXFP8Linear` of ``model`` as a :class:`Projection` whose
    input (of ``dtype``) is one slice, with the layer's activation."""
    from .nn import MXFP8Linear

    found = []
    for layer in model.modules():
        if isinstance(layer, MXFP8Linear):
            bias = layer.bias.dtype if layer.bias is not None else None
            k = layer.in_features
            found.append(Projection(layer.out_features, k, (k,), dtype, bias, layer.activation))
    return found


def _projection(item, dtype: torch.dtype, bias_dtype, activation: str = "mxfp8") -> Projection:
    if isinstance(item, Projection):
        return item
    if not isinstance(item, Sequence) or len(item) != 2:
        raise TypeError(
            "projections: expected (out_features, in_features) pairs, in_features an int or "
            f"a sequence of slice widths; got {item!r}"
        )
    n, k = item
    slices = (k,) if isinstance(k, int) or not isinstance(k, Iterable) else tuple(k)
    if not all(_is_size(w) for w in (n, *slices)):  # before summing them
        raise ValueError(f"projections: sizes must be positive ints, got {item!r}")
    try:
        return Projection(n, sum(slices), slices, dtype, bias_dtype, activation)
    except ValueError as error:
        raise ValueError(f"projections: {error}, got {item!r}") from None


def _meta(shape, dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


def _quantizer_served(projection: Projection, tokens: int) -> bool:
    """Whether the slice quantizer kernel serves ``projection``'s input at ``tokens``: the
    kernel's own refusal, asked about tensors shaped like the call's (contiguous)."""
    from .kernels.quantize import host as quantize_slice

    values = _meta((tokens, projection.in_features), VALUE_DTYPE)
    column = 0
    for width in projection.slices:
        if quantize_slice.refusal(_meta((tokens, width), projection.dtype), values, column):
            return False
        column += width
    return True


def _gemm_served(projection: Projection, tokens: int) -> bool:
    """Whether the SM90 GEMM serves ``projection`` at ``tokens`` into a new output: its own
    refusal, asked about tensors shaped like the call's."""
    from .kernels.gemm_sm90 import host as gemm_sm90

    n, k = projection.out_features, projection.in_features
    a = _meta((tokens, k), VALUE_DTYPE), _meta((scale_bytes(tokens, k),), SCALE_DTYPE)
    b = _meta((n, k), VALUE_DTYPE), _meta((scale_bytes(n, k),), SCALE_DTYPE)
    bias = None if projection.bias_dtype is None else _meta((n,), projection.bias_dtype)
    return gemm_sm90.refusal(*a, *b, bias, _meta((tokens, n), projection.dtype)) is None


def _w8a16_served(projection: Projection, tokens: int) -> bool:
    """Whether the SM90 W8A16 GEMM serves ``projection`` at ``tokens`` from contiguous
    slices into a new output: its own refusal, asked about tensors shaped like the call's."""
    from .kernels.gemm_sm90 import w8a16

    n, k = projection.out_features, projection.in_features
    slices = [_meta((tokens, width), projection.dtype) for width in projection.slices]
    b = _meta((n, k), VALUE_DTYPE), _meta((scale_bytes(n, k),), SCALE_DTYPE)
    bias = None if projection.bias_dtype is None else _meta((n,), projection.bias_dtype)
    return w8a16.refusal(slices, *b, bias, _meta((tokens, n), projection.dtype)) is None


def builds_for(
    projection: Projection,
    tokens: Iterable[int],
    capability: tuple[int, int],
    sms: int,
    device_name: str,
) -> list[launcher.Build]:
    """The kernel builds ``projection`` launches at each token count on a GPU of compute
    ``capability`` with ``sms`` SMs, named ``device_name`` (as CUDA reports it): its input
    slices' quantizer (W8A8) and, on Hopper, each GEMM config the selection picks and the
    launch that runs before it. A call that a kernel refuses (an input width that is not a
    multiple of 128, FP16 slices of a W8A16 projection, say) runs the reference and needs no
    build."""
    from .kernels.gemm_sm90 import host as gemm_sm90
    from .kernels.gemm_sm90 import w8a16
    from .kernels.quantize import host as quantize_slice

    tokens = list(tokens)
    if projection.activation == "bf16":  # nothing is quantized: the GEMM alone
        if kernels_of(capability).w8a16 != "cute":
            return []
        n, gpu = projection.out_features, (sms, device_name)
        found = (
            w8a16.builds(m, n, projection.slices, n, projection.dtype, projection.bias_dtype, gpu)
            for m in tokens
            if _w8a16_served(projection, m)
        )
        return list(dict.fromkeys(b for builds in found for b in builds))
    builds: dict[launcher.Build, None] = {}
    arch = quantize_slice.arch_for(capability)
    if arch is not None and _quantizer_served(projection, max(tokens, default=1)):
        fp16 = projection.dtype == torch.float16
        builds.update(dict.fromkeys(quantize_slice.builds(fp16, projection.slices, arch)))
    if kernels_of(capability).gemm != "cute":  # cuBLAS or the reference: nothing to build
        return list(builds)
    n, k = projection.out_features, projection.in_features
    for m in (t for t in tokens if _gemm_served(projection, t)):
        found = gemm_sm90.builds(
            m, n, k, n, projection.dtype, projection.bias_dtype, (sms, device_name)
        )
        builds.update(dict.fromkeys(found))
    return list(builds)


def warmup(
    projections,
    tokens: Iterable[int] | None = None,
    *,
    max_tokens: int = 512,
    dtype: torch.dtype = torch.bfloat16,
    bias_dtype: torch.dtype | None = None,
    activation: str = "mxfp8",
    device: torch.device | str | int | None = None,
    workers: int | None = None,
    progress: bool = True,
) -> WarmupReport:
    """Make ready every kernel ``projections`` launch at ``tokens``, before the first call.

    Args:
        projections: a model (its :class:`~mxfp8_fusion.MXFP8Linear` layers), or
            ``(out_features, in_features)`` pairs where ``in_features`` is an int or the
            widths of the slices staged side by side (``(4096, [4096] * 3)``).
        tokens: the token counts the model will be called with; by default
            :func:`capture_sizes` up to ``max_tokens``.
        dtype: the activations' dtype (BF16 or FP16), also the output's.
        bias_dtype: the bias dtype of the pairs (None: no bias); a model's layers say theirs.
        activation: ``"mxfp8"`` (W8A8: the slices are quantized) or ``"bf16"`` (W8A16: the
            GEMM reads them as they are) for the pairs; a model's layers say theirs.
        device: the device the model runs on (default: the current CUDA device); another
            device than CUDA (``"cpu"``) has nothing to compile, as below.
        workers: parallel compiles, this process's included (default: the CPU count, at
            most 16; 1 compiles everything in this process).
        progress: show a progress bar on stderr.

    Kernels already on disk are read (milliseconds each); the others are compiled and
    stored there for the next process. A call that no kernel serves (an input width that
    is not a multiple of 128, say) runs the reference and is not planned.

    Without a CUDA device (or without nvidia-cutlass-dsl) every call runs the plain-torch
    reference, so there is nothing to compile: warm-up says so in one notice and returns a
    report of 0 builds, and start-up code needs no guard for such machines. The arguments
    are checked there too.

    Raises:
        TypeError, ValueError: naming the argument, before anything is compiled (on any
            machine).
    """
    start = time.perf_counter()
    workers = _workers(workers)
    plan = _plan(projections, tokens, max_tokens, dtype, bias_dtype, activation, device)
    ready = [b for b in plan if launcher.loaded(b)]
    todo = [b for b in plan if not launcher.loaded(b)]
    directory = kernel_cache.cache_dir()
    on_disk = [b for b in todo if kernel_cache.stored(directory, b)]
    missing = [b for b in todo if b not in on_disk]
    bar = Bar("warming up mxfp8_fusion kernels", len(todo), enabled=progress)
    for build in on_disk:
        launcher.function(build)
        bar.advance()
    if len(missing) > 1 and workers > 1 and directory and kernel_cache.writable(directory):
        _compile_in_workers(missing, directory, workers, bar)
    else:
        for build in missing:
            launcher.function(build)
            bar.advance()
    bar.close()
    return WarmupReport(
        len(plan), len(ready), len(on_disk), len(missing), time.perf_counter() - start
    )


def _plan(
    projections, tokens, max_tokens, dtype, bias_dtype, activation, device
) -> list[launcher.Build]:
    _check_dtypes(dtype, bias_dtype)
    check_activation(activation)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens: expected a positive int, got {max_tokens!r}")
    tokens = capture_sizes(max_tokens) if tokens is None else list(tokens)
    if not tokens or not all(type(t) is int and t > 0 for t in tokens):
        raise ValueError(f"tokens: expected positive ints, got {tokens!r}")
    if isinstance(projections, nn.Module):
        items = projections_of(projections, dtype)
    elif isinstance(projections, Iterable):
        items = [_projection(p, dtype, bias_dtype, activation) for p in projections]
    else:
        raise TypeError(f"projections: expected a model or (out, in) pairs, got {projections!r}")
    device = _checked_device(device)
    if device is not None and device.type != "cuda":
        notice(f"warm-up has nothing to compile for device {device} (every call there runs "
               "the plain-torch reference)", once=f"warmup on {device.type}")  # fmt: skip
        return []
    if not torch.cuda.is_available() or not dispatch.cute_dsl_installed():
        why = "no CUDA device" if not torch.cuda.is_available() else "no nvidia-cutlass-dsl"
        notice(f"warm-up has nothing to compile ({why}: every call runs the plain-torch "
               "reference)", once="warmup without kernels")  # fmt: skip
        return []
    index = _device_index(device)
    capability = torch.cuda.get_device_capability(index)
    properties = torch.cuda.get_device_properties(index)
    sms, name = properties.multi_processor_count, properties.name
    plan: dict[launcher.Build, None] = {}
    for item in items:
        plan.update(dict.fromkeys(builds_for(item, tokens, capability, sms, name)))
    return list(plan)


def _checked_device(device) -> torch.device | None:
    """``device`` checked, on any machine: None (the current CUDA device), an int (a CUDA
    index), or anything ``torch.device`` takes. A device of another type (``"cpu"``, where
    a model on a CPU-only machine is) is valid: its calls run the reference, so there is
    nothing to compile for it."""
    if device is None:
        return None
    try:
        return torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"device: {error}") from None


def _device_index(device: torch.device | None) -> int:
    if device is None or device.index is None:
        return torch.cuda.current_device()
    if device.index >= torch.cuda.device_count():
        raise ValueError(f"device: {device}, but there are {torch.cuda.device_count()} GPUs")
    return device.index


def _workers(workers: int | None) -> int:
    if workers is None:
        return min(16, os.cpu_count() or 1)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers: expected a positive int, got {workers!r}")
    return workers


def _cost(build: launcher.Build) -> int:
    """How long ``build`` takes to compile, roughly: tiled GEMMs (3-4 s on an H200's host)
    before swap-AB GEMMs (1-1.5 s) before the small launches."""
    if build.kind not in ("gemm", "gemm w8a16"):
        return 0
    return 1 if build.facts[0].kernel == "swap-ab" else 2


def _compile_in_workers(builds, directory, workers: int, bar: Bar) -> None:
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
    code = "from mxfp8_fusion.kernel_warmup import _worker_main; _worker_main()"
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


def _worker_main() -> None:
    """A warm-up worker: compile and store each build of the pickled list on stdin, and
    print its index once it is on disk."""
    for index, build in enumerate(pickle.load(sys.stdin.buffer)):
        kernel_cache.build_and_store(build, lambda b=build: launcher.compile_build(b))
        print(index, flush=True)
