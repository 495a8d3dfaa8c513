"""The functional collectives the tensor-parallel layers use: traced by ``torch.compile``
into the graph (no graph break), waited on in eager code."""

from __future__ import annotations

import torch
import torch.distributed._functional_collectives as funcol
from torch import Tensor


def _waited(t: Tensor) -> Tensor:
    # Eager functional collectives return an AsyncCollectiveTensor; hand the caller a plain
    # tensor. Under torch.compile they are already waited on in the graph (wait_tensor).
    return t.wait() if isinstance(t, funcol.AsyncCollectiveTensor) else t


def _all_gather_rows(t: Tensor, group_name: str) -> Tensor:
    gather = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor
    return _waited(gather(t, 0, group_name))


def all_reduce_sum(t: Tensor, group_name: str) -> Tensor:
    """Sum ``t`` over the group (functional ``all_reduce`` + wait); a new tensor."""
    return _waited(funcol.all_reduce(t, "sum", group_name))


def gather_last_dim(t: Tensor, group_name: str, world_size: int) -> Tensor:
    """All ranks' ``t`` ``[..., n]`` side by side in rank order: ``[..., world_size * n]``.

    NCCL and gloo gather along dim 0, so the gathered ``[world_size * rows, n]`` is laid out
    by columns with one ``torch.cat``: under torch.compile that cat is a site of the pass when
    an MXFP8 linear reads the gathered output.
    """
    n = t.shape[-1]
    gathered = _all_gather_rows(t.reshape(-1, n), group_name)
    out = torch.cat(gathered.chunk(world_size, dim=0), dim=-1)
    return out.view(*t.shape[:-1], world_size * n)
