"""A failure that needs an earlier program on its server, against the real
scheduler: found, history-shrunk, written to a file that replays from a
fresh server.

The planted fault (``tests/planted/history_fault.py``, not an SGLang bug):
after a script that paused generation, any request in a later script
crashes the scheduler. Alone on a fresh server the failing program passes.
The explorer sees that right after the crash, replays the programs its
server ran before it on fresh servers, delta-debugs them down, then the
failing program's actions, and writes one file whose ``RUNS_BEFORE`` runs
what it needs first.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from scripted_runtime.user_side import scenario_history
from scripted_runtime.user_side.explore import explorer
from scripted_runtime.user_side.explore.explore_settings import ExploreSettings
from scripted_runtime.user_side.server_config import ServerConfig

REPO = Path(__file__).resolve().parents[2]
PLANTED = str(REPO / "tests" / "planted" / "history_fault.py") + ":PATCH"
SIGNATURE_WORDS = "planted history fault"


def _explore(tmp_path, shrink_time_s):
    lines = []
    report = explorer.explore(ServerConfig("pp1-normal", patches=(PLANTED,)),
                              ExploreSettings(profile="ci", max_examples=12, shrink_time_s=shrink_time_s, corpus=False,
                                              check_determinism=False),
                              out_dir=tmp_path, progress=lines.append)
    return report, lines


def _earlier_programs(path: str):
    tree = ast.parse(Path(path).read_text())
    return {n.name: ast.get_source_segment(Path(path).read_text(), n)
            for n in tree.body if isinstance(n, ast.FunctionDef)}


@pytest.mark.slow
def test_a_failure_needing_an_earlier_program_is_found_history_shrunk_and_replays_fresh(tmp_path):
    """A 25 s shrink budget (about 2 minutes in all: each trial is a server start)."""
    report, lines = _explore(tmp_path, shrink_time_s=25)
    log = "\n".join(lines)
    assert report.failed and SIGNATURE_WORDS in report.signature, log
    assert any("passes alone on a fresh server" in line for line in lines), log
    assert report.history_verdict and report.history_verdict.startswith("needs history"), log
    # the file: the failing program, after the earlier programs it needs (one of them pauses)
    earlier = scenario_history.runs_before(report.scenario_path, "program")
    assert earlier, log
    functions = _earlier_programs(report.scenario_path)
    assert any("pause_generation" in functions[spec.rpartition(":")[2]] for spec in earlier), log
    # ... replayed by the explorer on a fresh server: the same failure
    assert report.replayed_fresh and report.replay_matches, report.replay_verdict
    # the failing program alone was written too, and passes alone
    assert report.standalone_path and Path(report.standalone_path).exists()
    assert "RUNS_BEFORE" not in Path(report.standalone_path).read_text()


@pytest.mark.slow
def test_history_shrinks_to_the_one_pausing_program_and_run_replays_it(tmp_path):
    """The full shrink (about 5 minutes here): one earlier program, and
    `scripted-runtime run` on the written file fails the same way from a
    fresh server."""
    report, lines = _explore(tmp_path, shrink_time_s=600)
    log = "\n".join(lines)
    earlier = scenario_history.runs_before(report.scenario_path, "program")
    assert len(earlier) == 1, log
    assert "pause_generation" in _earlier_programs(report.scenario_path)["earlier_1"]
    assert len(report.program_lines) == 1 and report.program_lines[0].startswith("start"), report.program_lines
    proc = subprocess.run(
        [sys.executable, "-m", "scripted_runtime.user_side.cli", "run", f"{report.scenario_path}:program",
         "--no-overlap", "--patch", PLANTED], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    assert "(RUNS_BEFORE of program): PASS" in proc.stderr and SIGNATURE_WORDS in proc.stdout
