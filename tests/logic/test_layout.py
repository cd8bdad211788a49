"""The package layout: no import cycles, and the scheduler side never pulls
in user-side code (pure, no SGLang)."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests import import_graph

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("scripted_runtime", "hooks=scripted_runtime.hooks")
# Run inside SGLang's processes: what they import, directly or not, must
# never be user-side code (server control, builds, the CLI, the explorer's search).
IN_SGLANG = ("scripted_runtime.scheduler_side", "scripted_runtime.hooks", "scripted_runtime.protocol",
             "scripted_runtime.errors", "scripted_runtime.timeline")


@pytest.fixture(scope="module")
def graph():
    return import_graph.build(ROOT, PACKAGES)


def test_no_import_cycles(graph):
    # Imports under ``if TYPE_CHECKING:`` count (import_graph.build's default):
    # two modules whose annotations name each other's types are one unit.
    found = import_graph.cycles(graph)
    assert not found, "import cycles (move what both need into the module that owns it):\n" + "\n".join(
        import_graph.describe_cycle(graph, comp) for comp in found)


def test_the_package_roots_lazy_names_close_no_cycle(graph):
    # scripted_runtime/__init__.py imports user_side.server and user_side.result
    # inside its module __getattr__ (PEP 562: ``scripted_runtime.ScriptedServer``).
    # Those edges count like any function-level import. They close no cycle
    # because no module of ours imports the package root itself: ``import
    # scripted_runtime.x`` is an edge to ``x`` only (Python has run the root's
    # __init__, which imports nothing, before any submodule; __getattr__ runs
    # only when someone asks the root for such a name). A ``from
    # scripted_runtime import ScriptedServer`` inside the package would be an
    # edge to the root, and this test (and the cycle test) would fail.
    assert {"scripted_runtime.user_side.server", "scripted_runtime.user_side.result"} <= set(graph["scripted_runtime"])
    importers = sorted(mod for mod, deps in graph.items() if "scripted_runtime" in deps)
    assert not importers, f"modules importing the package root itself: {importers}"


def test_the_graph_covers_both_sides(graph):
    # Guards the test above against reading nothing (a moved root, a glob gone wrong).
    assert "scripted_runtime.scheduler_side.driver" in graph
    assert "scripted_runtime.user_side.server" in graph
    assert "scripted_runtime.scheduler_side.context.api" in graph["scripted_runtime.scheduler_side.driver"]


def test_code_run_by_sglang_never_reaches_user_side(graph):
    bad = []
    for mod in graph:
        if mod.startswith(IN_SGLANG):
            for target, via in import_graph.reachable(graph, mod).items():
                if target.startswith("scripted_runtime.user_side"):
                    bad.append(f"{mod} reaches {target} (imported by {via})")
    assert not bad, "\n".join(bad)


def _write(root: Path, files: dict) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def test_cycle_finder_sees_function_level_and_type_checking_imports(tmp_path):
    _write(tmp_path, {
        "pkg/__init__.py": "from pkg import a\n",            # a package importing its child: no cycle
        "pkg/a.py": "from pkg.b import thing\n",
        "pkg/b.py": """
            from typing import TYPE_CHECKING
            if TYPE_CHECKING:
                from pkg import c
            def thing():
                from pkg import a   # lazy, still a cycle a <-> b
            """,
        "pkg/c.py": "from . import b\n",                     # relative; b -> c only under TYPE_CHECKING
    })
    graph = import_graph.build(tmp_path, ["pkg"])
    assert graph["pkg.c"] == {"pkg.b": 1}
    assert graph["pkg.b"] == {"pkg.c": 4, "pkg.a": 6}
    assert import_graph.cycles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]
    described = import_graph.describe_cycle(graph, ["pkg.a", "pkg.b", "pkg.c"])
    assert "pkg.b -> pkg.a (line 6)" in described and "pkg.b -> pkg.c (line 4)" in described
    assert import_graph.reachable(graph, "pkg.c") == {"pkg.b": "pkg.c", "pkg.a": "pkg.b"}
    # Only the imports that can run: b -> c is annotation-only, so c closes no cycle.
    runtime = import_graph.build(tmp_path, ["pkg"], type_checking=False)
    assert runtime["pkg.c"] == {"pkg.b": 1}
    assert "pkg.c" not in runtime["pkg.b"]
    assert import_graph.cycles(runtime) == [["pkg.a", "pkg.b"]]
    assert "pkg.b -> pkg.a (line 6)" in import_graph.describe_cycle(runtime, ["pkg.a", "pkg.b"])
    assert import_graph.reachable(runtime, "pkg.c") == {"pkg.b": "pkg.c", "pkg.a": "pkg.b"}


def test_public_imports_keep_working():
    import scripted_runtime
    from scripted_runtime import ScriptedServer, ScriptResult, ScriptFailedError  # noqa: F401
    # Scenario files written by `explore` before the split import this path.
    from scripted_runtime.explore import program

    assert callable(program.end_state_checks)
    assert ScriptedServer.__module__ == "scripted_runtime.user_side.server"
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        scripted_runtime.nope  # noqa: B018
