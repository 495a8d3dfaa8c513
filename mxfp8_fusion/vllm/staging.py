"""The drafter's ``fc`` input staged where vLLM concatenates it, without vLLM.

Two ways vLLM feeds ``fc`` (read from vLLM 0.32-0.34):

- **Eagerly**: a runner or speculator calls ``combine_hidden_states(torch.cat(slices, -1))``.
  The auxiliary hidden states are handed to it as :class:`Staged` views bound to a
  :class:`Step`; their ``torch.cat`` runs ``fc`` into a buffer allocated once and returns a
  stand-in of the concatenation's shape (one element, broadcast) that
  ``combine_hidden_states`` recognizes (:func:`combined`). ``fc`` runs as its layer does
  (:mod:`mxfp8_fusion.project`): a W8A16 ``fc`` reads the slices where they are; a W8A8
  one has each slice quantized into its columns of MXFP8 storage allocated once, then runs
  the MXFP8 GEMM.
- **In a captured graph** (DFlash's full decode graphs, vLLM 0.33+): eager code writes the
  concatenation into a fixed buffer (``torch.cat(..., out=buffer[:n])``) and the graph
  applies ``fc`` to ``buffer[:m]``. For a W8A8 ``fc``, :class:`GraphStaging` replaces that
  buffer by a stand-in over MXFP8 storage of the same rows: the ``cat`` quantizes into the
  storage, and the graph's ``combine_hidden_states`` runs the GEMM from it. (A W8A16
  ``fc`` keeps vLLM's BF16 buffer, which it reads as it is: the graph reads that address.)
  Both are free of allocation and host syncs after construction, so they capture and
  replay.

Any other operation on a stand-in is an error naming the switch that turns staging off:
a stand-in has no data a reader could use.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .. import api, project
from ..format import STAGE_ALIGN
from . import linear, settings

# torch.cat's builtin, not the module attribute: code that wraps torch.cat (a profiler, a
# test counting calls) still reaches __torch_function__ with this function.
_CAT = torch._C._VariableFunctions.cat
_PENDING = "_mxfp8_fusion_staged"
OFF_SWITCH = f"{settings.DISABLE_VARIABLE}=drafter"


def _norms(model: nn.Module):
    return getattr(model.model, "fc_norm", None)


class Step:
    """The eager step of one drafter's ``fc``, for up to ``capacity`` tokens, as ``fc``'s
    activation runs it: straight from the slices for a W8A16 ``fc``; through MXFP8 storage
    allocated once for a W8A8 one."""

    def __init__(self, model: nn.Module, fc: nn.Module, capacity: int, dtype: torch.dtype):
        self.model = model
        self.fc = fc
        self.norms = _norms(model)
        self.weight = linear.packed_weight(fc)
        self.bias = getattr(fc, "bias", None)
        self.capacity, self.dtype = capacity, dtype
        self.activation = linear.activation_of(fc)
        device = fc.weight.device
        self.storage = None
        if self.activation.quantized:  # W8A8: its input is quantized first
            self.storage = api.empty_input(capacity, self.weight.in_features, device, dtype)
        self.out = torch.empty(capacity, self.weight.out_features, dtype=dtype, device=device)

    def matches(self, tensors, dim) -> bool:
        """Whether ``torch.cat(tensors, dim)`` is the concatenation ``fc`` reads."""
        return _fits(tensors, dim, self.weight.in_features, self.capacity, self.out)

    def concatenate(self, tensors) -> Tensor:
        """Run ``fc`` on ``cat(tensors, -1)`` without making it, and return the stand-in."""
        if self.norms is not None:
            tensors = [norm(t) for norm, t in zip(self.norms, tensors, strict=True)]
        projected = project.project(
            self.weight, self.activation, tensors, bias=self.bias, out=self.out,
            storage=self.storage,
        )  # fmt: skip
        if not self.activation.quantized:
            settings.stats.slice_steps += 1
        tokens, width = tensors[0].shape[0], self.weight.in_features
        stand_in = self.out.new_empty((1, 1)).expand(tokens, width)
        setattr(self.model, _PENDING, (stand_in, projected))
        settings.stats.staged_steps += 1
        return stand_in


def _fits(tensors, dim, width: int, capacity: int, out: Tensor) -> bool:
    if dim not in (-1, 1) or not tensors or tensors[0].dim() != 2:
        return False
    tokens = tensors[0].shape[0]
    return (
        all(t.dim() == 2 and t.shape[0] == tokens for t in tensors)
        and sum(t.shape[1] for t in tensors) == width
        and all(t.shape[1] % STAGE_ALIGN == 0 for t in tensors)
        and all(t.dtype == out.dtype and t.device == out.device for t in tensors)
        and tokens <= capacity
    )


class GraphStaging:
    """MXFP8 storage in place of a speculator's BF16 ``[rows, K]`` staging buffer.

    ``stage`` is what ``torch.cat(slices, -1, out=buffer[:n])`` becomes (eager); ``project``
    is what ``combine_hidden_states(buffer[:m])`` becomes (inside the captured graph). Rows
    never staged read as zeros, as the zero-filled buffer they replace. Rows past a step's
    tokens hold an earlier step's, as vLLM's buffer does, but need not give the same
    output: the kernel resets their scales (vLLM stores their K/V in padding slots).
    """

    def __init__(self, model: nn.Module, fc: nn.Module, rows: int, dtype: torch.dtype):
        self.model = model
        self.norms = _norms(model)
        self.activation = linear.activation_of(fc)  # W8A8: the drafter stages no other
        self.weight = linear.packed_weight(fc)
        self.bias = getattr(fc, "bias", None)
        device = fc.weight.device
        self.storage = api.empty_input(rows, self.weight.in_features, device, dtype)
        self.storage.values.zero_()
        self.storage.scales.zero_()
        self.out = torch.zeros(rows, self.weight.out_features, dtype=dtype, device=device)

    def stand_in(self) -> Staged:
        """The tensor that takes the buffer's place: its shape, its dtype, no data."""
        rows, width = self.storage.capacity, self.weight.in_features
        return _staged(self.out.new_zeros((1, 1)).expand(rows, width), graph=self)

    def stage(self, tensors) -> None:
        """Quantize ``cat(tensors, -1)``'s rows into rows ``[0, tokens)`` of the storage."""
        tokens = tensors[0].shape[0]
        if tokens == 0:
            return
        if self.norms is not None:
            tensors = [norm(t) for norm, t in zip(self.norms, tensors, strict=True)]
        if _fits(tensors, -1, self.weight.in_features, self.storage.capacity, self.out):
            project.stage(self.activation, tensors, self.storage)
            settings.stats.staged_steps += 1
        else:  # slices the kernel cannot take one by one: concatenate them (rare)
            whole = torch.cat([t.to(self.out.dtype) for t in tensors], -1)
            api.quantize_input_slice(whole, self.storage, 0)
            settings.stats.unstaged_concatenations += 1

    def project(self, tokens: int) -> Tensor:
        """``fc`` on the first ``tokens`` staged rows, into the buffer allocated once."""
        return project.finish(
            self.weight, self.activation, [], self.storage, tokens, out=self.out, bias=self.bias
        )


# What a reader may ask a graph stand-in: its metadata is the buffer's.
_METADATA = {
    Tensor.shape.__get__,
    Tensor.dtype.__get__,
    Tensor.device.__get__,
    Tensor.size,
    Tensor.dim,
    Tensor.numel,
    Tensor.__len__,
}


class Staged(Tensor):
    """A tensor vLLM's drafter code holds in place of one it concatenates or fills.

    Eager auxiliary hidden states (``_step`` set) stay this type when sliced, and their
    ``torch.cat`` goes to the step. A graph stand-in (``_graph`` set) takes row slices
    ``[:n]`` and a ``cat`` into itself; anything else on it raises. Every other operation
    runs on plain tensors and returns plain tensors.
    """

    _step: Step | None = None
    _graph: GraphStaging | None = None
    _rows: slice | None = None

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        with torch._C.DisableTorchFunctionSubclass():
            if func is Tensor.__getitem__:
                return _slice(args[0], args[1], func(*args, **kwargs))
            if func is _CAT:
                done = _cat(cls, args, kwargs)
                if done is not NotImplemented:
                    return done
            if func in _METADATA:
                return func(*_plain(args), **_plain(kwargs))
            if any(_graph_of(v) is not None for v in (*args, *kwargs.values())):
                raise RuntimeError(
                    f"mxfp8_fusion: vLLM used DFlash's staged drafter input in a way the "
                    f"plugin does not stage ({getattr(func, '__name__', func)}); set "
                    f"{OFF_SWITCH} to leave it to vLLM"
                )
            return func(*_plain(args), **_plain(kwargs))


def _staged(t: Tensor, step: Step | None = None, graph: GraphStaging | None = None, rows=None):
    out = t.as_subclass(Staged)
    out._step, out._graph, out._rows = step, graph, rows
    return out


def _slice(source: Staged, key, result: Tensor):
    if source._graph is None:
        return _staged(result, step=source._step)
    if not isinstance(key, slice) or key.step not in (None, 1) or key.start not in (None, 0):
        key = None  # only leading rows are staged: another view reads nothing defined
    return _staged(result, graph=source._graph, rows=key)


def _graph_of(value) -> GraphStaging | None:
    if isinstance(value, (list, tuple)):
        return next((g for v in value if (g := _graph_of(v)) is not None), None)
    return value._graph if isinstance(value, Staged) else None


def _cat(cls, args, kwargs):
    tensors = args[0] if args else kwargs.get("tensors")
    if not isinstance(tensors, (list, tuple)):
        return NotImplemented
    tensors = list(tensors)
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    out = kwargs.get("out")
    plain = [t.as_subclass(Tensor) for t in tensors]
    if isinstance(out, Staged) and out._graph is not None:
        if out._rows is None or dim not in (-1, 1) or _graph_of(tensors) is not None:
            return NotImplemented
        out._graph.stage(plain)
        return out
    if out is None and tensors and all(type(t) is cls and t._step for t in tensors):
        step = tensors[0]._step
        if step.matches(plain, dim):
            return step.concatenate(plain)
        settings.stats.unstaged_concatenations += 1
    return NotImplemented


def _plain(value):
    if isinstance(value, Staged):
        return value.as_subclass(Tensor)
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def bind(tensors, step: Step) -> list[Tensor]:
    """``tensors`` seen as :class:`Staged` views whose concatenation goes to ``step``."""
    return [_staged(t, step=step) for t in tensors]


def combined(model: nn.Module, hidden_states) -> Tensor | None:
    """What ``combine_hidden_states(hidden_states)`` returns when ``hidden_states`` is a
    stand-in (``None``: it is not, and vLLM's own code runs)."""
    pending = model.__dict__.pop(_PENDING, None)
    if pending is not None and pending[0] is hidden_states:
        return pending[1]
    graph = _graph_of(hidden_states)
    if graph is None:
        return None
    if hidden_states._rows is None or hidden_states.dim() != 2:
        raise RuntimeError(
            "mxfp8_fusion: vLLM combined rows of DFlash's staged drafter input other than "
            f"the leading ones; set {OFF_SWITCH} to leave it to vLLM"
        )
    return graph.project(hidden_states.shape[0])
