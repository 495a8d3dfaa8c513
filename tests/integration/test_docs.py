"""The README's code runs as written, and user-facing text names nothing outside the
repository."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


_SNIPPETS = [
    (page, index)
    for page in (README, ROOT / "docs" / "tensor_parallel.md")
    for index in range(len(_python_blocks(page.read_text())))
]


@pytest.mark.slow
@pytest.mark.parametrize(("page", "index"), _SNIPPETS, ids=lambda v: getattr(v, "name", v))
def test_readme_snippet_runs(page, index):
    """Each snippet of the README and the guides in a fresh interpreter, as a reader would
    paste it (a snippet that sets up a process group leaves no state behind for other
    tests)."""
    code = _python_blocks(page.read_text())[index]
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-4000:]


def test_readme_is_short_and_shows_both_commands():
    text = README.read_text()
    assert len(text.splitlines()) <= 150
    assert "python -m mxfp8_fusion demo" in text
    assert "python -m pytest" in text


# Paths, tools and machines that exist only where this project is developed.
_OUTSIDE = re.compile(
    r"\.\./shared|(^|[\s`'\"(])\.device\b|bootstrap\.sh"
    r"|GPU machine's copy|on these machines|lent (GPU|H200|machine)"
)
_USER_TEXT = ("README.md", "docs", "mxfp8_fusion", "passes", "kernels", "benchmarks",
              "examples", ".ci", "pyproject.toml")  # fmt: skip


def _user_files():
    for name in _USER_TEXT:
        path = ROOT / name
        files = [path] if path.is_file() else sorted(path.rglob("*")) if path.exists() else []
        for f in files:
            if f.is_file() and f.suffix in ("", ".md", ".py", ".toml", ".sh", ".txt"):
                yield f


def test_no_user_text_names_paths_outside_the_repository():
    offenders = []
    for f in _user_files():
        for number, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            if _OUTSIDE.search(line):
                offenders.append(f"{f.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_no_command_holds_a_placeholder_for_this_repository():
    """A reader cannot run ``git clone <this repository>``: install commands start from the
    checkout they already have."""
    placeholder = re.compile(r"<(this|the) (repository|repo)\b|<repo(sitory)?[-_ ]?(url)?>", re.I)
    offenders = [
        f"{f.relative_to(ROOT)}:{number}"
        for f in _user_files()
        for number, line in enumerate(f.read_text(errors="replace").splitlines(), 1)
        if placeholder.search(line)
    ]
    assert not offenders, offenders


def test_readme_links_resolve():
    text = README.read_text()
    for target in re.findall(r"\]\(([^)#]+)\)", text):
        if "://" not in target:
            assert (ROOT / target).exists(), target
