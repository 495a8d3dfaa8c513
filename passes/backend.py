"""The ``mxfp8_fusion`` torch.compile backend: Inductor with the fusion pass installed.

Registered only through the ``torch_dynamo_backends`` entry point (``pyproject.toml``);
``torch.compile(model, backend="mxfp8_fusion")`` loads it without a prior import. Calling
``register_backend`` for the same name as well would make Dynamo fail with "duplicate name".

``torch.compile`` hands a non-Inductor backend its ``mode`` and ``options`` as keyword
arguments (``torch._TorchCompileWrapper``; only when they are not the defaults, and never
both at once). This backend applies them exactly as Inductor does: ``mode`` expands to
``torch._inductor.list_mode_options(mode)``, ``options`` are Inductor config patches.
Keys of ``options`` that start with ``"mxfp8_fusion."`` set :class:`FusionOptions` fields
instead, for example ``options={"mxfp8_fusion.max_slices": 8}``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import fx

from .. import lowering
from ..progress import notice
from . import report_store
from .fusion import PREFIX, FusionOptions, FusionPass, install, log


def inductor_patches(mode: str | None, options: dict[str, Any] | None) -> dict[str, Any]:
    """Inductor config patches for ``mode`` and ``options``, checked as Inductor checks them.

    Raises:
        RuntimeError: on an unknown mode or an unknown Inductor option (Inductor's errors).
    """
    from torch._inductor import config, list_mode_options

    patches: dict[str, Any] = {}
    if mode and mode != "default":
        patches.update(list_mode_options(mode))
    known = config.get_config_copy()
    for key, value in (options or {}).items():
        name = key.replace("-", "_")
        if name not in known:
            raise RuntimeError(
                f"Unexpected optimization option {key} for backend mxfp8_fusion; known options "
                f"are Inductor's config keys and {PREFIX}<FusionOptions field>"
            )
        patches[name] = value
    return patches


def split_options(
    options: Mapping[str, Any] | None, bare_fields: bool = False
) -> tuple[dict[str, Any], FusionOptions]:
    """Split ``options`` into Inductor options and :class:`FusionOptions`.

    Keys starting with ``"mxfp8_fusion."`` are pass options; with ``bare_fields``, so are keys
    that name a :class:`FusionOptions` field without the prefix (``"max_slices"``).

    Raises:
        TypeError: ``options`` is not a dict; an unknown ``mxfp8_fusion.`` key; a pass option
            of the wrong type (each named as its key spells it).
        ValueError: a pass option out of range.
    """
    if options is None:
        return {}, FusionOptions()
    if not isinstance(options, Mapping):
        raise TypeError(f"options must be a dict, got {type(options).__name__}")
    fields = {f.name for f in dataclasses.fields(FusionOptions)}
    inductor, fusion = {}, {}
    for key, value in options.items():
        is_pass = isinstance(key, str) and (
            key.startswith(PREFIX) or (bare_fields and key in fields)
        )
        (fusion if is_pass else inductor)[key] = value
    return inductor, FusionOptions.from_mapping(fusion)


def mxfp8_fusion_backend(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    mode: str | None = None,
    options: dict[str, Any] | None = None,
    fusion: FusionPass | None = None,
    **kwargs: Any,
):
    """Compile ``gm`` with Inductor and the MXFP8 fusion pass as ``post_grad_custom_post_pass``.

    Args:
        gm, example_inputs: what Dynamo passes to every backend.
        mode: an Inductor mode (``"default"``, ``"reduce-overhead"``, ``"max-autotune"``, ...).
        options: Inductor config patches, plus ``"mxfp8_fusion.<field>"`` pass options.
        fusion: a :class:`FusionPass` to use (to read its counters); a new one by default.
        **kwargs: rejected; named so that the error says what was given.

    A ``post_grad_custom_post_pass`` the user already configured (globally or in
    ``options``) runs first and is kept; the composed pass's uuid covers both.

    Raises:
        TypeError, ValueError: on unknown arguments or bad pass options (Dynamo reports them
            as ``BackendCompilerFailed``, the original error its ``inner_exception``).
        RuntimeError: on unknown modes or Inductor options, as Inductor raises.
    """
    if kwargs:
        raise TypeError(f"mxfp8_fusion backend: unexpected arguments {sorted(kwargs)}")
    from torch._inductor.compile_fx import compile_fx

    inductor_options, fusion_options = split_options(options)
    if fusion is not None and fusion_options != FusionOptions():
        raise TypeError("mxfp8_fusion backend: pass fusion or mxfp8_fusion.* options, not both")
    patches = inductor_patches(mode, inductor_options)
    fusion = install(patches, fusion if fusion is not None else FusionPass(fusion_options))
    lowering.register()  # Inductor's lowering module is loaded by now (see lowering.py)
    # the passes by uuid (their repr may hold an address), every other option by value
    chain = patches["post_grad_custom_post_pass"]
    options_text = sorted((k, repr(v)) for k, v in patches.items() if "custom" not in k)
    settings = repr((options_text, chain.uuid()))
    digest = report_store.key(gm, example_inputs, settings)
    graphs, reports = fusion.graphs, len(fusion.reports)
    fusion.traced_cats += sum(1 for n in gm.graph.nodes if n.target in _CATS)
    mxfp8_ops = sum(1 for n in gm.graph.nodes if _is_mxfp8_op(n.target))
    fusion.traced_mxfp8_ops += mxfp8_ops
    if not _compiled[0]:  # an INFO record, as torch's own: shown where logging asks for it
        _compiled[0] = True
        log.info(
            "mxfp8_fusion: compiling with Inductor and the MXFP8 fusion pass (the first "
            "compile in a process takes seconds to minutes; later calls reuse it)"
        )
    inner = _ReportingInnerCompile(fusion, settings)
    compiled = compile_fx(gm, example_inputs, inner_compile=inner, config_patches=patches)
    _say_if_nothing_to_rewrite(fusion, fusion.contents[graphs:], mxfp8_ops)
    if inner.calls:  # Inductor compiled, or served from its FX graph cache: reported there
        report_store.store(digest, *_since(fusion, graphs, reports))
    else:  # served from AOTAutograd's cache, keyed on this Dynamo graph: no inner compile
        _replay(fusion, digest)
    return compiled


class _ReportingInnerCompile:
    """Inductor's ``compile_fx_inner``, with the pass's reports stored or replayed per graph.

    Inductor's FX graph cache keys on the graph this receives: the canonical post-autograd
    graph, whose names are AOTAutograd's (``arg0_1``), not the user's. Keying the reports on
    it too, every FX graph cache hit finds the reports of the graph it serves, whatever the
    user's module, attribute and argument names were.
    """

    def __init__(self, fusion: FusionPass, settings: str):
        self.fusion, self.settings, self.calls = fusion, settings, 0

    def __call__(self, gm: fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any):
        from torch._inductor.compile_fx import compile_fx_inner

        self.calls += 1
        digest = report_store.key(gm, example_inputs, self.settings)
        # where this program's cats come from: a stored report names the first program's
        traces = {n.name: n.meta.get("stack_trace") for n in gm.graph.nodes}
        graphs, reports = self.fusion.graphs, len(self.fusion.reports)
        compiled = compile_fx_inner(gm, example_inputs, **kwargs)
        if self.fusion.graphs > graphs:
            report_store.store(digest, *_since(self.fusion, graphs, reports))
        else:  # served from the FX graph cache: the pass did not run
            _replay(self.fusion, digest, traces)
        return compiled


def _since(fusion: FusionPass, graphs: int, reports: int):
    """The reports and graph contents recorded since the counts ``graphs`` and ``reports``,
    their graphs numbered from 1 (as stored)."""
    new = [dataclasses.replace(r, graph=r.graph - graphs) for r in fusion.reports[reports:]]
    return new, fusion.contents[graphs:]


def _replay(fusion: FusionPass, digest: str, traces: Mapping[str, Any] | None = None) -> None:
    """Replay the reports stored under ``digest``, each at the user line ``traces`` gives
    its cat (FX node name -> stack trace), where it gives one."""
    stored = report_store.load(digest)
    if stored is not None:
        reports, contents = stored
        fusion.replay([r.at((traces or {}).get(r.cat)) for r in reports], contents)
    else:
        log.info(
            "mxfp8_fusion: graph served from Inductor's cache with no stored report; "
            "the pass's counters and reports do not cover it"
        )


_CATS = (torch.cat, torch.concat, torch.concatenate, torch.ops.aten.cat.default)
_compiled: list[bool] = [False]  # whether this process has compiled with the backend
_saw_mxfp8: list[bool] = [False]  # whether a graph compiled here held an MXFP8 op


def _is_mxfp8_op(target: Any) -> bool:
    return isinstance(target, torch._ops.OpOverload) and target.namespace == "mxfp8"


def _say_if_nothing_to_rewrite(
    fusion: FusionPass, contents: list[tuple[int, int]], mxfp8_ops: int
) -> None:
    """Once per process: the graphs just compiled hold no MXFP8 op at all (no quantize or
    linear, and no eager-API op such as ``mm_slices_into``), and no earlier one did (the
    model was most likely not converted). Silenced with the skipped-site warnings
    (``warn_skipped``), as explain silences it: its report says the same."""
    _saw_mxfp8[0] = _saw_mxfp8[0] or mxfp8_ops > 0 or any(mxfp8 for _, mxfp8 in contents)
    if contents and not _saw_mxfp8[0] and fusion.options.warn_skipped:
        notice(
            "the graph compiled with backend='mxfp8_fusion' holds no MXFP8 linear, so the "
            "pass has nothing to rewrite: convert the model first, mxfp8_fusion.convert(model) "
            "(an nn.Linear stays a BF16 GEMM); mxfp8_fusion.explain(model, *inputs) says more",
            once="nothing to rewrite",
        )


def _reset() -> None:
    """Called by ``torch._dynamo.reset()``: drop CUDA graph trees as Inductor's reset does."""
    if torch.cuda.is_available():
        from torch._inductor.cudagraph_trees import reset_cudagraph_trees

        reset_cudagraph_trees()


mxfp8_fusion_backend.reset = _reset  # type: ignore[attr-defined]
