"""The package's shape (docs/architecture.md, "The package's shape"): no
import cycle between its modules, function-level imports included, and
dependencies one way between its folders.

Read from the source with ``ast``, not by importing: an import inside a
function counts as much as one at the top (it is a cycle all the same the
day it runs), and imports under ``if TYPE_CHECKING:`` do not (they never run).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "opt4torch"

#: What each folder may import of the package's other folders (the binding,
#: _engine, and the top-level helpers _messages and _progress go anywhere).
ALLOWED = {
    "io": set(),
    "planning": set(),
    "sources": {"io"},
    "pool": {"io", "planning", "sources"},
    "distributed": {"io", "planning", "pool", "sources"},
    "loader": {"io", "planning", "pool", "sources", "distributed"},
}


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    found["opt4torch._engine"] = PACKAGE / "_engine.pyi"
    return found


def type_checking_only(tree: ast.AST) -> set[int]:
    """Line numbers of the imports under ``if TYPE_CHECKING:``."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                for sub in ast.walk(inner):
                    if isinstance(sub, (ast.Import, ast.ImportFrom)):
                        lines.add(sub.lineno)
    return lines


def imports() -> dict[str, set[str]]:
    """Each module's imports of the package's modules, wherever they sit."""
    mods = modules()
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        if path.suffix != ".py":
            continue
        tree = ast.parse(path.read_text())
        skip = type_checking_only(tree)
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(tree):
            if getattr(node, "lineno", None) in skip:
                continue
            if isinstance(node, ast.ImportFrom):
                base = package[:len(package) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else []))
                for alias in node.names:
                    full = f"{target}.{alias.name}"
                    edges[name].add(full if full in mods else target)
            elif isinstance(node, ast.Import):
                edges[name].update(a.name for a in node.names if a.name in mods)
        edges[name] = {t for t in edges[name] if t in mods and t != name}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_graph_is_read() -> None:
    edges = imports()
    assert "opt4torch.pool.cache" in edges["opt4torch.loader.dataloader"] or any(
        t.startswith("opt4torch.pool") for t in edges["opt4torch.loader.build"]), edges["opt4torch.loader.build"]
    assert "opt4torch.io.forksafe" in edges["opt4torch.pool.prefetch"]


def test_no_import_cycle() -> None:
    found = cycles(imports())
    assert not found, f"import cycles (function-level imports included): {found}"


def test_a_cycle_is_found() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]


def test_folders_depend_one_way() -> None:
    wrong = []
    for name, targets in imports().items():
        parts = name.split(".")
        if len(parts) < 3 or parts[1] not in ALLOWED:
            continue
        for target in targets:
            tparts = target.split(".")
            if len(tparts) >= 3 and tparts[1] in ALLOWED and tparts[1] != parts[1] \
                    and tparts[1] not in ALLOWED[parts[1]]:
                wrong.append(f"{name} imports {target}")
    assert not wrong, f"imports against the folders' order (docs/architecture.md): {wrong}"
