"""Resolve the plugin's vLLM hooks in a release's sources without importing vLLM.

A vLLM GPU wheel pins a torch this machine does not have, so its code cannot be imported
here; its Python sources can be read. :class:`Sources` opens a wheel (or an unpacked tree)
and :meth:`Sources.signature` finds a hook's object by walking the module's syntax tree:
classes and functions defined there, names it imports (followed to their module), and names
a module-level ``__getattr__`` serves. A renamed object, a moved module or a changed
parameter list is a :class:`LookupError`, as :meth:`Hook.resolve` raises on an installed
vLLM.
"""

from __future__ import annotations

import ast
import os
import re
import zipfile
from pathlib import Path

WHEEL_DIRECTORY = "MXFP8_FUSION_VLLM_WHEELS"
"""Where ``pip download --no-deps vllm==X`` wheels are (``.ci/vllm`` fills it)."""


def wheel_directory() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return Path(os.environ.get(WHEEL_DIRECTORY, default / "mxfp8_fusion" / "vllm-wheels"))


def wheel_for(release: str) -> Path | None:
    """The cached ``vllm`` wheel of ``release`` (``"0.34"``: the newest 0.34.x there)."""
    pattern = re.compile(rf"vllm-{re.escape(release)}\.(\d+)-.*\.whl$")
    found = sorted(
        (int(m[1]), p) for p in wheel_directory().glob("vllm-*.whl") if (m := pattern.match(p.name))
    )
    return found[-1][1] if found else None


class Sources:
    """The ``vllm`` package's Python files in a wheel or a directory holding ``vllm/``."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._trees: dict[str, ast.Module] = {}
        if self.path.is_dir():
            self._files = {
                str(p.relative_to(self.path)): p for p in self.path.rglob("vllm/**/*.py")
            }
            self._zip = None
        else:
            self._zip = zipfile.ZipFile(self.path)
            self._files = {n: n for n in self._zip.namelist() if n.startswith("vllm/")}

    def is_package(self, module: str) -> bool:
        return module.replace(".", "/") + "/__init__.py" in self._files

    def text(self, module: str) -> str | None:
        """The source of ``module`` (a module file or a package's ``__init__.py``)."""
        base = module.replace(".", "/")
        for name in (f"{base}.py", f"{base}/__init__.py"):
            if name in self._files:
                if self._zip is not None:
                    return self._zip.read(name).decode()
                return self._files[name].read_text()
        return None

    def tree(self, module: str) -> ast.Module:
        if module not in self._trees:
            text = self.text(module)
            if text is None:
                raise LookupError(f"cannot import {module} (no such module)")
            self._trees[module] = ast.parse(text)
        return self._trees[module]

    def version(self) -> str:
        """The release these sources are (``vllm/_version.py``, else the wheel's name)."""
        text = self.text("vllm._version") or ""
        match = re.search(r"version\s*(?::\s*str\s*)?=\s*['\"]([^'\"]+)", text)
        if match:
            return match[1]
        return self.path.name.split("-")[1]

    def find(self, module: str, name: str, depth: int = 0):
        """The syntax node ``module.name`` is (a dotted ``name`` goes into classes)."""
        head, _, rest = name.partition(".")
        node = self._top_level(module, head, depth)
        for part in rest.split(".") if rest else ():
            if not isinstance(node, ast.ClassDef):
                raise LookupError(f"{module}.{name} does not exist")
            node = next(
                (n for n in node.body if _defines(n, part)),
                None,
            )
            if node is None:
                raise LookupError(f"{module}.{name} does not exist")
        return node

    def _top_level(self, module: str, name: str, depth: int):
        if depth > 8:
            raise LookupError(f"{module}.{name}: import chain too deep")
        tree = self.tree(module)
        for node in tree.body:
            if _defines(node, name):
                return node
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        source = _absolute(module, node, self.is_package(module))
                        return self.find(source, alias.name, depth + 1)
        if _getattr_serves(tree, name):
            return ast.Name(id=name)  # served lazily (vllm.platforms.current_platform)
        raise LookupError(f"{module}.{name} does not exist")

    def signature(self, module: str, name: str) -> tuple[str, ...] | None:
        """The parameter names of ``module.name`` when it is a function, else ``None``."""
        node = self.find(module, name)
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            return None
        a = node.args
        names = [p.arg for p in (*a.posonlyargs, *a.args)]
        names += [a.vararg.arg] if a.vararg else []
        names += [p.arg for p in a.kwonlyargs]
        names += [a.kwarg.arg] if a.kwarg else []
        return tuple(names)  # as inspect.signature lists them


def _defines(node, name: str) -> bool:
    if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
        return node.name == name
    if isinstance(node, ast.Assign):
        return any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
    if isinstance(node, ast.AnnAssign):
        return isinstance(node.target, ast.Name) and node.target.id == name
    return False


def _absolute(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module
    # a package's __init__ resolves relative imports from itself, a module from its parent
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _getattr_serves(tree: ast.Module, name: str) -> bool:
    getattr_ = next(
        (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "__getattr__"), None
    )
    if getattr_ is None:
        return False
    return any(isinstance(n, ast.Constant) and n.value == name for n in ast.walk(getattr_))


def load_function(sources: Sources, module: str, name: str, namespace: dict):
    """The function ``module.name`` compiled from the release's own source into
    ``namespace`` (its globals): vLLM's code, run here without its module's imports."""
    node = sources.find(module, name)
    if not isinstance(node, ast.FunctionDef):
        raise LookupError(f"{module}.{name} is not a function")
    node = ast.FunctionDef(**{**vars(node), "decorator_list": [], "returns": None})
    for arg in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs):
        arg.annotation = None  # annotations name types this namespace does not import
    code = compile(ast.fix_missing_locations(ast.Module([node], [])), f"<{module}>", "exec")
    exec(code, namespace)
    return namespace[node.name]


def load_block(sources: Sources, module: str, name: str, test: str, params, namespace: dict):
    """The first ``if <test>:`` statement of ``module.name``'s body, as a function of
    ``params`` that returns its locals: one step of a long vLLM method, run alone."""
    function = sources.find(module, name)
    block = next(
        n for n in ast.walk(function) if isinstance(n, ast.If) and ast.unparse(n.test) == test
    )
    result = ast.parse("return locals()").body[0]
    args = ast.arguments(
        posonlyargs=[],
        args=[ast.arg(p) for p in params],
        kwonlyargs=[],
        kw_defaults=[],
        defaults=[],
    )
    node = ast.FunctionDef(name="block", args=args, body=[block, result], decorator_list=[])
    code = compile(ast.fix_missing_locations(ast.Module([node], [])), f"<{module}>", "exec")
    exec(code, namespace)
    return namespace["block"]
