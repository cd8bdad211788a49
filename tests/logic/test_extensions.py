"""Extension points: a user's window, invariant and explorer action
(``scripted_runtime/extensions.py``), registered from a module outside the
package, loaded in every scheduler rank, and seen in ``run`` and
``explore`` output (the example module ``scenarios/extension_example.py``)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import find

from scripted_runtime import extensions as ext
from scripted_runtime.scheduler_side import windows
from scripted_runtime.user_side.explore import actions as A, strategies
from scripted_runtime.user_side.explore.stats import Stats
from tests.helpers import isolate_extensions

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = "scenarios/extension_example.py"


@pytest.fixture
def clean_registry(monkeypatch):
    isolate_extensions(monkeypatch)


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
