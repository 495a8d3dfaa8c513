"""EAGLE-3 / DFlash ``fc`` staged slice by slice, so vLLM's BF16 concatenation never exists.

vLLM concatenates the target's auxiliary hidden states in eager code and hands the result
to the drafter's ``combine_hidden_states``, which applies ``fc``:

- the V1 model runner in ``GPUModelRunner.propose_draft_token_ids`` (vLLM 0.32, 0.33; the
  CPU runner inherits it there);
- the V2 model runner (vLLM's GPU default from 0.32, the only runner from 0.34) in each
  speculator's ``propose``: ``TargetDependentARSpeculator`` (EAGLE-3) and
  ``DFlashSpeculator``. From 0.33 DFlash under full decode CUDA graphs also writes the
  concatenation into a fixed buffer that the captured graph combines.

When that ``fc`` is an MXFP8 linear this library packed, and the drafter is one whose
``combine_hidden_states`` the plugin wraps (Llama EAGLE-3, Qwen3 DFlash) and does nothing
between the concatenation and ``fc`` but per-slice norms, the concatenation is never made
(:mod:`.staging`): a W8A16 ``fc`` reads the auxiliary hidden states where they are; for a
W8A8 one each slice is quantized into its columns of MXFP8 storage. Either way ``fc``'s
output goes into a buffer allocated once. DFlash's full-graph buffer is replaced by MXFP8
storage for a W8A8 ``fc`` only: a W8A16 ``fc`` reads vLLM's BF16 buffer as it is. Any other
drafter, path or shape runs vLLM's code unchanged. The drafter's forward (what vLLM
compiles and captures) is not touched.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor, nn

from ..format import STAGE_ALIGN
from . import hooks, linear, staging

_STEP = "_mxfp8_fusion_step"
_GRAPH_BUFFER = "_aux_staging"  # DFlashSpeculator's fixed buffer (vLLM 0.33+)
_GRAPH_METHODS = "_mxfp8_fusion_graph_methods"  # the methods that use it, as read


def _unwrapped(model):
    if model is not None and hasattr(model, "unwrap"):  # vLLM's CUDA Graph wrapper
        return model.unwrap()
    return model


def stageable_fc(model: nn.Module | None) -> nn.Module | None:
    """The drafter's ``fc`` when this plugin can stage it, else ``None``.

    ``model`` is vLLM's drafter (``Eagle3LlamaForCausalLM``, ``DFlashQwen3ForCausalLM``):
    its ``combine_hidden_states`` is wrapped by the plugin, its inner ``model`` uses
    auxiliary hidden states, its ``fc`` was packed by our kernel and returns its output
    alone with the bias added, and no norm spans the whole concatenation
    (``norm_before_fc``).
    """
    model = _unwrapped(model)
    combine = getattr(type(model), "combine_hidden_states", None)
    if model is None or not getattr(combine, hooks.WRAPPED, False):
        return None  # a drafter whose combine step we do not know
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


def _step_for(owner, model, aux: list[Tensor]) -> staging.Step | None:
    model = _unwrapped(model)
    fc = stageable_fc(model)
    if fc is None:
        return None
    step = getattr(model, _STEP, None)
    if step is None or step.fc is not fc or step.dtype != aux[0].dtype:
        capacity = getattr(owner, "max_num_tokens", None)
        if not isinstance(capacity, int) or aux[0].dtype not in (torch.bfloat16, torch.float16):
            return None
        step = staging.Step(model, fc, capacity, aux[0].dtype)
        setattr(model, _STEP, step)
    return step


def _wrap_propose(hook: hooks.Hook, model_of):
    """Wrap a ``propose`` whose ``aux_hidden_states`` argument is staged; ``model_of``
    gives the drafter model of the runner or speculator."""
    index = hook.parameters.index("aux_hidden_states") - 1  # after self

    def make(original):
        @functools.wraps(original)
        def propose(self, *args, **kwargs):
            aux = args[index] if len(args) > index else kwargs.get("aux_hidden_states")
            if not aux or not all(isinstance(h, Tensor) for h in aux):
                return original(self, *args, **kwargs)
            step = _step_for(self, model_of(self), aux)
            if step is None:
                return original(self, *args, **kwargs)
            seen = staging.bind(aux, step)
            if len(args) > index:
                args = (*args[:index], seen, *args[index + 1 :])
            else:
                kwargs["aux_hidden_states"] = seen
            return original(self, *args, **kwargs)

        return propose

    return make


def _stage_graph_buffer(speculator) -> None:
    """Put MXFP8 storage in place of DFlash's BF16 graph buffer, once (see GraphStaging),
    for a W8A8 ``fc``. A W8A16 ``fc`` reads the BF16 buffer itself: the captured graph
    reads that address, and nothing would be saved by copying it."""
    buffer = speculator.__dict__.get(_GRAPH_BUFFER)
    if not isinstance(buffer, Tensor) or isinstance(buffer, staging.Staged):
        return
    read = getattr(type(speculator), _GRAPH_METHODS, None)
    if read is None or any(getattr(type(speculator), f.__name__) is not f for f in read):
        return  # a speculator whose buffer handling was not read (a subclass overrides it)
    model = _unwrapped(getattr(speculator, "model", None))
    fc = stageable_fc(model)
    if fc is None or not linear.activation_of(fc).quantized:
        return
    if buffer.dim() != 2 or buffer.shape[1] != fc.weight.shape[1]:
        return
    if buffer.dtype not in (torch.bfloat16, torch.float16) or buffer.device != fc.weight.device:
        return
    graph = staging.GraphStaging(model, fc, buffer.shape[0], buffer.dtype)
    setattr(speculator, _GRAPH_BUFFER, graph.stand_in())


def _wrap_capture(original):
    @functools.wraps(original)
    def capture(self, *args, **kwargs):
        # before the graphs record the buffer's reads; vLLM writes the buffer only before a
        # full-graph replay, so capture is the one place to replace it
        _stage_graph_buffer(self)
        return original(self, *args, **kwargs)

    return capture


def _wrap_combine(original):
    @functools.wraps(original)
    def combine_hidden_states(self, hidden_states, *args, **kwargs):
        result = staging.combined(self, hidden_states)
        if result is not None:
            return result
        return original(self, hidden_states, *args, **kwargs)

    return combine_hidden_states


def _runner_drafter(runner):
    return getattr(getattr(runner, "drafter", None), "model", None)


def _speculator_model(speculator):
    return getattr(speculator, "model", None)


_PROPOSE = {
    "GPUModelRunner.propose_draft_token_ids": _runner_drafter,
    "TargetDependentARSpeculator.propose": _speculator_model,
    "DFlashSpeculator.propose": _speculator_model,
}
_COMBINE = (
    "Eagle3LlamaForCausalLM.combine_hidden_states",
    "DFlashQwen3ForCausalLM.combine_hidden_states",
)


def install(table: dict[str, hooks.Hook], graph_staging: bool = True) -> bool:
    """Wrap the draft steps and both drafters' ``combine_hidden_states`` named in ``table``
    (this release's drafter hooks), once; ``True`` when something was wrapped now.

    ``graph_staging``: also stage DFlash's full-graph buffer where the release has it
    (only on releases whose code was read: a stand-in meets only the uses read there).
    """
    wrapped = False
    for name in _COMBINE:
        wrapped = hooks.wrap(table[name], _wrap_combine) or wrapped
    for name, model_of in _PROPOSE.items():
        if name in table:
            wrapped = hooks.wrap(table[name], _wrap_propose(table[name], model_of)) or wrapped
    graph = "DFlashSpeculator._store_hidden_states" in table and graph_staging
    if graph:
        owner = hooks.Hook(table["DFlashSpeculator.capture"].module, "DFlashSpeculator").resolve()
        methods = ("_store_hidden_states", "_prepare_graph_forward")
        setattr(owner, _GRAPH_METHODS, tuple(vars(owner)[m] for m in methods))
        wrapped = hooks.wrap(table["DFlashSpeculator.capture"], _wrap_capture) or wrapped
    return wrapped
