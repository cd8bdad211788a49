"""The pytest plugin (registered as ``pytest11`` entry point
``scripted_runtime``): loaded by every pytest run in an environment where
the package is installed, with no conftest.py to copy.

In a test file::

    import pytest

    @pytest.mark.scripted_runtime(pp=1, overlap=False, sglang_args={"chunked_prefill_size": 32})
    def test_row_reuse(scripted_server):
        result = scripted_server.run("my_scenarios.py:row_reuse")
        assert result.passed, result.summary()

* ``scripted_server``: the live server of the test's configuration (the
  closest ``scripted_runtime`` marker; without one, pp=1 with overlap).
  One server per configuration per session, and so per xdist worker; a
  dead one is restarted. ``run`` is ``ScriptedServer.run``, recorded for
  the failure report.
* The marker: ``pp`` (1 or 4), ``overlap`` (pp=1), ``sglang_args`` (extra
  SGLang ``ServerArgs`` fields), ``revert_fixes`` (fix toggles),
  ``patches`` (built-in or ``MODULE:ATTR`` / ``PATH.py:ATTR``),
  ``extensions`` (modules of your own windows, invariants and explorer
  actions: docs/extensions.md).
* Options: ``--scripted-runtime-device``, ``--scripted-runtime-revert-fix``
  and ``--scripted-runtime-patch`` (the build under test, for every
  server: SGLang itself is the one installed in the environment),
  ``--scripted-runtime-traces failed|all|none`` and
  ``--scripted-runtime-trace-dir``.
* A failing test's report has a ``scripted-runtime`` section: each run's
  summary, the timeline tail of a failing run and its trace's path.

docs/pytest-plugin.md has the guide.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, List, Optional

import pytest

from scripted_runtime import specs

MARKER = "scripted_runtime"
MARKER_ARGS = ("pp", "overlap", "sglang_args", "revert_fixes", "patches", "extensions")
TRACE_MODES = ("failed", "all", "none")
_RESULTS = pytest.StashKey[List[Any]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("scripted-runtime", "scripted-runtime (the SGLang scheduler harness)")
    group.addoption("--scripted-runtime-device", default=os.environ.get("SCRIPTED_RUNTIME_TEST_DEVICE", "cpu"),
                    choices=["cpu", "cuda"], help="device of the scripted_server fixture's servers (default cpu)")
    group.addoption("--scripted-runtime-revert-fix", action="append", default=[], metavar="NAME",
                    help="undo this SGLang fix in every server (repeatable; see docs/mutants.md)")
    group.addoption("--scripted-runtime-patch", action="append", default=[], metavar="SPEC",
                    help="apply this patch in every server (repeatable): NAME, MODULE:ATTR or PATH.py:ATTR")
    group.addoption("--scripted-runtime-extension", action="append", default=[], metavar="MODULE|PATH.py",
                    help="load your windows, invariants and explorer actions in every server (repeatable)")
    group.addoption("--scripted-runtime-traces", default="failed", choices=TRACE_MODES,
                    help="step traces to keep: of failing runs (default), all, or none recorded")
    group.addoption("--scripted-runtime-trace-dir", default="", metavar="DIR",
                    help="where traces go (default: a directory under pytest's basetemp)")
    group.addoption("--scripted-runtime-log-dir", default="", metavar="DIR", help="where server logs go")


_RENDEZVOUS = pytest.StashKey[Any]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARKER}(pp=1, overlap=True, sglang_args=None, revert_fixes=(), patches=(), extensions=()): the "
        "configuration of the scripted_server fixture's server (scripted-runtime)")
    from scripted_runtime.user_side import templates

    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the controller's template, if it offers one
        templates.take_rendezvous()
    elif _xdist_workers(config) >= 2 and not config.option.collectonly \
            and config.getoption("--scripted-runtime-device") == "cpu" and templates.enabled("cpu", os.environ):
        # the controller: one template for all its workers (started when the first asks), not one each
        from scripted_runtime.user_side import server as server_mod

        rendezvous = templates.Rendezvous(lambda: server_mod.prestart_template("cpu"))
        os.environ[templates.ENV_RENDEZVOUS] = rendezvous.directory  # the workers start after configure
        config.stash[_RENDEZVOUS] = rendezvous


def _xdist_workers(config: pytest.Config) -> int:
    """How many pytest-xdist workers this run starts (0 without xdist)."""
    if getattr(config.option, "dist", "no") == "no":
        return 0
    try:
        return int(getattr(config.option, "numprocesses", 0) or 0)
    except (TypeError, ValueError):
        return 0


def pytest_unconfigure(config: pytest.Config) -> None:
    rendezvous = config.stash.get(_RENDEZVOUS, None)
    if rendezvous is not None:
        from scripted_runtime.user_side import templates

        os.environ.pop(templates.ENV_RENDEZVOUS, None)
        rendezvous.close()
        if rendezvous.template is not None:
            templates.release(rendezvous.template)


def marker_config(marker: Optional[pytest.Mark], *, device: str = "cpu", revert_fixes=(), patches=(),
                  extensions=()) -> Any:
    """The ``ServerConfig`` a ``scripted_runtime`` marker asks for (plus the
    command line's device and build options); a bad one is a UsageError."""
    from scripted_runtime.user_side import engine_config
    from scripted_runtime.user_side.server_config import ServerConfig

    kwargs = dict(marker.kwargs) if marker is not None else {}
    if marker is not None and marker.args:
        raise pytest.UsageError(f"@pytest.mark.{MARKER} takes keyword arguments only ({', '.join(MARKER_ARGS)})")
    unknown = sorted(set(kwargs) - set(MARKER_ARGS))
    if unknown:
        raise pytest.UsageError(f"@pytest.mark.{MARKER}: unknown argument(s) {', '.join(unknown)}; "
                                f"known: {', '.join(MARKER_ARGS)}")
    try:
        topology = engine_config.topology_for(int(kwargs.get("pp", 1)), bool(kwargs.get("overlap", True)))
    except ValueError as exc:
        raise pytest.UsageError(f"@pytest.mark.{MARKER}: {exc}") from exc
    return ServerConfig(topology=topology, device=device, engine_overrides=dict(kwargs.get("sglang_args") or {}),
                        revert_fixes=(*revert_fixes, *kwargs.get("revert_fixes", ())),
                        patches=(*patches, *kwargs.get("patches", ())),
                        extensions=(*extensions, *kwargs.get("extensions", ())))


_PRESTART = pytest.StashKey[Any]()


def pytest_collection_finish(session: pytest.Session) -> None:
    """When a selected test will need a server, start the process template
    (docs/internals.md, "Process templates": torch and SGLang imported once)
    in a background thread now, so its imports overlap the tests that run
    before the first server instead of delaying that server's start."""
    config = session.config
    if config.option.collectonly or config.getoption("--scripted-runtime-device") != "cpu":
        return
    if not any("scripted_runtime_pool" in getattr(item, "fixturenames", ()) and not item.get_closest_marker("skip")
               for item in session.items):
        return
    import threading

    def prestart() -> None:
        from scripted_runtime.user_side import server as server_mod

        try:
            server_mod.prestart_template("cpu")
        except Exception:  # noqa: BLE001 - the first server's own start then reports it
            pass

    thread = threading.Thread(target=prestart, name="scripted-runtime-template-prestart", daemon=True)
    thread.start()
    config.stash[_PRESTART] = thread


def pytest_sessionfinish(session: pytest.Session) -> None:
    thread = session.config.stash.get(_PRESTART, None)
    if thread is not None:  # a session that ended before its first server: let the start finish, then close
        thread.join(timeout=200)


@pytest.fixture(scope="session")
def scripted_runtime_pool(request):
    """The session's servers, one per configuration (per xdist worker)."""
    from scripted_runtime.user_side.pool import ServerPool

    log_dir = request.config.getoption("--scripted-runtime-log-dir")
    pool = ServerPool(device=request.config.getoption("--scripted-runtime-device"),
                      log_dir=Path(log_dir) if log_dir else None)
    yield pool
    pool.shutdown_all()


def _function_name(script: Any) -> str:
    """The function a script names: its ``__name__``, or the NAME of a
    ``PATH.py:NAME`` / ``MODULE:NAME`` string (the text itself if neither)."""
    text = str(getattr(script, "__name__", script))
    try:
        return specs.parse(text).attr
    except specs.SpecError:
        return text


class RecordingServer:
    """A test's view of its server: ``run`` records every result (for the
    failure report) and writes traces where the options say; everything
    else is the ``ScriptedServer``'s."""

    def __init__(self, server: Any, results: List[Any], trace_dir: Optional[Path]) -> None:
        self._server, self._results, self._trace_dir = server, results, trace_dir

    def run(self, script: Any, *args: Any, **kwargs: Any) -> Any:
        if "trace" not in kwargs:
            if self._trace_dir is None:
                kwargs["trace"] = False
            else:
                n = len(self._results) + 1
                name = specs.safe_name(_function_name(script))[-60:]
                kwargs["trace"] = self._trace_dir / f"{n:02d}-{name}.jsonl"
        result = self._server.run(script, *args, **kwargs)
        self._results.append(result)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)


@pytest.fixture
def scripted_server(request, scripted_runtime_pool, tmp_path_factory):
    """The live server of this test's ``scripted_runtime`` marker."""
    config = request.config
    server = scripted_runtime_pool.get(marker_config(
        request.node.get_closest_marker(MARKER), device=scripted_runtime_pool.device,
        revert_fixes=config.getoption("--scripted-runtime-revert-fix"),
        patches=config.getoption("--scripted-runtime-patch"),
        extensions=config.getoption("--scripted-runtime-extension")))
    mode = config.getoption("--scripted-runtime-traces")
    trace_dir = None
    if mode != "none":
        base = config.getoption("--scripted-runtime-trace-dir")
        root = Path(base) if base else tmp_path_factory.getbasetemp() / "scripted-runtime-traces"
        trace_dir = root / re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.nodeid)[-120:]
        trace_dir.mkdir(parents=True, exist_ok=True)
    results: List[Any] = []
    request.node.stash[_RESULTS] = results
    yield RecordingServer(server, results, trace_dir)
    if mode == "failed":  # keep only failing runs' traces
        for result in results:
            if result.passed and result.trace_path and os.path.exists(result.trace_path):
                os.remove(result.trace_path)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    outcome = yield
    report = outcome.get_result()
    results = item.stash.get(_RESULTS, None)
    if report.when != "call" or not report.failed or not results:
        return
    report.sections.append(("scripted-runtime", failure_section(results)))


def failure_section(results: List[Any]) -> str:
    """What a failing test's report shows: each run's summary, then the
    timeline tail and trace of every failing one."""
    lines = [f"{len(results)} script run(s) on the scripted server:"]
    lines += ["  " + r.summary().splitlines()[0] for r in results]
    for r in results:
        if r.passed:
            continue
        lines.append("")
        lines += r.summary().splitlines()  # the error, the timeline tail and the trace's path
        if not r.trace_path:
            lines.append("trace: not recorded (--scripted-runtime-traces none)")
        else:
            lines.append(f"  render it: scripted-runtime trace render {r.trace_path} -o trace.svg")
    return "\n".join(lines)
