"""Every hook of every supported vLLM release, checked against that release's own sources.

The sources are the registry's GPU wheels (``pip download --no-deps vllm==X``), read without
importing them (they pin a torch this machine does not have): ``.ci/vllm`` downloads them
into a cache and sets ``MXFP8_FUSION_VLLM_WHEELS``; with ``MXFP8_FUSION_REQUIRE_VLLM_WHEELS=1``
(as there) a missing wheel fails instead of skipping. A renamed or re-signed name fails
here, as it would turn its part off in that release.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest
from helpers import vllm_sources

from mxfp8_fusion.vllm import hooks, settings

RELEASES = sorted(hooks.RELEASES, key=hooks._key)
RELEASED = [r for r in RELEASES if r not in hooks.UNRELEASED]
MAIN = Path(vllm_sources.__file__).with_name("vllm_main")
"""The extract of vLLM main the unreleased table is checked against (its README says what
it holds and from which commits)."""


@functools.cache
def _sources(release: str) -> vllm_sources.Sources:
    if release in hooks.UNRELEASED:
        return vllm_sources.Sources(MAIN)
    wheel = vllm_sources.wheel_for(release)
    if wheel is None:
        where = vllm_sources.wheel_directory()
        if os.environ.get("MXFP8_FUSION_REQUIRE_VLLM_WHEELS") == "1":
            pytest.fail(f"no vllm=={release}.* wheel in {where}")
        pytest.skip(f"no vllm=={release}.* wheel in {where} (.ci/vllm downloads them)")
    return vllm_sources.Sources(wheel)


def _resolve(sources: vllm_sources.Sources, hook: hooks.Hook) -> None:
    hook.check_parameters(sources.signature(hook.module, hook.name))


@pytest.mark.parametrize("release", RELEASED)
@pytest.mark.parametrize("part", settings.PARTS)
def test_every_hook_fits_its_release(release, part):
    sources = _sources(release)
    assert sources.version().startswith(release + ".")
    for hook in hooks.RELEASES[release][part]:
        _resolve(sources, hook)


def _previous(release: str) -> str:
    return max((r for r in RELEASED if hooks._key(r) < hooks._key(release)), key=hooks._key)


@pytest.mark.parametrize("release", sorted(hooks.UNRELEASED))
@pytest.mark.parametrize("part", settings.PARTS)
def test_every_new_hook_of_vllm_main_fits_its_source(release, part):
    """An unreleased table (vLLM main): each hook that differs from the last release's is
    resolved in the extract of main's source (without network, as CI runs); the hooks it
    shares with that release are checked against that release's wheel above."""
    previous = set(hooks.RELEASES[_previous(release)][part])
    for hook in hooks.RELEASES[release][part]:
        if hook not in previous:
            _resolve(_sources(release), hook)


def test_vllm_main_needs_its_own_table():
    """The V2 drafter hooks of 0.34's table that main's table replaces do not fit main
    (with 0.34's table the drafter part would turn off there); the one kept does."""
    sources, kept = _sources("0.35"), set(hooks.RELEASES["0.35"]["drafter"])
    v2 = [h for h in hooks.RELEASES["0.34"]["drafter"] if h.module.startswith(hooks._V2)]
    assert [h.name for h in v2 if h in kept] == ["DFlashSpeculator.capture"]
    for hook in v2:
        if hook in kept:
            _resolve(sources, hook)
        else:
            with pytest.raises(LookupError):
                _resolve(sources, hook)


def _named(release: str, part: str, name: str) -> hooks.Hook:
    return next(h for h in hooks.RELEASES[release][part] if h.name == name)


ABSENT = [
    # (release, a hook of another release that must not fit it, why the tables differ)
    ("0.34", _named("0.33", "drafter", "GPUModelRunner.propose_draft_token_ids"), "no V1"),
    ("0.32", _named("0.33", "drafter", "DFlashSpeculator._store_hidden_states"), "no buffer"),
    ("0.32", _named("0.33", "pass", "CompilationConfig.init_backend"), "4 parameters"),
    ("0.33", _named("0.32", "pass", "CompilationConfig.init_backend"), "5 parameters"),
    ("0.34", _named("0.32", "pass", "CompilationConfig.init_backend"), "5 parameters"),
    ("0.35", _named("0.34", "drafter", "DFlashSpeculator._store_hidden_states"), "no buffer"),
    ("0.35", _named("0.34", "drafter", "DFlashSpeculator.propose"), "dp_sync"),
    ("0.35", _named("0.34", "drafter", "TargetDependentARSpeculator.propose"), "dp_sync"),
]


@pytest.mark.parametrize(("release", "hook", "why"), ABSENT, ids=[f"{r}-{w}" for r, _, w in ABSENT])
def test_where_the_tables_differ_the_sources_do(release, hook, why):
    with pytest.raises(LookupError):
        _resolve(_sources(release), hook)


def test_a_renamed_or_resigned_name_fails():
    sources = _sources(RELEASED[-1])
    good = hooks.RELEASES[RELEASED[-1]]["drafter"][-1]
    _resolve(sources, good)
    for bad in (
        hooks.Hook(good.module, good.name + "_renamed", good.parameters),
        hooks.Hook(good.module + "_moved", good.name, good.parameters),
        hooks.Hook(good.module, good.name, (*good.parameters, "extra")),
        hooks.Hook(good.module, good.name, good.parameters[:-1]),
    ):
        with pytest.raises(LookupError):
            _resolve(sources, bad)


def test_release_table_choice():
    assert hooks.release_for("0.32.0") == ("0.32", True)
    assert hooks.release_for("0.32.3+cpu") == ("0.32", True)
    assert hooks.release_for("0.34.1") == ("0.34", True)
    assert hooks.release_for("0.35.0") == ("0.35", True)  # read from main, unreleased
    assert hooks.release_for("0.35.0rc1.dev42+g1234abcd") == ("0.35", True)
    assert hooks.release_for("0.36.0") == ("0.35", False)  # newer: the newest table
    assert hooks.release_for("1.0.0") == ("0.35", False)
    assert hooks.release_for("0.31.2") == (None, False)
    assert hooks.release_for("") == (None, False)
