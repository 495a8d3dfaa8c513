"""The schedules proven on a GPU (``proven.json`` beside this file): data, read here.

A schedule (``select.schedule``: a config's fields without those the token count sets) is
proven when the GPU suite's determinism test (``tests/kernels/test_gemm_determinism.py``)
ran it 20 times into poisoned outputs, on shapes with full waves, a stream-K tail, partial
tiles and several slices, and every run gave the same bits within the accumulation bound.
Only proven schedules are chosen (``select.choose_config``), timed by the tune
(``search.candidates``) or warmed up. A schedule new to the search space waits under
``pending`` (:func:`pending`): the determinism test runs it too, but nothing picks it until
it has passed on a GPU and moved to the list. No torch, no cutlass.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

PATH = Path(__file__).with_name("proven.json")


@functools.cache
def _document() -> dict:
    return json.loads(PATH.read_text())


def entries() -> tuple[dict, ...]:
    """The proven schedules, as ``select.schedule`` writes them."""
    return tuple(_document()["schedules"])


def pending() -> tuple[dict, ...]:
    """The schedules awaiting their proof: offered by the search space, run by the
    determinism test, and chosen, tuned or warmed up by nothing yet."""
    return tuple(_document().get("pending", []))


@functools.cache
def _keys() -> frozenset[str]:
    return frozenset(key(entry) for entry in entries())


def key(entry: dict) -> str:
    """A schedule's identity: its fields, in one order."""
    return json.dumps(entry, sort_keys=True)


def holds(entry: dict) -> bool:
    """Whether the schedule ``entry`` is proven."""
    return key(entry) in _keys()
