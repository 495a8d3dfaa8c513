"""``InputStager``: stage one MXFP8 projection's input slice by slice, from eager code.

For engine code that runs a projection outside any compiled graph (a drafter's
``combine_hidden_states``, say) and produces its input in pieces: the MXFP8 storage is
allocated once, for a token capacity; each slice is quantized into its columns as soon as
it exists; :meth:`InputStager.finish` runs the GEMM into an output the caller owns. After
construction nothing allocates device memory or waits for the device, so a step that
appends and finishes can be captured in a CUDA Graph and replayed.

Built on :mod:`mxfp8_fusion.api` (``empty_input``, ``quantize_input_slice(s)``,
``mm_quantized_into``), whose checks it keeps: bad input raises ``TypeError`` or
``ValueError`` naming the argument before anything is written.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from . import api
from .checks import check_bias
from .format import MXFP8Input, MXFP8Weight


def _weight_and_bias(weight) -> tuple[MXFP8Weight, Tensor | None]:
    from .nn import MXFP8Linear

    if isinstance(weight, MXFP8Linear):
        return weight.weight, weight.bias
    if isinstance(weight, MXFP8Weight):
        return weight, None
    if isinstance(weight, nn.Linear):
        raise TypeError(
            "weight: expected an MXFP8Weight or MXFP8Linear, got an nn.Linear "
            "(convert it first: MXFP8Linear.from_linear or mxfp8_fusion.convert)"
        )
    raise TypeError(f"weight: expected an MXFP8Weight or MXFP8Linear, got {type(weight).__name__}")


class InputStager:
    """Stage the input of ``weight``'s projection, up to ``capacity`` tokens, slice by slice.

    Typical use, once per step::

        stager.append(h_low)             # as each slice is produced
        stager.append(h_mid, h_high)     # several at once: one kernel launch
        y = stager.finish(out)           # out[:tokens] = cat(slices) @ W.T (+ bias)

    Slices are appended left to right; each is BF16/FP16 ``[tokens, width]`` (a strided
    view is fine), ``width`` a multiple of 128, and every slice of a step has the same
    token count (at most ``capacity``). ``finish`` needs all ``in_features`` columns staged
    and starts the next step; :meth:`reset` abandons a partly staged one.

    Args:
        weight: an :class:`MXFP8Weight`, or an :class:`~mxfp8_fusion.MXFP8Linear` (its bias
            is then used unless ``bias`` is given).
        capacity: the most tokens one step stages.
        bias: ``[out_features]`` added by ``finish``; ``None`` for the module's or none.
        dtype: the slices' dtype (BF16 or FP16).

    Raises:
        TypeError, ValueError: on a bad weight, capacity, bias or dtype.
    """

    def __init__(
        self,
        weight: MXFP8Weight | nn.Module,
        capacity: int,
        *,
        bias: Tensor | None = None,
        dtype: torch.dtype = torch.bfloat16,
    ):
        self.weight, module_bias = _weight_and_bias(weight)
        self.bias = bias if bias is not None else module_bias
        check_bias(self.bias, self.weight)
        self.storage: MXFP8Input = api.empty_input(
            capacity, self.weight.in_features, self.weight.device, dtype
        )
        self._column = 0
        self._tokens: int | None = None

    @property
    def capacity(self) -> int:
        return self.storage.capacity

    @property
    def in_features(self) -> int:
        return self.storage.in_features

    @property
    def out_features(self) -> int:
        return self.weight.out_features

    @property
    def staged_columns(self) -> int:
        """Columns staged so far in this step."""
        return self._column

    @property
    def tokens(self) -> int | None:
        """Token count of this step (``None`` before its first slice)."""
        return self._tokens

    def append(self, *sources: Tensor) -> None:
        """Quantize ``sources`` into the next columns, left to right.

        Raises:
            TypeError, ValueError: naming the slice (``source`` when one is appended,
            ``sources[i]`` when several are) at fault: a wrong type, dtype, device or
            width, a token count above capacity or unlike this step's earlier slices, or
            columns past ``in_features``. Nothing is written and the step is unchanged.
        """
        if not sources:
            raise TypeError("sources: expected at least one tensor, got none")
        if self._tokens is not None:
            for i, source in enumerate(sources):
                rows = source.shape[0] if isinstance(source, Tensor) and source.dim() else None
                if rows is not None and rows != self._tokens:
                    name = "source" if len(sources) == 1 else f"sources[{i}]"
                    raise ValueError(
                        f"{name}: expected {self._tokens} rows (this step's earlier "
                        f"slices), got {rows}"
                    )
        if len(sources) == 1:
            api.quantize_input_slice(sources[0], self.storage, self._column)
        else:
            api.quantize_input_slices(list(sources), self.storage, self._column)
        self._tokens = sources[0].shape[0]
        self._column += sum(s.shape[1] for s in sources)

    def finish(self, out: Tensor) -> Tensor:
        """Run the GEMM on this step's staged tokens into ``out`` and start the next step.

        ``out`` is caller-owned, ``[>= tokens, out_features]``, BF16 or FP16, on the
        weight's device; rows past ``tokens`` are not touched. Returns ``out[:tokens]``
        (``out`` itself when it has exactly ``tokens`` rows).

        Raises:
            ValueError: when not every column is staged yet (the step is kept, so it can be
            completed); TypeError, ValueError: on a bad ``out`` (as
            :func:`~mxfp8_fusion.mm_quantized_into`).
        """
        if self._column != self.in_features:
            raise ValueError(
                f"stager: expected all {self.in_features} input columns staged before "
                f"finish, got {self._column}"
            )
        result = api.mm_quantized_into(
            self.storage, self.weight, out, tokens=self._tokens, bias=self.bias
        )
        self.reset()
        return result

    def reset(self) -> None:
        """Abandon the current step; the next slice goes to column 0 again."""
        self._column = 0
        self._tokens = None

    def __repr__(self) -> str:
        return (
            f"InputStager(capacity={self.capacity}, in_features={self.in_features}, "
            f"out_features={self.out_features}, staged_columns={self._column})"
        )


__all__ = ["InputStager"]
