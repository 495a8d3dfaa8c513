"""Tensor parallelism: shard splits and loading, the compiled graph of each rank, and the
layers run in real gloo process groups of 2 and 4 ranks (NCCL on 2 GPUs where present)."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.distributed as dist
from expecttest import assert_expected_inline
from helpers.passes import Capture, randn
from helpers.tensor_parallel import (
    WIDTHS,
    Block,
    Drafter,
    K,
    N,
    check_all,
    check_nccl,
    full_linear,
    launch,
    reference_block,
)
from torch import nn

import mxfp8_fusion as mf
from mxfp8_fusion import reference
from mxfp8_fusion import tensor_parallel as tp
from mxfp8_fusion.nn import MXFP8Linear

# --- splits -----------------------------------------------------------------------------------


def test_split_out_features_equal_shards_of_128_rows():
    assert tp.split_out_features(512, 4) == [(0, 128), (128, 256), (256, 384), (384, 512)]
    assert tp.split_out_features(7168, 8)[1] == (896, 1792)
    for n, world in [(384, 4), (7168, 16), (100, 1), (0, 1)]:
        with pytest.raises(ValueError, match=r"^out_features: expected a positive multiple of 128"):
            tp.split_out_features(n, world)


def test_split_in_features_128_aligned_as_even_as_blocks_go():
    assert tp.split_in_features(1024, 2) == [(0, 512), (512, 1024)]
    assert tp.split_in_features(768, 4) == [(0, 128), (128, 384), (384, 512), (512, 768)]
    assert tp.split_in_features(43008, 16)[15] == (40320, 43008)
    for k, world in [(1000, 2), (384, 4), (128, 0)]:
        with pytest.raises(ValueError, match=r"^in_features: expected a multiple of 128"):
            tp.split_in_features(k, world)


# --- loading a rank's shard -------------------------------------------------------------------


def _checkpoint(weight: torch.Tensor):
    values, rows = reference.quantize_rows(weight)
    return values, rows  # E4M3 [N, K] and row-major uint8 [N, K/32], as a checkpoint holds them


def _sources(weight: torch.Tensor):
    """The three forms a full weight comes in: BF16, an MXFP8 checkpoint, packed (blocked)."""
    values, rows = _checkpoint(weight)
    packed = mf.pack_weight(weight)
    return {
        "bf16": (weight, None),
        "checkpoint": (values, rows),
        "blocked": (packed.values, packed.scales),
    }


def _assert_weight_bitwise(a: mf.MXFP8Weight, b: mf.MXFP8Weight) -> None:
    assert torch.equal(a.values.view(torch.uint8), b.values.view(torch.uint8))
    assert torch.equal(a.scales.view(torch.uint8), b.scales.view(torch.uint8))


@pytest.mark.parametrize("source", ["bf16", "checkpoint", "blocked"])
def test_column_shard_is_the_rows_of_the_packed_weight(source):
    weight = full_linear(k=512, n=512).weight.detach()
    full = mf.pack_weight(weight)
    full_rows = reference.from_blocked(full.scales, 512, 16)
    w, scales = _sources(weight)[source]
    for start, end in tp.split_out_features(512, 4):
        shard = tp.load_column_shard(w, (start, end), scales, "cpu")
        _assert_weight_bitwise(shard, mf.pack_weight(weight[start:end]))
        assert torch.equal(shard.values.view(torch.uint8), full.values[start:end].view(torch.uint8))
        assert torch.equal(reference.from_blocked(shard.scales, 128, 16), full_rows[start:end])


@pytest.mark.parametrize("source", ["bf16", "checkpoint", "blocked"])
def test_row_shard_is_the_columns_of_the_packed_weight(source):
    weight = full_linear(k=768, n=200).weight.detach()  # N not a multiple of 128: padded rows
    full = mf.pack_weight(weight)
    full_rows = reference.from_blocked(full.scales, 200, 24)
    w, scales = _sources(weight)[source]
    for start, end in tp.split_in_features(768, 4):
        shard = tp.load_row_shard(w, (start, end), scales, "cpu")
        _assert_weight_bitwise(shard, mf.pack_weight(weight[:, start:end]))
        g0, g1 = start // 32, end // 32
        assert torch.equal(reference.from_blocked(shard.scales, 200, g1 - g0), full_rows[:, g0:g1])


@pytest.mark.parametrize("source", ["bf16", "checkpoint", "blocked"])
def test_row_shard_of_a_width_not_a_multiple_of_128(source):
    """K 160: the blocked layout pads its 5 groups to two chunks per row block, so a
    128-column shard is the first chunk of every row block."""
    weight = full_linear(k=160, n=256).weight.detach()
    w, scales = _sources(weight)[source]
    shard = tp.load_row_shard(w, (0, 128), scales, "cpu")
    _assert_weight_bitwise(shard, mf.pack_weight(weight[:, :128]))


class LazyTensor:
    """A lazily read tensor, as a safetensors slice: ``get_shape()`` and ``[...]`` indexing;
    it records every index it is read with."""

    def __init__(self, t: torch.Tensor):
        self.t, self.reads = t, []

    def get_shape(self):
        return list(self.t.shape)

    def __getitem__(self, index):
        self.reads.append(index)
        return self.t[index]


def test_lazy_sources_are_read_only_at_the_shard():
    weight = full_linear(k=512, n=512).weight.detach()
    values, rows = _checkpoint(weight)
    lazy_w, lazy_v, lazy_s = LazyTensor(weight), LazyTensor(values), LazyTensor(rows)
    shard = tp.load_column_shard(lazy_w, (128, 256), device="cpu")
    _assert_weight_bitwise(shard, mf.pack_weight(weight[128:256]))
    assert lazy_w.reads == [slice(128, 256)]
    shard = tp.load_row_shard(lazy_v, (256, 384), lazy_s, "cpu")
    _assert_weight_bitwise(shard, mf.pack_weight(weight[:, 256:384]))
    assert lazy_v.reads == [(slice(None), slice(256, 384))]
    assert lazy_s.reads == [(slice(None), slice(8, 12))]


def test_loader_errors_name_the_argument():
    weight = full_linear(k=512, n=512).weight.detach()
    with pytest.raises(ValueError, match=r"^weight: expected a tensor with data"):
        tp.load_column_shard(torch.empty(512, 512, device="meta"), (0, 128))
    with pytest.raises(TypeError, match=r"^weight: expected a torch.Tensor or a sliceable"):
        tp.load_row_shard([[1.0]], (0, 128))
    with pytest.raises(ValueError, match=r"^weight: expected a 2-D"):
        tp.load_row_shard(weight[0], (0, 128))
    with pytest.raises(ValueError, match=r"^columns: expected multiples of 128, got \(0, 96\)"):
        tp.load_row_shard(weight, (0, 96))
    with pytest.raises(ValueError, match=r"^rows: expected \(start, end\) with 0 <= start"):
        tp.load_column_shard(weight, (0, 1000))
    with pytest.raises(TypeError, match=r"^weight: expected float8_e4m3fn values with scales"):
        tp.load_row_shard(weight, (0, 128), torch.zeros(512, 16, dtype=torch.uint8))
    packed = mf.pack_weight(weight)
    with pytest.raises(ValueError, match=r"^rows: expected multiples of 128"):
        tp.load_column_shard(packed.values, (0, 64), packed.scales)
    with pytest.raises(ValueError, match=r"^scales: expected blocked scales of 8192 bytes"):
        tp.load_column_shard(packed.values, (0, 128), packed.scales[:100])


# --- one rank's graph (a fake process group: collectives traced, not run) ---------------------


@contextlib.contextmanager
def fake_group(rank: int, world: int):
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    torch._dynamo.reset()
    try:
        yield dist.group.WORLD
    finally:
        torch._dynamo.reset()
        dist.destroy_process_group()


def _compile_rank(layer: nn.Module) -> Capture:
    cap = Capture()
    with torch.no_grad():
        torch.compile(Drafter(layer), backend=cap, fullgraph=True)(
            *[randn(8, w, seed=i) for i, w in enumerate(WIDTHS)]
        )
    assert cap.fusion.matches == 1 and cap.fusion.skipped == 0
    return cap


def test_row_parallel_rank_stages_only_its_columns():
    """Rank 1 of 4 owns columns [256, 512) of cat([384, 256, 384]): the last 128 columns of
    slice 0 and the first 128 of slice 1 are quantized; slice 2 is never read."""
    lin = full_linear()
    with fake_group(1, 4) as group:
        layer = tp.RowParallelMXFP8Linear.from_weight(lin.weight.detach(), group, bias=lin.bias)
        assert layer.columns == (256, 512) and layer.local.bias is None
        cap = _compile_rank(layer)
    assert_expected_inline(
        cap.before[-1][0],
        """\
cat0 = aten.cat([in0, in1, in2], -1)
slice0 = aten.slice(cat0, 1, 256, 512)
linear0 = mxfp8.linear(slice0, in3, in4, None)
all_reduce0 = _c10d_functional.all_reduce(linear0, 'sum', '0')
wait_tensor0 = _c10d_functional.wait_tensor(all_reduce0)
return [wait_tensor0]""",
    )
    assert_expected_inline(
        cap.graph_after,
        """\
empty0 = aten.empty([8, 256], dtype=float8_e4m3fn, device=device(type='cpu'))
empty1 = aten.empty([1024], dtype=uint8, device=device(type='cpu'))
slice0 = aten.slice(in0, 1, 256, 384)
slice1 = aten.slice(in1, 1, 0, 128)
quantize_slices0 = mxfp8.quantize_slices_([slice0, slice1], empty0, empty1, [0, 128])
mm0 = mxfp8.mm(empty0, empty1, in2, in3, None, bfloat16)
all_reduce0 = _c10d_functional.all_reduce(mm0, 'sum', '0')
wait_tensor0 = _c10d_functional.wait_tensor(all_reduce0)
return [wait_tensor0]""",
    )


def test_column_parallel_rank_stages_the_whole_input_and_gathers():
    lin = full_linear()
    with fake_group(1, 4) as group:
        layer = tp.ColumnParallelMXFP8Linear.from_weight(lin.weight.detach(), group, bias=lin.bias)
        assert layer.rows == (128, 256) and layer.local.bias.shape == (128,)
        cap = _compile_rank(layer)
    assert_expected_inline(
        cap.graph_after,
        """\
empty0 = aten.empty([8, 1024], dtype=float8_e4m3fn, device=device(type='cpu'))
empty1 = aten.empty([4096], dtype=uint8, device=device(type='cpu'))
quantize_slices0 = mxfp8.quantize_slices_([in0, in1, in2], empty0, empty1, [0, 384, 640])
mm0 = mxfp8.mm(empty0, empty1, in3, in4, in5, bfloat16)
all_gather_into_tensor0 = _c10d_functional.all_gather_into_tensor(mm0, 4, '0')
wait_tensor0 = _c10d_functional.wait_tensor(all_gather_into_tensor0)
split0 = aten.split(wait_tensor0, 8)
getitem0 = getitem(split0, 0)
getitem1 = getitem(split0, 1)
getitem2 = getitem(split0, 2)
getitem3 = getitem(split0, 3)
cat0 = aten.cat([getitem0, getitem1, getitem2, getitem3], -1)
return [cat0]""",
    )


def test_explain_reports_a_row_parallel_rank_site():
    lin = full_linear()
    with fake_group(3, 4) as group:
        layer = tp.RowParallelMXFP8Linear.from_weight(lin.weight.detach(), group)
        report = mf.explain(Drafter(layer), *[randn(8, w, seed=i) for i, w in enumerate(WIDTHS)])
    (site,) = report.sites
    assert site.rewritten and site.consumers == 1 and site.widths == tuple(WIDTHS)


def test_world_of_one_is_the_plain_layer():
    lin = full_linear()
    single = MXFP8Linear.from_linear(lin)
    xs = [randn(5, w, seed=i) for i, w in enumerate(WIDTHS)]
    x = torch.cat(xs, -1)
    with fake_group(0, 1) as group:
        for cls in (tp.ColumnParallelMXFP8Linear, tp.RowParallelMXFP8Linear):
            layer = cls.from_weight(lin.weight.detach(), group, bias=lin.bias)
            assert torch.equal(layer(x), single(x)) and torch.equal(
                layer.forward_slices(xs), single(x)
            )


def test_w8a16_shards_keep_their_activation():
    """A W8A16 layer sharded stays W8A16 (``shard`` keeps it, ``from_weight`` takes it), and a
    world of one gives the plain W8A16 layer's bits, from the slices too."""
    lin = full_linear()
    single = MXFP8Linear.from_linear(lin, activation="bf16")
    xs = [randn(5, w, seed=i) for i, w in enumerate(WIDTHS)]
    x = torch.cat(xs, -1)
    with fake_group(0, 1) as group:
        for cls in (tp.ColumnParallelMXFP8Linear, tp.RowParallelMXFP8Linear):
            layer = cls.from_weight(lin.weight.detach(), group, bias=lin.bias, activation="bf16")
            assert layer.local.activation == "bf16"
            assert torch.equal(layer(x), single(x))
            assert torch.equal(layer.forward_slices(xs), single(x))
        model = tp.shard(nn.Sequential(single), group, {"0": "column"})
        assert model[0].local.activation == "bf16"
        model = tp.shard(nn.Sequential(lin), group, {"0": "row"}, activation="bf16")
        assert model[0].local.activation == "bf16"
        with pytest.raises(ValueError, match="^activation: "):
            tp.shard(nn.Sequential(full_linear()), group, {"0": "row"}, activation="w8a16")


# --- validation (before anything is replaced) -------------------------------------------------


def test_layer_errors_name_the_argument():
    lin = full_linear()
    with fake_group(1, 4) as group:
        with pytest.raises(TypeError, match=r"^group: expected a torch.distributed ProcessGroup"):
            tp.ColumnParallelMXFP8Linear.from_weight(lin.weight.detach(), "0")
        with pytest.raises(ValueError, match=r"^out_features: expected a positive multiple of 128"):
            tp.ColumnParallelMXFP8Linear.from_weight(lin.weight.detach()[:384], group)
        with pytest.raises(ValueError, match=r"^in_features: expected a multiple of 128"):
            tp.RowParallelMXFP8Linear.from_weight(lin.weight.detach()[:, :384], group)
        with pytest.raises(TypeError, match=r"^local: expected an MXFP8Linear"):
            tp.RowParallelMXFP8Linear(lin, group, K)
        with pytest.raises(ValueError, match=r"^local: expected no bias on rank 1"):
            tp.RowParallelMXFP8Linear(MXFP8Linear.from_linear(full_linear(k=256)), group, K)
        row = tp.RowParallelMXFP8Linear.from_weight(lin.weight.detach(), group)
        with pytest.raises(ValueError, match=r"^x: expected 1024 features, got 512"):
            row(randn(4, 512))
        with pytest.raises(ValueError, match=r"^slices: expected widths summing to 1024, got 768"):
            row.forward_slices([randn(4, 384), randn(4, 384)])
        with pytest.raises(ValueError, match=r"^slices\[1\]: expected leading dims \(4,\)"):
            row.forward_slices([randn(4, 512), randn(5, 512)])


@pytest.mark.parametrize(
    ("plan", "state_dict", "error", "message"),
    [
        ({"fc": "diagonal"}, None, ValueError, r"^plan\['fc'\]: expected 'column', 'row'"),
        ({"nope": "row"}, None, ValueError, r"^plan\['nope'\]: model has no submodule 'nope'"),
        ({"": "row"}, None, ValueError, r"^plan: expected qualified layer names"),
        ({}, None, TypeError, r"^plan: expected a non-empty mapping"),
        ({"down": "row", "fc": "column"}, None, ValueError, r"^plan\[.fc.\]: out_features"),
        ({"fc": "row"}, {"fc.weight_values": 0}, ValueError, r"^state_dict: has fc.weight_values"),
        (
            {"fc": "row"},
            {"fc.weight": torch.zeros(N, K)},
            TypeError,
            r"^plan\['fc'\]: expected a bf",
        ),
    ],
)
def test_shard_errors_name_the_plan_entry_and_replace_nothing(plan, state_dict, error, message):
    model = Block(n=384)  # 384 output rows do not split over 4 ranks by 128
    before = [type(m) for m in model.modules()]
    with fake_group(0, 4) as group, pytest.raises(error, match=message):
        tp.shard(model, group, plan, state_dict=state_dict)
    assert [type(m) for m in model.modules()] == before


def test_shard_of_a_meta_model_needs_its_weights():
    with torch.device("meta"):
        model = Block()
    with (
        fake_group(0, 2) as group,
        pytest.raises(ValueError, match=r"^state_dict: expected fc.weight"),
    ):
        tp.shard(model, group, {"fc": "row"})


def test_shard_reads_only_each_ranks_part_of_a_lazy_checkpoint():
    block = reference_block()
    state = {name: LazyTensor(t.detach()) for name, t in block.state_dict().items()}
    with torch.device("meta"):
        model = Block()
    with fake_group(1, 2) as group:
        tp.shard(model, group, {"fc": "row", "up": "column"}, state_dict=state)
    assert state["fc.weight"].reads == [(slice(None), slice(512, 1024))]
    assert state["up.weight"].reads == [slice(512, 1024)]
    assert state["up.bias"].reads == [slice(512, 1024)]
    assert state["fc.bias"].reads == []  # rank 1 of a row-parallel layer holds no bias
    _assert_weight_bitwise(
        mf.MXFP8Weight(model.fc.local.weight_values, model.fc.local.weight_scales),
        mf.pack_weight(block.fc.weight.detach()[:, 512:]),
    )


# --- real process groups ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A BF16 checkpoint of the test block and an MXFP8 one (its converted state_dict)."""
    path = tmp_path_factory.mktemp("tp")
    block = reference_block()
    torch.save(block.state_dict(), path / "bf16.pt")
    torch.save(mf.convert(block).state_dict(), path / "mxfp8.pt")
    return str(path / "bf16.pt"), str(path / "mxfp8.pt")


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_gloo_ranks_match_the_single_process_layer(world, checkpoints):
    """Eager and compiled, column and row parallel, with bias, dynamic token counts, a model
    sharded from checkpoints: against the single-process results (column bitwise, row within
    the stated bound and bitwise across its own eager, staged and compiled forms)."""
    launch(check_all, world, *checkpoints)


def _two_gpus() -> bool:
    return torch.cuda.is_available() and torch.cuda.device_count() >= 2


@pytest.mark.gpu
@pytest.mark.skipif(not _two_gpus(), reason="needs two CUDA devices")
def test_nccl_two_gpus_match_the_single_gpu_layer():
    launch(check_nccl, 2, backend="nccl")
