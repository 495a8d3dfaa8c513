"""mxfp8_fusion: quantize concatenated BF16 slices straight into MXFP8 GEMM storage.

Eager API: :func:`pack_weight`, :func:`empty_input`, :func:`quantize_input_slice`,
:func:`mm_quantized`, :func:`mm_quantized_into`, and the one-shot :func:`quantize` / :func:`mm`.
Compiled: ``torch.compile(model, backend="mxfp8_fusion")`` rewrites ``cat -> MXFP8 linear``.
"""

from . import ops  # noqa: F401  (registers the mxfp8:: custom ops)
from .api import (
    empty_input,
    mm,
    mm_quantized,
    mm_quantized_into,
    pack_weight,
    quantize,
    quantize_input_slice,
)
from .format import MXFP8Input, MXFP8Weight
from .nn import MXFP8Linear, convert
from .passes import FusionOptions, FusionPass, explain

__all__ = [
    "FusionOptions",
    "FusionPass",
    "MXFP8Input",
    "MXFP8Linear",
    "MXFP8Weight",
    "convert",
    "empty_input",
    "explain",
    "mm",
    "mm_quantized",
    "mm_quantized_into",
    "pack_weight",
    "quantize",
    "quantize_input_slice",
]
