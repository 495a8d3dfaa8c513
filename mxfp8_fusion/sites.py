"""Which slices feed each MXFP8 layer of a model: its cat sites, found by one eager run.

The compiled model (``backend="mxfp8_fusion"``) stages a ``torch.cat(slices, -1)`` that
feeds an MXFP8 linear slice by slice, and its kernels are built per slice width; a plain
input is one slice. :func:`cat_widths` runs the model once on example inputs and records,
for each :class:`~mxfp8_fusion.MXFP8Linear`, the widths of what it was called with, so
that warm-up makes ready the builds the compiled model will launch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from .format import STAGE_ALIGN


class _CatRecorder(TorchFunctionMode):
    """Remembers every ``torch.cat`` on the last dim of 16-bit or FP32 tensors: its result
    and its slices' widths (the results are kept alive for the run, so no address is
    reused while they are compared)."""

    def __init__(self):
        super().__init__()
        self.cats: list[tuple[Tensor, tuple[int, ...]]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if func in (torch.cat, torch.concat, torch.concatenate) and isinstance(result, Tensor):
            tensors = args[0] if args else kwargs.get("tensors", ())
            dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
            if result.dim() and dim in (-1, result.dim() - 1) and len(tensors) > 1:
                self.cats.append((result, tuple(t.shape[-1] for t in tensors)))
        return result

    def widths_of(self, x: Tensor) -> tuple[int, ...] | None:
        """The widths of the cat whose result ``x`` is (or a view of it with its rows
        flattened: same memory, same last dim), None when it is none."""
        for result, widths in reversed(self.cats):
            same = x is result or (
                x.untyped_storage()._cdata == result.untyped_storage()._cdata
                and x.storage_offset() == result.storage_offset()
                and x.numel() == result.numel()
                and x.shape[-1] == result.shape[-1]
            )
            if same:
                return widths
        return None


def cat_widths(
    model: nn.Module, example_inputs: Sequence, example_kwargs: Mapping | None = None
) -> dict[nn.Module, list[tuple[int, ...]]]:
    """``{layer: [the slice widths of each distinct input it was called with]}`` for every
    :class:`~mxfp8_fusion.MXFP8Linear` that ``model(*example_inputs, **example_kwargs)``
    calls, once, without autograd. An input made by ``torch.cat`` on the last dim whose
    slices are all multiples of 128 wide (the pass's rule for staging them) gives its
    widths; any other input one slice of the layer's width.

    The MXFP8 layers are not run (each returns zeros of its output's shape), so no MXFP8
    kernel is launched or compiled by this run; the rest of the model runs as usual.

    Raises:
        TypeError: ``example_inputs`` is not a list or tuple, ``example_kwargs`` not a dict.
    """
    from .nn import MXFP8Linear

    if not isinstance(example_inputs, (list, tuple)):
        raise TypeError(
            f"example_inputs: expected a list or tuple of the model's arguments, got "
            f"{type(example_inputs).__name__}"
        )
    if example_kwargs is not None and not isinstance(example_kwargs, Mapping):
        raise TypeError(f"example_kwargs: expected a dict, got {type(example_kwargs).__name__}")
    recorder = _CatRecorder()
    found: dict[nn.Module, list[tuple[int, ...]]] = {}

    def stand_in(layer: MXFP8Linear):
        def forward(x: Tensor) -> Tensor:
            widths = recorder.widths_of(x)
            if widths is None or any(w % STAGE_ALIGN for w in widths):
                widths = (layer.in_features,)
            forms = found.setdefault(layer, [])
            if widths not in forms:
                forms.append(widths)
            return x.new_zeros(*x.shape[:-1], layer.out_features)

        return forward

    layers = [m for m in model.modules() if isinstance(m, MXFP8Linear)]
    for layer in layers:
        layer.forward = stand_in(layer)  # an instance attribute: the class's is untouched
    try:
        with torch.no_grad(), recorder:
            model(*example_inputs, **(example_kwargs or {}))
    finally:
        for layer in layers:
            del layer.forward
    return found


__all__ = ["cat_widths"]
