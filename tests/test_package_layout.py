"""The package's shape: no module imports one that imports it back, directly or through others."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "kpool_cupy"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _exists(module: str) -> bool:
    path = PACKAGE.parent.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _imports(path: Path) -> set[str]:
    """Package modules ``path`` imports anywhere in it (module level, in functions, at the bottom)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # "from package import submodule" imports the submodule; the package is imported before any of
            # its modules whatever they import, so it is an edge only when a name comes from it.
            submodules = {f"{target}.{alias.name}" for alias in node.names if _exists(f"{target}.{alias.name}")}
            found.update(submodules)
            if len(submodules) < len(node.names):
                found.add(target)
    # A package's own "from . import child" names the package itself: not an edge.
    return {m for m in found if m.split(".")[0] == "kpool_cupy" and _exists(m) and m != name}


def _graph() -> dict[str, set[str]]:
    return {_module_name(p): _imports(p) for p in PACKAGE.rglob("*.py")}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the path, 2 done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (found := visit(target)):
                return found
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (found := visit(module)):
            return found
    return None


def test_the_package_has_no_import_cycle():
    assert _cycle(_graph()) is None, " -> ".join(_cycle(_graph()) or [])


def test_the_cycle_finder_finds_a_planted_cycle():
    # The check above could pass by finding nothing at all: plant a cycle.
    graph = _graph()
    graph["kpool_cupy.dtypes"] = graph["kpool_cupy.dtypes"] | {"kpool_cupy.ops.compress"}
    assert _cycle(graph) is not None
    assert "kpool_cupy.ops.compress" in graph["kpool_cupy.ops"]  # imports are seen at all


def test_backends_know_no_op():
    # Backends place memory and run launches; the ops describe themselves.
    for path in (PACKAGE / "backends").glob("*.py"):
        ops = {m for m in _imports(path) if m.startswith("kpool_cupy.ops.")}
        assert ops <= {"kpool_cupy.ops.framework.spec", "kpool_cupy.ops.framework.binding"}, (path, ops)


# The package's layers, lowest first: a module imports from its own layer or
# lower ones only (docs/architecture.md, "Layers"). The longest prefix names a
# module's layer; a new module outside every prefix fails until it is placed.
LAYERS = (
    ("foundation", ("kpool_cupy.dtypes", "kpool_cupy.arrays", "kpool_cupy.pool_offsets", "kpool_cupy.cache_dirs")),
    ("kernel", ("kpool_cupy.kernel",)),
    ("emulator", ("kpool_cupy.emulator",)),
    ("ops", ("kpool_cupy.ops",)),
    ("backends", ("kpool_cupy.backends",)),
    (
        "public",
        (
            "kpool_cupy",
            "kpool_cupy.functions",
            "kpool_cupy.emulate",
            "kpool_cupy.reference",
            "kpool_cupy.torch",
            "kpool_cupy.compat",
        ),
    ),
    ("developer tools", ("kpool_cupy.tools", "kpool_cupy.bench", "kpool_cupy.cli", "kpool_cupy.__main__")),
)


def _layer(module: str) -> int:
    """The layer of ``module``: its longest listed prefix's (the package itself only by its own name), -1 for a
    module no layer lists."""
    found = [
        (len(prefix), i)
        for i, (_, prefixes) in enumerate(LAYERS)
        for prefix in prefixes
        if module == prefix or (prefix != "kpool_cupy" and module.startswith(prefix + "."))
    ]
    return max(found)[1] if found else -1


def _upward(graph: dict[str, set[str]]) -> list[str]:
    return [
        f"{m} ({LAYERS[_layer(m)][0]}) imports {t} ({LAYERS[_layer(t)][0]})"
        for m, targets in sorted(graph.items())
        for t in sorted(targets)
        if _layer(t) > _layer(m)
    ]


def test_imports_go_down_the_layers_only():
    assert _upward(_graph()) == []


def test_the_layer_check_sees_an_upward_import():
    # The package's top imports nothing from the developer tools (compile_ptx
    # lives in kernel/nvrtc.py); planting such an import must fail.
    graph = _graph()
    assert not {m for m in graph["kpool_cupy"] if _layer(m) == len(LAYERS) - 1}
    graph["kpool_cupy"] = graph["kpool_cupy"] | {"kpool_cupy.tools.variants"}
    assert _upward(graph) == ["kpool_cupy (public) imports kpool_cupy.tools.variants (developer tools)"]


def test_every_module_has_a_layer():
    assert [module for module in _graph() if _layer(module) < 0] == []
    assert _layer("kpool_cupy.brand_new") == -1  # the check can fail


def _ops_part(module: str) -> int:
    """Inside ops/: 0 the framework, 1 the families, 2 a leaf op (one op and its FP8 form), 3 the op list."""
    if module == "kpool_cupy.ops":
        return 3
    return {"framework": 0, "families": 1}.get(module.split(".")[2], 2)


def _ops_upward(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for m, targets in sorted(graph.items()):
        for t in sorted(targets):
            if not (m.startswith("kpool_cupy.ops") and t.startswith("kpool_cupy.ops")):
                continue
            if _ops_part(t) > _ops_part(m) or (_ops_part(m) == _ops_part(t) == 2 and m != t):
                found.append(f"{m} imports {t}")
    return found


def test_a_leaf_op_imports_only_the_framework_and_the_families():
    # ops/framework (spec, binding, results, checks, operands) < ops/families
    # (pooling, rings, FP8 destinations, expansion, scoring, selection) < the
    # leaf ops, and a leaf op never imports another leaf op.
    graph = _graph()
    assert _ops_upward(graph) == []
    graph["kpool_cupy.ops.index_topk"] = graph["kpool_cupy.ops.index_topk"] | {"kpool_cupy.ops.expand_topk"}
    assert _ops_upward(graph) == ["kpool_cupy.ops.index_topk imports kpool_cupy.ops.expand_topk"]
