"""Stop strings on a real pp1-text server (the overlap loop with the
harness's tokenizer for the tiny model): requests with stop strings read off
their own outputs end where SGLang's stop-string rule says, judged by the
request contract (``scheduler_side/stop_strings.py``); a window one token
short (the sixth blind set's ``blind6_stop_str_window_short``, kept as an
external patch) is caught. Both in the slow lane (a server of their own);
the rule on SGLang's own finish code, without a server, is in the default
lane: tests/logic/test_stop_strings.py."""
from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = f"{ROOT / 'scenarios' / 'request_semantics.py'}:stop_strings"
BLIND = f"{ROOT / 'bench' / 'blind_mutants' / 'blind6_mutants.py'}:blind6_stop_str_window_short"


@pytest.mark.slow  # its own server (pp1-text, ~20 s): the default lane is at its 10-minute budget
def test_requests_stop_where_the_window_sees_their_stop_string(server_pool):
    result = server_pool.get("pp1-text").run(SCENARIO)
    assert result.passed, result.summary()
    value = result.value
    kinds = {o[0] for o in value["outcomes"]}
    assert {"straddling", "two_tokens", "one_token"} <= kinds, value["outcomes"]
    # every stop the window holds ended its request there; those it misses ran to their length
    for kind, stop, at, reason, n in value["outcomes"]:
        if at is None:
            assert reason == "FINISH_LENGTH" and n == 12, value["outcomes"]
        else:
            assert reason == "FINISH_MATCHED_STR" and n == at, value["outcomes"]
    assert value["stopped_on_a_string"] >= 2 and value["answers_checked"] == len(value["outcomes"]) + 3, value


@pytest.mark.slow
def test_a_stop_window_one_token_short_breaks_the_stop_string_rule():
    from scripted_runtime import ScriptedServer

    server = ScriptedServer.start(topology="pp1-text", patches=[BLIND])
    try:
        result = server.run(SCENARIO)
    finally:
        server.shutdown()
    assert not result.passed
    assert result.error.startswith("RequestContractError: request "), result.error
    assert "stop string" in result.error and "yet the request finished" in result.error, result.error
