"""Stand-ins for vLLM's drafter pieces, for the plugin's drafter tests without vLLM.

- :class:`PackedFc`: a ``ReplicatedLinear`` whose MXFP8 weight the plugin's kernel packed
  (W8A8 or W8A16).
- :func:`drafter_class`: a drafter model class whose ``combine_hidden_states`` is given
  (vLLM's own, loaded from a release's sources, or a reduced copy), wrapped by the plugin
  as ``hooks.wrap`` does.
- :func:`count_concatenations`: counts BF16 tensors of ``fc``'s input width that
  ``torch.cat`` allocates.
"""

from __future__ import annotations

import sys

import torch
from torch import nn

import mxfp8_fusion as mf
from mxfp8_fusion.vllm import drafter, hooks, linear

HIDDEN = 256
LAYERS = 3


class PackedFc(nn.Module):
    """vLLM's ``fc`` (``ReplicatedLinear``) after our kernel's ``process_weights`` for
    ``activation`` (``"mxfp8"``: W8A8, ``"bf16"``: W8A16)."""

    def __init__(self, device, hidden=HIDDEN, layers=LAYERS, bias=False, activation="mxfp8"):
        super().__init__()
        gen = torch.Generator().manual_seed(3)
        w = (torch.randn(hidden, layers * hidden, generator=gen) * 0.05).to(torch.bfloat16)
        values, scales = mf.reference.quantize_rows(w)
        self.weight = nn.Parameter(values.to(device), requires_grad=False)
        self.weight_scale = nn.Parameter(scales.to(device), requires_grad=False)
        b = torch.randn(hidden, generator=gen).to(torch.bfloat16).to(device) if bias else None
        self.bias = b
        self.input_size = layers * hidden
        self.params_dtype = torch.bfloat16
        self.return_bias = False
        self.skip_bias_add = False
        linear.process_weights(self, "model.fc", activation)

    def forward(self, x):
        return linear.apply_weights(self, x, self.bias)


class Inner(nn.Module):
    """The drafter's inner model: what ``combine_hidden_states`` reads."""

    def __init__(self, fc: nn.Module):
        super().__init__()
        self.fc = fc
        self.use_aux_hidden_state = True
        self.norm_before_fc = False
        self.fc_norm = None
        self.num_aux_hidden_states = LAYERS


def drafter_class(name: str, combine, wrapped: bool = True) -> type:
    """A drafter model class named ``name`` with ``combine`` as ``combine_hidden_states``,
    wrapped by the plugin (``wrapped``) as its install does for vLLM's drafters."""

    def __init__(self, fc):
        nn.Module.__init__(self)
        self.model = Inner(fc)

    cls = type(name, (nn.Module,), {"__init__": __init__, "combine_hidden_states": combine})
    cls.__module__ = __name__
    if wrapped:
        setattr(sys.modules[__name__], name, cls)
        hooks.wrap(hooks.Hook(__name__, f"{name}.combine_hidden_states"), drafter._wrap_combine)
    return cls


def reduced_combine(self, hidden_states):
    """vLLM's ``combine_hidden_states``, reduced to what it does here."""
    return self.model.fc(hidden_states)


def count_concatenations(monkeypatch, width: int) -> dict:
    """Count the BF16 / FP16 ``[tokens, width]`` tensors ``torch.cat`` returns with storage
    of their own (what the staging must never make). FP32 ones are not counted: the W8A16
    plain-torch reference gathers its FP32 working chunks (at most 1024 columns) with
    ``torch.cat``, as the W8A8 one dequantizes its chunks to FP32."""
    counts = {"allocated": 0}
    original = torch.cat

    def cat(*args, **kwargs):
        out = original(*args, **kwargs)
        if (
            "out" not in kwargs
            and out.dtype in (torch.bfloat16, torch.float16)
            and out.dim() == 2
            and out.shape[1] == width
            and out.untyped_storage().nbytes() >= out.numel() * 2
        ):
            counts["allocated"] += 1
        return out

    monkeypatch.setattr(torch, "cat", cat)
    return counts
