"""Grad mode for the ``mxfp8::`` ops: the forward runs, any backward through an op raises.

mxfp8_fusion is inference-only. In grad mode an op whose input requires grad still computes
exactly what it computes under ``torch.no_grad()``, and its outputs (a mutating op: the
buffers it writes) carry a backward that raises a ``RuntimeError`` naming the op, when it
runs. No gradient is ever silently missing or zero, and nothing is saved for backward:
keeping an input alive (the BF16 concatenation the fused path never materializes) would
defeat the point of quantizing it.

The backward does not raise in Python: it emits ``mxfp8::gradient_unavailable``, whose
kernel raises and whose fake returns an empty gradient. AOTAutograd traces the backward
with fake tensors when it compiles a graph in grad mode, so a Python raise would fail the
compile; the op becomes a node of the compiled backward and raises only when that runs.

No gradient is ever a float8 tensor that autograd must add up: MXFP8 storage read by two
ops (one quantized input, several GEMMs) would need a float8 sum in the backward, which
Triton cannot build, so the compiled backward would fail with a compiler error instead of
raising ours. An op reads float8 storage with history through a BF16 scalar "bridge" made
once per storage version (:func:`_bridge`): readers' gradients meet, and are added, on
that scalar; the bridge alone hands a float8 gradient on to the storage's writer.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torch.utils import _python_dispatch
from torch.utils.weak import WeakIdKeyDictionary

from . import lowering

_lib = torch.library.Library("mxfp8", "FRAGMENT")
_TENSOR_LIST = torch._C.ListType.ofTensors()

# The eager API each op serves, named in the error so that a user knows which call it means.
_CALLED_BY = {
    "quantize_slice_": "quantize_input_slice",
    "quantize_slices_": "quantize_input_slices",
    "quantize": "quantize / pack_weight",
    "mm_into": "mm_quantized_into",
    "mm": "mm_quantized",
    "linear": "MXFP8Linear / mm",
    "mm_slices_into": "mm_slices_into",
    "mm_slices": "mm_slices",
    "linear_w8a16": "MXFP8Linear(activation='bf16')",
}


def _message(op: str, argument: str) -> str:
    return (
        f"{op} has no gradient with respect to {argument}: mxfp8_fusion is inference-only. "
        "Run the model under torch.no_grad() or torch.inference_mode(), or detach the tensors "
        "given to it."
    )


def _gradient_unavailable_body(
    grad: Tensor, shape: Sequence[int], dtype: torch.dtype, op: str, argument: str
) -> Tensor:
    """The gradient of ``op``'s input ``argument``: raises, the op has none. ``grad`` ties
    the call to the backward graph (a node with no tensor input could be constant-folded,
    that is run, at compile time); ``shape`` and ``dtype`` are the input's, for the fake."""
    raise RuntimeError(_message(op, argument))


_lib.define(
    "gradient_unavailable" + torch.library.infer_schema(_gradient_unavailable_body, mutates_args=())
)
_lib.impl("gradient_unavailable", _gradient_unavailable_body, "CompositeExplicitAutograd")
gradient_unavailable = torch.ops.mxfp8.gradient_unavailable.default


@torch.library.register_fake("mxfp8::gradient_unavailable")
def _(grad, shape, dtype, op, argument):
    lowering.register()  # before Inductor lowers any mxfp8:: op
    return grad.new_empty(shape, dtype=dtype)


def autograd_kernel(op):
    """The ``Autograd`` kernel of ``op``: records through :class:`_NoGradient` (functional
    ops) or :class:`_NoGradientWrite` (mutating ops) when an input the op reads requires
    grad in grad mode; otherwise runs the op below autograd, recording nothing."""
    signature = _Signature(op)

    def kernel(*args):
        if torch.is_grad_enabled() and signature.reads_requires_grad(args):
            return signature.record(args)
        with torch._C._AutoDispatchBelowAutograd():
            return op(*args)

    return kernel


class _Signature:
    """What autograd needs to know about one op's arguments: names, ``Tensor[]`` positions
    (an ``autograd.Function`` sees only top-level tensors, so lists are flattened) and the
    arguments it writes."""

    def __init__(self, op):
        schema = op._schema
        self.op = op
        self.name = f"{schema.name} ({_CALLED_BY[schema.name.split('::')[1]]})"
        self.arguments = [a.name for a in schema.arguments]
        self.lists = {i for i, a in enumerate(schema.arguments) if a.type.isSubtypeOf(_TENSOR_LIST)}
        self.written = {i for i, a in enumerate(schema.arguments) if a.is_write}

    def reads_requires_grad(self, args) -> bool:
        """Whether an argument the op reads (not one it only writes) requires grad."""
        for i, arg in enumerate(args):
            if i in self.written:
                continue
            for t in arg if i in self.lists else (arg,):
                if isinstance(t, Tensor) and has_history(t):
                    return True
        return False

    def record(self, args):
        flat, layout, labels, dirty = [], [], [], []
        for i, arg in enumerate(args):
            name = self.arguments[i]
            if i in self.lists:
                layout.append(len(arg))
                labels += [f"{name}[{j}]" for j in range(len(arg))]
                flat += arg
                continue
            layout.append(None)
            labels.append(name)
            if i in self.written and arg.is_floating_point():  # uint8 scales carry no grad
                dirty.append(len(flat))
            flat.append(arg)
        # float8 storage the op reads: run on it detached, take its history from its bridge
        bridges, bridge_labels = [], []
        for j, t in enumerate(flat):
            if j in dirty or not isinstance(t, Tensor) or t.dtype not in _FLOAT8:
                continue
            if has_history(t):
                bridges.append(_bridge(t))
                bridge_labels.append(labels[j])
                flat[j] = t.detach()
        flat += bridges
        labels = labels + bridge_labels
        if not self.written:
            return _NoGradient.apply(self, layout, labels, *flat)
        for i in dirty:  # as torch refuses for any in-place op, but before anything is written
            if flat[i].is_leaf and flat[i].requires_grad:
                raise RuntimeError(
                    f"{self.name}: {labels[i]} is a leaf tensor that requires grad; it cannot "
                    "be written in place in grad mode. Pass a tensor that does not require grad."
                )
        if _python_dispatch._get_current_dispatch_mode() is None:
            _NoGradientInPlace.apply(self, layout, labels, dirty, *flat)
            return None
        self._write_traced(flat, layout, labels, dirty)
        return None

    def _write_traced(self, flat, layout, labels, dirty) -> None:
        """:meth:`record`'s write while tracing (a dispatch mode is active under Dynamo and
        AOTAutograd)."""
        # AOTAutograd drops the history that mark_dirty gives a graph input (torch 2.13), so
        # the op writes copies, and a plain copy_, which AOTAutograd does carry back to the
        # caller's tensor, puts them in place with their history.
        # A float8 buffer's earlier history reaches the backward through copy_'s edge to the
        # overwritten tensor alone: the op takes it detached, so that no two float8
        # gradients meet on it.
        sources = [
            t.detach() if j in dirty and t.dtype in _FLOAT8 else t for j, t in enumerate(flat)
        ]
        # What the op read, as one BF16 scalar that the ops reading the written float8 buffer
        # take their history from: the buffer itself then gets no gradient from them, only
        # the one AOTAutograd gives a mutated graph input (its tangent), which nothing adds.
        reads = [
            (labels[j], t)
            for j, t in enumerate(flat)
            if j not in dirty and isinstance(t, Tensor) and has_history(t)
        ]
        for i in dirty:  # the buffer's earlier writes, through their own scalars
            earlier = _current_bridge(flat[i]) if flat[i].dtype in _FLOAT8 else None
            if earlier is not None:
                reads.append((labels[i], earlier))
        history = _History.apply(self, [label for label, _ in reads], *[t for _, t in reads])
        written = _NoGradientWrite.apply(self, layout, labels, dirty, *sources)
        for i, new in zip(dirty, written, strict=True):
            flat[i].copy_(new)
            if flat[i].dtype in _FLOAT8:
                _BRIDGES[flat[i]] = (flat[i]._version, history)


def _unflatten(flat, layout) -> list:
    args, at = [], 0
    for count in layout:
        if count is None:
            args.append(flat[at])
            at += 1
        else:
            args.append(list(flat[at : at + count]))
            at += count
    return args


class _NoGradient(torch.autograd.Function):
    """Runs a functional op below autograd; the backward of its outputs raises.

    An output whose gradient never arrives (the scales, usually) gets none: materialized
    zeros would put e8m0 kernels into a compiled backward.
    """

    @staticmethod
    def forward(ctx, signature, layout, labels, *flat):
        _remember_inputs(ctx, signature, labels, flat)
        with torch._C._AutoDispatchBelowAutograd():
            return signature.op(*_unflatten(flat, layout))

    @staticmethod
    def backward(ctx, *grads):
        return (None, None, None, *_input_gradients(ctx, grads))


class _NoGradientInPlace(torch.autograd.Function):
    """Runs a mutating op below autograd and marks the floating-point buffers it writes
    (``flat[dirty]``) as modified in place, so they, and whatever is computed from them
    later, carry a backward that raises.

    A buffer that already had history keeps it, chained behind this node, as for any
    in-place torch op: storage reused step after step in grad mode keeps every step's graph
    alive until it is detached (``values.detach_()``) or dropped.
    """

    @staticmethod
    def forward(ctx, signature, layout, labels, dirty, *flat):
        _remember_inputs(ctx, signature, labels, flat)
        with torch._C._AutoDispatchBelowAutograd():
            signature.op(*_unflatten(flat, layout))
        buffers = [flat[i] for i in dirty]
        ctx.mark_dirty(*buffers)
        return tuple(buffers)

    @staticmethod
    def backward(ctx, *grads):
        return (None, None, None, None, *_input_gradients(ctx, grads))


class _NoGradientWrite(torch.autograd.Function):
    """Runs a mutating op below autograd on copies of the buffers ``flat[dirty]`` and returns
    the copies, whose backward raises (the traced form of :class:`_NoGradientInPlace`)."""

    @staticmethod
    def forward(ctx, signature, layout, labels, dirty, *flat):
        _remember_inputs(ctx, signature, labels, flat)
        flat = list(flat)
        for i in dirty:
            flat[i] = flat[i].clone()
        with torch._C._AutoDispatchBelowAutograd():
            signature.op(*_unflatten(flat, layout))
        return tuple(flat[i] for i in dirty)

    @staticmethod
    def backward(ctx, *grads):
        return (None, None, None, None, *_input_gradients(ctx, grads))


class _History(torch.autograd.Function):
    """A BF16 scalar standing for what a mutating op read while tracing: its backward gives
    those inputs the op's raising gradients (see :class:`_Signature.record`)."""

    @staticmethod
    def forward(ctx, signature, labels, *inputs):
        _remember_inputs(ctx, signature, labels, inputs)
        return inputs[0].new_zeros((), dtype=torch.bfloat16)

    @staticmethod
    def backward(ctx, grad):
        return (None, None, *_input_gradients(ctx, (grad,)))


def _remember_inputs(ctx, signature, labels, flat) -> None:
    # shapes and dtypes only: no tensor is kept alive for a backward that cannot run
    ctx.set_materialize_grads(False)
    ctx.what = signature.name
    ctx.inputs = [
        (label, t.shape, t.dtype) if isinstance(t, Tensor) else None
        for label, t in zip(labels, flat, strict=True)
    ]


def _input_gradients(ctx, grads) -> list:
    grad = next((g for g in grads if g is not None), None)
    if grad is None:  # nothing differentiable used the outputs: none is needed from here
        return [None] * len(ctx.inputs)
    offset = len(ctx.needs_input_grad) - len(ctx.inputs)
    gradients = []
    for needed, spec in zip(ctx.needs_input_grad[offset:], ctx.inputs, strict=True):
        if needed and spec is not None:
            label, shape, dtype = spec
            gradients.append(gradient_unavailable(grad, list(shape), dtype, ctx.what, label))
        else:
            gradients.append(None)
    return gradients


# --- row views of MXFP8 storage --------------------------------------------------------


def live_rows(values: Tensor, tokens) -> Tensor:
    """``values[:tokens]`` of MXFP8 storage, to pass to an op (``values`` itself when that
    is all of it: a view costs ~1 us a call).

    Storage that carries history (staged from a source that requires grad) gets a view whose
    backward raises at once: the plain slice's backward, a float8 zero-fill and scatter, is
    not something Inductor can compile, and a compiled backward must reach the raise. While
    compiling in grad mode the choice is left to ``mxfp8::live_rows``: Dynamo does not see
    the ``requires_grad`` that a mutating op gives the buffer it writes; AOTAutograd does.
    """
    if tokens == values.shape[0]:
        return values
    if torch.is_grad_enabled() and (values.requires_grad or torch.compiler.is_compiling()):
        return _live_rows_op(values, tokens)
    return values[:tokens]


def _live_rows_body(values: Tensor, tokens: int) -> Tensor:
    if torch.is_grad_enabled() and has_history(values):
        # the ops read the rows through the storage's bridge: a plain slice's backward, a
        # float8 zero-fill and scatter, is not something Inductor can compile
        rows = values.detach()[:tokens]
        _BRIDGES[rows] = (rows._version, _bridge(values))
        return rows
    return values[:tokens]


# CompositeImplicitAutograd: Dynamo records the call as one node, AOTAutograd runs this body
# under autograd with the buffer's true requires_grad.
_lib.define("live_rows(Tensor(a) values, SymInt tokens) -> Tensor(a)")
_lib.impl("live_rows", _live_rows_body, "CompositeImplicitAutograd")
_live_rows_op = torch.ops.mxfp8.live_rows.default


# float8 dtypes: no arithmetic in Triton, so no float8 gradient may meet another
_FLOAT8 = tuple(
    getattr(torch, name)
    for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
                 "float8_e8m0fnu")
    if hasattr(torch, name)
)  # fmt: skip

# float8 storage (or a row view of it) -> (its version when bridged, the bridge)
_BRIDGES: WeakIdKeyDictionary = WeakIdKeyDictionary()


def has_history(t: Tensor) -> bool:
    """Whether a backward through ``t`` must reach a raise: it requires grad, or it is a
    detached row view of storage that does (made by :func:`live_rows`)."""
    return t.requires_grad or (bool(_BRIDGES) and t in _BRIDGES)


def _bridge(t: Tensor) -> Tensor:
    """A BF16 scalar whose backward hands ``t`` its (raising) gradient, one per version of
    ``t``: every op reading ``t`` takes its history from it, so their gradients are added
    on the scalar and ``t`` gets a single float8 gradient (Triton cannot add float8)."""
    bridge = _current_bridge(t)
    if bridge is not None:
        return bridge
    bridge = _Bridge.apply(t)
    _BRIDGES[t] = (t._version, bridge)
    return bridge


def _current_bridge(t: Tensor) -> Tensor | None:
    """The scalar registered for ``t``'s current version, if any."""
    entry = _BRIDGES.get(t)
    return entry[1] if entry is not None and entry[0] == t._version else None


class _Bridge(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t):
        ctx.set_materialize_grads(False)
        ctx.shape, ctx.dtype = t.shape, t.dtype
        return t.new_zeros((), dtype=torch.bfloat16)

    @staticmethod
    def backward(ctx, grad):
        if grad is None:
            return None
        what = "MXFP8 input storage (MXFP8Input.values)"
        return gradient_unavailable(grad, list(ctx.shape), ctx.dtype, what, "values")
