"""The kernel cache on disk (kernels/runtime/cache.py), on the CPU: keys, corruption,
concurrent writers, unusable directories. Real builds compile under ``CUTE_DSL_ARCH``."""

import hashlib
import importlib.util
import json
import multiprocessing
import os
import stat
import subprocess
import sys
import warnings

import pytest
import torch

requires_cutlass = pytest.mark.skipif(
    importlib.util.find_spec("cutlass") is None, reason="nvidia-cutlass-dsl is not installed"
)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh cache directory for this test, builds forgotten before and after."""
    from mxfp8_fusion.kernels.runtime import cache as kernel_cache
    from mxfp8_fusion.kernels.runtime import launcher

    if not torch.cuda.is_available():
        monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    monkeypatch.setenv(kernel_cache.ENV, str(tmp_path / "kernels"))
    monkeypatch.setattr(launcher, "_functions", {})
    monkeypatch.setattr(kernel_cache, "_unwritable", set())
    monkeypatch.setattr(kernel_cache, "_untrusted", set())
    return tmp_path / "kernels"


class _Compiled:
    """Stands in for a compiled build: exports a few bytes, no compile needed."""

    def export_to_c(self, path, function_name):
        with open(path, "wb") as f:
            f.write(function_name.encode())


def _no_compile(*facts):
    raise AssertionError("these tests store what they built themselves")


def _build(width=256, arch="sm_90a"):
    from mxfp8_fusion.kernels.quantize import host as qs

    return qs.build_of(qs.config_of(False, width, 1, arch))


def _counting(monkeypatch):
    from mxfp8_fusion.kernels.runtime import launcher

    calls = []
    real = launcher.compile_build
    monkeypatch.setattr(launcher, "compile_build", lambda b: calls.append(b) or real(b))
    return calls


def test_key_names_everything_that_changes_the_binary(monkeypatch):
    from mxfp8_fusion.kernels.runtime import cache as kernel_cache

    key = kernel_cache.entry_key(_build())
    assert key == kernel_cache.entry_key(_build())
    assert key != kernel_cache.entry_key(_build(width=384))
    assert key != kernel_cache.entry_key(_build(arch="sm_100a"))
    monkeypatch.setattr(kernel_cache, "source_hash", lambda: "edited kernel source")
    assert key != kernel_cache.entry_key(_build())
    monkeypatch.undo()
    toolchain = {"packages": {"nvidia-cutlass-dsl": "9.9"}, "machine": "x86_64"}
    monkeypatch.setattr(kernel_cache, "toolchain", lambda: toolchain)
    assert key != kernel_cache.entry_key(_build())


def test_key_hashes_the_device_code_not_the_tuned_table():
    """A retuned table or a dispatch rule keeps every entry; every module that holds device
    code (a ``@cute`` function, an inline-PTX op) or compiles a build is hashed, and so is
    the storage format."""
    from mxfp8_fusion.kernels.runtime import cache as kernel_cache

    hashed = kernel_cache.device_sources()
    package = next(iter(hashed.values())).parents[1]
    for name in kernel_cache.HOST_ONLY:
        assert (package / name).is_file() and name not in hashed
    for path in package.rglob("*.py"):
        text = path.read_text()
        if any(mark in text for mark in ("@cute.", "@dsl_user_op", "def compile_")):
            assert path.relative_to(package).as_posix() in hashed
    assert "../format.py" in hashed


def test_key_is_the_same_in_another_process():
    from mxfp8_fusion.kernels.runtime import cache as kernel_cache

    code = (
        "from mxfp8_fusion.kernels.runtime import cache as kernel_cache;"
        "from mxfp8_fusion.kernels.quantize import host as qs;"
        "print(kernel_cache.entry_key(qs.build_of(qs.config_of(False, 256, 1, 'sm_90a'))))"
    )
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert other.stdout.strip() == kernel_cache.entry_key(_build())


def test_default_location_and_override(monkeypatch, tmp_path):
    from mxfp8_fusion.kernels.runtime import cache as kernel_cache

    monkeypatch.delenv(kernel_cache.ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert kernel_cache.cache_dir() == tmp_path / "mxfp8_fusion" / "kernels"
    monkeypatch.setenv(kernel_cache.ENV, "off")
    assert kernel_cache.cache_dir() is None
    monkeypatch.setattr(kernel_cache, "_override", [])
    kernel_cache.set_cache_dir(tmp_path / "mine")
    assert kernel_cache.cache_dir() == tmp_path / "mine"
    with pytest.raises(TypeError, match="^path:"):
        kernel_cache.set_cache_dir(3)


@pytest.mark.parametrize("off", ["", "off", " OFF ", "none", "0"])
def test_the_words_for_off_mean_off_in_the_variable_and_in_the_call(monkeypatch, off):
    from mxfp8_fusion.kernels.runtime import cache as kernel_cache

    monkeypatch.setattr(kernel_cache, "_override", [])
    monkeypatch.setenv(kernel_cache.ENV, off)
    assert kernel_cache.cache_dir() is None
    monkeypatch.delenv(kernel_cache.ENV)
    kernel_cache.set_cache_dir(off)  # '' wrote into the current directory
    assert kernel_cache.cache_dir() is None


@requires_cutlass
def test_entry_is_reused_by_a_fresh_process(cache, monkeypatch):
    from mxfp8_fusion.kernels.runtime import launcher

    calls = _counting(monkeypatch)
    launcher.function(_build())
    assert calls == [_build()] and len(list(cache.glob("*.o"))) == 1
    code = (
        "from mxfp8_fusion.kernels.runtime import launcher;"
        "from mxfp8_fusion.kernels.quantize import host as qs;"
        "launcher.compile_build = None;"  # a compile would fail: the entry must be loaded
        "launcher.function(qs.build_of(qs.config_of(False, 256, 1, 'sm_90a')))"
    )
    env = {**os.environ, "CUTE_DSL_ARCH": "sm_90a"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=300)


@requires_cutlass
@pytest.mark.parametrize("damage", ["truncate", "flip", "drop record", "other key"])
def test_a_damaged_entry_is_rebuilt_not_loaded(cache, monkeypatch, damage):
    from mxfp8_fusion.kernels.runtime import cache as kernel_cache
    from mxfp8_fusion.kernels.runtime import launcher

    build = _build()
    launcher.function(build)
    key = kernel_cache.entry_key(build)
    obj, record = cache / f"{key}.o", cache / f"{key}.json"
    data = obj.read_bytes()
    if damage == "truncate":
        obj.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        obj.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    elif damage == "drop record":
        record.unlink()
    else:
        fields = json.loads(record.read_text())
        record.write_text(json.dumps({**fields, "key": "0" * 64}))
    assert not kernel_cache.stored(cache, build)
    launcher._functions.clear()
    calls = _counting(monkeypatch)
    launcher.function(build)
    assert calls == [build]  # rebuilt, and the entry repaired
    assert kernel_cache.stored(cache, build)
    assert hashlib.sha256(obj.read_bytes()).hexdigest() == json.loads(record.read_text())["sha256"]


def _store_concurrently(directory: str, rounds: int) -> None:
    from mxfp8_fusion.kernels.runtime import cache as kernel_cache
    from mxfp8_fusion.kernels.runtime import launcher

    class Slow:  # a compiled build whose object file is written in pieces
        def export_to_c(self, path, function_name):
            with open(path, "wb") as f:
                for i in range(64):
                    f.write(bytes([i]) * 4096)
                    f.flush()

    build = launcher.Build("quantizer", ("concurrency",), "sm_90a", _no_compile)
    for _ in range(rounds):
        kernel_cache.store(kernel_cache.Path(directory), build, Slow())
        record = kernel_cache._verified(kernel_cache.Path(directory), build)
        assert record is not None and record["size"] == 64 * 4096


def test_concurrent_writers_never_leave_half_an_entry(tmp_path):
    context = multiprocessing.get_context("spawn")
    workers = [
        context.Process(target=_store_concurrently, args=(str(tmp_path), 20)) for _ in range(4)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    assert [w.exitcode for w in workers] == [0, 0, 0, 0]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporaries


@requires_cutlass
def test_unwritable_directory_warns_once_and_still_runs(cache, monkeypatch, tmp_path):
    from mxfp8_fusion.kernels.runtime import cache as kernel_cache
    from mxfp8_fusion.kernels.runtime import launcher

    blocker = tmp_path / "a file"
    blocker.write_text("")
    monkeypatch.setenv(kernel_cache.ENV, str(blocker / "kernels"))  # cannot be made
    with pytest.warns(kernel_cache.KernelCacheWarning, match="cannot write its kernel cache"):
        first = launcher.function(_build())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        second = launcher.function(_build(width=384))
    assert callable(first) and callable(second)


@requires_cutlass
def test_full_directory_falls_back_with_one_warning(cache, monkeypatch):
    from mxfp8_fusion.kernels.runtime import cache as kernel_cache
    from mxfp8_fusion.kernels.runtime import launcher

    real = kernel_cache.store

    def full(directory, *args):
        if directory == cache:
            raise OSError(28, "No space left on device")
        return real(directory, *args)

    monkeypatch.setattr(kernel_cache, "store", full)
    with pytest.warns(kernel_cache.KernelCacheWarning, match="No space left"):
        fn = launcher.function(_build())
    assert callable(fn) and not kernel_cache.stored(cache, _build())


@requires_cutlass
def test_read_only_cache_with_entries_is_still_read(cache, monkeypatch):
    from mxfp8_fusion.kernels.runtime import cache as kernel_cache
    from mxfp8_fusion.kernels.runtime import launcher

    launcher.function(_build())
    launcher._functions.clear()
    kernel_cache._unwritable.add(cache)  # as after a failed write
    calls = _counting(monkeypatch)
    launcher.function(_build())
    assert calls == []


@requires_cutlass
@pytest.mark.parametrize("lie", ["another build's entry", "another toolchain", "another source"])
def test_an_entry_is_used_only_for_the_build_it_records(cache, monkeypatch, lie):
    """An entry whose record names anything but the build asked for (here put under the
    asked-for key, with that key written into its record) is a miss: rebuilt, replaced."""
    from mxfp8_fusion.kernels.runtime import cache as kernel_cache
    from mxfp8_fusion.kernels.runtime import launcher

    asked, other = _build(width=384), _build(width=256)
    launcher.function(other if lie == "another build's entry" else asked)
    key = kernel_cache.entry_key(asked)
    if lie == "another build's entry":
        other_key = kernel_cache.entry_key(other)
        (cache / f"{key}.o").write_bytes((cache / f"{other_key}.o").read_bytes())
        fields = json.loads((cache / f"{other_key}.json").read_text())
    else:
        fields = json.loads((cache / f"{key}.json").read_text())
        field = "toolchain" if lie == "another toolchain" else "source"
        fields[field] = {"packages": {}, "machine": "elsewhere"} if field == "toolchain" else "0"
    (cache / f"{key}.json").write_text(json.dumps({**fields, "key": key}))
    assert not kernel_cache.stored(cache, asked)
    launcher._functions.clear()
    calls = _counting(monkeypatch)
    launcher.function(asked)
    assert calls == [asked] and kernel_cache.stored(cache, asked)
    assert json.loads((cache / f"{key}.json").read_text())["function"].endswith(key[:24])


def test_entries_are_private_whatever_the_umask(cache):
    from mxfp8_fusion.kernels.runtime import cache as kernel_cache
    from mxfp8_fusion.kernels.runtime import launcher

    directory = cache / "a" / "b"
    kernel_cache.set_cache_dir(directory)
    build = launcher.Build("quantizer", ("private",), "sm_90a", _no_compile)
    old = os.umask(0)
    try:
        _, stored_in = kernel_cache.build_and_store(build, _Compiled)
    finally:
        os.umask(old)
        kernel_cache._override.clear()
    assert stored_in == directory
    for made in (cache, cache / "a", directory):
        assert stat.S_IMODE(made.stat().st_mode) == 0o700, made
    entries = sorted(directory.iterdir())
    assert len(entries) == 2 and all(stat.S_IMODE(e.stat().st_mode) == 0o600 for e in entries)


@pytest.mark.parametrize("exposure", ["world-writable", "group-writable", "another owner"])
def test_a_directory_others_can_write_is_neither_read_nor_written(cache, monkeypatch, exposure):
    from mxfp8_fusion.kernels.runtime import cache as kernel_cache
    from mxfp8_fusion.kernels.runtime import launcher

    build, second = (launcher.Build("quantizer", (name,), "sm_90a", _no_compile) for name in "ab")
    kernel_cache.build_and_store(build, _Compiled)
    assert kernel_cache.stored(cache, build)
    if exposure == "another owner":
        uid = os.getuid()
        monkeypatch.setattr(kernel_cache.os, "getuid", lambda: uid + 1)
    else:
        cache.chmod(0o777 if exposure == "world-writable" else 0o770)
    with pytest.warns(kernel_cache.KernelCacheWarning, match="chmod 700") as caught:
        assert not kernel_cache.stored(cache, build)
        _, stored_in = kernel_cache.build_and_store(second, _Compiled)
    assert len(caught) == 1 and str(cache) in str(caught[0].message)
    assert (
        stored_in not in (None, cache)
        and not (cache / f"{kernel_cache.entry_key(second)}.o").exists()
    )


def test_an_entry_file_others_can_write_is_not_loaded(cache):
    from mxfp8_fusion.kernels.runtime import cache as kernel_cache
    from mxfp8_fusion.kernels.runtime import launcher

    build = launcher.Build("quantizer", ("file",), "sm_90a", _no_compile)
    kernel_cache.build_and_store(build, _Compiled)
    (cache / f"{kernel_cache.entry_key(build)}.o").chmod(0o666)
    assert not kernel_cache.stored(cache, build)
