"""The package's layers import one way (docs/architecture.md, 'Layers'): every module of
mxfp8_fusion/, kernels/ and passes/ sits in one layer of :data:`LAYERS`, and its import
statements (read with ast, lazy imports in functions and ``TYPE_CHECKING`` blocks too) name
only modules of its own layer or of the layers it may use."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "mxfp8_fusion"

# layer: (the modules in it, by dotted name in the package or a prefix of one, the layers
# its modules may import besides their own). A module takes the layer of its longest prefix.
LAYERS = {
    # storage-format facts and the user-facing notices: import nothing of the package
    "ground": (("format", "progress"), ()),
    # the kernels, their compile cache and dispatch: the format facts, never an op or an API
    "kernels": (("kernels",), ("ground",)),
    # the custom ops, their references and Inductor fallbacks: over the kernels' dispatch
    "ops": (("reference", "lowering", "grad", "ops"), ("ground", "kernels")),
    # the FX pass and the backend: rewrite graphs of the ops; no kernel, no model code
    "passes": (("passes",), ("ground", "ops")),
    # what users call: the eager API, modules, tensor parallel, warm-up, explain (it reads
    # nn's conversion rules), the package's own namespace
    "api": (
        (
            "",
            "api",
            "checks",
            "w8a16",
            "interop",
            "nn",
            "project",
            "sites",
            "stager",
            "sharding",
            "collectives",
            "tensor_parallel",
            "kernel_warmup",
            "demo",
            "passes.explain",
        ),
        ("ground", "kernels", "ops", "passes"),
    ),
    # entry points loaded from outside: the command line and the vLLM plugin
    "entry": (("__main__", "vllm"), ("ground", "kernels", "ops", "passes", "api")),
}


def _modules() -> dict[str, Path]:
    """{dotted name in the package ("" for the package itself): file} of every module."""
    found = {}
    for folder, prefix in ((PACKAGE, ()), ("kernels", ("kernels",)), ("passes", ("passes",))):
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if folder == PACKAGE and parts[0] in ("kernels", "passes"):
                continue  # the links to the top-level folders: read there
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((*prefix, *parts))] = path
    return found


def layer_of(module: str) -> str:
    """The layer of ``module`` (a dotted name in the package; "" the package itself): that of
    its longest prefix in :data:`LAYERS`."""
    best, layer = -1, None
    for name, (members, _uses) in LAYERS.items():
        for member in members:
            parts = member.split(".") if member else []
            matches = module.split(".")[: len(parts)] == parts if parts else module == ""
            if matches and len(parts) > best:
                best, layer = len(parts), name
    assert layer is not None, f"mxfp8_fusion.{module} is in no layer of LAYERS"
    return layer


def imports_of(module: str, path: Path, modules: dict) -> set[str]:
    """The package's modules ``module`` imports (dotted names in the package)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            named = node.module.split(".") if node.module else []
            if node.level:
                base = package.split(".") if package else []
                parts = [*base[: len(base) - (node.level - 1)], *named]
            elif named[:1] == [PACKAGE]:
                parts = named[1:]
            else:
                continue
            target = ".".join(parts)
            for alias in node.names:  # ``from . import ops`` imports the module ops
                child = f"{target}.{alias.name}".lstrip(".")
                found.add(child if child in modules else target)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE:
                    found.add(alias.name.partition(".")[2])
    return found


def test_every_module_imports_only_its_layer_and_the_layers_it_may_use():
    modules = _modules()
    assert {"format", "ops", "kernels.dispatch", "passes.fusion", "vllm.plugin"} <= set(modules)
    wrong = []
    for module, path in modules.items():
        layer = layer_of(module)
        allowed = {layer, *LAYERS[layer][1]}
        for imported in sorted(imports_of(module, path, modules)):
            if imported not in modules:
                wrong.append(f"mxfp8_fusion.{module} imports {imported!r}, not a module")
            elif layer == "ground" or layer_of(imported) not in allowed:
                wrong.append(
                    f"mxfp8_fusion.{module} ({layer}) imports mxfp8_fusion.{imported} "
                    f"({layer_of(imported)})"
                )
    assert not wrong, "\n".join(wrong)


def test_the_layers_form_no_cycle():
    """Each layer may use only layers listed before it: the order is the import direction."""
    names = list(LAYERS)
    for i, (_name, (_members, uses)) in enumerate(LAYERS.items()):
        assert set(uses) <= set(names[:i])


def test_the_reader_sees_relative_and_lazy_imports():
    """The reader resolves what the layer check relies on: a relative import that climbs out
    of kernels/, ``from . import`` of a module, and an import inside a function."""
    modules = _modules()
    assert "format" in imports_of(
        "kernels.gemm_sm90.config", modules["kernels.gemm_sm90.config"], modules
    )
    assert "ops" in imports_of("", modules[""], modules)
    assert "nn" in imports_of("kernel_warmup", modules["kernel_warmup"], modules)  # lazy
    assert "passes.fusion" in imports_of("vllm.compile", modules["vllm.compile"], modules)
