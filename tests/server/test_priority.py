"""Priority scheduling on a real pp1-priority server (issue 35's request-level
features: ``enable_priority_scheduling``, three running requests at most):
a better request preempts or waits as SGLang's threshold says, with the
``priority`` contract and every check on; the dropped-threshold mutant is
caught by the contract. Slow lane: ``mutate --topology pp1-priority``
(the unmutated baseline clean, the mutant killed by the ci exploration with
its seed corpus, the kill replayed; without the corpus it survives the ci
budget: bench/README.md). The contract on fakes: tests/logic/test_priority_contract.py."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = "scenarios/priority.py:preempt_for_a_better_request"
MUTANT = "mut_priority_preemption_threshold_dropped"


def test_a_better_request_preempts_past_the_threshold_and_waits_within_it(server_pool):
    server = server_pool.get("pp1-priority")
    result = server.run(SCENARIO)
    assert result.passed, result.summary()
    assert result.value["kept_tokens"] >= 2 and result.value["outputs"] == [40, 40, 40], result.value
    assert "decode_retracted_waiting" in result.windows_reached(), result.windows_reached()


def test_preemption_within_the_threshold_is_a_priority_contract_violation(server_pool):
    server = server_pool.get("pp1-priority", patches=(MUTANT,))
    result = server.run(SCENARIO)
    assert not result.passed
    violation = result.violation or {}
    assert violation.get("invariant") == "priority", result.summary()
    assert "was preempted by the prefill" in violation["message"] and "threshold 10" in violation["message"]


@pytest.mark.slow
def test_a_ci_priority_exploration_finds_nothing_and_the_explorer_kills_the_mutant(tmp_path):
    out = tmp_path / "table.json"
    proc = subprocess.run(
        [sys.executable, "-m", "scripted_runtime.user_side.cli", "mutate", "--topology", "pp1-priority",
         "--shrink-time", "5", "--out", str(tmp_path / "found"), "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {r["mutant"]: r for r in json.loads(out.read_text())["rows"]}
    from scripted_runtime.user_side import mutate

    assert rows[mutate.BASELINE]["status"] == "clean", rows[mutate.BASELINE]
    assert rows[MUTANT]["status"] == "killed" and rows[MUTANT]["replays"] is True, rows[MUTANT]
