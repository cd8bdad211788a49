"""The ``admission_budget`` contract against the real scheduler
(scenarios/kv_pressure.py:two_arrive_at_the_admission_boundary): SGLang
0.5.23 keeps it at the boundary of what one prefill pass can admit, and a
build that does not charge an admitted request's extend breaks it. The
fakes' tests: tests/logic/test_admission_contract.py."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import run_ok

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = f"{ROOT}/scenarios/kv_pressure.py:two_arrive_at_the_admission_boundary"


def test_admission_stops_at_the_free_kv(server_pool):
    value = run_ok(server_pool.get("pp1-normal"), SCENARIO).value
    assert value["taken"] > 7000 and value["outputs_compared"] == 2, value


@pytest.mark.slow
@pytest.mark.scripted_runtime(overlap=False, patches=("mut_prefill_budget_ignores_admitted_extend",))
def test_an_admission_that_does_not_charge_the_extend_breaks_it(scripted_server):
    result = scripted_server.run(SCENARIO)
    assert not result.passed
    assert result.violation["invariant"] == "admission_budget", result.summary()
    assert "20 KV tokens" in result.error and "17 free and 0 evictable" in result.error, result.error
