"""Symbolic slice widths: their values in this compile, which of them may be specialized,
and the specialization.

Dynamo makes a width symbolic when a second model of the same class, or the same code with
other widths, runs (automatic dynamic shapes): the pass then specializes it with a guard, as
Inductor does with a size it needs static. A width the user required to stay dynamic
(``torch._dynamo.mark_dynamic``, export's ``Dim``) must not be: Dynamo would fail the whole
compile with a ``ConstraintViolationError`` when it checks its guards, so such a site is
left unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .pattern import Site


def hint(size) -> int | None:
    """A size's value in this compile: the int, or a symbolic size's hint (what Dynamo saw);
    ``None`` for a data-dependent size, which has none. Reading the hint adds no guard."""
    if isinstance(size, int):
        return size
    node = getattr(size, "node", None)
    value = getattr(node, "hint", None)
    return int(value) if value is not None else None


def _required_dynamic(shape_env) -> set:
    """The symbols of the input sizes that carry a user's dynamic-shape constraint: Dynamo
    records one per input dim in the shape environment's tracked fakes. Automatic dynamic
    shapes record one too, but ``warn_only``: specializing those only recompiles."""
    found: set = set()
    for tracked in getattr(shape_env, "tracked_fakes", None) or ():
        context = getattr(tracked, "symbolic_context", None)
        constraints = getattr(context, "constraint_sizes", None) or ()
        for size, constraint in zip(getattr(tracked.fake, "shape", ()), constraints, strict=False):
            strict = constraint is not None and not getattr(constraint, "warn_only", False)
            if strict and isinstance(size, torch.SymInt):
                found |= size.node.expr.free_symbols
    return found


def required_dynamic(size) -> bool:
    """Whether ``size`` depends on an input size the user required to stay dynamic."""
    node = getattr(size, "node", None)
    shape_env = getattr(node, "shape_env", None)
    if shape_env is None:
        return False
    return bool(node.expr.free_symbols & _required_dynamic(shape_env))


def specialize(site: Site) -> None:
    """Guard each symbolic slice width to its value in this compile: the staged storage's
    columns and scale chunks are laid out for these widths, and a call with other widths
    compiles again (the widths were checked by :func:`required_dynamic` first)."""
    from torch.fx.experimental.symbolic_shapes import guard_int

    for i, source in enumerate(site.slices):
        size = source.meta["val"].shape[-1]
        if not isinstance(size, int) and guard_int(size) != site.widths[i]:
            raise RuntimeError(f"slice {i}'s width {size} did not specialize to its hint")
