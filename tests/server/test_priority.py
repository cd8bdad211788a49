"""Priority scheduling on a real pp1-priority server (issue 35's request-level
features: ``enable_priority_scheduling``, three running requests at most):
a better request preempts or waits as SGLang's threshold says, with the
``priority`` contract and every check on; the dropped-threshold mutant is
caught by the contract. Slow lane: ``mutate --topology pp1-priority``
(the unmutated baseline clean, the mutant killed by the ci exploration with
its seed corpus, the kill replayed; without the corpus it survives the ci
budget: bench/README.md). The contract on fakes: tests/logic/test_priority_contract.py."""
from __future__ import annotations

import pytest

from tests.helpers import mutate_table

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
    rows = mutate_table("pp1-priority", tmp_path, "--shrink-time", "5")
    assert rows[MUTANT]["status"] == "killed" and rows[MUTANT]["replays"] is True, rows[MUTANT]
