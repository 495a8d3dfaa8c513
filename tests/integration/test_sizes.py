"""Size limits that keep the code readable in one sitting: no source file over 500 lines, no
test file over 450, no function over 80 (a ``@cute.kernel`` body excepted: it is one device
entry point, and splitting it only moves its parameter list around). Each test lists every
offender."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# the package (passes and kernels are reached through links under mxfp8_fusion, which rglob
# does not follow), and the rest of the code
SOURCE = ("mxfp8_fusion", "passes", "kernels", "benchmarks", "tests", "examples")
MAX_FILE_LINES = 500
MAX_TEST_FILE_LINES = 450
MAX_FUNCTION_LINES = 80
EXEMPT_DECORATORS = {"cute.kernel"}


def _python_files() -> list[Path]:
    return sorted(f for name in SOURCE for f in (ROOT / name).rglob("*.py"))


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def _functions(path: Path):
    """(qualified name, lines from ``def`` to the end, decorators) of each function."""
    found = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = child.end_lineno - child.lineno + 1
                decorators = {ast.unparse(d).split("(")[0] for d in child.decorator_list}
                found.append((f"{prefix}{child.name}", length, decorators))
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text()), "")
    return found


def _long_functions() -> dict[str, int]:
    long = {}
    for path in _python_files():
        for name, length, decorators in _functions(path):
            if length > MAX_FUNCTION_LINES and not decorators & EXEMPT_DECORATORS:
                long[f"{path.relative_to(ROOT)}::{name}"] = length
    return long


def test_no_source_file_is_over_500_lines():
    offenders = [
        f"{f.relative_to(ROOT)}: {_lines(f)} lines"
        for f in _python_files()
        if _lines(f) > MAX_FILE_LINES
    ]
    assert not offenders, f"over {MAX_FILE_LINES} lines:\n" + "\n".join(offenders)


def test_no_test_file_is_over_450_lines():
    tests = [f for f in _python_files() if f.name.startswith("test_")]
    offenders = [
        f"{f.relative_to(ROOT)}: {_lines(f)} lines"
        for f in tests
        if _lines(f) > MAX_TEST_FILE_LINES
    ]
    assert not offenders, f"test files over {MAX_TEST_FILE_LINES} lines:\n" + "\n".join(offenders)


def test_no_function_is_over_80_lines():
    long = _long_functions()
    offenders = [f"{name}: {length} lines" for name, length in long.items()]
    message = f"functions over {MAX_FUNCTION_LINES} lines (split them):\n"
    assert not offenders, message + "\n".join(offenders)


def test_a_function_is_measured_from_def_to_its_end(tmp_path):
    """Decorators are not counted, methods are named by their class, and ``@cute.kernel``
    is told apart from ``@cute.jit``."""
    body = "".join(f"        x{i} = {i}\n" for i in range(80))
    path = tmp_path / "m.py"
    path.write_text(
        "class C:\n    @cute.kernel\n    def k(self):\n" + body
        + "\n    @cute.jit\n    def j(self):\n" + body
        + "\n    def f(self):\n" + body[: -len("        x79 = 79\n")]
    )  # fmt: skip
    found = {name: (length, decorators) for name, length, decorators in _functions(path)}
    assert found == {
        "C.k": (81, {"cute.kernel"}),
        "C.j": (81, {"cute.jit"}),
        "C.f": (80, set()),
    }
