"""Scenarios that need a history: scripts to run before them on the same
server (harness process).

Some failures need what ran before them on the server (state the engine
reset does not clear). A scenario file written for one lists, in a
module-level literal, the scripts to run first, each after the usual engine
reset, on a fresh server::

    RUNS_BEFORE = {"program": ["earlier_1", "earlier_2"]}

``scripted-runtime run FILE:program`` (and so ``ab`` and ``bisect-check``)
and the explorer's replays run ``earlier_1``, ``earlier_2``, then
``program``. The file is read with ``ast`` (nothing imported here).
"""
from __future__ import annotations

import ast
from typing import Any, Callable, Dict, List

RUNS_BEFORE = "RUNS_BEFORE"


class HistoryError(ValueError):
    """A ``RUNS_BEFORE`` that cannot be followed (not a literal, a missing function)."""


def _literal(path: str) -> Dict[str, List[str]]:
    try:
        with open(path) as f:
            tree = ast.parse(f.read(), filename=path)
    except (OSError, SyntaxError):
        return {}  # the script loader reports those, with the line
    functions = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == RUNS_BEFORE
                                                for t in node.targets):
            try:
                value = ast.literal_eval(node.value)
            except ValueError as exc:
                raise HistoryError(f"{path}: {RUNS_BEFORE} must be a literal dict of lists of function "
                                   f"names ({exc})") from exc
            if not isinstance(value, dict) or not all(
                    isinstance(k, str) and isinstance(v, list) and all(isinstance(x, str) for x in v)
                    for k, v in value.items()):
                raise HistoryError(f"{path}: {RUNS_BEFORE} must map a function name to a list of function "
                                   "names, e.g. {'program': ['earlier_1']}")
            missing = sorted({x for v in value.values() for x in v} - functions)
            if missing:
                raise HistoryError(f"{path}: {RUNS_BEFORE} names functions the file does not define: "
                                   f"{', '.join(missing)}")
            return value
    return {}


def runs_before(path: str, function: str, *, where: str = "") -> List[str]:
    """The specs to run, in order, before ``path:function``: ``WHERE:NAME``
    (``where`` defaults to ``path``; pass the module name of a
    ``MODULE:FUNC`` spec to keep that form). Raises ``HistoryError``."""
    return [f"{where or path}:{name}" for name in _literal(path).get(function.split(".")[0], [])]


def run_in_order(path: str, function: str, run: Callable[[str, bool], Any]) -> Any:
    """``run(spec, last)`` for each script ``path:function`` lists to run
    before it, then for it (``last`` True); an earlier one that fails ends
    it, and its result is returned. Returns the last result."""
    specs = [*runs_before(path, function), f"{path}:{function}"]
    for i, spec in enumerate(specs):
        last = i == len(specs) - 1
        result = run(spec, last)
        if not result.passed and not last:
            return result
    return result
