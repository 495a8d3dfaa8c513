"""The pass's reports for graphs that Inductor serves from its caches.

On an FX graph cache or AOTAutograd cache hit, Inductor does not run post-grad passes: the
fusion pass sees nothing, so it would count nothing and warn about nothing, although the
served program has the same sites, rewritten or not. The ``mxfp8_fusion`` backend therefore
stores the reports of each graph it compiles beside Inductor's cache, keyed on what decides
them (a graph's code, its inputs' shapes and dtypes, the Inductor options and the pass's
uuid), and replays them on a hit (:meth:`FusionPass.replay`). Each is stored twice, as each
cache keys: under the post-autograd graph Inductor's FX graph cache keys on (AOTAutograd's
names, so programs that differ only in the user's names share it), and under the Dynamo
graph AOTAutograd's cache keys on (a hit there skips Inductor entirely).

Storing is best effort: a read-only or full cache directory only means a later hit has
nothing to replay, which the backend then logs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Sequence
from typing import Any

import torch

from .report import SiteReport

log = logging.getLogger("mxfp8_fusion.passes")

_VERSION = 1  # of the stored format


def key(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], settings: str) -> str:
    """A digest of what decides the pass's reports for ``gm``."""
    inputs = [
        (tuple(str(s) for s in x.shape), str(x.dtype), x.device.type)
        if isinstance(x, torch.Tensor)
        else repr(x)
        for x in example_inputs
    ]
    text = repr((_VERSION, torch.__version__, gm.code, inputs, settings))
    return hashlib.sha256(text.encode()).hexdigest()


def _path(digest: str) -> str:
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return os.path.join(cache_dir(), "mxfp8_fusion_reports", digest + ".json")


def store(digest: str, reports: list[SiteReport], contents: list[tuple[int, int]]) -> None:
    """Write the reports of one compile, atomically; never raises."""
    data = {"reports": [dataclasses.asdict(r) for r in reports], "contents": contents}
    try:
        path = _path(digest)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with tempfile.NamedTemporaryFile(
            "w", dir=os.path.dirname(path), suffix=".tmp", delete=False
        ) as f:
            json.dump(data, f)
        os.replace(f.name, path)
    except Exception as error:
        log.debug("mxfp8_fusion: the pass's reports were not stored: %s", error)


def load(digest: str) -> tuple[list[SiteReport], list[tuple[int, int]]] | None:
    """The stored reports of a compile, or ``None`` when there are none (or unreadable)."""
    try:
        with open(_path(digest)) as f:
            data = json.load(f)
        reports = [SiteReport(**{**r, "widths": tuple(r["widths"])}) for r in data["reports"]]
        return reports, [tuple(c) for c in data["contents"]]
    except Exception:
        return None
