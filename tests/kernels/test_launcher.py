"""The fast launch path of kernels/launcher.py, on the CPU: a fake compiled program stands in
for the DSL's, so no kernel is compiled and no GPU is needed."""

import ctypes
import importlib.util

import pytest

requires_cutlass = pytest.mark.skipif(
    importlib.util.find_spec("cutlass") is None, reason="nvidia-cutlass-dsl is not installed"
)


class _FakeExecutor:
    """The executor attributes the launcher's direct path relies on: the entry point reads
    every scalar through the packed pointers and records them."""

    _num_extra_args = 1
    _has_cuda_result = True

    def __init__(self, kinds):
        self.kinds = kinds
        self.cuda_result = ctypes.c_int32(0)
        self.seen = []

    def _get_invoke_packed_args(self, exe_args):
        packed = (ctypes.c_void_p * (len(exe_args) + 1))()
        for i, arg in enumerate(exe_args):
            packed[i] = arg.value if isinstance(arg, ctypes.c_void_p) else arg
        packed[len(exe_args)] = ctypes.addressof(self.cuda_result)
        return packed

    def capi_func(self, packed):
        ctype = {"q": ctypes.c_int64, "i": ctypes.c_int32}
        values = [ctype[k].from_address(packed[i]).value for i, k in enumerate(self.kinds)]
        stream = ctypes.c_uint64.from_address(packed[len(self.kinds)]).value
        self.seen.append((*values, stream))


class _FakeCompiled:
    """A compiled program whose marshalling matches the launcher's slot layout."""

    def __init__(self, kinds):
        self.kinds = kinds
        self.executor = _FakeExecutor(kinds)
        self.execution_args = self
        self._keep = []

    def generate_execution_args(self, args, kwargs):
        ctype = {"q": ctypes.c_int64, "i": ctypes.c_int32}
        slots = [ctype[k](v) for k, v in zip(self.kinds, args, strict=False)]
        stream = ctypes.c_uint64(int(args[-1]))
        self._keep += [*slots, stream]
        return [ctypes.c_void_p(ctypes.addressof(v)) for v in slots] + [
            ctypes.addressof(stream)
        ], None

    def to(self, device):
        return self.executor


@requires_cutlass  # the launcher builds its probe stream with cuda-python
def test_direct_launch_packs_pointers_once_and_refills_the_scalars():
    """The launcher calls the compiled entry point with one argument array built at
    construction; each call only rewrites the scalars behind it, and a CUDA error code
    from the entry point raises."""
    from mxfp8_fusion.kernels.launcher import Launcher

    kinds = "qqi"
    compiled = _FakeCompiled(kinds)
    launcher = Launcher(compiled, kinds, (1 << 40, 7, 3, 0xAB))
    assert launcher._entry is not None
    packed = launcher._entry[1]
    launcher((1 << 41, -5, 4097, 0xCD))
    launcher((2, 3, 4, 5))
    assert compiled.executor.seen == [(1 << 41, -5, 4097, 0xCD), (2, 3, 4, 5)]
    assert launcher._entry[1] is packed
    compiled.executor.cuda_result.value = 700
    with pytest.raises(RuntimeError, match="CUDA error 700"):
        launcher((0, 0, 0, 0))


class _GenericOnly(_FakeCompiled):
    """A compiled program whose executor lacks the internals the direct path reads (as a
    newer nvidia-cutlass-dsl might): every call must take the DSL's generic path."""

    def __init__(self, kinds):
        super().__init__(kinds)
        self.calls = []

    def to(self, device):
        return object()  # no _get_invoke_packed_args, capi_func, ...

    def __call__(self, *args):
        self.calls.append((*args[:-1], int(args[-1])))


@requires_cutlass
def test_changed_executor_internals_fall_back_to_the_generic_call():
    from mxfp8_fusion.kernels.launcher import Launcher

    compiled = _GenericOnly("qi")
    launcher = Launcher(compiled, "qi", (1 << 40, 7, 0xAB))
    assert launcher._entry is None
    launcher((5, 6, 0xCD))
    assert compiled.calls == [(5, 6, 0xCD)]
