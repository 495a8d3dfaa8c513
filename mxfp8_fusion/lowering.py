"""Inductor's fallback lowerings for the ``mxfp8::`` ops, registered before their first use.

Inductor lowers a custom op without a lowering of its own to a fallback kernel, and it makes
that fallback lazily, the first time it lowers the op. Making it also adds the op to the set
of ops that need realized inputs, which decides whether a producer read by the op and by
other ops is stored once or recomputed inside each consumer. Made lazily, the first compile
of a program that uses an ``mxfp8::`` op is lowered one way and every later compile in the
process the other way: identical programs gave different bytes, for instance an RMSNorm
beside an ``MXFP8Linear`` reading the unrounded FP32 sum in one and the stored BF16 sum in
the other. Registered once, before any lowering, every compile sees the same table.

:func:`register` is called by every ``mxfp8::`` fake implementation, which runs while
Inductor traces the graph (after it imported its lowering module, before it lowers
anything), and by the ``mxfp8_fusion`` backend. Importing this package never imports
Inductor.
"""

from __future__ import annotations

import logging
import sys

import torch

log = logging.getLogger("mxfp8_fusion")

_NAMESPACE = "mxfp8"
_registered = False


def register() -> None:
    """Register the fallback of every ``mxfp8::`` op, as Inductor would at first use.

    Does nothing until Inductor's lowering module is loaded, and nothing after it has
    registered them once. Never raises: a torch whose lowering internals differ keeps
    Inductor's lazy fallbacks.
    """
    global _registered
    if _registered:
        return
    lowering = sys.modules.get("torch._inductor.lowering")
    if lowering is None:
        return
    _registered = True
    try:
        from torch._library.utils import get_layout_constraint_tag

        for op in _ops():
            if op in lowering.lowerings:
                continue
            # the layout constraint Inductor's implicit fallback gives a custom op
            tag = get_layout_constraint_tag(op, with_default=True)
            constraint = lowering.tag_to_layout_constraint(tag)
            lowering.make_fallback(op, layout_constraint=constraint, warn=False)
    except Exception as error:  # an optimization of determinism, never worth a failure
        log.debug("mxfp8_fusion: Inductor fallbacks left to Inductor: %s", error)


def _ops() -> list[torch._ops.OpOverload]:
    """Every overload of every op in the ``mxfp8`` namespace."""
    prefix = _NAMESPACE + "::"
    names = sorted(
        {
            n[len(prefix) :].split(".")[0]
            for n in torch._C._dispatch_get_all_op_names()
            if n.startswith(prefix)
        }
    )
    namespace = getattr(torch.ops, _NAMESPACE)
    ops = []
    for name in names:
        packet = getattr(namespace, name)
        ops.extend(getattr(packet, overload) for overload in packet.overloads())
    return ops
