"""SHA-256 of the PTX of every shipped kernel build, compiled on a CPU (CUTE_DSL_ARCH).

A refactor of the kernels must leave their PTX byte-for-byte the same. This script compiles
every GEMM config the measured table and the heuristic can choose (W8A8, and W8A16 from one
or several slices), the launches that run before a GEMM, and the slice quantizer for every
arch it ships, and compares the hashes
with ``ptx_hashes.json`` beside it:

    python tests/helpers/ptx_hashes.py            # check (exit 1 naming what changed)
    python tests/helpers/ptx_hashes.py --write    # record the current hashes

A build is named by data (its config's fields and its compile-time shape), so the names
stay valid when the config classes change. The hash is over the PTX with each kernel's
entry symbol replaced by a placeholder: the DSL names a kernel after its class's qualified
name, so moving or renaming a class changes that name and nothing else. Takes about five
minutes on two CPU cores.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import tempfile
from pathlib import Path

HASHES = Path(__file__).with_name("ptx_hashes.json")
# Weight shapes beyond the table's that the heuristic serves (narrow, odd, small).
_EXTRA_SHAPES = ((200, 512), (640, 4160), (2048, 7168))
_TOKENS = (1, 8, 9, 16, 17, 32, 33, 48, 64, 96, 128, 192, 256, 300, 384, 512, 1024, 4096)
_DTYPES = ("bfloat16", "float16", "float32")


def config_fields(cfg) -> dict:
    """A config as the fields the hash list names builds by (the names the configs had when
    the list was first written: ``kernel``, ``f16`` and ``bf16_tokens`` as ints)."""
    from mxfp8_fusion.kernels.gemm_sm90.config import SwapABConfig

    swap_ab = isinstance(cfg, SwapABConfig)
    w8a16 = {"activation": "bf16"} if cfg.activation == "bf16" else {}  # new since the list began
    if swap_ab:  # new since the list began, and only where set
        for name in ("token_tiles", "split_tail", "tile_aligned"):
            if getattr(cfg, name):
                w8a16[name] = getattr(cfg, name)
    return dict(
        **w8a16,
        kernel=cfg.kernel,
        tile_n=128 if swap_ab else cfg.tile_n,
        stages=cfg.stages,
        stages16=4 if swap_ab else cfg.stages16,
        num_ctas=cfg.num_ctas,
        tokens_tile=cfg.tokens_tile if swap_ab else 0,
        consumers=cfg.consumers if swap_ab else 3,
        converters=1 if swap_ab else cfg.converters,
        tile_m=128 if swap_ab else cfg.tile_m,
        stream_k=0 if swap_ab else cfg.stream_k,
        # one compile serves both paths (gemm_sm90.compiled_config); W8A16: the BF16 path only
        f16=0 if w8a16 and not swap_ab else 1,
        bf16_tokens=int(cfg.bf16_tokens) if swap_ab else 0,
        tile_w=cfg.tile_w if swap_ab else 64,
        cluster=cfg.cluster if swap_ab else 1,
    )


def config_from_fields(fields: dict):
    """The config a hash-list build names."""
    from mxfp8_fusion.kernels.gemm_sm90 import config as gemm_config

    activation = fields.get("activation", "mxfp8")
    if fields["kernel"] == "swap-ab":
        return gemm_config.SwapABConfig(
            tokens_tile=fields["tokens_tile"], stages=fields["stages"],
            consumers=fields["consumers"], bf16_tokens=bool(fields["bf16_tokens"]),
            tile_w=fields["tile_w"], cluster=fields["cluster"], num_ctas=fields["num_ctas"],
            activation=activation, token_tiles=fields.get("token_tiles", 0),
            split_tail=fields.get("split_tail", False),
            tile_aligned=fields.get("tile_aligned", False),
        )  # fmt: skip
    return gemm_config.TiledConfig(
        tile_m=fields["tile_m"], tile_n=fields["tile_n"], converters=fields["converters"],
        stream_k=fields["stream_k"], stages=fields["stages"], stages16=fields["stages16"],
        num_ctas=fields["num_ctas"], fp16_tiles=bool(fields["f16"]), activation=activation,
    )  # fmt: skip


def gemm_builds() -> list[dict]:
    """Every distinct GEMM build the table and the heuristic choose (at the first shape that
    chooses it, BF16 out, BF16 bias), plus the dtype combinations of the compile test."""
    from mxfp8_fusion.kernels.gemm_sm90.host import gemm as g
    from mxfp8_fusion.kernels.gemm_sm90.tuning import select, table

    builds, seen = [], set()
    shapes = [*table.measured_shapes(), *_EXTRA_SHAPES]
    for n, k in shapes:
        for tokens in _TOKENS:
            for cfg in (select.choose_config(tokens, n, k), select.heuristic_config(tokens, n, k)):
                fields = config_fields(g.compiled_config(cfg))
                key = json.dumps(fields, sort_keys=True)
                if key not in seen:
                    seen.add(key)
                    builds.append(dict(fields=fields, n=n, k=k, out="bfloat16", bias="bfloat16"))
    firsts = {}  # the first build of each kernel and schedule
    for b in builds:
        f = b["fields"]
        firsts.setdefault((f["kernel"], f["bf16_tokens"], f["stream_k"]), f)
    for fields in firsts.values():
        builds.append(dict(fields=fields, n=200, k=4160, out="float16", bias="float32"))
        builds.append(dict(fields=fields, n=384, k=1056, out="bfloat16", bias=None))
    return builds + w8a16_builds(shapes)


def w8a16_builds(shapes) -> list[dict]:
    """Every distinct W8A16 build the choice makes on ``shapes`` (one slice), on the default
    device and on each device with a W8A16 table, each kernel and schedule's first also from
    three (or two) slices, FP16 out and FP32 bias."""
    from mxfp8_fusion.kernels.gemm_sm90.tuning import select, table

    devices = [table.MEASURED_DEVICE]
    devices += [t["device"] for t in table.tables() if t.get("activation") == "bf16"]
    builds, seen = [], set()
    for n, k in shapes:
        for tokens in _TOKENS:
            for device in dict.fromkeys(devices):
                cfg = select.choose_config(tokens, n, k, 132, device, activation="bf16")
                fields = config_fields(cfg)
                key = json.dumps(fields, sort_keys=True)
                if key not in seen and k % 128 == 0:
                    seen.add(key)
                    builds.append(dict(fields=fields, n=n, widths=[k], out="bfloat16", bias=None))
    firsts = {}
    for b in builds:
        f = b["fields"]
        schedule = (f["kernel"], f["cluster"], f["tile_w"], f["stream_k"], f.get("token_tiles"))
        firsts.setdefault(schedule, b)
    for b in firsts.values():
        k = b["widths"][0]
        parts = 3 if k % 384 == 0 else 2 if k % 256 == 0 else 1
        widths = [k // parts] * parts
        builds.append(
            dict(fields=b["fields"], n=b["n"], widths=widths, out="float16", bias="float32")
        )
    return builds


def _gemm_ptx(build: dict) -> str:
    import torch

    from mxfp8_fusion.kernels.gemm_sm90.host import gemm as g

    cfg = config_from_fields(build["fields"])
    bias = getattr(torch, build["bias"]) if build["bias"] else None
    out = getattr(torch, build["out"])
    a = tuple(build["widths"]) if "widths" in build else build["k"]  # W8A16: the slices
    return g.compile_gemm(cfg, build["n"], a, build["n"], out, bias).__ptx__


def _name(build: dict) -> str:
    fields = " ".join(f"{k}={v}" for k, v in sorted(build["fields"].items()))
    k = f"widths={'+'.join(map(str, build['widths']))}" if "widths" in build else f"k={build['k']}"
    return f"gemm {fields} | n={build['n']} {k} out={build['out']} bias={build['bias']}"


def without_entry_names(ptx: str) -> str:
    """``ptx`` with each ``.entry`` symbol (and its parameters' names, which extend it)
    replaced by ``KERNEL<i>``."""
    for i, name in enumerate(re.findall(r"\.entry\s+(\w+)", ptx)):
        ptx = ptx.replace(name, f"KERNEL{i}")
    return ptx


def all_hashes(builds: list[dict]) -> dict[str, str]:
    """{build name: sha256 of its PTX} for ``builds`` and the fixed non-GEMM builds."""
    from mxfp8_fusion.kernels.gemm_sm90.host import buffers
    from mxfp8_fusion.kernels.quantize import host as quantizer

    def sha(text: str) -> str:
        return hashlib.sha256(without_entry_names(text).encode()).hexdigest()

    hashes = {}
    for build in builds:
        hashes[_name(build)] = sha(_gemm_ptx(build))
        print(len(hashes), _name(build), flush=True)
    hashes["refs k=1056"] = sha(buffers.compile_refs(1056).__ptx__)
    hashes["tokens k=4160"] = sha(buffers.compile_tokens(4160).__ptx__)
    for arch in quantizer.ARCHS.values():
        for config in (
            quantizer.QuantizerConfig(fp16=False, width=7168, arch=arch),
            quantizer.QuantizerConfig(fp16=True, width=1024, slices=6, arch=arch),
        ):
            hashes[f"quantizer {config}"] = sha(quantizer.compile_kernel(config).__ptx__)
    return hashes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="record the current hashes")
    args = parser.parse_args()
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    os.environ.setdefault("CUTE_DSL_KEEP", "ptx")  # the PTX text, which the DSL also dumps:
    with tempfile.TemporaryDirectory(prefix="mxfp8-ptx-") as dump:  # not in the caller's folder
        os.environ.setdefault("CUTE_DSL_DUMP_DIR", dump)
        return _check_or_write(args.write)


def _check_or_write(write: bool) -> int:
    if write:
        builds = gemm_builds()
    else:
        builds = json.loads(HASHES.read_text())["gemm_builds"]
    hashes = all_hashes(builds)
    if write:
        HASHES.write_text(json.dumps({"gemm_builds": builds, "sha256": hashes}, indent=1) + "\n")
        print(f"wrote {len(hashes)} hashes to {HASHES}")
        return 0
    recorded = json.loads(HASHES.read_text())["sha256"]
    changed = sorted(name for name in recorded if hashes.get(name) != recorded[name])
    for name in changed:
        print("CHANGED:", name)
    print(f"{len(recorded) - len(changed)} of {len(recorded)} builds unchanged")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
