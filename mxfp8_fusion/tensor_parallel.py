"""Tensor-parallel MXFP8 linears over a ``torch.distributed`` process group.

- :class:`ColumnParallelMXFP8Linear`: the weight split by output features, each rank a
  multiple of 128 rows. Every rank quantizes the whole input and computes its output columns;
  ``gather_output`` all-gathers them. Bitwise equal to the single-device layer wherever the
  GEMM computes each output from its weight row alone (the CPU reference; the CUDA tiled
  kernel, above 64 tokens).
- :class:`RowParallelMXFP8Linear`: the weight split by input features at 128-column
  boundaries. Every rank quantizes only its column range of the input, its GEMM gives a
  partial output, and an all-reduce sums them (the bias is added once, by rank 0).
- :func:`shard`: swap a model's layers for their shards, reading only each rank's part of a
  full BF16 or MXFP8 weight.

Collectives are functional collectives (``torch.distributed._functional_collectives``):
``torch.compile`` traces them into the graph, so there is no graph break at the
communication and the ``mxfp8_fusion`` pass sees the whole projection. In particular it
stages a row-parallel rank's input range of ``torch.cat(slices, -1)`` from the slices inside
the range only. NCCL on GPUs, gloo on CPUs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn

from .collectives import all_reduce_sum, gather_last_dim
from .format import ROW_BLOCK, SOURCE_DTYPES, VALUE_DTYPE, Activation, check_activation
from .nn import MXFP8Linear
from .project import project
from .sharding import (
    _detached,
    _matrix_shape,
    _on,
    load_column_shard,
    load_row_shard,
    split_in_features,
    split_out_features,
)

# --- modules ------------------------------------------------------------------------------


def _group_facts(group) -> tuple[int, int, str]:
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(
            f"group: expected a torch.distributed ProcessGroup, got {type(group).__name__}"
        )
    return dist.get_rank(group), dist.get_world_size(group), group.group_name


def _flat_slices(slices, in_features: int, argument: str = "slices") -> list[Tensor]:
    """``slices`` ``[..., w_i]`` as 2-D ``[rows, w_i]`` views, their widths summing to
    ``in_features``."""
    if not isinstance(slices, (list, tuple)) or not slices:
        raise TypeError(
            f"{argument}: expected a non-empty list or tuple of tensors, got {type(slices).__name__}"
        )
    lead = None
    for i, s in enumerate(slices):
        if not isinstance(s, Tensor) or s.dim() < 2:
            raise TypeError(f"{argument}[{i}]: expected a tensor of at least 2 dims, got {s!r:.60}")
        if lead is None:
            lead = s.shape[:-1]
        elif s.shape[:-1] != lead:
            raise ValueError(
                f"{argument}[{i}]: expected leading dims {tuple(lead)} (as {argument}[0]), got {tuple(s.shape[:-1])}"
            )
    total = sum(s.shape[-1] for s in slices)
    if total != in_features:
        raise ValueError(f"{argument}: expected widths summing to {in_features}, got {total}")
    return [s.reshape(-1, s.shape[-1]) for s in slices]


def _staged_gemm(local: MXFP8Linear, parts: list[Tensor], lead_shape) -> Tensor:
    """``local`` on the concatenation of ``parts``, never made,
    as ``local`` runs its activation (:func:`mxfp8_fusion.project.project`: W8A8 quantizes
    each part straight into MXFP8 storage, W8A16 reads it as it is); the output takes
    ``lead_shape``'s leading dims."""
    y = project(local.weight, local.activation, parts, bias=local.bias)
    return y.view(*lead_shape[:-1], y.shape[-1])


def _load_shard(
    weight, group, scales, bias, device, by_rows: bool, activation: str
) -> tuple[MXFP8Linear, int]:
    """This rank's shard of a full weight as an MXFP8Linear with ``activation``, and the
    weight's K: its rows (``by_rows``: column parallel, the bias's rows with them) or its
    columns (row parallel, the whole bias on rank 0 only). Only that part of ``weight`` is
    read."""
    check_activation(activation)
    rank, world, _ = _group_facts(group)
    n, k = _matrix_shape(weight, "weight")
    if by_rows:
        part = split_out_features(n, world)[rank]
        bias = None if bias is None else bias[part[0] : part[1]]
    else:
        part = split_in_features(k, world)[rank]
        bias = bias[:] if bias is not None and rank == 0 else None
    device = _device(group, device)
    load = load_column_shard if by_rows else load_row_shard
    packed = load(weight, part, scales, device)
    local_bias = None if bias is None else _on(_detached(bias), device)
    return MXFP8Linear(packed.values, packed.scales, local_bias, activation), k


class ColumnParallelMXFP8Linear(nn.Module):
    """An MXFP8 linear whose weight is split by output features over ``group``.

    Rank ``r`` holds rows ``split_out_features(out_features, world)[r]`` of the weight (and of
    the bias) as ``self.local``, an :class:`MXFP8Linear`. ``forward(x)`` takes the whole
    input ``[..., in_features]``, quantizes it and computes this rank's output columns; with
    ``gather_output`` (default) they are all-gathered into ``[..., out_features]``, else
    ``[..., out_features / world]`` is returned (for a following row-parallel layer with
    ``input_is_parallel``).

    Per rank: weight ``N/world x K``; MXFP8 input storage ``tokens x K`` (the whole input);
    GEMM ``2 tokens K N / world`` FLOP; output ``tokens x N / world``, gathered
    ``tokens x N``. Each output column is computed from one weight row by the GEMM that
    computes it on one device, so the output equals the single-device layer's bitwise
    (the CPU reference; on CUDA the tiled kernel above 64 tokens; at 64 tokens or fewer the
    swap-AB kernel splits K by the number of weight tiles, so the sum order can differ).

    Build it with :meth:`from_weight` or :func:`shard`; the constructor takes a shard that is
    already loaded.
    """

    def __init__(self, local: MXFP8Linear, group: dist.ProcessGroup, gather_output: bool = True):
        super().__init__()
        if not isinstance(local, MXFP8Linear):
            raise TypeError(f"local: expected an MXFP8Linear shard, got {type(local).__name__}")
        self.rank, self.world_size, self.group_name = _group_facts(group)
        if local.out_features % ROW_BLOCK:
            raise ValueError(
                f"local: expected a shard of a multiple of {ROW_BLOCK} output rows, got {local.out_features}"
            )
        self.local = local
        self.gather_output = bool(gather_output)
        self.in_features = local.in_features
        self.out_features = local.out_features * self.world_size
        self.rows = (self.rank * local.out_features, (self.rank + 1) * local.out_features)

    @classmethod
    def from_weight(
        cls,
        weight,
        group: dist.ProcessGroup,
        *,
        scales=None,
        bias: Tensor | None = None,
        gather_output: bool = True,
        device: torch.device | str | None = None,
        activation: str = "mxfp8",
    ) -> ColumnParallelMXFP8Linear:
        """This rank's shard of a full weight (see :func:`load_column_shard` for the forms
        ``weight`` and ``scales`` take); only its rows are read. ``bias`` is the full bias;
        ``activation`` the shard's (:class:`~mxfp8_fusion.MXFP8Linear`).

        Raises:
            TypeError, ValueError: on a bad group, weight, split or activation.
        """
        local, _ = _load_shard(weight, group, scales, bias, device, True, activation)
        return cls(local, group, gather_output)

    def _finish(self, y: Tensor) -> Tensor:
        if not self.gather_output or self.world_size == 1:
            return y
        return gather_last_dim(y, self.group_name, self.world_size)

    def forward(self, x: Tensor) -> Tensor:
        return self._finish(self.local(x))

    def forward_slices(self, slices: Sequence[Tensor]) -> Tensor:
        """``forward(torch.cat(slices, -1))`` without the BF16 concatenation: each slice is
        quantized straight into MXFP8 storage (one ``quantize_input_slices``), then the GEMM
        and the gather. Bitwise equal to ``forward`` of the concatenation.

        Raises:
            TypeError, ValueError: on slices that do not make a ``[..., in_features]`` input.
        """
        flat = _flat_slices(slices, self.in_features)
        return self._finish(_staged_gemm(self.local, flat, slices[0].shape))

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"rows={self.rows}, rank={self.rank}/{self.world_size}, gather_output={self.gather_output}"
        )


class RowParallelMXFP8Linear(nn.Module):
    """An MXFP8 linear whose weight is split by input features over ``group``.

    Rank ``r`` holds columns ``[start, end) = split_in_features(in_features, world)[r]`` of the
    weight as ``self.local``. ``forward(x)`` takes the whole input ``[..., in_features]``
    (or, with ``input_is_parallel``, only this rank's ``[..., end - start]``), quantizes
    only its columns, computes the partial output ``[..., out_features]`` and sums the
    partials with an all-reduce. Rank 0's GEMM adds the bias, so it is added once.

    Per rank: weight ``N x K/world``; MXFP8 input storage ``tokens x K/world``; GEMM
    ``2 tokens N K / world`` FLOP; the partial output ``tokens x N``, all-reduced.

    Tolerance against the single-device layer, and why: the split changes the summation
    order. Each rank's GEMM sums its K range in FP32 and rounds its partial ``p_r`` to the
    output dtype (unit roundoff ``u``: 2**-8 for BF16, 2**-11 for FP16), and the all-reduce
    adds the ``world`` rounded partials, rounding after each addition; one device rounds its
    whole sum once. If every GEMM output ``v`` is within ``g * u * |v| + 2**-14 * S`` of the
    exact value (``S = sum_k |a_k b_k|`` over its K range; ``g = 1`` for the CPU reference,
    ``g = 2`` for the CUDA kernels' stated bound), then per output, to first order,
    ``|y_tp - y_1| <= u * (g * |y_1| + (g + world - 1) * sum_r |p_r|) + 2**-13 * S``. The
    tests check exactly this bound.

    Build it with :meth:`from_weight` or :func:`shard`; the constructor takes a shard that is
    already loaded (with the bias on rank 0 only).
    """

    def __init__(
        self,
        local: MXFP8Linear,
        group: dist.ProcessGroup,
        in_features: int,
        input_is_parallel: bool = False,
    ):
        super().__init__()
        if not isinstance(local, MXFP8Linear):
            raise TypeError(f"local: expected an MXFP8Linear shard, got {type(local).__name__}")
        self.rank, self.world_size, self.group_name = _group_facts(group)
        self.columns = split_in_features(in_features, self.world_size)[self.rank]
        width = self.columns[1] - self.columns[0]
        if local.in_features != width:
            raise ValueError(
                f"local: expected in_features {width} (columns {self.columns} of {in_features}), got {local.in_features}"
            )
        if self.rank != 0 and local.bias is not None:
            raise ValueError(f"local: expected no bias on rank {self.rank} (rank 0 adds it once)")
        self.local = local
        self.in_features = in_features
        self.out_features = local.out_features
        self.input_is_parallel = bool(input_is_parallel)

    @classmethod
    def from_weight(
        cls,
        weight,
        group: dist.ProcessGroup,
        *,
        scales=None,
        bias: Tensor | None = None,
        input_is_parallel: bool = False,
        device: torch.device | str | None = None,
        activation: str = "mxfp8",
    ) -> RowParallelMXFP8Linear:
        """This rank's shard of a full weight (see :func:`load_row_shard` for the forms
        ``weight`` and ``scales`` take); only its columns are read. ``bias`` is the full bias,
        kept by rank 0 only; ``activation`` the shard's (:class:`~mxfp8_fusion.MXFP8Linear`).

        Raises:
            TypeError, ValueError: on a bad group, weight, split or activation.
        """
        local, k = _load_shard(weight, group, scales, bias, device, False, activation)
        return cls(local, group, k, input_is_parallel)

    @property
    def bias(self) -> Tensor | None:
        """The bias (rank 0 holds it; ``None`` on the other ranks)."""
        return self.local.bias

    def _finish(self, y: Tensor) -> Tensor:
        return y if self.world_size == 1 else all_reduce_sum(y, self.group_name)

    def forward(self, x: Tensor) -> Tensor:
        if not self.input_is_parallel and self.world_size > 1:
            if not isinstance(x, Tensor) or x.shape[-1] != self.in_features:
                given = x.shape[-1] if isinstance(x, Tensor) else type(x).__name__
                raise ValueError(f"x: expected {self.in_features} features, got {given}")
            x = x[..., self.columns[0] : self.columns[1]]  # quantized alone, a strided view
        return self._finish(self.local(x))

    def forward_slices(self, slices: Sequence[Tensor]) -> Tensor:
        """``forward(torch.cat(slices, -1))`` without the BF16 concatenation: only the slices
        or slice parts inside this rank's column range are quantized, straight into MXFP8
        storage of the range's width; then the GEMM and the all-reduce. Bitwise equal to
        ``forward`` of the concatenation.

        With ``input_is_parallel`` the slices make up this rank's columns only.

        Raises:
            TypeError, ValueError: on slices that do not make the input, or a slice part that
                is not 128-aligned.
        """
        start, end = self.columns
        if self.input_is_parallel:
            flat = _flat_slices(slices, end - start)
            parts = flat
        else:
            flat = _flat_slices(slices, self.in_features)
            parts, column = [], 0
            for s in flat:
                lo, hi = max(column, start), min(column + s.shape[1], end)
                if lo < hi:
                    parts.append(s[:, lo - column : hi - column])
                column += s.shape[1]
        return self._finish(_staged_gemm(self.local, parts, slices[0].shape))

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"columns={self.columns}, rank={self.rank}/{self.world_size}, "
            f"input_is_parallel={self.input_is_parallel}"
        )


# --- sharding a model ---------------------------------------------------------------------


@dataclass(frozen=True)
class ColumnParallel:
    """Plan entry: shard the layer by output features (:class:`ColumnParallelMXFP8Linear`)."""

    gather_output: bool = True


@dataclass(frozen=True)
class RowParallel:
    """Plan entry: shard the layer by input features (:class:`RowParallelMXFP8Linear`)."""

    input_is_parallel: bool = False


_STYLES = {"column": ColumnParallel(), "row": RowParallel()}


def _device(group, device) -> torch.device:
    """``device``, else this rank's CUDA device for an NCCL group, else the CPU."""
    if device is not None:
        return torch.device(device)
    if "nccl" in str(dist.get_backend(group)):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _style(style, name: str):
    if isinstance(style, (ColumnParallel, RowParallel)):
        return style
    if isinstance(style, str) and style in _STYLES:
        return _STYLES[style]
    raise ValueError(
        f"plan[{name!r}]: expected 'column', 'row', ColumnParallel(...) or RowParallel(...), got {style!r}"
    )


def _weights_of(name: str, module: nn.Module, state_dict: Mapping | None):
    """``(weight, scales, bias)`` for plan entry ``name``: from ``state_dict`` when it holds
    them (``name.weight`` BF16/FP16, or ``name.weight_values`` + ``name.weight_scales``), else
    from the module itself."""
    sd = state_dict if state_dict is not None else {}
    prefix = f"{name}."
    bias = sd.get(prefix + "bias")
    if prefix + "weight_values" in sd:
        if prefix + "weight_scales" not in sd:
            raise ValueError(f"state_dict: has {prefix}weight_values but no {prefix}weight_scales")
        return sd[prefix + "weight_values"], sd[prefix + "weight_scales"], bias
    if prefix + "weight" in sd:
        return sd[prefix + "weight"], None, bias
    if isinstance(module, MXFP8Linear):
        weight, scales, bias = module.weight_values, module.weight_scales, module.bias
    else:
        weight, scales, bias = module.weight, None, module.bias
    if weight.device.type == "meta":
        raise ValueError(
            f"state_dict: expected {prefix}weight or {prefix}weight_values for plan entry "
            f"{name!r}, whose module is on the meta device"
        )
    return weight.detach(), scales, None if bias is None else bias.detach()


def _check_dtype(weight, scales, name: str) -> None:
    if not isinstance(weight, Tensor):
        return  # a lazy tensor: pack_weight checks the dtype of the part it reads
    expected = (VALUE_DTYPE,) if scales is not None else SOURCE_DTYPES
    if weight.dtype not in expected:
        what = "float8_e4m3fn values" if scales is not None else "a bfloat16 or float16 weight"
        raise TypeError(f"plan[{name!r}]: expected {what}, got {weight.dtype}")


def _job(model, name, style, state_dict, world: int, activation: str | None) -> tuple:
    """Plan entry ``name``'s checked ``(name, style, weight, scales, bias, activation)``."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"plan: expected qualified layer names, got key {name!r}")
    style = _style(style, name)
    try:
        module = model.get_submodule(name)
    except AttributeError:
        raise ValueError(f"plan[{name!r}]: model has no submodule {name!r}") from None
    if not isinstance(module, (nn.Linear, MXFP8Linear)):
        raise TypeError(
            f"plan[{name!r}]: expected an nn.Linear or MXFP8Linear, got {type(module).__name__}"
        )
    weight, scales, bias = _weights_of(name, module, state_dict)
    _check_dtype(weight, scales, name)
    n, k = _matrix_shape(weight, f"plan[{name!r}] weight")
    try:
        if isinstance(style, ColumnParallel):
            split_out_features(n, world)
        else:
            split_in_features(k, world)
    except ValueError as error:
        raise ValueError(f"plan[{name!r}]: {error}") from None
    own = module.activation if isinstance(module, MXFP8Linear) else Activation.W8A8
    return name, style, weight, scales, bias, activation or own


def shard(
    model: nn.Module,
    group: dist.ProcessGroup,
    plan: Mapping[str, str | ColumnParallel | RowParallel],
    state_dict: Mapping[str, object] | None = None,
    device: torch.device | str | None = None,
    activation: str | None = None,
) -> nn.Module:
    """Replace the layers that ``plan`` names (in place) by this rank's tensor-parallel MXFP8
    shard; returns ``model``. A shard keeps its :class:`MXFP8Linear`'s ``activation``
    (``nn.Linear`` layers become W8A8) unless ``activation`` (``"mxfp8"`` or ``"bf16"``) is
    given for all of them.

    Args:
        model: holds the planned layers as ``nn.Linear`` (BF16/FP16) or :class:`MXFP8Linear`,
            possibly on the meta device when ``state_dict`` has their weights.
        group: the tensor-parallel process group (NCCL or gloo).
        plan: ``{qualified layer name: "column" | "row" | ColumnParallel(...) |
            RowParallel(...)}``.
        state_dict: where to read full weights from, by the layer's name: ``name.weight``
            (BF16/FP16 ``[N, K]``) or ``name.weight_values`` (E4M3) with
            ``name.weight_scales`` (row-major ``[N, K/32]`` or blocked), and ``name.bias``.
            Tensors may be memory-mapped (``torch.load(..., mmap=True)``) or lazy
            safetensors slices: only each rank's rows or columns are read. Layers it lacks
            use the model's own weights.
        device: where the shards go; default this rank's CUDA device under NCCL, else CPU.

    Each rank quantizes only its shard (column: its rows; row: its 128-aligned columns); no
    rank materializes the full BF16 weight, on the host or the device, beyond what the
    caller already holds.

    Raises:
        TypeError, ValueError: naming the plan entry, before any layer is replaced.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected an nn.Module, got {type(model).__name__}")
    if activation is not None:
        check_activation(activation)
    _, world, _ = _group_facts(group)
    if not isinstance(plan, Mapping) or not plan:
        raise TypeError(
            f"plan: expected a non-empty mapping of layer names to styles, got {plan!r:.60}"
        )
    jobs = [_job(model, name, style, state_dict, world, activation) for name, style in plan.items()]
    target = _device(group, device)
    for name, style, weight, scales, bias, chosen in jobs:
        if isinstance(style, ColumnParallel):
            layer = ColumnParallelMXFP8Linear.from_weight(
                weight, group, scales=scales, bias=bias, gather_output=style.gather_output,
                device=target, activation=chosen,
            )  # fmt: skip
        else:
            layer = RowParallelMXFP8Linear.from_weight(
                weight, group, scales=scales, bias=bias,
                input_is_parallel=style.input_is_parallel, device=target, activation=chosen,
            )  # fmt: skip
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, layer)
    return model


__all__ = [
    "ColumnParallel",
    "ColumnParallelMXFP8Linear",
    "RowParallel",
    "RowParallelMXFP8Linear",
    "all_reduce_sum",
    "gather_last_dim",
    "load_column_shard",
    "load_row_shard",
    "shard",
    "split_in_features",
    "split_out_features",
]
