"""No object of ours reaches into another's private attributes: each one is
handed what it uses (by keyword) and asks through public methods.

Read with ``ast`` (nothing imported). ``X._name`` is a reach-in unless ``X``
is ``self``, ``cls`` or ``super()``. Allowed anyway: names the standard
library documents with a leading underscore (``os._exit``, the named-tuple
API). In ``hooks/``, the code that patches SGLang on purpose, private
attributes of SGLang's objects (and the hooks' own markers and wrappers put
onto them) are fair game; there only reach-ins into our own code count: a
private attribute of a module or class imported from ``scripted_runtime``,
or one whose name a class of ``scripted_runtime/`` defines as private.
"""
from __future__ import annotations

import ast
import textwrap
from pathlib import Path
from typing import Iterable, List, Set

ROOT = Path(__file__).resolve().parents[2]
OWN = ("self", "cls")
# Documented public API despite the underscore.
STDLIB = {("os", "_exit"), ("sys", "_getframe")}
NAMEDTUPLE_API = {"_replace", "_asdict", "_fields", "_make", "_field_defaults"}


def _private(attr: str) -> bool:
    return attr.startswith("_") and not (attr.startswith("__") and attr.endswith("__"))


def _own_receiver(node: ast.expr) -> bool:
    if isinstance(node, ast.Name) and node.id in OWN:
        return True
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"


def defined_private_names(sources: Iterable[str]) -> Set[str]:
    """Private names our classes define: methods and class attributes, and
    ``self._x = ...`` in their methods."""
    names: Set[str] = set()
    for source in sources:
        for cls in ast.walk(ast.parse(source)):
            if not isinstance(cls, ast.ClassDef):
                continue
            for node in ast.walk(cls):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(node.name):
                    names.add(node.name)
                elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _own_receiver(node.value):
                    names.add(node.attr)
                elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    names.add(node.target.id)
                elif isinstance(node, ast.Assign):
                    names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return {n for n in names if _private(n)}


def _names_imported_from_us(tree: ast.AST) -> Set[str]:
    bound: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("scripted_runtime")):
            bound.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.Import):
            bound.update(a.asname or a.name.split(".")[0] for a in node.names if a.name.startswith("scripted_runtime"))
    return bound


def reach_ins(source: str, *, patches_sglang: bool = False, our_private: Set[str] = frozenset()) -> List[str]:
    """``line: expression`` for each private attribute read or written on
    another object. ``patches_sglang``: the file is one of ``hooks/``."""
    tree = ast.parse(source)
    ours = _names_imported_from_us(tree) if patches_sglang else set()
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and _private(node.attr)) or _own_receiver(node.value):
            continue
        receiver = node.value.id if isinstance(node.value, ast.Name) else None
        if (receiver, node.attr) in STDLIB or node.attr in NAMEDTUPLE_API:
            continue
        if patches_sglang and receiver not in ours and node.attr not in our_private:
            continue
        found.append((node.lineno, node.col_offset, ast.unparse(node)))
    return [f"{line}: {text}" for line, _, text in sorted(found)]


def _files(folder: str) -> List[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def test_no_object_reaches_into_another():
    harness = _files("scripted_runtime")
    our_private = defined_private_names(p.read_text() for p in harness)
    bad = []
    for path in harness + _files("hooks"):
        hooks = path.is_relative_to(ROOT / "hooks")
        for hit in reach_ins(path.read_text(), patches_sglang=hooks, our_private=our_private):
            bad.append(f"{path.relative_to(ROOT)}:{hit}")
    assert not bad, ("private attributes read across objects (hand the collaborator over by keyword and "
                     "give it a public method or property):\n" + "\n".join(bad))


def test_the_rule_catches_the_reach_ins_it_is_about():
    source = textwrap.dedent("""
        import os
        class Handle:
            def status(self):
                return self._ctx._driver.tracker           # 5
        class Driver:
            def needs_drain(self):
                return bool(self.ctx._exhausted)          # 8
            def wrap(self, dispatcher):
                driver = self
                def inner(req):
                    driver._queued -= 1                   # 12
                    return super()._wrap(self._x, cls._y)  # all three allowed
                return inner
        def after(d, ctx, rec):
            d.ctx._exhausted_tokens()                     # 16
            ctx._release_exhausted()                      # 17
            os._exit(rec._replace(step=0).__class__)      # allowed: documented API, dunder
        """)
    assert reach_ins(source) == ["5: self._ctx._driver", "8: self.ctx._exhausted", "12: driver._queued",
                                 "16: d.ctx._exhausted_tokens", "17: ctx._release_exhausted"]


def test_in_hooks_only_reach_ins_into_our_own_code_count():
    source = textwrap.dedent("""
        from scripted_runtime.hooks import scheduler_hook
        def patch(scheduler, module, ctx):
            scheduler._is_no_request()             # SGLang's: the hooks patch it on purpose
            module._is_cpu = True
            scheduler_hook._report_crashes(None)   # 6: a private function of ours
            ctx._exhausted                          # 7: a private name one of our classes defines
        """)
    assert reach_ins(source, patches_sglang=True, our_private={"_exhausted"}) == [
        "6: scheduler_hook._report_crashes", "7: ctx._exhausted"]
    assert len(reach_ins(source)) == 4  # outside hooks/ every one counts
    assert defined_private_names(["class C:\n    _a: int = 0\n    _b = 1\n    def _c(self):\n        self._d = 2\n"
                                  "        other._e = 3\n"]) == {"_a", "_b", "_c", "_d"}
