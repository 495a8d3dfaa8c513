"""The kernel cache on disk: each kernel build compiled once per machine, not once per process.

An entry is the build's object file as the DSL exports it (``export_to_c``), loaded back
with ``cutlass.cute.runtime.load_module`` (milliseconds, against seconds for a compile),
beside a small JSON record of its SHA-256 and what it was built from.

* Key: a hash of everything that changes the binary: the build (kernel kind, compile-time
  facts, arch), the source the device code is made of (:func:`device_sources`: not the
  tuned table nor the host modules that only choose builds), and the versions of the DSL,
  its CUDA libraries and TVM-FFI. A change to any of them is another key, so a stale entry is never
  found, let alone served.
* Location: ``MXFP8_FUSION_CACHE_DIR``, else ``$XDG_CACHE_HOME/mxfp8_fusion/kernels``
  (``~/.cache`` without it), or :func:`set_cache_dir` in the process. ``off``, ``none``,
  ``0`` or an empty string turn the cache off, in either.
* Validity: an entry is loaded only where its record names exactly the build asked for
  (the facts, the source, the toolchain, the key and the exported function) and its object
  file's size and SHA-256 match the record. Anything else (truncated, corrupted, replaced
  between the two renames, recorded for another build) is a miss: rebuilt, and replaced.
  Entries are written to a temporary name and renamed into place, so concurrent processes
  never see half an entry.
* Trust: an entry is native code that every later process runs, so the cache keeps to
  itself: directories it creates are 0700 and its files 0600, whatever the umask, and it
  neither reads nor writes a directory that another user owns or that group or others can
  write (as ssh refuses such a ``~/.ssh``), nor loads a file that is not private in the same
  sense. Such a directory costs one warning naming it and the fix; so does one that cannot
  be written (read-only, full), which is still read. The process then keeps its builds in a
  private temporary directory.
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
import stat
import tempfile
import warnings
from importlib import metadata
from pathlib import Path

from ...progress import notice

ENV = "MXFP8_FUSION_CACHE_DIR"


class KernelCacheWarning(UserWarning):
    """The kernel cache directory cannot be used; kernels are compiled per process."""


_override: list = []  # [Path | None] once set_cache_dir was called
_unwritable: set[Path] = set()  # cannot be written to: still read
_untrusted: set[Path] = set()  # other users can write there: neither read nor written
_private: list[Path] = []
_OFF = ("", "off", "0", "none")


def default_dir() -> Path:
    """``$XDG_CACHE_HOME/mxfp8_fusion/kernels``, ``~/.cache/mxfp8_fusion/kernels`` without it."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mxfp8_fusion" / "kernels"


def _from_text(text: str) -> Path | None:
    """A directory spelled as text (the environment variable, or a str given to
    :func:`set_cache_dir`): None for the words that turn the cache off."""
    return None if text.strip().lower() in _OFF else Path(text)


def cache_dir() -> Path | None:
    """The directory kernels are cached in; None where the cache is off."""
    if _override:
        return _override[0]
    env = os.environ.get(ENV)
    if env is not None:
        return _from_text(env)
    return default_dir()


def set_cache_dir(path: str | os.PathLike | None) -> None:
    """Cache kernels in ``path`` from now on in this process. ``None``, or a str that
    ``MXFP8_FUSION_CACHE_DIR`` reads as off (``""``, ``"off"``, ``"none"``, ``"0"``), turns
    the disk cache off. Builds already loaded stay loaded.

    Raises:
        TypeError: ``path`` is neither a str, an ``os.PathLike`` nor None.
    """
    if path is None or isinstance(path, str):
        _override[:] = [None if path is None else _from_text(path)]
    elif isinstance(path, os.PathLike):
        _override[:] = [Path(path)]
    else:
        raise TypeError(f"path: expected a str, os.PathLike or None, got {type(path).__name__}")


HOST_ONLY = (
    "capability.py",
    "dispatch.py",
    "gemm_cublas.py",
    "gemm_sm90/tuning/search.py",
    "gemm_sm90/tuning/select.py",
    "gemm_sm90/tuning/table.py",
    "runtime/cache.py",
)
"""Modules of the kernel package that choose, route or store builds but never shape a
binary (what they choose is in the build's facts and arch): an edit there, a retuned table
say, keeps every cached entry. Everything else is hashed, so a new module errs towards a
rebuild."""


def device_sources() -> dict[str, Path]:
    """The files a kernel binary is made of, by their names in the package: the kernel
    package's modules but :data:`HOST_ONLY`, and the storage format they build against."""
    from ... import format as storage_format

    package = Path(__file__).parents[1]
    names = {p.relative_to(package).as_posix(): p for p in sorted(package.rglob("*.py"))}
    found = {name: path for name, path in names.items() if name not in HOST_ONLY}
    return {**found, "../format.py": Path(storage_format.__file__)}


@functools.cache
def source_hash() -> str:
    """SHA-256 of :func:`device_sources` (each file's name and bytes)."""
    digest = hashlib.sha256()
    for name, path in device_sources().items():
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
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


def _identity(build) -> dict:
    """Everything that changes ``build``'s binary, as its record holds it (JSON values)."""
    return {
        "build": [build.kind, repr(build.facts), build.arch],
        "source": source_hash(),
        "toolchain": toolchain(),
    }


def _key_of(identity: dict) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def entry_key(build) -> str:
    """The cache key of ``build`` (a ``launcher.Build``): hex SHA-256 of everything that
    changes its binary."""
    return _key_of(_identity(build))


def _function_name(key: str) -> str:
    return f"mxfp8_fusion_{key[:24]}"


def _not_private(st: os.stat_result) -> str | None:
    """Why a file or directory with these facts may hold what another user wrote, else None."""
    uid = os.getuid() if hasattr(os, "getuid") else st.st_uid
    if st.st_uid != uid:
        return f"it is owned by another user (uid {st.st_uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return "its group or other users can write to it"
    return None


def _read_private(path: Path) -> bytes:
    """The bytes of ``path``; ``OSError`` where it is not this user's alone to write."""
    with open(path, "rb") as f:
        if _not_private(os.fstat(f.fileno())):
            raise PermissionError(f"{path} is not private")
        return f.read()


def _verified(directory: Path, build) -> dict | None:
    """The record of ``build``'s entry in ``directory`` where it is valid (the record names
    exactly this build, its object file's size and SHA-256 match, both files private),
    else None."""
    identity = _identity(build)
    key = _key_of(identity)
    try:
        record = json.loads(_read_private(directory / f"{key}.json"))
        data = _read_private(directory / f"{key}.o")
    except (OSError, ValueError):
        return None
    expected = {
        **identity,
        "key": key,
        "function": _function_name(key),
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    valid = isinstance(record, dict) and all(record.get(f) == v for f, v in expected.items())
    return record if valid else None


def stored(directory: Path | None, build) -> bool:
    """Whether ``directory`` holds a valid entry for ``build`` (checked, not loaded)."""
    return directory is not None and trusted(directory) and _verified(directory, build) is not None


def load(directory: Path, build):
    """``build``'s function stored in ``directory``, or None where there is no valid entry
    (missing, truncated, corrupted, recorded for another build, not private, not loadable)."""
    record = _verified(directory, build)
    if record is None:
        return None
    try:
        from cutlass.cute.runtime import load_module

        module = load_module(str(directory / f"{record['key']}.o"), enable_tvm_ffi=True)
        return getattr(module, record["function"])
    except Exception:  # an entry the DSL cannot load is a miss: the build is redone
        return None


def _make_dirs(directory: Path) -> None:
    """Make ``directory`` and its missing parents, each 0700 whatever the umask."""
    missing = []
    while not directory.exists() and directory != directory.parent:
        missing.append(directory)
        directory = directory.parent
    for path in reversed(missing):
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:  # made meanwhile by another process
            continue
        os.chmod(path, 0o700)  # mkdir's mode passes through the umask


def _replace_atomically(directory: Path, name: str, write) -> None:
    tmp = directory / f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        write(tmp)
        os.chmod(tmp, 0o600)  # the writer's mode passes through the umask
        os.replace(tmp, directory / name)
    finally:
        tmp.unlink(missing_ok=True)


def store(directory: Path, build, compiled) -> None:
    """Write ``compiled`` (a TVM-FFI build of ``build``) in ``directory``: the object file
    first, then its record, each renamed into place. Raises ``OSError`` where the directory
    is unusable."""
    _make_dirs(directory)
    identity = _identity(build)
    key = _key_of(identity)
    name = _function_name(key)
    data: list[bytes] = []

    def write_object(tmp: Path) -> None:
        compiled.export_to_c(str(tmp), function_name=name)
        data.append(tmp.read_bytes())

    _replace_atomically(directory, f"{key}.o", write_object)
    record = {
        **identity,
        "key": key,
        "function": name,
        "size": len(data[0]),
        "sha256": hashlib.sha256(data[0]).hexdigest(),
        "description": build.describe(),
    }
    _replace_atomically(directory, f"{key}.json", lambda p: p.write_text(json.dumps(record)))


def _private_dir() -> Path:
    if not _private:
        path = Path(tempfile.mkdtemp(prefix="mxfp8_fusion-kernels-"))
        atexit.register(shutil.rmtree, path, ignore_errors=True)
        _private.append(path)
    return _private[0]


def trusted(directory: Path) -> bool:
    """Whether ``directory`` may be read and written: missing (it is made private), or this
    user's and writable by no one else. The first refusal of a directory warns."""
    if directory in _untrusted:
        return False
    try:
        reason = _not_private(os.stat(directory))
    except OSError:  # missing, or not reachable: writing it will say
        return True
    if reason is None:
        return True
    _untrusted.add(directory)
    warnings.warn(
        f"mxfp8_fusion does not use the kernel cache in {directory}: {reason}, and every "
        f"process would run the kernels it finds there. Make it yours alone (chown it to "
        f"you, chmod 700 {directory}), or set {ENV} to such a directory; until then kernels "
        "are compiled in each process.",
        KernelCacheWarning,
        stacklevel=3,
    )
    return False


def writable(directory: Path) -> bool:
    """Whether builds can be stored in ``directory`` (it is made if missing)."""
    if directory in _unwritable or not trusted(directory):
        return False
    try:
        _make_dirs(directory)
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
    directory = _trusted_cache_dir()
    notice(
        f"compiling a kernel, {build.describe()} (seconds; "
        + ("kept on disk for the next process)" if directory else "the disk cache is off)")
    )
    compiled = compile_fn()
    if directory is not None and directory not in _unwritable:
        try:
            store(directory, build, compiled)
            return compiled, directory
        except OSError as error:
            _give_up(directory, error)
    try:
        private = _private_dir()
        store(private, build, compiled)
        return compiled, private
    except OSError:
        return compiled, None


def _trusted_cache_dir() -> Path | None:
    directory = cache_dir()
    return directory if directory is not None and trusted(directory) else None


def load_or_build(build, compile_fn):
    """``build``'s launchable function: loaded from the cache, else compiled by
    ``compile_fn()``, stored and loaded back (so every launch takes the same path)."""
    directory = _trusted_cache_dir()
    if directory is not None:  # a read-only directory may still hold entries
        function = load(directory, build)
        if function is not None:
            return function
    compiled, stored_in = build_and_store(build, compile_fn)
    function = load(stored_in, build) if stored_in is not None else None
    return function if function is not None else compiled
