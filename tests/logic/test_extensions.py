"""Extension points: a user's window, invariant and explorer action
(``scripted_runtime/extensions.py``), registered from a module outside the
package, loaded in every scheduler rank, and seen in ``run`` and
``explore`` output (the example module ``scenarios/extension_example.py``)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import find

from scripted_runtime import extensions as ext
from scripted_runtime.scheduler_side import check_registry, windows
from scripted_runtime.user_side.explore import actions as A, strategies
from scripted_runtime.user_side.explore.stats import Stats

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = "scenarios/extension_example.py"


def _isolate(mp: pytest.MonkeyPatch) -> None:
    """Registrations made from here on do not leak into the rest of the session."""
    mp.setattr(check_registry, "_extension_windows", {})
    mp.setattr(check_registry, "_extension_checks", {})
    mp.setattr(ext, "_actions", {})
    mp.setattr(ext, "_loaded", [])
    mp.setattr(ext, "_registered", set())
    mp.setattr(windows, "WINDOWS", dict(windows.WINDOWS))


@pytest.fixture
def clean_registry(monkeypatch):
    _isolate(monkeypatch)


def test_the_example_module_registers_one_of_each_and_the_explorer_draws_its_action(clean_registry):
    ext.activate([str(ROOT / EXAMPLE)])
    assert ext.summary() == {"windows": ["two_or_more_waiting"], "invariants": ["output_within_budget"],
                             "actions": ["abort_newest_then_step"]}
    assert "two_or_more_waiting" in windows.WINDOWS and "two_or_more_waiting" in strategies.windows_for("pp4")
    from scripted_runtime.scheduler_side import invariants

    assert invariants.validate_names(["output_within_budget"]) == ("output_within_budget",)
    drawn = find(strategies.action_strategy("pp1-normal"), lambda a: isinstance(a, A.Extension))
    assert drawn == A.Extension("abort_newest_then_step")
    source = A.to_source([drawn]).text
    assert "explore.extension_action(ctx, reqs, 'abort_newest_then_step')" in source
    ext.activate([str(ROOT / EXAMPLE)])  # loading twice is a no-op
    assert len(ext.actions()) == 1


def test_names_must_not_clash(clean_registry):
    @ext.window
    def mine(scheduler):
        return None

    with pytest.raises(ext.ExtensionError, match="already an extension window"):
        @ext.invariant
        def mine(view):  # noqa: F811 - the clash is the point
            return None

    @ext.window
    def finished_not_pruned(scheduler):  # a built-in window's name
        return None

    with pytest.raises(ext.ExtensionError, match="a built-in window has that name"):
        ext.register_windows()
    with pytest.raises(ext.ExtensionError, match="unknown loop kind"):
        ext.window(loops=("gpu",))

    @ext.invariant
    def idle_gate(view):  # a built-in check's name
        return None

    from scripted_runtime.scheduler_side import invariants

    with pytest.raises(ext.ExtensionError, match="a built-in check has that name"):
        invariants.all_names()


def test_coverage_table_has_a_row_per_extension_action():
    stats = Stats()
    stats.coverage = {"ext:abort_newest_then_step|decode": 2, "flush_cache|idle": 1}
    table = stats.coverage_table()
    row = next(line for line in table.splitlines() if "ext:abort_newest_then_step" in line)
    assert "2" in row


@pytest.mark.parametrize("spec, words", [("nowhere.py", "file not found"),
                                         ("no_such_module_xyz", "no such module")])
def test_a_missing_extension_is_a_one_line_usage_error(spec, words):
    proc = subprocess.run([sys.executable, "-m", "scripted_runtime.user_side.cli", "run",
                           "scenarios/demo.py:chunked_then_decode", "--extension", spec],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and words in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@pytest.fixture(scope="module")
def example_server(server_pool):
    """One pp1-normal server with the example module loaded in its rank
    (the plugin's pool: started once, shared by the two tests below)."""
    with pytest.MonkeyPatch.context() as mp:
        _isolate(mp)
        ext.activate([str(ROOT / EXAMPLE)])  # in this process too, as --extension does
        yield server_pool.get("pp1-normal", extensions=[EXAMPLE])


@pytest.mark.sglang
@pytest.mark.slow  # a server of its own (~25 s); the default lane keeps the pure tests above
def test_run_shows_the_window_and_action_and_the_invariant_fails_a_broken_request(example_server, capsys):
    """What ``scripted-runtime run --extension ...`` prints, through the
    command's own output functions, for both example scenarios."""
    from scripted_runtime.user_side import cli

    cli._print_extensions(example_server.info)
    results = [example_server.run(f"{ROOT / EXAMPLE}:{name}", trace=False)
               for name in ("uses_all_three", "budget_broken")]
    for result in results:
        cli._report(result)
    out = capsys.readouterr().out
    assert ("extensions loaded in the scheduler: windows two_or_more_waiting; invariants output_within_budget; "
            "actions abort_newest_then_step") in out
    assert results[0].passed, out
    assert re.search(r"windows reached: .*two_or_more_waiting x\d", out), out
    assert not results[1].passed and "InvariantViolation[output_within_budget]" in out, out


@pytest.mark.sglang
@pytest.mark.slow
def test_explore_draws_the_action_counts_the_window_and_checks_the_invariant(example_server, tmp_path):
    from scripted_runtime.user_side.explore import explorer
    from scripted_runtime.user_side.explore.explore_settings import ExploreSettings
    from scripted_runtime.user_side.server_config import ServerConfig

    lines = []
    report = explorer.explore(ServerConfig("pp1-normal", extensions=(EXAMPLE,)),
                              ExploreSettings(profile="ci", max_examples=25, corpus=False, check_determinism=False),
                              server=example_server, out_dir=tmp_path, progress=lines.append)
    explorer.print_report(report, profile="ci", out=lines.append)
    out = "\n".join(lines)
    assert not report.failed, out  # the invariant found nothing on the real scheduler
    assert re.search(r"windows \(reached/entered\): .*two_or_more_waiting \d+/\d+", out), out
    row = next((line for line in lines if "ext:abort_newest_then_step" in line), "")
    assert re.search(r"\| +\d+ ", row), out  # the action ran in some phase
