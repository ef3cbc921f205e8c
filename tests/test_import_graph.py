"""The package's import graph: no cycle, and configuration at the bottom.

Every ``import`` of a ``scrapy_openclaw`` module counts, function-level ones
too (they hide a cycle instead of breaking it); ``if TYPE_CHECKING:`` imports
do not (they never run). For settings.py the packages Python runs to reach a
module (``a.b.c`` runs ``a/b/__init__.py``) count too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import scrapy_openclaw

PACKAGE = Path(scrapy_openclaw.__file__).parent
#: What settings.py may import: modules that import nothing of ours but these.
GROUND_FLOOR = {
    "scrapy_openclaw.exceptions",
    "scrapy_openclaw.redact",
    "scrapy_openclaw.runtime",
    "scrapy_openclaw.scrapy_internals",
    "scrapy_openclaw.startup",
}


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ("scrapy_openclaw", *path.relative_to(PACKAGE).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(name: str, path: Path, modules: dict[str, Path], *, packages: bool = False) -> set[str]:
    """The package modules *name* imports when it runs (at load or in a function)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if _is_type_checking(child):
                continue
            targets: list[str] = []
            if isinstance(child, ast.Import):
                targets = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in child.names]
            for target in targets:
                while target not in modules and "." in target:
                    target = target.rpartition(".")[0]
                if packages:
                    found.update(_loaded_with(target, name, modules))
                elif target in modules and target != name:
                    found.add(target)
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return found


def _loaded_with(target: str, importer: str, modules: dict[str, Path]) -> set[str]:
    """*target* and the packages Python runs first to import it (but not *importer*'s own)."""
    own = importer.split(".")
    parts = target.split(".")
    loaded = {".".join(parts[:n]) for n in range(2, len(parts) + 1) if parts[:n] != own[:n]}
    return {m for m in loaded if m in modules and m != importer}


def _graph(*, packages: bool = False) -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules, packages=packages) for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of *graph* (its modules in order), or None."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state:
                found = walk(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = walk(node)
            if found:
                return found
    return None


def test_the_package_has_no_import_cycle() -> None:
    cycle = _cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_settings_imports_only_the_ground_floor() -> None:
    graph = _graph(packages=True)
    upward = graph["scrapy_openclaw.settings"] - GROUND_FLOOR
    assert not upward, f"settings.py imports upward: {sorted(upward)}"
    for module in GROUND_FLOOR:
        assert graph[module] <= GROUND_FLOOR, f"{module} imports {sorted(graph[module] - GROUND_FLOOR)}"


def test_the_walk_sees_cycles_and_function_level_imports(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("def f():\n    from pkg import b\n")
    (tmp_path / "b.py").write_text("from pkg.a import f\n")
    modules = {"pkg.a": tmp_path / "a.py", "pkg.b": tmp_path / "b.py"}
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert graph == {"pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}}
    assert _cycle(graph) == ["pkg.a", "pkg.b", "pkg.a"]
