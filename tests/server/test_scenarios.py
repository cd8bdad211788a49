"""The shipped scenarios, run against the real scheduler."""
from __future__ import annotations

from pathlib import Path

import pytest

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


def test_demo_scenario(server):
    result = server.run(f"{SCENARIOS / 'demo.py'}:chunked_then_decode")
    assert result.passed, result.traceback
    assert result.value == {"chunks": 3, "output_len": 8}


def test_flush_vs_finished_request(server):
    result = server.run(f"{SCENARIOS / 'flush_vs_finished_request.py'}:flush_in_window")
    if server.info["loop_kind"] == "overlap":
        # 0.5.23's overlap loop (skip-finishing-decode) prunes a length-finished
        # request in the iteration that finishes it: the window never opens.
        assert not result.passed
        assert "waited 100 steps for the request finished but not yet pruned" in result.error
    else:
        assert result.passed, result.traceback
        assert "running_batch" in result.value["held_by"]


# --- known races, proved against their fix toggles ------------------------------

PP_FLUSH = f"{SCENARIOS / 'pp_flush_inflight.py'}:flush_with_chunk_in_flight"


@pytest.fixture(scope="module")
def pp4_without_pr27446():
    from scripted_runtime import ScriptedServer

    server = ScriptedServer.start(topology="pp4", revert_fixes=["pr27446"])
    yield server
    server.shutdown()


@pytest.mark.pp4
def test_pr27446_scenario_passes_on_the_fixed_build(server_pool):
    result = server_pool.get("pp4").run(PP_FLUSH)
    assert result.passed, result.summary()
    assert result.value["window"].startswith("mbs[") and result.value["output_len"] == 4


@pytest.mark.pp4
def test_pr27446_scenario_catches_the_reverted_fix(pp4_without_pr27446):
    caught = pp4_without_pr27446.run(PP_FLUSH)
    assert not caught.passed and caught.violation["invariant"] == "idle_gate", caught.summary()
    # Without invariants the flush is accepted and the in-flight chunk's result
    # then meets a tree that was reset under it.
    unchecked = pp4_without_pr27446.run(PP_FLUSH, invariants=False)
    assert not unchecked.passed, unchecked.summary()
    assert unchecked.crashed or "flush_cache was accepted" in unchecked.error, unchecked.summary()


@pytest.mark.pp4
def test_explorer_finds_pr27446_without_being_told_the_window(pp4_without_pr27446, tmp_path):
    """The ci search on the same reverted server: it meets the idle-gate
    violation, writes a scenario that replays it, and replays it
    deterministically. The window was never named to the explorer. Every
    check but the output oracle (its references would cost this server
    ~25 s; the idle gate is what catches this)."""
    from scripted_runtime.scheduler_side.invariants import NAMES
    from scripted_runtime.user_side.explore import explorer

    from scripted_runtime.user_side.explore.explore_settings import ExploreSettings
    from scripted_runtime.user_side.server_config import ServerConfig

    report = explorer.explore(ServerConfig("pp4", revert_fixes=("pr27446",),
                                           checks=[n for n in NAMES if n != "greedy_output"]),
                              ExploreSettings(profile="ci", shrink_time_s=5), server=pp4_without_pr27446,
                              out_dir=tmp_path, progress=lambda line: print(f"[explore] {line}"))
    assert report.signature == "InvariantViolation[idle_gate]", report.stats.summary()
    assert report.replay_matches, report.replay_verdict
    assert report.determinism_ok, report.determinism_verdict
    source = Path(report.scenario_path).read_text()
    assert "--revert-fix pr27446" in source and "# <-- FAILS here" in source
    compile(source, report.scenario_path, "exec")


def test_update_weights_vs_stale_batch_on_overlap(server_pool):
    """Issue 14062 on 0.5.23 (>=0.5.22): refused flush reported, no crash."""
    result = server_pool.get("pp1-overlap").run(
        f"{SCENARIOS / 'update_weights_stale_batch.py'}:update_weights_in_window")
    assert result.passed, result.summary()
    assert result.value["update_success"] is False
    assert "cache was not flushed" in result.value["update_message"]


def test_overlap_free_then_reuse_shows_the_row_taken_from_an_unprocessed_forward(server_pool):
    """Issue 18744 on CPU: the reuse happens (LIFO rows, 0.5.19+) and is fenced
    by the synchronous CPU forward; the failing side needs a GPU."""
    result = server_pool.get("pp1-overlap").run(
        f"{SCENARIOS / 'overlap_free_then_reuse.py'}:free_then_reuse")
    assert result.passed, result.summary()
    value = result.value
    assert value["a_row"] == value["b_row"]
    assert value["reused_in_flight"] and value["reused_in_flight"][0]["row"] == value["a_row"]
    assert value["fence"] == "synchronous CPU forward"


@pytest.mark.parametrize("mode", ["in_place", "retract"])
def test_pause_then_flush(server_pool, mode):
    result = server_pool.get("pp1-overlap").run(f"{SCENARIOS / 'pause_then_flush.py'}:{mode}")
    assert result.passed, result.summary()
    assert result.value["flush_success"] is (mode == "retract")  # 0.5.21+ accepts it after retract


# --- the request-semantics contract (docs/checks.md) ------------------------------

REQUEST_SEMANTICS = SCENARIOS / "request_semantics.py"


def test_requests_end_by_their_own_sampling_parameters(server):
    caps = server.run(f"{REQUEST_SEMANTICS}:length_caps")
    assert caps.passed, caps.traceback
    assert caps.value["answers_checked"] == 3, caps.value
    stops = server.run(f"{REQUEST_SEMANTICS}:stop_tokens")
    assert stops.passed, stops.traceback
    assert stops.value["stopped"][-1] in stops.value["probe"], stops.value
    streamed = server.run(f"{REQUEST_SEMANTICS}:streamed_answers")
    assert streamed.passed, streamed.traceback
    # the streamed 6-token answer came in several events; a plain answer has none
    assert streamed.value["events"][0] > 1 and streamed.value["events"][1] is None, streamed.value
    logprobs = server.run(f"{REQUEST_SEMANTICS}:logprobs")
    assert logprobs.passed, logprobs.traceback
    assert logprobs.value["logprobs_checked"] == 6 and logprobs.value["outputs_compared"] == 7, logprobs.value


@pytest.mark.slow
def test_the_contract_sees_a_short_length_finish_with_the_oracle_off():
    """``mut_length_cap_one_early`` with ``greedy_output`` off: the request
    contract alone names it (with the oracle on, the oracle sees it first)."""
    from scripted_runtime import ScriptedServer
    from scripted_runtime.scheduler_side import invariants

    server = ScriptedServer.start(topology="pp1-overlap", patches=["mut_length_cap_one_early"])
    try:
        result = server.run(f"{REQUEST_SEMANTICS}:length_caps",
                            invariants=[n for n in invariants.NAMES if n != "greedy_output"])
    finally:
        server.shutdown()
    assert not result.passed
    assert result.error.startswith("RequestContractError: request "), result.error
    assert "finish reason length with 1 of max_new_tokens=2" in result.error, result.error


@pytest.mark.slow
@pytest.mark.parametrize("mutant, words", [
    ("mut_stream_resends_last_token", "the answer's output_ids"),
    ("mut_chunked_prefill_answer_withheld", "no /generate answer arrived"),
])
def test_the_answer_delivery_contract_sees_what_the_client_gets(mutant, words):
    """Two bugs between the scheduler and the client that change nothing the
    scheduler holds (so the oracle and the request contract pass): the
    answer-delivery contract names both."""
    from scripted_runtime import ScriptedServer

    server = ScriptedServer.start(topology="pp1-overlap", patches=[mutant])
    try:
        result = server.run(f"{REQUEST_SEMANTICS}:streamed_answers")
    finally:
        server.shutdown()
    assert not result.passed
    assert result.error.startswith("AnswerDeliveryError: request "), result.error
    assert words in result.error, result.error


@pytest.mark.slow
@pytest.mark.parametrize("topology", ["pp1-normal", "pp4"])
def test_a_flush_arriving_with_a_request_during_a_pause_is_accepted_and_its_refusal_named(topology):
    """The request, the pause and the flush in one batch: 0.5.23 accepts the
    flush (only a waiting request is held), at pp=4 too, where the flush
    contract's liveness half is judged on the driver rank since d39aeae;
    with ``mut_flush_refused_while_paused`` the refusal is named. At pp=4
    the pause check is off (the registered ``pp_pause_ignored``)."""
    from scripted_runtime import ScriptedServer, known_bugs
    from scripted_runtime.scheduler_side.invariants import NAMES

    script = f"{SCENARIOS / 'pause_then_flush.py'}:arriving"
    for patches in ([], ["mut_flush_refused_while_paused"]):
        server = ScriptedServer.start(topology=topology, patches=patches)
        try:
            # the checks a registered bug masks where it applies, off as explore turns them off
            waived = known_bugs.waived_checks(known_bugs.REGISTRY, topology=topology,
                                              sglang_version=server.info.get("sglang_version"))
            result = server.run(script, invariants=[n for n in NAMES if n not in waived])
        finally:
            server.shutdown()
        if not patches:
            assert result.passed, result.summary()
            assert result.value == {"flush_success": True, "output_len": 8}, result.value
        else:
            assert not result.passed and result.violation and result.violation["invariant"] == "flush", \
                result.summary()
            assert "flush_cache refused, though the engine is paused and only waiting requests are held" in \
                result.violation["message"], result.summary()


@pytest.mark.slow
def test_the_flush_contract_sees_a_flush_refused_with_only_waiting_requests_during_a_pause():
    """``mut_flush_refused_while_paused`` (written blind, second set): the
    flush after pause_generation(retract) is refused, as releases before
    0.5.21 did; the flush contract's liveness half names it (0.5.23 accepts
    it: ``is_fully_idle(ignore_waiting=self._engine_paused)``)."""
    from scripted_runtime import ScriptedServer

    server = ScriptedServer.start(topology="pp1-overlap", patches=["mut_flush_refused_while_paused"])
    try:
        result = server.run(f"{SCENARIOS / 'windows.py'}:paused_retract_waiting_with_kv")
    finally:
        server.shutdown()
    assert not result.passed and result.violation and result.violation["invariant"] == "flush", result.summary()
    assert "flush_cache refused, though the engine is paused and only waiting requests are held" in \
        result.violation["message"], result.summary()
