"""Tensor-parallel receipt: the drafter-like projection ``fc(cat(hidden))`` sharded over
1, 2, 4 and 8 GPUs (the degrees the machine has), column- and row-parallel.

Each TP degree runs in its own spawned NCCL process group, one process per GPU. Each rank
loads its shard of one full BF16 checkpoint (memory-mapped: it reads only its rows or
columns) with ``mxfp8_fusion.tensor_parallel.shard``, then runs, interleaved A B A B:

1. ``eager``: ``layer(torch.cat(hidden, -1))``
2. ``staged_eager``: ``layer.forward_slices(hidden)`` (no BF16 concatenation)
3. ``compiled``: ``torch.compile(Drafter(layer), backend="mxfp8_fusion")``
4. ``graph_replay``: 3 with ``mode="reduce-overhead"``, static inputs (at TP 1; at every
   degree with ``--graph-replay``)

Per variant and rank: the median time of one call (CUDA events; all ranks start each call
together after a barrier), the same behind a sleep kernel (GPU work only), and the
transient peak (``max_memory_allocated`` during the call minus ``memory_allocated``
before). Per rank, by construction: the resident shard bytes, the staged MXFP8 storage and
the GEMM's FLOP. Checks: 2 and 3 bitwise equal to 1 on every rank, and rank 0's output
against the single-device layer (column: bitwise; row: the relative error).

NVLink multicast stays off (``NCCL_NVLS_ENABLE=0``, ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``,
``NVSHMEM_DISABLE_NVLS=1``, set before any process starts).

    python benchmarks/tensor_parallel.py --tp 1          # one GPU, under 2 minutes
    python benchmarks/tensor_parallel.py                 # every degree the GPUs allow
    python benchmarks/tensor_parallel.py --cpu-smoke     # the script's path on the CPU
"""

from __future__ import annotations

import os

# before torch: the NCCL of every rank reads these when its communicator starts
os.environ.update(
    {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
)

import argparse
import json
import socket
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from common import (
    Drafter,
    environment,
    git_revision,
    time_interleaved,
    transient_peak,
    write_receipt,
)
from torch import nn

import mxfp8_fusion as mf
from mxfp8_fusion import tensor_parallel as tp
from mxfp8_fusion.format import scale_bytes

MULTICAST_OFF = ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")


@dataclass(frozen=True)
class Geometry:
    name: str
    tokens: int
    hidden: int
    slices: int

    @property
    def in_features(self) -> int:
        return self.hidden * self.slices


GEOMETRIES = {
    "reference": Geometry("reference: 6 x 7168 -> 7168, tokens 4096", 4096, 7168, 6),
    "drafter": Geometry("drafter: 3 x 4096 -> 4096, tokens 16384", 16384, 4096, 3),
}
# --cpu-smoke: the script's whole path on the CPU (gloo, the reference ops) in seconds; its
# times and peaks mean nothing
SMOKE = Geometry("smoke: 3 x 256 -> 256, tokens 64 (CPU)", 64, 256, 3)
MODES = ("column", "row")


def write_checkpoint(geo: Geometry, path: Path, device: torch.device) -> None:
    """A full BF16 ``fc`` (weight and bias) as a torch.save file: what every rank shards.
    Drawn on ``device`` (a GPU draws the reference weight's 308 M values in milliseconds,
    one CPU thread in seconds)."""
    gen = torch.Generator(device=device).manual_seed(0)
    k, n = geo.in_features, geo.hidden
    weight = (torch.randn(n, k, generator=gen, device=device) * k**-0.5).to(torch.bfloat16)
    bias = (torch.randn(n, generator=gen, device=device) * 0.1).to(torch.bfloat16)
    torch.save({"fc.weight": weight.cpu(), "fc.bias": bias.cpu()}, path)
    del weight, bias


def hidden_states(geo: Geometry, device: torch.device) -> list[torch.Tensor]:
    # the same inputs on every rank (a seeded CUDA generator is deterministic per shape)
    gen = torch.Generator(device=device).manual_seed(1)
    return [
        torch.randn(geo.tokens, geo.hidden, generator=gen, device=device, dtype=torch.bfloat16)
        for _ in range(geo.slices)
    ]


def _barrier() -> None:
    """Every rank starts a timed call together, so the ranks' collectives do not wait on a
    rank that is behind."""
    dist.barrier()
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


def shard_bytes(layer: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in (*layer.buffers(), *layer.parameters()))


def bench_case(geo: Geometry, mode: str, checkpoint: str, rounds: int, graph_replay: bool, device):
    """One geometry and mode on this rank: measurements and checks (see the module doc)."""
    group = dist.group.WORLD
    rank, world = dist.get_rank(), dist.get_world_size()
    torch._dynamo.reset()
    with torch.device("meta"):
        model = Drafter(nn.Linear(geo.in_features, geo.hidden, dtype=torch.bfloat16))
    state = torch.load(checkpoint, mmap=True, weights_only=True)
    tp.shard(model, group, {"fc": mode}, state_dict=state, device=device)
    layer = model.fc
    hidden = hidden_states(geo, device)
    fns = {
        "eager": model,
        "staged_eager": lambda *h: layer.forward_slices(list(h)),
        "compiled": torch.compile(model, backend="mxfp8_fusion"),
    }
    if graph_replay:
        graphed = torch.compile(model, backend="mxfp8_fusion", mode="reduce-overhead")
        static = [h.clone() for h in hidden]
        for h in static:
            torch._dynamo.mark_static_address(h)
        fns["graph_replay"] = lambda *_: graphed(*static)
    with torch.no_grad():
        for fn in fns.values():  # compiles, kernel builds, graph capture
            for _ in range(3):
                fn(*hidden)
        peaks, outputs = {}, {}
        for name, fn in fns.items():
            dist.barrier()
            peaks[name], out = transient_peak(fn, hidden)
            outputs[name] = out.clone()
            del out
        times = time_interleaved(fns, hidden, rounds, queued=False, before_each=_barrier)
        queued = time_interleaved(fns, hidden, rounds, queued=True, before_each=_barrier)
    ref = outputs["eager"].view(torch.int16)
    bitwise = {n: bool(torch.equal(o.view(torch.int16), ref)) for n, o in outputs.items()}
    if mode == "column":
        rows, k_local = layer.local.out_features, geo.in_features
    else:
        rows, k_local = geo.hidden, layer.columns[1] - layer.columns[0]
    rank_result = {
        "rank": rank,
        "median_ms": times,
        "median_ms_queued": queued,
        "transient_peak_bytes": peaks,
        "shard_bytes": shard_bytes(layer),
        "staged_storage_bytes": geo.tokens * k_local + scale_bytes(geo.tokens, k_local),
        "gemm_tflop": 2.0 * geo.tokens * k_local * rows / 1e12,
        "bitwise_equal_to_eager": bitwise,
    }
    check = (
        single_device_check(geo, mode, checkpoint, hidden, outputs["eager"]) if rank == 0 else None
    )
    del fns, model, outputs
    torch._dynamo.reset()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    per_rank = [None] * world
    dist.all_gather_object(per_rank, rank_result)
    return {"per_rank": per_rank, "single_device_check": check}


def single_device_check(geo, mode, checkpoint, hidden, out) -> dict:
    """Rank 0's output against the unsharded layer on its GPU (column: bitwise expected;
    row: the summation order differs, see RowParallelMXFP8Linear)."""
    # the full BF16 weight, on rank 0 and for this check only
    state = torch.load(checkpoint, mmap=True, weights_only=True)
    single = mf.MXFP8Linear.from_linear(_bf16_linear(state, out.device))
    with torch.no_grad():
        expected = single(torch.cat(hidden, dim=-1))
    diff = (out.double() - expected.double()).abs()
    result = {
        "bitwise_equal": bool(torch.equal(out.view(torch.int16), expected.view(torch.int16))),
        "fraction_bitwise_equal": float(
            (out.view(torch.int16) == expected.view(torch.int16)).float().mean()
        ),
        "max_abs_diff": float(diff.max()),
        "relative_error": float(diff.norm() / expected.double().norm()),
    }
    del single, expected
    if out.device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def _bf16_linear(state, device) -> nn.Linear:
    weight = state["fc.weight"]
    linear = nn.Linear(weight.shape[1], weight.shape[0], dtype=torch.bfloat16, device="meta")
    linear = linear.to_empty(device=device).requires_grad_(False)
    linear.weight.copy_(weight)
    linear.bias.copy_(state["fc.bias"])
    return linear


def _worker(rank, world, port, cases, rounds, graph_replay, out_path, smoke):
    if smoke:
        device = torch.device("cpu")
        torch.set_num_threads(1)
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
        )
    else:
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
        dist.init_process_group(
            "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
            device_id=device,
        )  # fmt: skip
    try:
        results = []
        for geo_key, mode, checkpoint in cases:
            geo = SMOKE if smoke else GEOMETRIES[geo_key]
            result = bench_case(geo, mode, checkpoint, rounds, graph_replay, device)
            results.append({"geometry": geo_key, "mode": mode, "tp": world, **result})
        if rank == 0:
            Path(out_path).write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def summarize(result: dict, geo: Geometry) -> dict:
    """The receipt entry of one (geometry, mode, TP): per variant the slowest rank's
    median (a step waits for it) and the largest per-rank peak, beside the per-rank lists."""
    ranks = result["per_rank"]
    variants = list(ranks[0]["median_ms"])
    summary = {
        name: {
            "median_ms": max(r["median_ms"][name] for r in ranks),
            "median_ms_queued": max(r["median_ms_queued"][name] for r in ranks),
            "transient_peak_bytes": max(r["transient_peak_bytes"][name] for r in ranks),
            "bitwise_equal_to_eager_on_every_rank": all(
                r["bitwise_equal_to_eager"][name] for r in ranks
            ),
        }
        for name in variants
    }
    k, n = geo.in_features, geo.hidden
    return {
        "geometry": asdict(geo) | {"in_features": k, "out_features": n},
        "mode": result["mode"],
        "tp": result["tp"],
        "variants": summary,
        "per_rank": ranks,
        "bytes_single_device": {
            "bf16_concatenation": geo.tokens * k * 2,
            "mxfp8_storage": geo.tokens * k + scale_bytes(geo.tokens, k),
            "mxfp8_weight": n * k + scale_bytes(n, k),
            "output": geo.tokens * n * 2,
        },
        "gemm_tflop_single_device": 2.0 * geo.tokens * k * n / 1e12,
        "single_device_check_rank0": result["single_device_check"],
    }


def add_ratios(entries: list[dict]) -> None:
    """Each entry's times over the TP-1 entry of the same geometry and mode, where measured."""
    base = {(e["geometry"]["name"], e["mode"]): e for e in entries if e["tp"] == 1}
    for e in entries:
        one = base.get((e["geometry"]["name"], e["mode"]))
        if one is None:
            continue
        e["ratios"] = {
            f"{name}_over_tp1_time_queued (lower is faster)": v["median_ms_queued"]
            / one["variants"][name]["median_ms_queued"]
            for name, v in e["variants"].items()
            if name in one["variants"]
        } | {
            f"{name}_over_tp1_transient_peak (lower is less memory)": v["transient_peak_bytes"]
            / max(one["variants"][name]["transient_peak_bytes"], 1)
            for name, v in e["variants"].items()
            if name in one["variants"]
        }


def print_table(entries: list[dict]) -> None:
    print(
        f"\n{'geometry':<10} {'mode':<7} {'tp':>3} {'variant':<13} {'ms':>8} {'queued ms':>10} "
        f"{'peak MiB/rank':>14} {'shard MiB':>10} {'storage MiB':>12}"
    )
    for e in entries:
        r0 = e["per_rank"][0]
        for name, v in e["variants"].items():
            print(
                f"{e['geometry']['name'].split(':')[0]:<10} {e['mode']:<7} {e['tp']:>3} "
                f"{name:<13} {v['median_ms']:>8.3f} {v['median_ms_queued']:>10.3f} "
                f"{v['transient_peak_bytes'] / 2**20:>14.1f} {r0['shard_bytes'] / 2**20:>10.1f} "
                f"{r0['staged_storage_bytes'] / 2**20:>12.1f}"
            )
        print(f"{'':<22} single-device check (rank 0): {e['single_device_check_rank0']}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--tp", type=int, nargs="+", default=None, help="TP degrees (default: 1 2 4 8 that fit)"
    )
    parser.add_argument(
        "--geometry", choices=sorted(GEOMETRIES), nargs="+", default=list(GEOMETRIES)
    )
    parser.add_argument("--mode", choices=MODES, nargs="+", default=list(MODES))
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument(
        "--graph-replay",
        action="store_true",
        help="also time CUDA Graph replay at TP > 1 (always timed at TP 1)",
    )
    parser.add_argument(
        "--out", default=None, help="default benchmarks/results/tensor_parallel.json"
    )
    parser.add_argument("--git-rev", default=None)
    parser.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="run the whole script on the CPU (gloo, a tiny geometry, TP 1 and 2): checks the "
        "script, measures nothing; writes a receipt only with --out",
    )
    return parser


def run_degrees(args, degrees: list[int]) -> list[dict]:
    """Every case of ``args`` at each TP degree, one spawned process group per degree, from
    checkpoints written once: the summarized receipt entries."""
    draw_on = "cpu" if args.cpu_smoke else "cuda:0"
    entries = []
    with tempfile.TemporaryDirectory() as tmp:
        checkpoints = {}
        for key in args.geometry:
            checkpoints[key] = str(Path(tmp) / f"{key}.pt")
            geo = SMOKE if args.cpu_smoke else GEOMETRIES[key]
            write_checkpoint(geo, Path(checkpoints[key]), torch.device(draw_on))
        cases = [(key, mode, checkpoints[key]) for key in args.geometry for mode in args.mode]
        for world in degrees:
            out_path = Path(tmp) / f"tp{world}.json"
            print(f"TP {world}: {len(cases)} case(s) on {world} GPU(s)", flush=True)
            mp.spawn(
                _worker,
                args=(
                    world,
                    _free_port(),
                    cases,
                    args.rounds,
                    (args.graph_replay or world == 1) and not args.cpu_smoke,
                    str(out_path),
                    args.cpu_smoke,
                ),
                nprocs=world,
                join=True,
            )
            for result in json.loads(out_path.read_text()):
                geo = SMOKE if args.cpu_smoke else GEOMETRIES[result["geometry"]]
                entries.append(summarize(result, geo))
    return entries


def receipt_of(args, entries: list[dict], gpus: int) -> dict:
    """The receipt: environment, method and every entry."""
    if args.cpu_smoke:
        env = {"gpu": None, "torch": torch.__version__, "git_revision": git_revision(args.git_rev)}
    else:
        env = environment(args.git_rev) | {"gpus": gpus}
    return {
        "benchmark": "tensor_parallel"
        + (" (CPU smoke run: no measurements)" if args.cpu_smoke else ""),
        "environment": env,
        "method": (
            "one spawned NCCL process group per TP degree, one process per GPU; each rank loads "
            "its shard of one memory-mapped BF16 checkpoint with tensor_parallel.shard; "
            "variants interleaved A B A B per round (order rotated), each call after a barrier; "
            "median_ms = median of CUDA-event timings of one call starting on an idle GPU, "
            "median_ms_queued = the same behind a ~3 ms sleep kernel (GPU work only); per "
            "variant the slowest rank's median and the largest per-rank transient peak "
            "(max_memory_allocated during the call minus memory_allocated before); "
            "staged_storage_bytes and gemm_tflop per rank by construction; ratios are to TP 1 "
            "of the same geometry and mode"
        ),
        "multicast_off": {key: os.environ[key] for key in MULTICAST_OFF},
        "rounds": args.rounds,
        "results": entries,
    }


def main() -> None:
    parser = _parser()
    args = parser.parse_args()
    gpus = 2 if args.cpu_smoke else torch.cuda.device_count()
    if gpus == 0:
        parser.error("needs CUDA GPUs (one per rank)")
    degrees = args.tp or [d for d in (1, 2, 4, 8) if d <= gpus]
    if any(d < 1 or d > gpus for d in degrees):
        parser.error(
            f"--tp: each degree must be between 1 and the {gpus} GPU(s) here, got {degrees}"
        )
    if args.cpu_smoke:
        args.geometry = ["smoke"]
    entries = run_degrees(args, degrees)
    add_ratios(entries)
    print_table(entries)
    out = args.out or (None if args.cpu_smoke else "benchmarks/results/tensor_parallel.json")
    if out is not None:
        write_receipt(out, receipt_of(args, entries, gpus))


if __name__ == "__main__":
    main()
