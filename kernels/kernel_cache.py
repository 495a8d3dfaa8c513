"""The kernel cache on disk: each kernel build compiled once per machine, not once per process.

An entry is the build's object file as the DSL exports it (``export_to_c``), loaded back
with ``cutlass.cute.runtime.load_module`` (milliseconds, against seconds for a compile),
beside a small JSON record of its SHA-256 and what it was built from.

* Key: a hash of everything that changes the binary: the build (kernel kind, compile-time
  facts, arch), the source of the kernel package, and the versions of the DSL, its CUDA
  libraries and TVM-FFI. A change to any of them is another key, so a stale entry is never
  found, let alone served.
* Location: ``MXFP8_FUSION_CACHE_DIR`` (``off`` turns the cache off), else
  ``$XDG_CACHE_HOME/mxfp8_fusion/kernels`` (``~/.cache`` without it), or
  :func:`set_cache_dir` in the process.
* Safety: entries are written to a temporary name and renamed into place, so concurrent
  processes never see half an entry. An entry whose bytes do not match its record
  (truncated, corrupted, or replaced between the two renames) is rebuilt, never loaded.
  A directory that cannot be written (read-only, full) costs one warning; the process then
  keeps its builds in a private temporary directory.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import json
import os
import platform
import secrets
import shutil
import tempfile
import warnings
from importlib import metadata
from pathlib import Path

from ..progress import notice

ENV = "MXFP8_FUSION_CACHE_DIR"


class KernelCacheWarning(UserWarning):
    """The kernel cache directory cannot be used; kernels are compiled per process."""


_override: list = []  # [Path | None] once set_cache_dir was called
_unwritable: set[Path] = set()
_private: list[Path] = []


def default_dir() -> Path:
    """``$XDG_CACHE_HOME/mxfp8_fusion/kernels``, ``~/.cache/mxfp8_fusion/kernels`` without it."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mxfp8_fusion" / "kernels"


def cache_dir() -> Path | None:
    """The directory kernels are cached in; None where the cache is off."""
    if _override:
        return _override[0]
    env = os.environ.get(ENV)
    if env is not None:
        return None if env.strip().lower() in ("", "off", "0", "none") else Path(env)
    return default_dir()


def set_cache_dir(path: str | os.PathLike | None) -> None:
    """Cache kernels in ``path`` from now on in this process (``None``: no disk cache).
    Builds already loaded stay loaded."""
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path: expected a str, os.PathLike or None, got {type(path).__name__}")
    _override[:] = [None if path is None else Path(path)]


@functools.cache
def source_hash() -> str:
    """SHA-256 of the kernel package's source and the storage format it builds against."""
    from .. import format as storage_format

    files = [*sorted(Path(__file__).parent.glob("*.py")), Path(storage_format.__file__)]
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


@functools.cache
def toolchain() -> dict:
    """The versions a binary depends on besides its source: the DSL and its CUDA libraries,
    TVM-FFI, the host platform."""
    try:  # its own version too: a DSL put on the path without package metadata
        import cutlass

        versions = {"cutlass": getattr(cutlass, "__version__", "unknown")}
    except ImportError:
        versions = {"cutlass": "absent"}
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name.startswith(("nvidia-cutlass-dsl", "cuda-bindings")) or name == "apache-tvm-ffi":
            versions[name] = dist.version
    return {"packages": dict(sorted(versions.items())), "machine": platform.machine()}


def entry_key(build) -> str:
    """The cache key of ``build`` (a ``launcher.Build``): hex SHA-256 of everything that
    changes its binary."""
    record = {
        "build": [build.kind, repr(build.facts), build.arch],
        "source": source_hash(),
        "toolchain": toolchain(),
    }
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def _function_name(key: str) -> str:
    return f"mxfp8_fusion_{key[:24]}"


def _verified(directory: Path, key: str) -> dict | None:
    """The record of a valid entry under ``key`` (its object file's size and SHA-256 match
    the record), else None."""
    try:
        record = json.loads((directory / f"{key}.json").read_text())
        data = (directory / f"{key}.o").read_bytes()
    except (OSError, ValueError):
        return None
    valid = (
        isinstance(record, dict)
        and record.get("key") == key
        and record.get("size") == len(data)
        and record.get("sha256") == hashlib.sha256(data).hexdigest()
    )
    return record if valid else None


def stored(directory: Path | None, build) -> bool:
    """Whether ``directory`` holds a valid entry for ``build`` (checked, not loaded)."""
    return directory is not None and _verified(directory, entry_key(build)) is not None


def load(directory: Path, key: str):
    """The function stored under ``key`` in ``directory``, or None where there is no valid
    entry (missing, truncated, corrupted, recorded for another key, not loadable)."""
    record = _verified(directory, key)
    if record is None:
        return None
    try:
        from cutlass.cute.runtime import load_module

        module = load_module(str(directory / f"{key}.o"), enable_tvm_ffi=True)
        return getattr(module, record["function"])
    except Exception:  # an entry the DSL cannot load is a miss: the build is redone
        return None


def _replace_atomically(directory: Path, name: str, write) -> None:
    tmp = directory / f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        write(tmp)
        os.replace(tmp, directory / name)
    finally:
        tmp.unlink(missing_ok=True)


def store(directory: Path, key: str, build, compiled) -> None:
    """Write ``compiled`` (a TVM-FFI build) under ``key``: the object file first, then its
    record, each renamed into place. Raises ``OSError`` where the directory is unusable."""
    directory.mkdir(parents=True, exist_ok=True)
    name = _function_name(key)
    data: list[bytes] = []

    def write_object(tmp: Path) -> None:
        compiled.export_to_c(str(tmp), function_name=name)
        data.append(tmp.read_bytes())

    _replace_atomically(directory, f"{key}.o", write_object)
    record = {
        "key": key,
        "function": name,
        "size": len(data[0]),
        "sha256": hashlib.sha256(data[0]).hexdigest(),
        "build": build.describe(),
        "toolchain": toolchain(),
    }
    _replace_atomically(directory, f"{key}.json", lambda p: p.write_text(json.dumps(record)))


def _private_dir() -> Path:
    if not _private:
        path = Path(tempfile.mkdtemp(prefix="mxfp8_fusion-kernels-"))
        atexit.register(shutil.rmtree, path, ignore_errors=True)
        _private.append(path)
    return _private[0]


def writable(directory: Path) -> bool:
    """Whether builds can be stored in ``directory`` (it is made if missing)."""
    if directory in _unwritable:
        return False
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".probe.{os.getpid()}.{secrets.token_hex(4)}"
        probe.write_bytes(b"")
        probe.unlink()
        return True
    except OSError as error:
        _give_up(directory, error)
        return False


def _give_up(directory: Path, error: OSError) -> None:
    """Warn once that ``directory`` cannot be used, and stop trying it in this process."""
    if directory in _unwritable:
        return
    _unwritable.add(directory)
    warnings.warn(
        f"mxfp8_fusion cannot write its kernel cache in {directory} ({error}); kernels are "
        f"compiled in each process. Set {ENV} to a writable directory.",
        KernelCacheWarning,
        stacklevel=3,
    )


def build_and_store(build, compile_fn):
    """Compile ``build`` with ``compile_fn()`` and store it: in the cache directory, else
    (cache off, or the directory unusable: one warning) in this process's private one.
    Returns the compiled function and the directory it went to (None where no directory
    could be written: it is then launched as compiled)."""
    directory = cache_dir()
    notice(
        f"compiling a kernel, {build.describe()} (seconds; "
        + ("kept on disk for the next process)" if directory else "the disk cache is off)")
    )
    compiled = compile_fn()
    key = entry_key(build)
    if directory is not None and directory not in _unwritable:
        try:
            store(directory, key, build, compiled)
            return compiled, directory
        except OSError as error:
            _give_up(directory, error)
    try:
        private = _private_dir()
        store(private, key, build, compiled)
        return compiled, private
    except OSError:
        return compiled, None


def load_or_build(build, compile_fn):
    """``build``'s launchable function: loaded from the cache, else compiled by
    ``compile_fn()``, stored and loaded back (so every launch takes the same path)."""
    directory = cache_dir()
    key = entry_key(build)
    if directory is not None:  # a read-only directory may still hold entries
        function = load(directory, key)
        if function is not None:
            return function
    compiled, stored_in = build_and_store(build, compile_fn)
    function = load(stored_in, key) if stored_in is not None else None
    return function if function is not None else compiled
