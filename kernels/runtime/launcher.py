"""Compiling, caching and launching the CuTe DSL kernels.

Every kernel is compiled with the DSL's TVM-FFI calling convention (``--enable-tvm-ffi``):
its host entry takes typed pointers, 32-bit integers and a stream, and a call passes plain
Python ints (``tensor.data_ptr()``, the raw stream handle) or ``None`` for an argument the
build leaves out. TVM-FFI converts them in C, an order of magnitude faster per launch than
the DSL's generic Python call path (docs/quantize_log.md, 'Numbers behind the kernel
sources').

A build is named by a :class:`Build` (which kernel, its compile-time facts, its arch). The
first call of a build in a process takes it from, in order: this process's table, the disk
cache (``runtime.cache``: an object file per build, once per machine), a compile (seconds,
then stored on disk). :func:`launch` is that lookup plus the call. Also here: the device
side of programmatic dependent launch, :func:`wait_for_previous_kernel`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import NamedTuple

import torch

from . import cache as kernel_cache


class Build(NamedTuple):
    """One kernel binary: ``kind`` names the kernel (``"gemm"``, ``"quantizer"``, ...),
    ``facts`` are its compile-time facts (a tuple of hashable values with a stable
    ``repr``: configs, sizes, dtypes), ``arch`` the target (``"sm_90a"``), ``compiler`` the
    kernel module's compile function, called as ``compiler(*facts)``. A tuple, so that
    making and looking one up per launch costs little; it pickles (the function by its
    module and name), so a warm-up worker process can compile it too."""

    kind: str
    facts: tuple
    arch: str
    compiler: Callable

    def describe(self) -> str:
        """One line naming the build, for notices and cache entries."""
        return f"{self.kind} {', '.join(map(str, self.facts))} for {self.arch}"


def raw_stream(device_index: int) -> int:
    # The raw handle of the current stream without building a torch.cuda.Stream object
    # (Inductor's generated code reads it the same way).
    get_raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if get_raw is not None:
        return get_raw(device_index)
    return torch.cuda.current_stream(device_index).cuda_stream


def pointer(dtype_name: str, align: int = 16):
    """A compile-time placeholder for a typed global-memory pointer argument: ``dtype_name``
    is a ``cutlass`` numeric type's name (``"Float8E4M3FN"``), ``align`` the alignment in
    bytes every call's pointer has (the refusal checks guarantee it)."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_ptr

    return make_ptr(getattr(cutlass, dtype_name), 0, cute.AddressSpace.gmem, assumed_align=align)


def int32():
    """A compile-time placeholder for a 32-bit integer argument."""
    import cutlass

    return cutlass.Int32(1)


def address(ptr):
    """Inside a ``@cute.jit`` entry: the 64-bit address of a typed pointer argument, 0 for one
    the build leaves out (``None``). The kernels do their address arithmetic on integers."""
    import cutlass

    return cutlass.Int64(0) if ptr is None else ptr.toint()


def int32_or_zero(value):
    """Inside a ``@cute.jit`` entry: a 32-bit integer argument, 0 for one the build leaves out."""
    import cutlass

    return cutlass.Int32(0) if value is None else value


def compile_kernel(kernel, args: tuple, arch: str | None = None):
    """``cute.compile`` of ``kernel`` for ``args`` (placeholders: :func:`pointer`,
    :func:`int32`, ``None`` for a left-out argument; a stream is appended) with TVM-FFI.
    ``arch`` (``"sm_100a"``, ...) names the target; None leaves it to the DSL
    (``CUTE_DSL_ARCH``, else the current GPU's). Works without a GPU; a binary for another
    arch than the machine's can be inspected (``__ptx__``) but not launched."""
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_stream

    options = "--enable-tvm-ffi" + (f" --gpu-arch {arch}" if arch else "")
    return cute.compile(kernel, *args, make_fake_stream(), options=options)


def compile_build(build: Build):
    """Compile ``build`` (seconds; no cache involved)."""
    return build.compiler(*build.facts)


_functions: dict[Build, Callable] = {}
_lock = threading.Lock()


def function(build: Build) -> Callable:
    """The launchable function of ``build``: from this process's table, else the disk cache,
    else a compile (stored on disk for the next process)."""
    fn = _functions.get(build)
    if fn is None:
        with _lock:
            fn = _functions.get(build)
            if fn is None:
                fn = kernel_cache.load_or_build(build, lambda: compile_build(build))
                _functions[build] = fn
    return fn


def launch(build: Build, args: tuple) -> None:
    """Call ``build``'s kernel with ``args`` (ints, ``None`` for left-out arguments, the raw
    stream last)."""
    fn = _functions.get(build)
    if fn is None:
        fn = function(build)
    fn(*args)


def loaded(build: Build) -> bool:
    """Whether ``build`` is ready in this process (no compile or disk read on its next call)."""
    return build in _functions


def wait_for_previous_kernel() -> None:
    """Device side of programmatic dependent launch (kernels launched with ``use_pdl=True``).

    Such a launch may start its CTAs while the previous kernel on the stream still runs.
    This waits until that kernel has finished and its writes are visible, then lets the
    next kernel's CTAs be scheduled (they wait here in turn, so at most one kernel waits
    ahead of the running one; with the trigger before the wait, a whole chain of tiny
    launches was scheduled at once, and small slice launches replayed from a graph were
    slower than plain launches: docs/quantize_log.md). Call it before reading or writing
    anything in global memory; only set-up may come first. Stream order is kept; the
    launch latency between back-to-back kernels is hidden.
    """
    import cutlass.cute as cute

    cute.arch.griddepcontrol_wait()
    cute.arch.griddepcontrol_launch_dependents()
