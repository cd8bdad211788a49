"""The import graph of a set of packages, read with ``ast`` (nothing imported).

An edge ``a -> b`` means module ``a`` imports module ``b`` somewhere: at
the top, inside a function, in any branch, and under ``if TYPE_CHECKING:``
too (an annotation-only import still ties the two modules together: the
type names one the other); ``build(..., type_checking=False)`` leaves those
out, giving the imports that can run. ``from p import x`` is an edge to
``p.x`` when that is a module of the graph, else to ``p``. Parents are not
implied: ``import p.q`` is an edge to ``p.q`` only, as a package importing
its own submodules is no cycle.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Tuple

Graph = Dict[str, Dict[str, int]]  # module -> {imported module: first line}


def module_files(root: Path, packages: Iterable[str]) -> Dict[str, Path]:
    """Module name -> file. A package given as ``"FOLDER=DOTTED.NAME"`` is
    read from ``root/FOLDER`` and named ``DOTTED.NAME`` (the repository's
    ``hooks/`` is installed as ``scripted_runtime.hooks``)."""
    mods: Dict[str, Path] = {}
    for pkg in packages:
        folder, _, name = pkg.partition("=")
        prefix = (name or folder).split(".")
        for path in sorted((root / folder).rglob("*.py")):
            parts = prefix + list(path.relative_to(root / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = path
    return mods


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(node: ast.AST, modname: str, is_pkg: bool,
             type_checking: bool = True) -> Iterator[Tuple[List[str], int]]:
    """(candidate targets, most specific first; line) for each name imported;
    without ``type_checking``, none under ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(node):
        if not type_checking and isinstance(child, ast.If) and _type_checking(child.test):
            for stmt in child.orelse:
                yield from _imports_of_stmt(stmt, modname, is_pkg, type_checking)
            continue
        yield from _imports_of_stmt(child, modname, is_pkg, type_checking)


def _imports_of_stmt(child: ast.AST, modname: str, is_pkg: bool, type_checking: bool):
    if isinstance(child, ast.Import):
        for alias in child.names:
            yield [alias.name], child.lineno
    elif isinstance(child, ast.ImportFrom):
        if child.level:
            base = modname.split(".")
            if not is_pkg:
                base = base[:-1]
            base = base[: len(base) - (child.level - 1)]
            mod = ".".join(base + ([child.module] if child.module else []))
        else:
            mod = child.module or ""
        for alias in child.names:
            yield [f"{mod}.{alias.name}", mod], child.lineno
    if type_checking or not (isinstance(child, ast.If) and _type_checking(child.test)):
        yield from _imports(child, modname, is_pkg, type_checking)


def build(root: Path, packages: Iterable[str], *, type_checking: bool = True) -> Graph:
    """The graph; ``type_checking=False``: only imports that can run."""
    mods = module_files(root, packages)
    graph: Graph = {}
    for name, path in mods.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        deps: Dict[str, int] = {}
        for candidates, line in _imports(tree, name, path.name == "__init__.py", type_checking):
            target = next((c for c in candidates if c in mods), None)
            if target is not None and target != name:
                deps.setdefault(target, line)
        graph[name] = deps
    return graph


def cycles(graph: Graph) -> List[List[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack = set()
    found: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def describe_cycle(graph: Graph, comp: List[str]) -> str:
    """The edges inside one cycle, with the file line of each import."""
    members = set(comp)
    return "; ".join(f"{a} -> {b} (line {line})" for a in comp
                     for b, line in sorted(graph[a].items()) if b in members)


def reachable(graph: Graph, start: str) -> Dict[str, str]:
    """Every module ``start`` imports, directly or not -> the module importing it."""
    seen: Dict[str, str] = {}
    todo = [start]
    while todo:
        v = todo.pop()
        for w in graph[v]:
            if w not in seen and w != start:
                seen[w] = v
                todo.append(w)
    return seen
