"""Fast host launch of compiled CuTe DSL kernels whose arguments are all scalars.

The DSL's generic call path converts every argument on every call: about 60-80 us per
launch on the H200 host, longer than a few-token GEMM or a slice quantization on the GPU.
Kernels here take integer addresses and sizes instead of tensors, so a :class:`Launcher`
keeps their C storage, packed once, and refills it per call. Also here: the device side of
programmatic dependent launch, :func:`wait_for_previous_kernel`.
"""

from __future__ import annotations

import ctypes
import threading

import torch

from ..progress import notice


def raw_stream(device_index: int) -> int:
    # The raw handle of the current stream without building a torch.cuda.Stream object
    # (Inductor's generated code reads it the same way).
    get_raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if get_raw is not None:
        return get_raw(device_index)
    return torch.cuda.current_stream(device_index).cuda_stream


class Launcher:
    """Launches one compiled kernel on one device with reusable argument buffers.

    ``kinds`` names each argument but the trailing stream: ``q`` a 64-bit integer, ``i`` a
    32-bit one. The layout is checked once against the DSL's own marshalling of
    ``probe_args``; if it ever differs, or the executor's internals are not as expected,
    every call takes the DSL's generic path.
    """

    def __init__(self, compiled, kinds: str, probe_args: tuple) -> None:
        self._compiled = compiled
        self._lock = threading.Lock()
        ctype = {"q": ctypes.c_int64, "i": ctypes.c_int32}
        self._slots = [ctype[kind]() for kind in kinds]
        self._stream = ctypes.c_uint64()
        self._args = [ctypes.c_void_p(ctypes.addressof(v)) for v in self._slots]
        self._args.append(ctypes.addressof(self._stream))
        self._entry = None
        try:
            import cuda.bindings.driver as cuda

            probe = (*probe_args[:-1], cuda.CUstream(probe_args[-1]))
            generic, _ = compiled.execution_args.generate_execution_args(probe, {})
            if self._same_layout(generic, probe_args):
                self._entry = self._direct_entry(compiled.to(None))
        except Exception:  # any internal change: keep the generic path
            self._entry = None

    def _direct_entry(self, executor):
        """(C entry point, its packed argument array, CUDA result slot or None).

        The executor's ``run_compiled_program`` re-packs the argument pointers on every call
        (a Python loop over them: several us per launch). Ours never move, so they are
        packed once here, with the executor's own trailing arguments (result slot, kernel
        handles); a launch is then one ctypes call."""
        packed = executor._get_invoke_packed_args(self._args)
        count = len(self._args) + executor._num_extra_args
        if len(packed) < count:
            raise ValueError("unexpected packed-argument layout")
        own = (ctypes.c_void_p * count)(*packed[:count])
        result = executor.cuda_result if executor._has_cuda_result else None
        return executor.capi_func, own, result

    def _same_layout(self, generic: list, probe_args: tuple) -> bool:
        if len(generic) != len(self._slots) + 1 or isinstance(generic[-1], ctypes.c_void_p):
            return False
        for slot, arg, value in zip(self._slots, generic, probe_args, strict=False):
            if type(slot).from_address(arg.value).value != value:
                return False
        return ctypes.c_uint64.from_address(generic[-1]).value == probe_args[-1]

    def __call__(self, args: tuple) -> None:
        if self._entry is None:
            import cuda.bindings.driver as cuda

            self._compiled(*args[:-1], cuda.CUstream(args[-1]))
            return
        entry, packed, result = self._entry
        with self._lock:
            for slot, value in zip(self._slots, args, strict=False):
                slot.value = value
            self._stream.value = args[-1]
            entry(packed)
            if result is not None and result.value != 0:
                raise RuntimeError(f"CUDA error {result.value} launching a CuTe DSL kernel")


def compile_for_scalars(kernel, kinds: str, arch: str | None = None):
    """``cute.compile`` of a scalar-argument kernel: ``kinds`` as for :class:`Launcher`, each
    argument a placeholder of its type, then a placeholder stream (works without a GPU
    under ``CUTE_DSL_ARCH``). ``arch`` (``"sm_100a"``, ...) names the target; None leaves it
    to the DSL (``CUTE_DSL_ARCH``, else the current GPU's).

    A binary for another arch than the DSL's runtime one compiles, but has no execution
    engine: it can be inspected (PTX), not launched."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_stream

    fake = {"q": cutlass.Int64(1 << 20), "i": cutlass.Int32(1)}
    args = (*(fake[kind] for kind in kinds), make_fake_stream())
    notice(
        f"building the {type(kernel).__name__} kernel{f' for {arch}' if arch else ''} "
        "(a CuTe DSL compile: seconds; once per shape and config in a process)"
    )
    if arch is None:
        return cute.compile(kernel, *args)
    return cute.compile(kernel, *args, options=f"--gpu-arch {arch}")


def wait_for_previous_kernel() -> None:
    """Device side of programmatic dependent launch (kernels launched with ``use_pdl=True``).

    Such a launch may start its CTAs while the previous kernel on the stream still runs.
    This waits until that kernel has finished and its writes are visible, then lets the
    next kernel's CTAs be scheduled (they wait here in turn, so at most one kernel waits
    ahead of the running one; with the trigger before the wait, a whole chain of tiny
    launches was scheduled at once, and six 16-token slice launches replayed from a graph
    took 14 us against 10 us for plain launches). Call it before reading or writing
    anything in global memory; only set-up may come first. Stream order is kept; the
    launch latency between back-to-back kernels is hidden.
    """
    import cutlass.cute as cute

    cute.arch.griddepcontrol_wait()
    cute.arch.griddepcontrol_launch_dependents()


_launchers: dict = {}
_launchers_lock = threading.Lock()


def launch(key, compile_fn, kinds: str, args: tuple, device: int) -> None:
    """Launch ``args`` (trailing raw stream included) with the :class:`Launcher` cached under
    ``key``, made on first use from ``compile_fn()`` on ``device``."""
    launcher = _launchers.get(key)
    if launcher is None:
        compiled = compile_fn()
        with _launchers_lock:
            launcher = _launchers.get(key)
            if launcher is None:
                with torch.cuda.device(device):
                    launcher = _launchers[key] = Launcher(compiled, kinds, args)
    launcher(args)
