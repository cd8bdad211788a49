"""Server-history recovery's pure parts: delta debugging, ``RUNS_BEFORE``
files (written, parsed, followed by ``scripted-runtime run``). No server."""
from __future__ import annotations

import ast
import itertools
import subprocess
import sys
from pathlib import Path

import pytest

from scripted_runtime.user_side import scenario_history
from scripted_runtime.user_side.explore import actions as A, writer
from scripted_runtime.user_side.explore.history import ddmin
from scripted_runtime.user_side.explore.runner import Outcome
from scripted_runtime.user_side.result import ScriptResult
from scripted_runtime.user_side.server_config import ServerConfig

ROOT = Path(__file__).resolve().parents[2]


class Asked:
    """A ``fails`` predicate that records what it was asked."""

    def __init__(self, needed):
        self.needed = set(needed)
        self.asked = []

    def __call__(self, sub):
        self.asked.append(tuple(sub))
        return self.needed <= set(sub)


@pytest.mark.parametrize("needed", [{7}, {0}, {15}, {3, 11}, {2, 3, 4}])
def test_ddmin_finds_exactly_the_needed_items_in_order(needed):
    fails = Asked(needed)
    assert ddmin(list(range(16)), fails) == sorted(needed)
    assert len(fails.asked) == len(set(fails.asked))  # no subset asked twice


def test_ddmin_single_culprit_takes_logarithmic_trials():
    fails = Asked({37})
    ddmin(list(range(64)), fails)
    assert len(fails.asked) <= 2 * 6 + 2


def test_ddmin_tries_nothing_first_and_returns_it_when_that_fails():
    fails = Asked(set())
    assert ddmin(list(range(5)), fails) == []
    assert fails.asked == [()]


def test_ddmin_stops_at_the_deadline_with_the_smallest_failing_so_far():
    ticks = itertools.count()
    fails = Asked({5})
    got = ddmin(list(range(16)), fails, deadline=3, clock=lambda: next(ticks))
    assert 5 in got and len(got) < 16 and fails(got)
    assert len(fails.asked) <= 3


def _outcome():
    return Outcome(signature="SchedulerCrashed: AssertionError: boom", message="AssertionError: boom",
                   failing_action=0, failing_step=1)


def test_a_history_file_lists_its_earlier_programs_and_every_replay_follows_them(tmp_path):
    earlier = [[A.Pause("retract"), A.Continue()], [A.Steps(2)]]
    path = writer.write_scenario(tmp_path, [A.Start(8, 1, 1)], _outcome(), config=ServerConfig("pp1-normal"),
                                 sglang_version="0.5.23", seed=None, profile="ci", earlier=earlier,
                                 history_note="shrunk from 5 by delta debugging on 6 fresh servers")
    text = path.read_text()
    tree = ast.parse(text)
    functions = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert functions == ["program", "earlier_1", "earlier_2"]
    assert "It needs a history" in text and "shrunk from 5" in text and "pause_generation" in text
    assert scenario_history.runs_before(str(path), "program") == [f"{path}:earlier_1", f"{path}:earlier_2"]
    assert scenario_history.runs_before(str(path), "earlier_1") == []
    # the written program still maps its lines to actions (the failing mark is on it)
    assert "# <-- FAILS here" in text.split("def earlier_1")[0]


def test_a_file_without_history_runs_nothing_before(tmp_path):
    path = writer.write_scenario(tmp_path, [A.Start(8, 1, 1)], _outcome(), config=ServerConfig("pp1-normal"),
                                 sglang_version="0.5.23", seed=None, profile="ci")
    assert "RUNS_BEFORE" not in path.read_text()
    assert scenario_history.runs_before(str(path), "program") == []


@pytest.mark.parametrize("literal, words", [
    ("RUNS_BEFORE = {'program': ['missing']}", "does not define: missing"),
    ("RUNS_BEFORE = {'program': 'earlier'}", "must map a function name to a list"),
    ("RUNS_BEFORE = dict(program=['earlier'])", "must be a literal"),
])
def test_a_bad_runs_before_is_a_one_line_usage_error(tmp_path, literal, words):
    path = tmp_path / "s.py"
    path.write_text("def earlier(ctx):\n    yield\n\n\ndef program(ctx):\n    yield\n\n\n" + literal + "\n")
    with pytest.raises(scenario_history.HistoryError, match=words):
        scenario_history.runs_before(str(path), "program")
    proc = subprocess.run([sys.executable, "-m", "scripted_runtime.user_side.cli", "run", f"{path}:program"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and words in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


class FakeServer:
    """Records the scripts ``_run_with_history`` runs; ``failing`` ones fail."""

    def __init__(self, failing=()):
        self.ran, self.failing = [], set(failing)

    def run(self, spec, **kwargs):
        self.ran.append(spec)
        ok = spec.rpartition(":")[2] not in self.failing
        return ScriptResult(script=spec, passed=ok, steps=1, error=None if ok else "AssertionError: no")


def test_run_follows_runs_before_and_stops_at_an_earlier_failure(tmp_path):
    from scripted_runtime.user_side.cli import _run_with_history

    path = tmp_path / "s.py"
    path.write_text("def a(ctx):\n    yield\n\n\ndef b(ctx):\n    yield\n\n\ndef program(ctx):\n    yield\n\n\n"
                    "RUNS_BEFORE = {'program': ['a', 'b']}\n")
    server = FakeServer()
    assert _run_with_history(server, f"{path}:program", timeout=5, invariants=True, trace=False).passed
    assert server.ran == [f"{path}:a", f"{path}:b", f"{path}:program"]
    server = FakeServer(failing={"a"})
    result = _run_with_history(server, f"{path}:program", timeout=5, invariants=True, trace=False)
    assert not result.passed and server.ran == [f"{path}:a"]


class FakeRunner:
    """Programs of actions; after a program that pauses, any later program
    that starts a request fails (``flaky``: it never fails again)."""

    SIGNATURE = "SchedulerCrashed: AssertionError: planted"

    def __init__(self, flaky=False):
        self.flaky, self.armed, self.fresh, self.runs = flaky, False, 0, []
        self.servers = []  # per fresh server, the programs it ran

    def fresh_server(self, why):
        self.fresh += 1
        self.armed = False
        self.servers.append([])

    def _record(self, program, trace):
        self.runs.append(program)
        self.servers[-1].append(program)
        if trace:
            Path(trace).write_text("{}\n")

    def run(self, program, trace=False):
        self._record(program, trace)
        fails = self.armed and any(isinstance(a, A.Start) for a in program) and not self.flaky
        self.armed = self.armed or any(isinstance(a, A.Pause) for a in program)
        return Outcome(signature=self.SIGNATURE if fails else None, failing_action=0 if fails else None)


EARLIER = [[A.Start(8, 1, 1)], [A.Flush()], [A.Pause("retract"), A.Continue()], [A.Steps(3)], [A.Flush()]]
FAILING = [A.Steps(2), A.Start(8, 2, 1), A.Flush()]


def test_recover_shrinks_the_history_then_the_program_each_trial_on_a_fresh_server(tmp_path):
    from scripted_runtime.user_side.explore import history

    runner = FakeRunner()
    got = history.recover(runner, earlier=EARLIER, program=FAILING, shrunk=None, signature=FakeRunner.SIGNATURE,
                          budget_s=60, trace_dir=tmp_path)
    assert got.reproduced and got.shrink_complete
    assert got.earlier == [EARLIER[2]] and got.program == [FAILING[1]]
    assert got.trials == runner.fresh and got.outcome.failing_action == 0
    assert got.verdict.startswith("needs history:") and "1 of the 5 programs" in got.verdict


def test_recover_calls_a_failure_the_history_does_not_bring_back_nondeterministic(tmp_path):
    from scripted_runtime.user_side.explore import history

    runner = FakeRunner(flaky=True)
    got = history.recover(runner, earlier=EARLIER, program=FAILING, shrunk=None, signature=FakeRunner.SIGNATURE,
                          budget_s=60, trace_dir=tmp_path)
    assert not got.reproduced and got.trials == 1
    assert got.verdict.startswith("NONDETERMINISTIC") and "after the 5 programs" in got.verdict
    (what, trace), = got.traces.items()
    assert "it passed" in what and Path(trace).exists()


class StatelessRunner(FakeRunner):
    """A failure that needs no history: any program that starts a request
    and flushes fails, on any server."""

    def run(self, program, trace=False):
        self._record(program, trace)
        fails = any(isinstance(a, A.Start) for a in program) and any(isinstance(a, A.Flush) for a in program)
        return Outcome(signature=self.SIGNATURE if fails else None, failing_action=0 if fails else None)


def test_a_shrink_that_does_not_replay_is_redone_on_fresh_servers_when_the_program_fails_alone(tmp_path):
    """Hypothesis shrank on the explorer's server to a form that passes on a
    fresh one; the program as first met fails alone there: no history is
    needed, the program is shrunk again on fresh servers (not called "needs
    history: 0 of the N programs")."""
    from scripted_runtime.user_side.explore import history

    runner = StatelessRunner()
    got = history.recover(runner, earlier=EARLIER, program=FAILING, shrunk=[FAILING[2]],
                          signature=FakeRunner.SIGNATURE, budget_s=60, trace_dir=tmp_path)
    assert got.reproduced and got.alone and got.shrink_complete
    assert got.earlier == [] and got.program == [FAILING[1], FAILING[2]]
    assert runner.servers[0] == [FAILING]  # the first trial: the program as first met, alone
    assert all(len(ran) == 1 for ran in runner.servers)  # one program a fresh server: no history replayed
    assert got.trials == runner.fresh and got.outcome is not None
    assert got.verdict.startswith("needs no history:") and "(3 actions)" in got.verdict
    assert "shrunk again on fresh servers to 2 actions" in got.verdict
    (what, trace), = got.traces.items()
    assert "alone on a fresh server (it failed)" in what and Path(trace).exists()


def test_a_shrink_that_does_not_replay_still_gets_its_history_when_the_program_passes_alone(tmp_path):
    from scripted_runtime.user_side.explore import history

    runner = FakeRunner()
    got = history.recover(runner, earlier=EARLIER, program=FAILING, shrunk=[FAILING[1]],
                          signature=FakeRunner.SIGNATURE, budget_s=60, trace_dir=tmp_path)
    assert got.reproduced and not got.alone
    assert got.earlier == [EARLIER[2]] and got.program == [FAILING[1]]
    assert runner.servers[0] == [FAILING] and runner.servers[1] == EARLIER + [FAILING]  # alone, then the history
    # the program alone is run once: history ddmin never asks for the empty history again
    assert [i for i, ran in enumerate(runner.servers) if ran == [FAILING]] == [0]
    assert got.verdict.startswith("needs history:") and "1 of the 5 programs" in got.verdict


def test_a_failure_that_needs_no_history_is_written_as_a_plain_file_saying_how_it_was_shrunk(tmp_path):
    path = writer.write_scenario(tmp_path, [A.Start(8, 1, 1), A.Flush()], _outcome(),
                                 config=ServerConfig("pp1-normal"), sglang_version="0.5.23", seed=None,
                                 profile="ci", earlier=[],
                                 history_note="shrunk from 3 actions by delta debugging on 4 fresh servers")
    text = path.read_text()
    assert "RUNS_BEFORE" not in text and "needs a history" not in text
    assert "The program, shrunk from 3 actions by delta debugging on 4 fresh servers" in text
    assert "shrunk by Hypothesis" not in text
