"""``explain(model, *inputs)``: compile with the fusion pass and report every candidate site."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from ..nn import why_no_mxfp8
from .backend import inductor_patches, mxfp8_fusion_backend, split_options
from .fusion import FusionOptions, FusionPass
from .report import FusionReport


def explain(
    model: torch.nn.Module | Any,
    *inputs: Any,
    options: FusionOptions | Mapping[str, Any] | None = None,
    mode: str | None = None,
    dynamic: bool | None = None,
    fullgraph: bool = False,
    kwargs: Mapping[str, Any] | None = None,
    **unexpected: Any,
) -> FusionReport:
    """Compile ``model`` with the ``mxfp8_fusion`` pass, run it once on ``inputs``, and
    report what the pass did at every candidate site (a ``torch.cat`` that reaches an MXFP8
    quantize or linear): rewritten, or why not; when there is none, the likely reasons.

    It compiles as ``torch.compile(model, backend="mxfp8_fusion", mode=mode,
    options=options, dynamic=dynamic, fullgraph=fullgraph)`` would, except that Inductor's
    caches are bypassed so that the pass really runs, and the model is compiled afresh (a
    program compiled earlier with another backend is not reused). The same lines are logged
    at DEBUG on the ``mxfp8_fusion`` logger by every compile with the pass.

    Args:
        model: a module or function.
        *inputs: its positional arguments.
        options: pass options, as a :class:`FusionOptions` or a dict; in a dict, keys that
            name a ``FusionOptions`` field, with or without the ``"mxfp8_fusion."`` prefix,
            are pass options and the other keys Inductor options, as for ``torch.compile``.
        mode, dynamic, fullgraph: as for ``torch.compile``.
        kwargs: the model's keyword arguments (explain's own keywords are only the above,
            so that a typo in one is not passed to the model as an input).

    Returns:
        A :class:`FusionReport`; ``str(report)`` is a readable summary.

    Raises:
        TypeError: an unknown keyword, or an argument of the wrong type, named.
        ValueError: a bad pass option value, an unknown mode or Inductor option.
    """
    if unexpected:
        raise TypeError(
            f"explain: unexpected keyword argument(s) {', '.join(sorted(unexpected))}; pass the "
            "model's keyword arguments as kwargs={...} (explain's own keywords are options, "
            "mode, dynamic, fullgraph and kwargs)"
        )
    inductor_options, fusion_options = _split(options)
    if mode is not None and not isinstance(mode, str):
        raise TypeError(f"mode must be a str or None, got {type(mode).__name__}")
    if dynamic is not None and not isinstance(dynamic, bool):
        raise TypeError(f"dynamic must be True, False or None, got {type(dynamic).__name__}")
    if not isinstance(fullgraph, bool):
        raise TypeError(f"fullgraph must be True or False, got {type(fullgraph).__name__}")
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise TypeError(f"kwargs must be a dict or None, got {type(kwargs).__name__}")
    try:
        inductor_patches(mode, inductor_options)  # checked now, not inside Dynamo's compile
    except RuntimeError as error:
        raise ValueError(f"explain: {error}") from None

    # the report is what explain returns: no FusionSkippedWarning besides it
    fusion = FusionPass(dataclasses.replace(fusion_options, warn_skipped=False))

    def backend(gm, example_inputs):
        patches = {**inductor_options, "fx_graph_cache": False, "fx_graph_remote_cache": False}
        return mxfp8_fusion_backend(gm, example_inputs, mode=mode, options=patches, fusion=fusion)

    compiled = torch.compile(model, backend=backend, dynamic=dynamic, fullgraph=fullgraph)
    # The caches that would serve a compiled graph without running the pass. Not
    # force_disable_caches: it also turns off Dynamo's profile-guided state, with a warning.
    with torch._functorch.config.patch(
        enable_autograd_cache=False, enable_remote_autograd_cache=False
    ):
        compiled(*inputs, **(kwargs or {}))
    return FusionReport(
        sites=list(fusion.reports),
        graphs=fusion.graphs,
        contents=fusion.contents,
        model=why_no_mxfp8(model) if isinstance(model, torch.nn.Module) else None,
        traced_cats=fusion.traced_cats,
        traced_mxfp8_ops=fusion.traced_mxfp8_ops,
    )


def _split(options: Any) -> tuple[dict[str, Any], FusionOptions]:
    if options is None:
        return {}, FusionOptions()
    if isinstance(options, FusionOptions):
        return {}, options
    if isinstance(options, Mapping):
        return split_options(options, bare_fields=True)
    raise TypeError(
        f"options must be a FusionOptions, a dict or None, got {type(options).__name__}"
    )
