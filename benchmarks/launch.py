"""Host cost of one CuTe DSL kernel launch, by launch path (CUDA only).

The same slice quantizer build (BF16 [16, 7168] into [16, 7168] storage) launched three
ways, each timed over many back-to-back launches on one stream (host wall time per launch;
the kernel itself takes about 1.5 us, so the queue never fills):

* ``tvm_ffi_entry``: the project's path (``kernels.runtime.launcher.launch``): the build's TVM-FFI
  entry, loaded from the kernel cache, called with plain ints.
* ``dsl_compiled``: the object ``cute.compile(..., options="--enable-tvm-ffi")`` returns,
  called the same way (the DSL wraps the entry and converts pointer arguments in Python).
* ``int64_entry``: the same kernel behind an entry taking its three addresses as Int64
  instead of typed pointers (the interface before the pointers), exported and loaded the
  same way: what the typed pointers cost per launch.
* ``launch``: ``kernels.runtime.launcher.launch`` (the build's table lookup, then the entry).
* ``run_if_served``: the eager entry point as the ops call it (checks, then the launch).

Every path's output bytes are checked equal. Writes benchmarks/results/launch.json.

    python benchmarks/launch.py [--launches 5000] [--rounds 7] [--out PATH]
"""

from __future__ import annotations

import argparse
import statistics

import torch
from common import environment, host_us_per_call, require_cuda, write_receipt

from mxfp8_fusion.api import empty_input
from mxfp8_fusion.format import GROUP, group_blocks
from mxfp8_fusion.kernels.quantize import host as qs
from mxfp8_fusion.kernels.runtime import launcher


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
        launcher.raw_stream(device),
    )


def _int64_entry(config):
    """The quantizer build behind an Int64-address entry, stored and loaded like the
    project's builds (a private directory)."""
    import tempfile
    from pathlib import Path

    import cutlass
    import cutlass.cute as cute

    from mxfp8_fusion.kernels.quantize.kernel import THREADS, SliceQuantizer
    from mxfp8_fusion.kernels.runtime import cache as kernel_cache

    class Int64Entry(SliceQuantizer):
        @cute.jit
        def __call__(self, src, dst, scales, tokens, src_ld, dst_ld, column, g4, stream):
            self.kernel(src, dst, scales, tokens, src_ld, dst_ld, column, g4).launch(
                grid=self.grid(tokens), block=[THREADS, 1, 1], stream=stream, use_pdl=True
            )

    ints = (cutlass.Int64(1 << 20),) * 3 + (launcher.int32(),) * 5
    compiled = launcher.compile_kernel(Int64Entry(config), ints, config.arch)
    build = launcher.Build(
        "quantizer int64 entry", (config,), config.arch, None
    )  # stored, never compiled
    directory = Path(tempfile.mkdtemp())
    kernel_cache.store(directory, build, compiled)
    return kernel_cache.load(directory, build)


def _same_bytes(paths: dict, dest) -> dict:
    reference, same = None, {}
    for name, fn in paths.items():
        dest.values.zero_()
        dest.scales.view(torch.uint8).zero_()
        fn()
        torch.cuda.synchronize()
        got = (dest.values.view(torch.uint8).clone(), dest.scales.view(torch.uint8).clone())
        reference = reference or got
        same[name] = torch.equal(got[0], reference[0]) and torch.equal(got[1], reference[1])
    return same


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", default="benchmarks/results/launch.json")
    args = parser.parse_args()
    require_cuda(__file__)
    device = torch.cuda.current_device()
    source = torch.randn(16, 7168, dtype=torch.bfloat16, device="cuda")
    dest = empty_input(16, 7168, "cuda")
    config = qs.config_for(source)
    entry = launcher.function(qs.build_of(config))
    compiled = qs.compile_kernel(config)
    call_args = _args(source, dest, device)
    int64 = _int64_entry(config)
    build = qs.build_of(config)
    paths = {
        "tvm_ffi_entry": lambda: entry(*call_args),
        "int64_entry": lambda: int64(*call_args),
        "dsl_compiled": lambda: compiled(*call_args),
        "launch": lambda: launcher.launch(build, call_args),
        "run_if_served": lambda: qs.run_if_served(source, dest.values, dest.scales, 0),
    }
    same_bytes = _same_bytes(paths, dest)
    for fn in paths.values():  # warm-up
        host_us_per_call(fn, 200)
    us = {name: [] for name in paths}
    for _ in range(args.rounds):  # interleaved, one sample per path per round
        for name, fn in paths.items():
            us[name].append(host_us_per_call(fn, args.launches))
    medians = {name: statistics.median(v) for name, v in us.items()}
    for name, value in medians.items():
        print(f"{name:>18}: {value:7.2f} us per launch (bytes equal: {same_bytes[name]})")
    write_receipt(
        args.out,
        {
            "what": "host wall time per launch of the slice quantizer build (BF16 16 x 7168), "
            "by launch path; median over rounds of back-to-back launches",
            **environment(),
            "launches_per_round": args.launches,
            "rounds": args.rounds,
            "us_per_launch": medians,
            "samples_us": us,
            "same_bytes_as_first_path": same_bytes,
            "ratio_direction": "us per launch: lower is better",
            "dsl_compiled_over_tvm_ffi_entry": medians["dsl_compiled"] / medians["tvm_ffi_entry"],
        },
    )


if __name__ == "__main__":
    main()
