"""The README's test command (``pip install -e ".[test]" && python -m pytest -q``) on a
fresh CPU machine installs everything the non-GPU tests import, directly or through
torchao, so none of them skips there for a missing package."""

import re
import sys
from pathlib import Path

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
