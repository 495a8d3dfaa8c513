"""``InputStager``: stage one MXFP8 projection's input slice by slice, from eager code.

For engine code that runs a projection outside any compiled graph (a drafter's
``combine_hidden_states``, say) and produces its input in pieces. It computes what the
layer computes, for the layer's activation, through the one slices-to-output entry
(:mod:`mxfp8_fusion.project`): for W8A8 the MXFP8 storage is allocated once, for a token
capacity, and each slice is quantized into its columns as soon as it exists; for W8A16
nothing is quantized, and :meth:`InputStager.finish` reads the appended slices as they are.
``finish`` runs the GEMM into an output the caller owns. After construction nothing
allocates device memory or waits for the device, so a step that appends and finishes can be
captured in a CUDA Graph and replayed.

Its checks are the eager API's: bad input raises ``TypeError`` or ``ValueError`` naming the
argument before anything is written.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from . import api, project
from .checks import check_bias, require_2d, require_same_device, require_tensor
from .format import STAGE_ALIGN, Activation, MXFP8Input, MXFP8Weight, fail


def _layer_facts(weight) -> tuple[MXFP8Weight, Tensor | None, Activation | None]:
    """The weight, the bias and the activation (None: not said) of ``weight``."""
    from .nn import MXFP8Linear

    if isinstance(weight, MXFP8Linear):
        return weight.weight, weight.bias, weight.activation
    if isinstance(weight, MXFP8Weight):
        return weight, None, None
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

    The result is the layer's own, bit for bit, for its activation: W8A8 (``"mxfp8"``)
    quantizes each slice into MXFP8 storage at ``append``, as a compiled ``cat`` of them
    does; W8A16 (``"bf16"``) launches nothing at ``append`` and keeps the slices, which
    ``finish`` multiplies as they are (``mm_slices_into``): they must hold their values
    until ``finish`` (no copy is made), and no MXFP8 storage is allocated.

    Args:
        weight: an :class:`MXFP8Weight`, or an :class:`~mxfp8_fusion.MXFP8Linear` (its bias
            and activation are then used unless ``bias`` / ``activation`` are given).
        capacity: the most tokens one step stages.
        bias: ``[out_features]`` added by ``finish``; ``None`` for the module's or none.
        dtype: the slices' dtype (BF16 or FP16).
        activation: ``"mxfp8"`` (W8A8) or ``"bf16"`` (W8A16), or an
            :class:`~mxfp8_fusion.format.Activation`; ``None``: the layer's, W8A8 for a
            bare :class:`MXFP8Weight`.

    Raises:
        TypeError, ValueError: on a bad weight, capacity, bias, dtype or activation.
    """

    def __init__(
        self,
        weight: MXFP8Weight | nn.Module,
        capacity: int,
        *,
        bias: Tensor | None = None,
        dtype: torch.dtype = torch.bfloat16,
        activation: Activation | str | None = None,
    ):
        self.weight, module_bias, own = _layer_facts(weight)
        self.activation = Activation.of(activation or own or Activation.W8A8)
        self.bias = bias if bias is not None else module_bias
        check_bias(self.bias, self.weight)
        # W8A8's storage; W8A16 reads the slices themselves and needs none (its capacity
        # and dtype are checked alike, on storage that holds no memory)
        device = self.weight.device if self.activation.quantized else "meta"
        storage = api.empty_input(capacity, self.weight.in_features, device, dtype)
        self.storage: MXFP8Input | None = storage if self.activation.quantized else None
        self._capacity, self._dtype = storage.capacity, storage.dtype
        self._kept: list[Tensor] = []
        self._column = 0
        self._tokens: int | None = None

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def in_features(self) -> int:
        return self.weight.in_features

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
        if not self.activation.quantized:
            self._check_kept(sources)
        self._kept += project.stage(self.activation, sources, self.storage, self._column)
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
        result = project.finish(
            self.weight, self.activation, self._kept, self.storage, self._tokens,
            out=out, bias=self.bias,
        )  # fmt: skip
        self.reset()
        return result

    def reset(self) -> None:
        """Abandon the current step; the next slice goes to column 0 again."""
        self._kept = []
        self._column = 0
        self._tokens = None

    def _check_kept(self, sources) -> None:
        """What ``quantize_input_slice(s)`` checks of a W8A8 slice, for slices that W8A16
        keeps for ``finish``: nothing is kept unless every one passes."""
        column = self._column
        for i, source in enumerate(sources):
            name = "source" if len(sources) == 1 else f"sources[{i}]"
            require_tensor(source, name)
            require_2d(source, name)
            if source.dtype != self._dtype:
                fail(TypeError, name, f"dtype {self._dtype} (the stager's)", source.dtype)
            require_same_device(source, self.weight.device, name)
            rows, width = source.shape
            if rows > self._capacity or rows != sources[0].shape[0]:
                fail(ValueError, name, f"at most {self._capacity} rows, as sources[0]", rows)
            if width <= 0 or width % STAGE_ALIGN or column + width > self.in_features:
                fail(
                    ValueError, name,
                    f"a width that is a positive multiple of {STAGE_ALIGN} within the "
                    f"{self.in_features - column} unstaged columns", width,
                )  # fmt: skip
            column += width

    def __repr__(self) -> str:
        return (
            f"InputStager(capacity={self.capacity}, in_features={self.in_features}, "
            f"out_features={self.out_features}, activation={self.activation.value!r}, "
            f"staged_columns={self._column})"
        )


__all__ = ["InputStager"]
