"""The ``fill_ids`` contract against the real scheduler
(scenarios/retract_resume.py:resumed_after_a_retract_pause): SGLang 0.5.23
re-prefills a request resumed after a retract pause from its prompt and its
own output, and a build whose ``refresh_fill_ids`` drops the output's append
breaks it at the re-prefill. The fakes' tests:
tests/logic/test_fill_ids_contract.py."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import run_ok

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = f"{ROOT}/scenarios/retract_resume.py:resumed_after_a_retract_pause"


def test_a_request_resumed_after_a_retract_goes_on_from_its_own_output(server_pool):
    value = run_ok(server_pool.get("pp1-normal"), SCENARIO).value
    assert value["retractions"] == 1 and value["outputs_compared"] == 1, value


@pytest.mark.slow
@pytest.mark.scripted_runtime(overlap=False, patches=("mut_fill_ids_refresh_discards_append",))
def test_a_refresh_that_drops_the_output_breaks_it_at_the_re_prefill(scripted_server):
    result = scripted_server.run(SCENARIO)
    assert not result.passed
    assert result.violation["invariant"] == "fill_ids", result.summary()
    assert "prompt (16) and output (3) hold 19" in result.error, result.error
