"""Packaging: the README's test command (``pip install -e ".[test]" && python -m pytest -q``)
on a fresh CPU machine installs everything the non-GPU tests import, directly or through
torchao, so none of them skips there for a missing package; the repository's folders never
stand in for installed packages; the editable install and a wheel import alike."""

import ast
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the TOML reader pip itself carries
    from pip._vendor import tomli as tomllib

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"

# what the tests import beyond torch and the package's own dependencies, and the packages
# those need without declaring them (torchao imports numpy: without it test_format.py's
# torchao cross-check is skipped)
NEEDED_BY_TESTS = {"pytest", "expecttest", "torchao", "numpy"}


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower() for r in requirements}


def test_test_extra_holds_what_the_tests_need():
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    installed = _names(project["optional-dependencies"]["test"]) | _names(project["dependencies"])
    missing = NEEDED_BY_TESTS - installed
    assert not missing, f"add {sorted(missing)} to [project.optional-dependencies] test"


ROOT = PYPROJECT.parent


def _python(code: str, cwd: Path, **env: str) -> str:
    run = subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout.strip()


def test_the_top_level_folders_never_shadow_an_installed_package(tmp_path):
    """From the repository root (first on ``sys.path`` for ``python -c``, ``python -m
    pytest``, a REPL), ``import kernels`` and ``import passes`` find what the environment
    has installed, not this repository's folders: transformers imports Hugging Face's
    ``kernels``."""
    for name in ("kernels", "passes"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("ORIGIN = 'installed'\n")
    code = "import kernels, passes; print(kernels.ORIGIN, passes.ORIGIN)"
    assert _python(code, ROOT, PYTHONPATH=str(tmp_path)) == "installed installed"


def test_import_kernels_is_hugging_faces_where_it_is_installed():
    try:
        installed = metadata.distribution("kernels").locate_file("kernels/__init__.py")
    except metadata.PackageNotFoundError:
        pytest.skip("Hugging Face's kernels is not installed")
    where = _python("import kernels; print(kernels.__file__)", ROOT)
    assert Path(where).resolve() == Path(installed).resolve()


_IMPORT_ALL = (
    "import mxfp8_fusion, mxfp8_fusion.kernels.dispatch, mxfp8_fusion.passes.fusion;"
    "print(mxfp8_fusion.__file__, mxfp8_fusion.FusionPass.__module__)"
)


def test_the_installed_package_imports_from_anywhere(tmp_path):
    """Outside the repository the subpackages come from the install (editable or not)."""
    where, module = _python(_IMPORT_ALL, tmp_path).split()
    assert Path(where).name == "__init__.py" and module == "mxfp8_fusion.passes.fusion"


@pytest.mark.skipif(importlib.util.find_spec("setuptools") is None, reason="needs setuptools")
def test_the_wheel_holds_every_subpackage(tmp_path):
    """A wheel built from a copy of the checkout (setuptools writes into the tree it
    builds), unpacked and imported from outside it, has the kernels and the pass under
    ``mxfp8_fusion/`` and the backend's entry point."""
    tree = tmp_path / "tree"
    for name in ("mxfp8_fusion", "kernels", "passes"):
        ignore = shutil.ignore_patterns("__pycache__")
        shutil.copytree(ROOT / name, tree / name, symlinks=True, ignore=ignore)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, tree / name)
    build = [sys.executable, "-m", "pip", "wheel", str(tree), "--no-deps", "--no-build-isolation"]
    subprocess.run([*build, "-q", "-w", str(tmp_path)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("mxfp8_fusion-*.whl")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    for name in ("kernels", "passes"):  # every module and data file of every subfolder
        sources = {p.relative_to(ROOT / name) for p in (ROOT / name).rglob("*.py")}
        sources |= {p.relative_to(ROOT / name) for p in (ROOT / name).rglob("*.json")}
        shipped = {
            p.relative_to(site / "mxfp8_fusion" / name)
            for p in (site / "mxfp8_fusion" / name).rglob("*")
        }
        assert sources - shipped == set(), f"add {name}'s subpackages to pyproject's packages"
    where, _ = _python(_IMPORT_ALL, tmp_path, PYTHONPATH=str(site)).split()
    assert Path(where) == site / "mxfp8_fusion" / "__init__.py"
    (entry_points,) = site.glob("*.dist-info/entry_points.txt")
    assert "mxfp8_fusion.passes.backend:mxfp8_fusion_backend" in entry_points.read_text()


def _imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_examples_extra_holds_what_the_examples_import():
    """The examples need transformers, which the package itself does not: the ``examples``
    extra installs it."""
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    examples = sorted((ROOT / "examples").glob("*.py"))
    local = {path.stem for path in examples}
    needed = set().union(*map(_imported, examples)) - local - set(sys.stdlib_module_names)
    extra = _names(project["optional-dependencies"]["examples"]) | _names(project["dependencies"])
    assert needed - {"mxfp8_fusion"} <= extra, f"add {sorted(needed - extra)} to examples"
