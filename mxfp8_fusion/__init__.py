"""mxfp8_fusion: quantize concatenated BF16 slices straight into MXFP8 GEMM storage.

Eager API: :func:`pack_weight`, :func:`empty_input`, :func:`quantize_input_slice` (or
:func:`quantize_input_slices` for several at once), :func:`mm_quantized`,
:func:`mm_quantized_into`, and the one-shot :func:`quantize` / :func:`mm`;
:class:`InputStager` wraps them for engine code (allocate once, append slices, finish).
W8A16 (16-bit activations, MXFP8 weight): :func:`mm_slices` / :func:`mm_slices_into` read
the slices as they are, with no concatenation and no quantization at all.
Compiled: ``torch.compile(model, backend="mxfp8_fusion")`` rewrites ``cat -> MXFP8 linear``
so the BF16 concatenation is never materialized; :func:`explain` reports what it did at
every candidate site and why; :class:`FusionPass` adds the pass to an Inductor setup you own.
Start-up: :func:`warmup` compiles the kernels a model will launch, once per machine (they are
kept on disk: ``MXFP8_FUSION_CACHE_DIR``, :func:`set_kernel_cache_dir`).
"""

__version__ = "0.2.0"

from . import ops  # noqa: F401  (registers the mxfp8:: custom ops)
from .api import (
    empty_input,
    mm,
    mm_quantized,
    mm_quantized_into,
    pack_weight,
    quantize,
    quantize_input_slice,
    quantize_input_slices,
)
from .format import MXFP8Input, MXFP8Weight
from .kernel_warmup import warmup
from .kernels.runtime.cache import KernelCacheWarning
from .kernels.runtime.cache import set_cache_dir as set_kernel_cache_dir
from .nn import MXFP8Linear, convert
from .stager import InputStager
from .w8a16 import mm_slices, mm_slices_into

__all__ = [
    "FusionOptions",
    "FusionPass",
    "FusionSkippedWarning",
    "InputStager",
    "KernelCacheWarning",
    "MXFP8Input",
    "MXFP8Linear",
    "MXFP8Weight",
    "convert",
    "empty_input",
    "explain",
    "mm",
    "mm_quantized",
    "mm_quantized_into",
    "mm_slices",
    "mm_slices_into",
    "pack_weight",
    "quantize",
    "quantize_input_slice",
    "quantize_input_slices",
    "set_kernel_cache_dir",
    "warmup",
]

# Each name's module in mxfp8_fusion.passes. The pass needs torch._inductor (about a second to
# import): it is loaded on first use only.
_PASS_EXPORTS = {
    "FusionOptions": "fusion",
    "FusionPass": "fusion",
    "FusionSkippedWarning": "report",
    "explain": "explain",
}


def __getattr__(name: str):
    if name in _PASS_EXPORTS:
        import importlib

        return getattr(importlib.import_module(f".passes.{_PASS_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'mxfp8_fusion' has no attribute {name!r}")


# mxfp8_fusion.passes has no __init__.py (docs/architecture.md says why), so nothing would
# answer `from mxfp8_fusion.passes import FusionPass`, which its __init__ once served. The
# namespace package gets a module __getattr__ (PEP 562) serving those names from their
# modules, loaded on first use; its submodules (explain, report, ...) stay modules.
_PASSES_NAMES = {
    **{n: "fusion" for n in ("ComposedPass", "FusionOptions", "FusionPass", "compose", "install")},
    **{n: "report" for n in ("FusionReport", "FusionSkippedWarning", "SiteReport")},
    "mxfp8_fusion_backend": "backend",
}


def _passes_getattr(name: str):
    import importlib

    if name in _PASSES_NAMES:
        module = importlib.import_module(f"{__name__}.passes.{_PASSES_NAMES[name]}")
        return getattr(module, name)
    raise AttributeError(
        f"module 'mxfp8_fusion.passes' has no attribute {name!r}; the pass's public names are "
        "mxfp8_fusion.FusionPass, FusionOptions, FusionSkippedWarning and explain, and "
        "ComposedPass, compose and install are in mxfp8_fusion.passes.fusion"
    )


def _trail_to_the_pass_names() -> None:
    import importlib

    importlib.import_module(f"{__name__}.passes").__getattr__ = _passes_getattr


_trail_to_the_pass_names()
