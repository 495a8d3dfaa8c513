"""The Inductor post-grad pass and the ``mxfp8_fusion`` torch.compile backend,
installed as ``mxfp8_fusion.passes``.

- ``torch.compile(model, backend="mxfp8_fusion")``: Inductor with the pass (the backend is
  registered by the package's entry point, not by importing this module).
- :class:`FusionPass` / :func:`install`: add the pass to an Inductor setup you own.
- :func:`explain`: what the pass does at every candidate site, and why.
"""

from .backend import mxfp8_fusion_backend
from .explain import explain
from .fusion import ComposedPass, FusionOptions, FusionPass, compose, install
from .report import FusionReport, FusionSkippedWarning, SiteReport

__all__ = [
    "ComposedPass",
    "FusionOptions",
    "FusionPass",
    "FusionReport",
    "FusionSkippedWarning",
    "SiteReport",
    "compose",
    "explain",
    "install",
    "mxfp8_fusion_backend",
]
