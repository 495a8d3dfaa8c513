"""``explain(model, *inputs)``: compile with the fusion pass and report every candidate site."""

from __future__ import annotations

from typing import Any

import torch

from .fusion import FusionOptions, FusionPass, install
from .report import FusionReport


def explain(
    model: torch.nn.Module | Any,
    *inputs: Any,
    options: FusionOptions | None = None,
    dynamic: bool | None = None,
    **kwargs: Any,
) -> FusionReport:
    """Compile ``model`` with the ``mxfp8_fusion`` pass, run it once on ``inputs``, and
    report what the pass did at every candidate site (a ``torch.cat`` that reaches an MXFP8
    quantize or linear): rewritten, or why not.

    Inductor's caches are bypassed for this compile so that the pass really runs, and the
    model is compiled afresh (a program compiled earlier with another backend is not
    reused). The same lines are logged at DEBUG on the ``mxfp8_fusion`` logger by every
    compile with the pass.

    Args:
        model: a module or function.
        *inputs, **kwargs: the arguments to call it with.
        options: pass options (default :class:`FusionOptions`).
        dynamic: as for ``torch.compile``.

    Returns:
        A :class:`FusionReport`; ``str(report)`` is a readable summary.
    """
    from torch._inductor.compile_fx import compile_fx

    fusion = FusionPass(options)

    def backend(gm, example_inputs):
        patches: dict[str, Any] = {"fx_graph_cache": False, "force_disable_caches": True}
        install(patches, fusion)
        return compile_fx(gm, example_inputs, config_patches=patches)

    compiled = torch.compile(model, backend=backend, dynamic=dynamic)
    with torch._inductor.config.patch(force_disable_caches=True):
        compiled(*inputs, **kwargs)
    return FusionReport(sites=list(fusion.reports), graphs=fusion.graphs)
