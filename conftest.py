"""pytest wiring specific to the harness's own tests. The servers, the
``scripted_server`` fixture and the ``scripted_runtime`` marker come from the
package's pytest plugin (``scripted_runtime/pytest_plugin.py``,
docs/pytest-plugin.md), as in any project that installs it.

Options:
  --device cpu|cuda        short for --scripted-runtime-device (default cpu)
  --topology NAME[,NAME]   restrict server tests to these topologies
                           (pp1-overlap, pp1-normal, pp4; default: all)
  --server-log-dir DIR     short for --scripted-runtime-log-dir
  (tests marked ``crashes_server`` run after all the others)
  -m slow                  run the slow lane (tests marked ``slow``; skipped otherwise)
  --ab                     also run the cross-release A/B lane (tests marked ``ab``:
                           builds or reuses one environment per SGLang release,
                           ~10 GB and ~8 min each the first time)

Lanes by directory: every test under tests/server/ gets the ``sglang`` marker
here (it drives the real scheduler); tests/logic/ holds the tests without an
SGLang process. ``-m sglang`` / ``-m "not sglang"`` select on that marker.

Fixtures:
  server_pool  the plugin's session pool: one live server per configuration
  server       parametrized over the topologies; a test using it runs once per
               topology (pp4 runs carry the ``pp4`` marker)
  wheel, fresh_env  a wheel built from this checkout and a fresh environment
               with it installed, once per session (tests/wheel_env.py)
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from scripted_runtime.user_side.engine_config import TOPOLOGIES

TOPOLOGY_MARKS = {"pp4": [pytest.mark.pp4]}
# The lane that drives the real SGLang scheduler: its tests carry the ``sglang`` marker.
SERVER_TESTS = Path(__file__).resolve().parent / "tests" / "server"
# `explore` run by a test (in a subprocess too) neither replays nor keeps failures in a
# database of the checkout; the failure-database tests pass theirs explicitly.
os.environ["SCRIPTED_RUNTIME_DATABASE"] = "none"
# The output oracle's reference cache (scheduler_side/reference_cache.py): the suite's
# servers share one in a temporary directory, not the user's ~/.cache (removed at the end).
_REFERENCE_CACHE = None
if "SCRIPTED_RUNTIME_REFERENCE_CACHE" not in os.environ:
    import tempfile

    _REFERENCE_CACHE = tempfile.mkdtemp(prefix="scripted-runtime-references-")
    os.environ["SCRIPTED_RUNTIME_REFERENCE_CACHE"] = _REFERENCE_CACHE


def pytest_addoption(parser):
    group = parser.getgroup("scripted-runtime")
    group.addoption("--device", default=None, choices=["cpu", "cuda"],
                    help="short for --scripted-runtime-device (the plugin's option)")
    group.addoption("--topology", default="", help="comma-separated topologies to test (default: all)")
    group.addoption("--server-log-dir", default="", help="short for --scripted-runtime-log-dir")
    group.addoption("--ab", action="store_true", help="run the cross-release A/B lane (tests marked ab)")


def pytest_configure(config):
    # The servers come from the package's pytest plugin (scripted_runtime/pytest_plugin.py),
    # loaded through its pytest11 entry point, as in any other project.
    if not (config.pluginmanager.has_plugin("scripted_runtime")
            or config.pluginmanager.has_plugin("scripted_runtime.pytest_plugin")):
        raise pytest.UsageError("the scripted_runtime pytest plugin is not installed (its pytest11 entry point): "
                                "run bash ci/install.sh")
    if config.getoption("--device"):
        config.option.scripted_runtime_device = config.getoption("--device")
    if config.getoption("--server-log-dir"):
        config.option.scripted_runtime_log_dir = config.getoption("--server-log-dir")


def pytest_unconfigure(config):
    if _REFERENCE_CACHE is not None:
        import shutil

        shutil.rmtree(_REFERENCE_CACHE, ignore_errors=True)


def pytest_itemcollected(item):
    """The ``sglang`` marker comes from the directory, and ``slow`` from
    ``slow_on(*topologies)`` for an item on one of those topologies, before
    ``-m`` selects."""
    if item.path.resolve().is_relative_to(SERVER_TESTS):
        item.add_marker(pytest.mark.sglang)
    topology = getattr(getattr(item, "callspec", None), "params", {}).get("server")
    if topology is not None and any(topology in m.args for m in item.iter_markers("slow_on")):
        item.add_marker(pytest.mark.slow)


def pytest_collection_modifyitems(config, items):
    wanted = {t for t in config.getoption("--topology").split(",") if t}
    unknown = wanted - set(TOPOLOGIES)
    if unknown:
        raise pytest.UsageError(f"--topology: unknown {sorted(unknown)}; known: {sorted(TOPOLOGIES)}")
    device = config.getoption("--scripted-runtime-device")
    skip_gpu = pytest.mark.skip(reason="gpu test: run with --device cuda on a GPU runner")
    skip_ab = pytest.mark.skip(reason="cross-release A/B lane: run with --ab (builds ~10 GB per release)")
    run_ab = config.getoption("--ab")
    markexpr = config.getoption("-m") or ""
    skip_slow = pytest.mark.skip(reason="slow lane: run with -m slow")
    run_slow = "slow" in markexpr and "not slow" not in markexpr
    keep, drop = [], []
    for item in items:
        if "gpu" in item.keywords and device != "cuda":
            item.add_marker(skip_gpu)
        if "ab" in item.keywords and not run_ab:
            item.add_marker(skip_ab)
        if "slow" in item.keywords and not run_slow:
            item.add_marker(skip_slow)
        topology = getattr(getattr(item, "callspec", None), "params", {}).get("server")
        if wanted and topology is not None and topology not in wanted:
            drop.append(item)
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
    # Tests that kill their server go last: a pp4 restart costs ~35 s here, and
    # after them no test needs the server again (the order is otherwise kept).
    items[:] = ([i for i in keep if "crashes_server" not in i.keywords]
                + [i for i in keep if "crashes_server" in i.keywords])


# Modules whose tests share one expensive session resource a pytest-xdist
# worker would make again for itself: the mutants' install child (~20 s of
# SGLang imports). Under ``-n`` (the default lane) each is one unit of work.
ONE_WORKER_MODULES = ("tests/logic/test_mutants.py",)


def work_unit(nodeid: str) -> str:
    """The unit of work of a test under ``-n``: its module for
    ``ONE_WORKER_MODULES``, else the test itself (as ``--dist load``)."""
    module = nodeid.split("::", 1)[0]
    return module if module in ONE_WORKER_MODULES else nodeid


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Under ``-n``: tests handed out one by one to whichever worker is free,
    except the modules of ``work_unit``. (Not ``--dist loadgroup``: with
    pytest 9 its ``xdist_group`` marks do not reach the scheduler, measured:
    pytest-xdist 3.8 renames ``item._nodeid``, which pytest 9 no longer reads.)"""
    from xdist.scheduler import LoadScopeScheduling

    class Scheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return Scheduling(config, log)


def pytest_collection_finish(session):
    """The mutants' install child (tests/logic/test_mutants.py, ``child_report``)
    starts now when a selected test needs it: its ~20 s of imports then run
    beside the tests before it."""
    if session.config.option.collectonly or hasattr(session.config, "workerinput"):
        return  # under xdist the worker that runs the test starts it (its fixture)
    if any("child_report" in getattr(item, "fixturenames", ()) and not item.get_closest_marker("skip")
           for item in session.items):
        import importlib.util
        import tempfile

        if importlib.util.find_spec("sglang") is None:
            return
        from tests.logic import test_mutants

        directory = Path(tempfile.mkdtemp(prefix="scripted-runtime-mutants-child-"))
        session.config.stash[test_mutants.CHILD_REPORT] = test_mutants.start_child_report(directory)


def pytest_sessionfinish(session):
    from tests.logic import test_mutants

    started = session.config.stash.get(test_mutants.CHILD_REPORT, None)
    if started is not None:
        proc, directory = started
        if proc.poll() is None:  # the session ended before its test: nothing left running
            proc.kill()
            proc.wait()
        import shutil

        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def server_pool(scripted_runtime_pool):
    """The plugin's session pool: one live server per configuration."""
    return scripted_runtime_pool


@pytest.fixture(params=[pytest.param(t, marks=TOPOLOGY_MARKS.get(t, [])) for t in TOPOLOGIES])
def server(request, server_pool):
    return server_pool.get(request.param)


@pytest.fixture(scope="session")
def wheel(tmp_path_factory):
    """A wheel built from this checkout (tests/wheel_env.py), once per session."""
    from tests import wheel_env

    return wheel_env.build_wheel(tmp_path_factory)


@pytest.fixture(scope="session")
def fresh_env(wheel, tmp_path_factory):
    """A fresh virtual environment with the wheel installed (tests/wheel_env.py)."""
    from tests import wheel_env

    return wheel_env.make_fresh_env(wheel, tmp_path_factory)
