"""EAGLE-3 / DFlash ``fc`` staged slice by slice, so vLLM's BF16 concatenation never exists.

vLLM's model runner (``GPUModelRunner.propose_draft_token_ids``, which the CPU runner
inherits) concatenates the target's auxiliary hidden states for the live tokens in eager
code, and the proposer hands the result to the drafter's ``combine_hidden_states``, which
applies ``fc``. When that ``fc`` is an MXFP8 linear this library packed (and the drafter
does nothing between the concatenation and ``fc`` but per-slice norms), the plugin:

1. runs ``propose_draft_token_ids`` with the auxiliary hidden states seen through a thin
   tensor subclass, so that the runner's ``torch.cat`` of their slices reaches
   :meth:`_Step.concatenate` instead: each slice is quantized into its columns of an
   :class:`~mxfp8_fusion.InputStager` and the GEMM writes ``fc``'s output into a buffer
   allocated once; the runner gets back a stand-in of the concatenation's shape that
   holds one element (a broadcast view);
2. ``combine_hidden_states`` recognizes the stand-in and returns that output.

Any other drafter, runner path or shape goes through vLLM's code unchanged. The drafter's
own forward (what vLLM compiles and captures in CUDA Graphs) is not touched; the staging
runs where the concatenation ran, in eager code, and allocates nothing after its first
step.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor, nn

from ..format import STAGE_ALIGN
from ..stager import InputStager
from . import hooks, linear, settings

_PENDING = "_mxfp8_fusion_staged"
# torch.cat's builtin, not the module attribute: code that wraps torch.cat (a profiler, a
# test counting calls) still reaches __torch_function__ with this function.
_CAT = torch._C._VariableFunctions.cat
_STAGING = "_mxfp8_fusion_staging"


def stageable_fc(model: nn.Module) -> nn.Module | None:
    """The drafter's ``fc`` when this plugin can stage it, else ``None``.

    ``model`` is vLLM's drafter (``Eagle3LlamaForCausalLM``, ``DFlashQwen3ForCausalLM``):
    its inner ``model`` uses auxiliary hidden states, its ``fc`` was packed by our kernel
    and returns its output alone with the bias added, and no norm spans the whole
    concatenation (``norm_before_fc``).
    """
    inner = getattr(model, "model", None)
    fc = getattr(inner, "fc", None)
    if fc is None or not getattr(inner, "use_aux_hidden_state", False):
        return None
    if not getattr(fc, linear.PACKED_ATTRIBUTE, False):
        return None  # not ours: never change it
    if getattr(fc, "return_bias", False) or getattr(fc, "skip_bias_add", False):
        return None
    if getattr(inner, "norm_before_fc", False):
        return None
    if fc.weight.shape[1] % STAGE_ALIGN:
        return None  # staging needs 128-column slices; vLLM's concatenation serves it
    return fc


class _Step:
    """The stager of one drafter's ``fc``, and what one runner step staged."""

    def __init__(self, model: nn.Module, fc: nn.Module, capacity: int, dtype: torch.dtype):
        self.model = model
        self.fc = fc
        self.norms = getattr(model.model, "fc_norm", None)
        self.stager = InputStager(
            linear.packed_weight(fc), capacity, bias=getattr(fc, "bias", None), dtype=dtype
        )
        device = fc.weight.device
        self.out = torch.empty(capacity, self.stager.out_features, dtype=dtype, device=device)

    def matches(self, tensors, dim) -> bool:
        """Whether ``torch.cat(tensors, dim)`` is the concatenation ``fc`` reads."""
        if dim not in (-1, 1) or not tensors or tensors[0].dim() != 2:
            return False
        if self.norms is not None and len(self.norms) != len(tensors):
            return False
        tokens = tensors[0].shape[0]
        return (
            all(t.dim() == 2 and t.shape[0] == tokens for t in tensors)
            and sum(t.shape[1] for t in tensors) == self.stager.in_features
            and all(t.shape[1] % STAGE_ALIGN == 0 for t in tensors)
            and all(t.dtype == self.stager.storage.dtype for t in tensors)
            and all(t.device == self.out.device for t in tensors)
            and tokens <= self.stager.capacity
        )

    def concatenate(self, tensors) -> Tensor:
        """Stage ``tensors`` into ``fc``'s input, run ``fc``, and return the stand-in."""
        if self.norms is not None:
            tensors = [norm(t) for norm, t in zip(self.norms, tensors, strict=True)]
        self.stager.append(*tensors)
        projected = self.stager.finish(self.out)
        tokens, width = tensors[0].shape[0], self.stager.in_features
        stand_in = self.out.new_empty((1, 1)).expand(tokens, width)
        setattr(self.model, _PENDING, (stand_in, projected))
        settings.stats.staged_steps += 1
        return stand_in


class _AuxHidden(Tensor):
    """An auxiliary hidden state as the runner's draft step sees it: slicing keeps the
    type, ``torch.cat`` of such slices goes to the step's stager; anything else runs on
    plain tensors and returns plain tensors."""

    _step: _Step

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        with torch._C.DisableTorchFunctionSubclass():
            if func is Tensor.__getitem__:
                out = func(*args, **kwargs)
                return _view(out, args[0]._step)
            if func is _CAT:
                tensors = args[0] if args else kwargs.get("tensors")
                dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
                tensors = list(tensors)
                if all(type(t) is cls for t in tensors):
                    step = tensors[0]._step
                    plain = [t.as_subclass(Tensor) for t in tensors]
                    if step.matches(plain, dim):
                        return step.concatenate(plain)
                    settings.stats.unstaged_concatenations += 1
            return func(*_plain(args), **_plain(kwargs))


def _view(t: Tensor, step: _Step) -> Tensor:
    out = t.as_subclass(_AuxHidden)
    out._step = step
    return out


def _plain(value):
    if isinstance(value, _AuxHidden):
        return value.as_subclass(Tensor)
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _step_for(runner, aux: list[Tensor]) -> _Step | None:
    drafter = getattr(runner, "drafter", None)
    model = getattr(drafter, "model", None)
    if model is not None and hasattr(model, "unwrap"):  # vLLM's CUDA Graph wrapper
        model = model.unwrap()
    fc = stageable_fc(model) if model is not None else None
    if fc is None:
        return None
    step = getattr(model, _STAGING, None)
    if step is None or step.fc is not fc or step.stager.storage.dtype != aux[0].dtype:
        capacity = getattr(runner, "max_num_tokens", None)
        if not isinstance(capacity, int) or aux[0].dtype not in (torch.bfloat16, torch.float16):
            return None
        step = _Step(model, fc, capacity, aux[0].dtype)
        setattr(model, _STAGING, step)
    return step


def _wrap_propose(original):
    @functools.wraps(original)
    def propose_draft_token_ids(self, *args, **kwargs):
        index = 5  # aux_hidden_states, after the five parameters before it (hooks.py checks)
        aux = args[index] if len(args) > index else kwargs.get("aux_hidden_states")
        if not aux or not all(isinstance(h, Tensor) for h in aux):
            return original(self, *args, **kwargs)
        step = _step_for(self, aux)
        if step is None:
            return original(self, *args, **kwargs)
        seen = [_view(h, step) for h in aux]
        if len(args) > index:
            args = (*args[:index], seen, *args[index + 1 :])
        else:
            kwargs["aux_hidden_states"] = seen
        return original(self, *args, **kwargs)

    return propose_draft_token_ids


def _wrap_combine(original):
    @functools.wraps(original)
    def combine_hidden_states(self, hidden_states, *args, **kwargs):
        pending = self.__dict__.pop(_PENDING, None)
        if pending is not None and pending[0] is hidden_states:
            return pending[1]
        return original(self, hidden_states, *args, **kwargs)

    return combine_hidden_states


def install() -> bool:
    """Wrap the runner's draft step and both drafters' ``combine_hidden_states`` (once)."""
    wrapped = hooks.wrap(
        hooks.hook("drafter", "GPUModelRunner.propose_draft_token_ids"), _wrap_propose
    )
    for name in (
        "Eagle3LlamaForCausalLM.combine_hidden_states",
        "DFlashQwen3ForCausalLM.combine_hidden_states",
    ):
        wrapped = hooks.wrap(hooks.hook("drafter", name), _wrap_combine) or wrapped
    return wrapped
