"""The lanes are directories: tests/logic/ holds the tests without an SGLang
process, tests/server/ those that drive the real scheduler (conftest.py
gives each of them the ``sglang`` marker). Read from the test files' AST,
so both directories are checked whichever lane runs:

* no test or fixture under tests/logic/ takes a server fixture, directly or
  through a fixture of its module or of conftest.py (the names are the
  suite's: a logic test's own fixture does not take them);
* every test under tests/server/ reaches SGLang in one of the ways below,
  directly or through its module's fixtures and helper functions.

A test under tests/server/ that reaches SGLang some new way: add the way
here."""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOGIC, SERVER = ROOT / "tests" / "logic", ROOT / "tests" / "server"
# the suite's fixtures (conftest.py) and the plugin's (scripted_runtime/pytest_plugin.py)
SERVER_FIXTURES = {"server", "server_pool", "scripted_server", "scripted_runtime_pool"}
# calls that start SGLang: a server, an explorer runner's server, a command that starts its own (the
# mutate command through tests/helpers.py's mutate_table among them), a foreign pytest run with the plugin
STARTING_CALLS = {"ScriptedServer.start", "ScriptedServer", "ensure_server", "cli.main", "explorer.explore",
                  "runpytest_subprocess", "mutate_table"}
# a subprocess running the command line (as a module or the installed command), a bench that starts servers,
# or Python source run in a subprocess that starts one
STARTING_WORDS = {"scripted_runtime.user_side.cli", "scripted-runtime", "compare.py", "iteration_cost.py",
                  "ScriptedServer.start("}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _is_fixture(fn: ast.FunctionDef) -> bool:
    return any(_dotted(d.func if isinstance(d, ast.Call) else d).endswith("fixture") for d in fn.decorator_list)


def _functions(tree: ast.Module) -> Dict[str, ast.FunctionDef]:
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


def _args(fn: ast.FunctionDef) -> Set[str]:
    names = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
    for d in fn.decorator_list:  # @pytest.mark.usefixtures("server")
        if isinstance(d, ast.Call) and _dotted(d.func).endswith("usefixtures"):
            names |= {a.value for a in d.args if isinstance(a, ast.Constant)}
    return names


def _server_fixtures(tree: ast.Module, known: Set[str]) -> Set[str]:
    """``known`` and the fixtures of ``tree`` that take one of them, transitively."""
    found, fixtures = set(known), [f for f in _functions(tree).values() if _is_fixture(f)]
    grew = True
    while grew:
        grew = False
        for f in fixtures:
            if f.name not in found and _args(f) & found:
                found.add(f.name)
                grew = True
    return found


CONFTEST_SERVER_FIXTURES = _server_fixtures(ast.parse((ROOT / "conftest.py").read_text()), SERVER_FIXTURES)


def _tests(tree: ast.Module) -> List[ast.FunctionDef]:
    return [f for f in _functions(tree).values() if f.name.startswith("test_")]


def logic_offences(path: Path, tree: ast.Module) -> List[str]:
    """Tests and fixtures of a tests/logic/ file that take a server fixture."""
    servers = _server_fixtures(tree, CONFTEST_SERVER_FIXTURES)
    offences = []
    for fn in _functions(tree).values():
        if fn.name.startswith("test_") or _is_fixture(fn):
            if _args(fn) & servers:
                offences.append(f"{path.name}:{fn.lineno}: {fn.name} takes {sorted(_args(fn) & servers)}")
            if any("scripted_runtime" in _dotted(d.func if isinstance(d, ast.Call) else d) for d in fn.decorator_list):
                offences.append(f"{path.name}:{fn.lineno}: {fn.name} has the scripted_runtime marker")
    return offences


def _reaches_sglang(fn: ast.FunctionDef, functions: Dict[str, ast.FunctionDef], servers: Set[str]) -> bool:
    """Whether ``fn``, or a fixture or function of its module it uses, reaches SGLang."""
    seen, todo = set(), [fn]
    while todo:
        f = todo.pop()
        if f.name in seen:
            continue
        seen.add(f.name)
        if _args(f) & servers:
            return True
        for node in ast.walk(f):
            if isinstance(node, ast.Call):
                name = _dotted(node.func)
                if any(name == c or name.endswith("." + c) for c in STARTING_CALLS):
                    return True
                if name in functions:
                    todo.append(functions[name])
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                if any(word in node.value for word in STARTING_WORDS):
                    return True
        todo.extend(functions[a] for a in _args(f) if a in functions)
    return False


def server_offences(path: Path, tree: ast.Module) -> List[str]:
    """Tests of a tests/server/ file that reach SGLang in none of the known ways
    (or the file has no test at all)."""
    functions, servers = _functions(tree), _server_fixtures(tree, CONFTEST_SERVER_FIXTURES)
    tests = _tests(tree)
    if not tests:
        return [f"{path.name}: no test"]
    return [f"{path.name}:{t.lineno}: {t.name} does not reach SGLang (no server fixture, no call that starts one)"
            for t in tests if not _reaches_sglang(t, functions, servers)]


def _files(folder: Path) -> List[Path]:
    return sorted(folder.glob("test_*.py"))


def test_the_lanes_are_the_two_directories():
    top = sorted(p.name for p in (ROOT / "tests").glob("test_*.py"))
    assert not top, f"test files outside tests/logic/ and tests/server/: {top}"
    assert len(_files(LOGIC)) >= 20 and len(_files(SERVER)) >= 10
    for folder in (LOGIC, SERVER):
        assert (folder / "__init__.py").is_file(), f"{folder}: __init__.py keeps same-named modules of both lanes apart"


def test_no_logic_test_takes_a_server_fixture():
    offences = [o for p in _files(LOGIC) for o in logic_offences(p, ast.parse(p.read_text()))]
    assert not offences, "tests under tests/logic/ that use a server (move them to tests/server/):\n" + "\n".join(offences)


def test_every_server_test_reaches_sglang():
    offences = [o for p in _files(SERVER) for o in server_offences(p, ast.parse(p.read_text()))]
    assert not offences, "tests under tests/server/ without a server (move them to tests/logic/):\n" + "\n".join(offences)


def test_the_checks_catch_a_test_in_the_wrong_lane():
    logic = ast.parse(
        "import pytest\n"
        "@pytest.fixture\n"
        "def warm(server_pool):\n    return server_pool.get('pp4')\n"
        "def test_pure():\n    assert 1\n"
        "def test_direct(server):\n    pass\n"
        "def test_through_a_fixture(warm):\n    pass\n"
        "@pytest.mark.usefixtures('server')\n"
        "def test_used(tmp_path):\n    pass\n"
        "@pytest.mark.scripted_runtime(pp=1)\n"
        "def test_marked(tmp_path):\n    pass\n")
    assert logic_offences(Path("a.py"), logic) == [
        "a.py:3: warm takes ['server_pool']",
        "a.py:7: test_direct takes ['server']",
        "a.py:9: test_through_a_fixture takes ['warm']",
        "a.py:12: test_used takes ['server']",
        "a.py:15: test_marked has the scripted_runtime marker",
    ]
    server = ast.parse(
        "import subprocess, sys\n"
        "from scripted_runtime import ScriptedServer\n"
        "def _start():\n    return ScriptedServer.start(topology='pp4')\n"
        "def _cli(*a):\n    return subprocess.run([sys.executable, '-m', 'scripted_runtime.user_side.cli', *a])\n"
        "def test_pure():\n    assert 1\n"
        "def test_fixture(server):\n    pass\n"
        "def test_helper():\n    _start()\n"
        "def test_command():\n    _cli('run')\n"
        "def test_explore(tmp_path):\n    explorer.explore(None)\n")
    assert server_offences(Path("b.py"), server) == [
        "b.py:7: test_pure does not reach SGLang (no server fixture, no call that starts one)"]
    assert server_offences(Path("c.py"), ast.parse("X = 1\n")) == ["c.py: no test"]


@pytest.fixture
def collected(request):
    return [i for i in request.session.items if hasattr(i, "path")]


def test_the_sglang_marker_comes_from_the_directory(collected):
    """In this run: every collected test under tests/server/ carries ``sglang``,
    none under tests/logic/ does, and no logic test's fixture closure (conftest
    and plugin fixtures included) holds a server fixture."""
    server_items = [i for i in collected if i.path.resolve().is_relative_to(SERVER)]
    logic_items = [i for i in collected if i.path.resolve().is_relative_to(LOGIC)]
    assert logic_items, "this test is itself under tests/logic/"
    assert all(i.get_closest_marker("sglang") for i in server_items)
    assert not [i.nodeid for i in logic_items if i.get_closest_marker("sglang")]
    assert not [i.nodeid for i in logic_items if SERVER_FIXTURES & set(getattr(i, "fixturenames", ()))]


def test_under_xdist_a_shared_session_resource_is_made_by_one_worker_only():
    """``-n 2`` (the default lane): the tests of a module in
    conftest.ONE_WORKER_MODULES are one unit of work (one worker makes their
    shared resource), every other test its own unit; the scheduler conftest.py
    gives pytest-xdist splits them so."""
    import conftest
    from xdist.scheduler import LoadScopeScheduling

    module = conftest.ONE_WORKER_MODULES[0]
    a, b = f"{module}::test_one[x]", f"{module}::test_two"
    other = "tests/server/test_cli.py::test_bad_engine_argument_is_a_one_line_usage_error"
    assert conftest.work_unit(a) == conftest.work_unit(b) == module
    assert conftest.work_unit(other) == other
    assert all((ROOT / m).is_file() for m in conftest.ONE_WORKER_MODULES)

    class Config:  # what LoadScopeScheduling reads at construction
        class option:
            maxschedchunk = None
            loadscopereorder = True
        def getvalue(self, name):
            return ["popen", "popen"] if name == "tx" else None

    scheduler = conftest.pytest_xdist_make_scheduler(Config(), None)
    assert isinstance(scheduler, LoadScopeScheduling)
    assert scheduler._split_scope(a) == scheduler._split_scope(b) != scheduler._split_scope(other)
