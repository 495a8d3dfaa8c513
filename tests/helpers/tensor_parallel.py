"""Multi-process pieces of the tensor-parallel tests: the launcher and the per-rank checks.

Each check runs in every rank of a real process group (gloo on the CPU, NCCL on GPUs) and
raises on failure; ``torch.multiprocessing.spawn`` re-raises it in the test with the rank's
traceback. No tests here: the test modules import it as
``helpers.tensor_parallel`` (tests/conftest.py).
"""

from __future__ import annotations

import os
import socket
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import mxfp8_fusion as mf
from mxfp8_fusion import reference
from mxfp8_fusion import tensor_parallel as tp
from mxfp8_fusion.nn import MXFP8Linear

WIDTHS = [384, 256, 384]  # K = 1024: row ranges at 2 and 4 ranks cut through slices
K, N = sum(WIDTHS), 512  # N = 4 x 128: column shards of 128 rows at 4 ranks

# NVLink multicast stays off on the GPU machines (NCCL NVLS, symmetric-memory multicast).
NO_MULTICAST = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(check, world: int, *args, backend: str = "gloo") -> None:
    """Run ``check(rank, world, device, *args)`` in ``world`` spawned ranks of a fresh group.

    The ranks inherit NVLink multicast off and Inductor compiling in-process (CI has two
    cores); this process's environment is restored afterwards.
    """
    env = {**NO_MULTICAST, "TORCHINDUCTOR_COMPILE_THREADS": "1"}
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        for attempt in (1, 2):
            try:
                mp.spawn(
                    _entry, args=(world, free_port(), backend, check, args), nprocs=world, join=True
                )
                return
            except mp.ProcessExitedException as error:
                # Once in about a dozen CI runs a gloo rank died in C++ ("terminate called
                # without an active exception", SIGABRT) while compiling, before any check
                # ran; not reproduced in 13 runs since. A failed check raises in Python
                # (ProcessRaisedException) and is never retried.
                if attempt == 2 or error.signal_name != "SIGABRT":
                    raise
                warnings.warn(f"a rank aborted ({error}); running the ranks again", stacklevel=2)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _entry(rank, world, port, backend, check, args):
    torch.set_num_threads(1)
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group(
        backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        # the FX graph cache off, so the pass runs (a hit skips it) and its counts are real
        with (
            torch.no_grad(),
            torch._inductor.config.patch(fx_graph_cache=False),
            torch._functorch.config.patch(enable_autograd_cache=False),
        ):
            check(rank, world, device, *args)
    finally:
        dist.destroy_process_group()


# --- shared data -------------------------------------------------------------------------


def full_linear(k: int = K, n: int = N, seed: int = 0) -> nn.Linear:
    """The same BF16 layer on every rank (seeded), bias large enough that adding it twice or
    not at all is far outside the row-parallel tolerance."""
    gen = torch.Generator().manual_seed(seed)
    lin = nn.Linear(k, n, dtype=torch.bfloat16)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n, k, generator=gen) * k**-0.5)
        lin.bias.copy_(torch.randn(n, generator=gen) * 4)
    return lin


def hidden(*lead: int, device, seed: int = 0, widths=WIDTHS) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(*lead, w, generator=gen) * 3).to(device=device, dtype=torch.bfloat16)
        for w in widths
    ]


class Drafter(nn.Module):
    def __init__(self, fc):
        super().__init__()
        self.fc = fc

    def forward(self, *slices):
        return self.fc(torch.cat(slices, dim=-1))


def assert_bitwise(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype, (what, a.shape, b.shape, a.dtype, b.dtype)
    same = torch.equal(a.contiguous().view(torch.int16), b.contiguous().view(torch.int16))
    assert same, f"{what}: not bitwise equal, max |diff| {(a.float() - b.float()).abs().max()}"


def assert_same_on_all_ranks(t: torch.Tensor, what: str) -> None:
    """Every rank holds the same bytes (the all-reduce and all-gather give each the same)."""
    bits = t.contiguous().view(torch.int16).reshape(-1).to(torch.int32)  # gloo: no int16
    gathered = [torch.empty_like(bits) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, bits)
    for r, g in enumerate(gathered):
        assert torch.equal(g, bits), f"{what}: rank {r} differs from rank {dist.get_rank()}"


def row_parallel_bound(x: torch.Tensor, lin: nn.Linear, world: int, y_1: torch.Tensor):
    """The per-output bound of ``RowParallelMXFP8Linear``'s docstring, from the partial
    outputs every rank computes (recomputed here for all ranks from the full weight):
    ``u * (g |y_1| + (g + world - 1) sum_r |p_r|) + 2**-13 S``, widened by ``1 + world u``
    for the second-order terms."""
    flat = x.reshape(-1, x.shape[-1])
    weight, bias = lin.weight.detach().to(x.device), lin.bias.detach().to(x.device)
    partial_sum = torch.zeros(flat.shape[0], weight.shape[0], dtype=torch.float64, device=x.device)
    for r, (c0, c1) in enumerate(tp.split_in_features(weight.shape[1], world)):
        part = mf.mm(
            flat[:, c0:c1], mf.pack_weight(weight[:, c0:c1]), bias=bias if r == 0 else None
        )
        partial_sum += part.double().abs()
    q = mf.quantize(flat)
    w = mf.pack_weight(weight)
    a = reference.dequantize(q.values, q.scales).double().abs()
    b = reference.dequantize(w.values, w.scales).double().abs()
    u = 2.0**-8 if x.dtype == torch.bfloat16 else 2.0**-11
    g = 1 if x.device.type == "cpu" else 2
    y_abs = y_1.reshape(flat.shape[0], -1).double().abs()
    bound = u * (g * y_abs + (g + world - 1) * partial_sum) + 2.0**-13 * (a @ b.T)
    return (bound * (1 + world * u)).view(y_1.shape)


def assert_within_row_bound(y, y_1, x, lin, world, what: str) -> None:
    bound = row_parallel_bound(x, lin, world, y_1)
    err = (y.double() - y_1.double()).abs()
    assert bool((err <= bound).all()), f"{what}: max excess {(err - bound).max().item()}"
    # and the aggregate a real bug would break: well below one BF16 rounding of the output
    rel = (y.double() - y_1.double()).norm() / y_1.double().norm()
    assert rel < 2.0**-8, f"{what}: relative error {rel}"


class CountingBackend:
    """``backend="mxfp8_fusion"`` with its pass and the number of compiles kept to read."""

    def __init__(self):
        from mxfp8_fusion.passes.fusion import FusionPass

        self.fusion = FusionPass()
        self.compiles = 0

    def __call__(self, gm, example_inputs):
        from mxfp8_fusion.passes.backend import mxfp8_fusion_backend

        self.compiles += 1
        return mxfp8_fusion_backend(gm, example_inputs, fusion=self.fusion)


def _kernel_is_column_exact(device, tokens: int) -> bool:
    # On CUDA the swap-AB kernel (<= 64 tokens) splits K by the count of weight tiles, so a
    # column shard may sum in another order; the tiled kernel computes each output alone.
    return device.type == "cpu" or tokens > 64


# --- the checks ----------------------------------------------------------------------------


def check_eager(rank, world, device, token_counts=(1, 5, 33)):
    """Column and row parallel, eager, against the single-device layer; leading dims kept."""
    group = dist.group.WORLD
    lin = full_linear()
    single = MXFP8Linear.from_linear(lin.to(device))
    col = tp.ColumnParallelMXFP8Linear.from_weight(lin.weight.detach(), group, bias=lin.bias)
    row = tp.RowParallelMXFP8Linear.from_weight(lin.weight.detach(), group, bias=lin.bias)
    assert col.local.out_features == N // world and row.local.in_features == K // world
    for lead in [(t,) for t in token_counts] + [(2, 3)]:
        xs = hidden(*lead, device=device, seed=sum(lead))
        x = torch.cat(xs, -1)
        y_1 = single(x)
        y_col = col(x)
        if _kernel_is_column_exact(device, x.numel() // K):
            assert_bitwise(y_col, y_1, f"column {lead}")
        assert_bitwise(col.forward_slices(xs), y_col, f"column staged {lead}")
        y_row = row(x)
        assert_within_row_bound(y_row, y_1, x, lin, world, f"row {lead}")
        assert_bitwise(row.forward_slices(xs), y_row, f"row staged {lead}")
        assert_same_on_all_ranks(y_row, f"row {lead}")


class BothModes(nn.Module):
    """One concatenation read whole by a column-parallel layer and by a row-parallel one
    (each rank's column range): one compiled site of two column ranges."""

    def __init__(self, column, row):
        super().__init__()
        self.column, self.row = column, row

    def forward(self, *slices):
        x = torch.cat(slices, dim=-1)
        return self.column(x), self.row(x)


def check_compiled(rank, world, device, token_counts=(4, 17, 40)):
    """Both modes compiled with the fusion pass, the token count dynamic (one compile, no
    graph break): column bitwise the single-device layer, row bitwise its eager self."""
    group = dist.group.WORLD
    lin = full_linear(seed=1)
    single = MXFP8Linear.from_linear(lin.to(device))
    weight = lin.weight.detach()
    model = BothModes(
        tp.ColumnParallelMXFP8Linear.from_weight(weight, group, bias=lin.bias),
        tp.RowParallelMXFP8Linear.from_weight(weight, group, bias=lin.bias),
    )
    torch._dynamo.reset()
    backend = CountingBackend()
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    for tokens in token_counts:
        xs = hidden(tokens, device=device, seed=tokens)
        for x in xs:
            torch._dynamo.mark_dynamic(x, 0)
        (column, row), (column_eager, row_eager) = compiled(*xs), model(*xs)
        assert_bitwise(column, column_eager, f"column compiled vs eager, {tokens} tokens")
        assert_bitwise(row, row_eager, f"row compiled vs eager, {tokens} tokens")
        if _kernel_is_column_exact(device, tokens):
            assert_bitwise(column, single(torch.cat(xs, -1)), f"column compiled, {tokens} tokens")
    assert backend.compiles == 1, backend.compiles
    (report,) = backend.fusion.reports
    assert report.rewritten and report.consumers == 2, report


class Block(nn.Module):
    """A drafter projection and an MLP after it: ``down(relu(up(fc(cat(hidden)))))``."""

    def __init__(self, k: int = K, n: int = N):
        super().__init__()
        self.fc = nn.Linear(k, n, dtype=torch.bfloat16)
        self.up = nn.Linear(n, 2 * n, dtype=torch.bfloat16)
        self.down = nn.Linear(2 * n, n, bias=False, dtype=torch.bfloat16)

    def forward(self, *hidden):
        return self.down(torch.relu(self.up(self.fc(torch.cat(hidden, dim=-1)))))


def reference_block(seed: int = 2) -> Block:
    block = Block()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * p.shape[-1] ** -0.5)
    return block


MEGATRON_PLAN = {
    "fc": "row",
    "up": tp.ColumnParallel(gather_output=False),
    "down": tp.RowParallel(input_is_parallel=True),
}


def check_shard(rank, world, device, checkpoint: str, mxfp8_checkpoint: str):
    """``shard`` of a meta-device model from a memory-mapped BF16 checkpoint (row, column
    without gather, row with a parallel input) and from an MXFP8 one (column), against the
    single-device model."""
    group = dist.group.WORLD
    single = mf.convert(reference_block()).to(device)
    xs = hidden(24, device=device, seed=5)
    y_1 = single(*xs)

    with torch.device("meta"):
        model = Block()
    state = torch.load(checkpoint, mmap=True, weights_only=True)
    tp.shard(model, group, MEGATRON_PLAN, state_dict=state, device=device)
    assert isinstance(model.up, tp.ColumnParallelMXFP8Linear) and not model.up.gather_output
    assert model.down.local.bias is None and (model.fc.local.bias is None) == (rank != 0)
    y = model(*xs)
    assert_same_on_all_ranks(y, "sharded block")
    # fc's and down's row-parallel sums differ from one device's by a few BF16 roundings,
    # and the next layer's MXFP8 quantization turns some of those into a flipped E4M3
    # rounding (2**-3 relative): held against MXFP8's own error, against the BF16 block
    y_bf16 = reference_block().to(device)(*xs).double()
    rel_tp = (y.double() - y_1.double()).norm() / y_1.double().norm()
    rel_mxfp8 = (y_1.double() - y_bf16).norm() / y_bf16.norm()
    assert rel_tp < rel_mxfp8, (rel_tp, rel_mxfp8)

    # an MXFP8 checkpoint (blocked scales, as MXFP8Linear.state_dict holds them): column shards
    with torch.device("meta"):
        model = Block()
    state = torch.load(mxfp8_checkpoint, mmap=True, weights_only=True)
    tp.shard(model, group, dict.fromkeys(("fc", "up", "down"), "column"), state_dict=state)
    if _kernel_is_column_exact(device, 24):
        assert_bitwise(model(*xs), y_1, "column-sharded block from MXFP8")


def check_all(rank, world, device, checkpoint: str, mxfp8_checkpoint: str):
    """Every check in one process group (a spawn costs seconds on CI's two cores)."""
    check_eager(rank, world, device)
    check_compiled(rank, world, device)
    check_shard(rank, world, device, checkpoint, mxfp8_checkpoint)


def check_nccl(rank, world, device):
    """On CUDA: column shards bitwise where the tiled GEMM runs (more than 64 tokens)."""
    check_eager(rank, world, device, token_counts=(3, 96, 300))
    check_compiled(rank, world, device, token_counts=(80, 200, 17))
