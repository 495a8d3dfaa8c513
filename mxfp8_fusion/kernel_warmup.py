"""Compile the kernels a model will launch before its first call: :func:`warmup`.

A kernel build is compiled the first time a process launches it (seconds each; a GEMM
projection meets several builds across a serving engine's CUDA graph capture sizes), then
kept on disk (``MXFP8_FUSION_CACHE_DIR``) for every later process. :func:`warmup` makes
those builds ready up front: it reads the ones already on disk and compiles the rest in
parallel worker processes (compiling is host CPU work: ``kernels/runtime/farm.py``), with
a progress bar. Which builds a projection launches is ``kernels.dispatch.builds``'s answer,
the one the calls themselves follow; a model's cat sites are found by running it once on
example inputs (:mod:`mxfp8_fusion.sites`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from . import sites
from .format import GROUP, SOURCE_DTYPES, Activation
from .kernels import dispatch
from .kernels.runtime import cache as kernel_cache
from .kernels.runtime import farm, launcher
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
    ``activation`` W8A8 (``"mxfp8"``) the slices are quantized into MXFP8 storage; with
    W8A16 (``"bf16"``) the GEMM reads them as they are.

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
    activation: Activation = Activation.W8A8

    def __post_init__(self) -> None:
        sizes = (self.out_features, self.in_features, *self.slices)
        if not self.slices or not all(_is_size(v) for v in sizes):
            raise ValueError("sizes must be positive ints, with at least one slice")
        if sum(self.slices) != self.in_features:
            raise ValueError(f"the slice widths {list(self.slices)} must sum to in_features")
        object.__setattr__(self, "activation", Activation.of(self.activation))
        # the width rule first: it is the one a wrong slice breaks (widths that keep it sum
        # to a multiple of 32)
        if len(self.slices) > 1:
            self._check_widths()
        if self.in_features % GROUP:
            raise ValueError(f"in_features {self.in_features} must be a multiple of {GROUP}")
        _check_dtypes(self.dtype, self.bias_dtype)

    @property
    def call(self) -> dispatch.Call:
        """The call geometry the dispatcher plans builds for."""
        return dispatch.Call(
            self.out_features, self.slices, self.dtype, self.bias_dtype, self.activation
        )

    def _check_widths(self) -> None:
        for i, width in enumerate(self.slices):
            if width % _STAGED_WIDTH:
                how = (
                    "W8A16 slices (the GEMM reads each where it is)"
                    if self.activation is Activation.W8A16
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


def projections_of(
    model: nn.Module, dtype: torch.dtype, example_inputs=None, example_kwargs=None
) -> list[Projection]:
    """Every :class:`~mxfp8_fusion.MXFP8Linear` of ``model`` as a :class:`Projection` with
    the layer's activation, its input of ``dtype``. Without example inputs each input is one
    slice; with them, each input the layer was called with in one run on them
    (:func:`mxfp8_fusion.sites.cat_widths`): the slices of a ``torch.cat`` on the last dim
    that feeds it, as the compiled model stages them, else one slice."""
    from .nn import MXFP8Linear

    widths = {}
    if example_inputs is not None:
        widths = sites.cat_widths(model, example_inputs, example_kwargs)
    found = []
    for layer in model.modules():
        if isinstance(layer, MXFP8Linear):
            bias = layer.bias.dtype if layer.bias is not None else None
            n, k = layer.out_features, layer.in_features
            for slices in widths.get(layer) or [(k,)]:
                found.append(Projection(n, k, slices, dtype, bias, layer.activation))
    return found


def _projection(
    item, dtype: torch.dtype, bias_dtype, activation: Activation = Activation.W8A8
) -> Projection:
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


def builds_for(
    projection: Projection,
    tokens: Iterable[int],
    capability: tuple[int, int],
    sms: int,
    device_name: str,
) -> list[launcher.Build]:
    """The kernel builds ``projection`` launches at each token count on a GPU of compute
    ``capability`` with ``sms`` SMs, named ``device_name`` (as CUDA reports it): the
    dispatcher's answer (``kernels.dispatch.builds``), which the calls follow. A call that a
    kernel refuses runs the reference and needs no build."""
    return dispatch.builds(projection.call, tokens, capability, (sms, device_name))


def warmup(
    projections,
    tokens: Iterable[int] | None = None,
    *,
    max_tokens: int = 512,
    dtype: torch.dtype = torch.bfloat16,
    bias_dtype: torch.dtype | None = None,
    activation: Activation | str = Activation.W8A8,
    device: torch.device | str | int | None = None,
    workers: int | None = None,
    progress: bool = True,
    example_inputs: Sequence | None = None,
    example_kwargs: dict | None = None,
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
        example_inputs, example_kwargs: a model's positional and keyword arguments for
            one run that finds its cat sites (any token count; its MXFP8 layers are not
            run, so no kernel is launched or compiled by it): a layer fed by
            ``torch.cat(slices, -1)`` is then also planned with those slices' widths, as
            the model compiled with ``backend="mxfp8_fusion"`` stages them. Without them
            each layer's input is planned as one slice, as eager calls run it.

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
    examples = (example_inputs, example_kwargs)
    plan = _plan(projections, tokens, max_tokens, dtype, bias_dtype, activation, device, examples)
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
        farm.compile_in_workers(missing, directory, workers, bar)
    else:
        for build in missing:
            launcher.function(build)
            bar.advance()
    bar.close()
    return WarmupReport(
        len(plan), len(ready), len(on_disk), len(missing), time.perf_counter() - start
    )


def _plan(
    projections, tokens, max_tokens, dtype, bias_dtype, activation, device, examples=(None, None)
) -> list[launcher.Build]:
    _check_dtypes(dtype, bias_dtype)
    activation = Activation.of(activation)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens: expected a positive int, got {max_tokens!r}")
    tokens = capture_sizes(max_tokens) if tokens is None else list(tokens)
    if not tokens or not all(type(t) is int and t > 0 for t in tokens):
        raise ValueError(f"tokens: expected positive ints, got {tokens!r}")
    if isinstance(projections, nn.Module):
        items = projections_of(projections, dtype, *examples)
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
