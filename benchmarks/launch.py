"""Host cost of one CuTe DSL kernel launch, by launch path (CUDA only).

The same compiled slice quantizer (BF16 [16, 7168] into [16, 7168] storage) launched three
ways, each timed over many back-to-back launches on one stream (host wall time per launch;
the kernel itself takes about 1.5 us, so the queue never fills):

* ``launcher``: ``kernels.launcher.Launcher``, the project's path: the argument buffer is
  packed once and each launch is one ctypes call into the compiled entry point.
* ``dsl_generic``: the compiled function called as the DSL documents it
  (``compiled(*ints, cuda.CUstream(stream))``), which converts every argument per call.
* ``tvm_ffi``: the same kernel compiled with ``options="--enable-tvm-ffi"`` and called with
  plain ints (the DSL's own fast path; needs the ``apache-tvm-ffi`` package).

Also ``run_if_served``: the eager entry point (checks + launch) as the ops call it.
Every path's output bytes are checked equal. Writes benchmarks/results/launch.json.

    python benchmarks/launch.py [--launches 5000] [--rounds 7] [--out PATH]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from common import environment, write_receipt
from mxfp8_fusion.kernels import quantize_slice as qs
from mxfp8_fusion.kernels.launcher import Launcher, raw_stream

from mxfp8_fusion.api import empty_input
from mxfp8_fusion.format import GROUP, group_blocks


def _args(source, dest, device: int) -> tuple:
    k = dest.values.shape[1]
    return (
        source.data_ptr(),
        dest.values.data_ptr(),
        dest.scales.data_ptr(),
        source.shape[0],
        source.stride(0),
        k,
        0,
        group_blocks(k // GROUP),
        raw_stream(device),
    )


def _compile_tvm_ffi(config):
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_stream
    from mxfp8_fusion.kernels.quantize_slice_kernel import build

    fake = {"q": cutlass.Int64(1 << 20), "i": cutlass.Int32(1)}
    kinds = qs._kinds(config)
    return cute.compile(
        build(config),
        *(fake[kind] for kind in kinds),
        make_fake_stream(),
        options="--enable-tvm-ffi",
    )


def _per_launch_us(fn, launches: int, rounds: int) -> float:
    samples = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(launches):
            fn()
        elapsed = time.perf_counter() - start
        torch.cuda.synchronize()
        samples.append(elapsed / launches * 1e6)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", default="benchmarks/results/launch.json")
    args = parser.parse_args()

    import cuda.bindings.driver as cuda

    device = torch.cuda.current_device()
    source = torch.randn(16, 7168, dtype=torch.bfloat16, device="cuda")
    dest = empty_input(16, 7168, "cuda")
    config = qs.config_for(source)
    compiled = qs.compile_kernel(config)
    call_args = _args(source, dest, device)
    launcher = Launcher(compiled, qs._kinds(config), call_args)

    paths = {
        "launcher": lambda: launcher(call_args),
        "dsl_generic": lambda: compiled(*call_args[:-1], cuda.CUstream(call_args[-1])),
        "run_if_served": lambda: qs.run_if_served(source, dest.values, dest.scales, 0),
    }
    notes = {"launcher_direct_entry": launcher._entry is not None}
    try:
        tvm = _compile_tvm_ffi(config)
        paths["tvm_ffi"] = lambda: tvm(*call_args)
    except Exception as error:  # the package may be missing, or the option unsupported
        notes["tvm_ffi_unavailable"] = f"{type(error).__name__}: {error}"

    reference = None
    same_bytes = {}
    for name, fn in paths.items():
        dest.values.zero_()
        dest.scales.view(torch.uint8).zero_()
        fn()
        torch.cuda.synchronize()
        got = (dest.values.view(torch.uint8).clone(), dest.scales.view(torch.uint8).clone())
        if reference is None:
            reference = got
        same_bytes[name] = torch.equal(got[0], reference[0]) and torch.equal(got[1], reference[1])

    for fn in paths.values():  # warm-up
        _per_launch_us(fn, 200, 1)
    us = {name: [] for name in paths}
    for _ in range(args.rounds):  # interleaved, one sample per path per round
        for name, fn in paths.items():
            us[name].append(_per_launch_us(fn, args.launches, 1))
    medians = {name: statistics.median(v) for name, v in us.items()}
    for name, value in medians.items():
        print(f"{name:>18}: {value:7.2f} us per launch (bytes equal: {same_bytes[name]})")
    receipt = {
        "what": "host wall time per launch of the compiled slice quantizer (BF16 16 x 7168), "
        "by launch path; median over rounds of back-to-back launches",
        **environment(),
        "launches_per_round": args.launches,
        "rounds": args.rounds,
        "us_per_launch": medians,
        "samples_us": us,
        "same_bytes_as_first_path": same_bytes,
        "ratio_direction": "us per launch: lower is better",
        **notes,
    }
    if "tvm_ffi" in medians:
        receipt["tvm_ffi_over_launcher"] = medians["tvm_ffi"] / medians["launcher"]
    write_receipt(args.out, receipt)


if __name__ == "__main__":
    main()
