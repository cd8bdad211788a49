"""The greedy-output oracle's comparison, the known-bug registry and the
kill table's check names (pure logic)."""
from __future__ import annotations

from pathlib import Path

import pytest

from scripted_runtime import known_bugs
from scripted_runtime.scheduler_side import output_oracle as oracle
from scripted_runtime.user_side import mutate

ROOT = Path(__file__).resolve().parents[2]
REF = [37, 1, 37, 1, 37, 1, 37, 1]


def test_a_finished_request_must_equal_its_reference_prefix():
    assert oracle.compare("finished", REF[:5], REF[:5]) is None
    problem = oracle.compare("finished", [37, 1, 9, 1, 37], REF[:5])
    assert problem.startswith("token 2 is 9, the reference has 37")


def test_a_length_finish_must_have_max_new_tokens():
    assert "finished with 4 tokens, its reference ends after 5 (max_new_tokens=5)" in \
        oracle.compare("finished", REF[:4], REF[:5],
                       cut=oracle.cut_of(REF[:5], max_new_tokens=5, ignore_eos=True, stop_tokens=()))


def test_an_aborted_request_is_any_prefix_of_its_reference():
    assert oracle.compare("aborted", [], REF) is None
    assert oracle.compare("aborted", REF[:3], REF) is None
    assert "not a prefix of the reference: token 0 is 2" in oracle.compare("aborted", [2], REF)
    assert "past the end of its reference after 3" in oracle.compare("aborted", REF[:4], REF[:3])


def test_tokens_past_the_first_low_margin_reference_token_are_not_compared():
    # margins (best - second best logprob): token 2's is below MARGIN, so either choice there is greedy
    tops = [[-0.1, -2.0], [-0.5, -0.9], [-0.7, -0.7 - oracle.MARGIN / 2], [-0.1, -3.0]]
    assert oracle.comparable_prefix(tops, 4) == 2
    assert oracle.comparable_prefix(None, 4) == 4  # margins unknown (dummy weights, another release): all
    assert oracle.comparable_prefix([[-0.1, -2.0]] * 6, 4) == 4
    assert oracle.compare("finished", [37, 1, 9, 9], REF[:4], comparable=2) is None
    assert oracle.compare("finished", [37, 2, 9, 9], REF[:4], comparable=2).startswith("token 1 is 2")
    # where the comparison stops short of the expected end, so does the length judgement (either
    # choice past a low-margin token may meet a stop token earlier): the request contract judges it
    assert oracle.compare("finished", [37, 1, 9], REF[:4], comparable=2) is None
    assert oracle.compare("finished", [37, 1, 37], REF[:4], comparable=4).startswith("finished with 3 tokens")


def test_other_statuses_are_not_judged():
    assert oracle.compare("running", [5, 5], REF) is None


@pytest.mark.parametrize("temperature,greedy", [(0.0, True), (1e-6, False), (None, False), (0.7, False)])
def test_only_greedy_requests_are_compared(temperature, greedy):
    from sglang.srt.sampling.sampling_params import SamplingParams

    params = SamplingParams(temperature=temperature, max_new_tokens=4)
    params.normalize(None)  # as the tokenizer manager does
    params.verify(512)
    assert oracle.is_greedy(params) is greedy, vars(params)


# --- the known-bug registry ----------------------------------------------------------

PP_PAUSE = known_bugs.by_name("pp_pause_ignored")


LAUNCHED = ("ContractViolation[pause] at step 13: a decode forward of [r1] was launched at step 13 (PP slot 0), "
            "while paused (in_place) since step 13 (iteration 836)")


def test_a_registered_bug_matches_signature_rule_topology_and_release():
    sig = "ContractViolation[pause]"
    assert known_bugs.find(sig, topology="pp4", sglang_version="0.5.23", message=LAUNCHED) is PP_PAUSE
    assert known_bugs.find(sig, topology="pp1-normal", sglang_version="0.5.23", message=LAUNCHED) is None, \
        "other topology: new"
    assert known_bugs.find(sig, topology="pp4", sglang_version="0.5.24", message=LAUNCHED) is None, "later release"
    assert known_bugs.find(sig, topology="pp4", sglang_version=None, message=LAUNCHED) is None, "unknown build"
    other_rule = "ContractViolation[pause] at step 9: pause_generation(retract) left live requests in ..."
    assert known_bugs.find(sig, topology="pp4", sglang_version="0.5.23", message=other_rule) is None, \
        "another rule of the same contract: new"
    assert known_bugs.find("InvariantViolation[idle_gate]", topology="pp4", sglang_version="0.5.23",
                           message=LAUNCHED) is None


SHORTFALL = ("InvariantViolation[pool_accounting] at step 21: KV pool: available 1201 + evictable 0 + protected 0 + "
             "uncached 46 = 1247 != total 1248")


def test_an_entry_that_needs_operations_matches_only_a_program_that_posted_them():
    """A pool shortfall at pp4 is the PP retract bug only after a retract and
    an abort: a mutant's shortfall in a program without them (the kill
    table's `mut_kv_free_drops_last_index`) is a finding, not this bug."""
    leak = known_bugs.by_name("pp_retract_abort_adopted_decode_leak")
    sig = "InvariantViolation[pool_accounting]"
    find = lambda ops: known_bugs.find(sig, topology="pp4", sglang_version="0.5.23", message=SHORTFALL, ops=ops)
    assert find(["pause_generation(retract)", "abort(r3)", "continue_generation"]) is leak
    assert find(["pause_generation(retract)", "abort_all"]) is leak
    assert find(["flush_cache", "abort(r3)"]) is None, "no retract: another cause"
    assert find(["pause_generation(in_place)", "abort(r3)"]) is None, "an in-place pause retracts nothing"
    assert find(["pause_generation(retract)"]) is None, "no abort"
    # an abort pause is an abort_all (SGLang's tokenizer aborts every request and sends no pause on):
    # the shape the RL cycle's pause(abort) after a retract gives (found by a pp4 dev exploration)
    assert find(["pause_generation(retract)", "continue_generation", "pause_generation(abort)"]) is leak
    assert find(["pause_generation(in_place)", "pause_generation(abort)"]) is None, "no retract"
    assert find(None) is leak, "operations not known (a crash reports none): the message rules decide"
    # besides the PP retract entries, only the control-request crashes whose scenario posts the operation
    # itself need it (a crash of the same exception elsewhere is another bug), and the aborted prefill-only
    # request's dummy token (a token past max_new_tokens=0 of a request the program did not abort is
    # another bug), and the PP profiler corruption (a gloo error after a rank died, or garbage read,
    # in a program without a profile has another cause)
    assert {b.name for b in known_bugs.REGISTRY if b.needs_ops and not b.name.startswith("pp_retract_")} == {
        "release_memory_syncs_build_device", "abort_pause_during_in_place_pause",
        "prefill_only_abort_reports_dummy_token", "disk_update_rollback_reloads_failed_checkpoint",
        "pp_profiler_stop_with_sends_in_flight"}
    dummy = known_bugs.by_name("prefill_only_abort_reports_dummy_token")
    past = ("request r1-9-8 (8-token prompt of family 0, aborted): aborted after 1 tokens, past the end of its "
            "reference after 0 (max_new_tokens=0): [0] emitted after it")
    find = lambda topology, ops: known_bugs.find("OutputMismatch: request <rid>", topology=topology,
                                                 sglang_version="0.5.23", message=past, ops=ops)
    assert find("pp1-overlap", ["abort(r1-9-8)"]) is dummy and find("pp4", ["pause_generation(abort)"]) is dummy
    assert find("pp1-overlap", ["flush_cache"]) is None and find("pp1-normal", ["abort(r1-9-8)"]) is None
    # where the oracle does not compare the request (a weight update during its life), the request
    # contract's length rule sees the same token (met by the unmutated pp1-overlap baseline, 2487c0d)
    contract = ("request r1416-18750-891784: 1 tokens for max_new_tokens=0 (output_ids=[0], finish_reason="
                "{'type': 'abort', 'message': 'Aborted', 'status_code': None, 'err_type': None})")
    assert known_bugs.find("RequestContractError: request <rid>: N tokens for max_new_tokens=N", topology="pp1-overlap",
                           sglang_version="0.5.23", message=contract, ops=["abort(r1)"]) is dummy
    # in a batch with requests that sample, the token is a sampled one, not the dummy 0 (grammar 17's
    # derandomized pp1-overlap baseline)
    sampled = contract.replace("output_ids=[0]", "output_ids=[210]")
    assert known_bugs.find("RequestContractError: request <rid>: N tokens for max_new_tokens=N", topology="pp1-overlap",
                           sglang_version="0.5.23", message=sampled, ops=["abort_all"]) is dummy
    finished = contract.replace("'type': 'abort'", "'type': 'length'")
    assert known_bugs.find("RequestContractError: request <rid>: N tokens for max_new_tokens=N", topology="pp1-overlap",
                           sglang_version="0.5.23", message=finished, ops=["abort(r1)"]) is None, \
        "a token past max_new_tokens=0 of a request that was not aborted is another bug"
    two_slots = known_bugs.by_name("pp_retract_chunk_two_slots")
    owners = ("InvariantViolation[slot_ownership] at step 30: KV indices [5] of live request r1 (row 2) are in the "
              "allocator's free list (owners: r1: row 2 in mbs[0]/running_mbs[1])")
    for ops, expected in ((["pause_generation(retract)", "continue_generation"], two_slots), (["flush_cache"], None)):
        assert known_bugs.find("InvariantViolation[slot_ownership]", topology="pp4", sglang_version="0.5.23",
                               message=owners, ops=ops) is expected, ops


def test_a_crash_is_judged_by_the_operations_its_report_carries():
    """The double release's assertion fires for any KV released twice: a
    crash of a program that posted no retract (the kill table's
    ``mut_prune_keeps_aborted`` at pp4) is a finding; one whose driver sent
    no control log is left to the message rules."""
    from scripted_runtime.user_side.explore.runner import posted_ops
    from scripted_runtime.user_side.result import ScriptResult

    double = known_bugs.by_name("pp_retract_chunk_double_release")
    sig = "SchedulerCrashed: AssertionError: Only a mamba-capable tree cache allows freeing before alloc"
    find = lambda ops: known_bugs.find(sig, topology="pp4", sglang_version="0.5.23", message=sig, ops=ops)
    reported = ScriptResult("s", passed=False, crashed=True, control_log=[{"op": "abort(r1)"}])
    assert posted_ops(reported) == ("abort(r1)",) and find(posted_ops(reported)) is None
    retracted = ScriptResult("s", passed=False, crashed=True, control_log=[{"op": "pause_generation(retract)"}])
    assert find(posted_ops(retracted)) is double
    silent = ScriptResult("s", passed=False, crashed=True, control_log_known=False)
    assert posted_ops(silent) is None and find(posted_ops(silent)) is double


STALE_LAST_MBS = ("InvariantViolation[idle_gate] at step 8: is_fully_idle() says idle but 1 live request(s) are "
                  "held: r0-639-926797 in last_mbs[1] (a flush_cache accepted now would reset the pools under them)")


def test_a_crash_in_the_reset_after_a_registered_server_breaking_failure_is_that_bug():
    """A pp4 dev exploration (2026-11-26) reported "SchedulerCrashed:
    AssertionError in release_kv_cache" four times as new: each program had
    failed on ``pp_retract_abort_stale_last_mbs`` (whose entry says the next
    reset dies), and the reset after it died. The program's own failure
    decides then, for entries that break the server only."""
    from scripted_runtime.user_side.explore.runner import _own_failure, posted_ops, signature_of
    from scripted_runtime.user_side.result import ScriptResult

    stale = known_bugs.by_name("pp_retract_abort_stale_last_mbs")
    assert stale.breaks_server
    log = [{"op": "flush_cache"}, {"op": "pause_generation(retract)"}, {"op": "pause_generation(abort)"}]
    crash = "SchedulerCrashed: AssertionError in release_kv_cache (common.py)"
    settled = ScriptResult("s", passed=False, crashed=True, control_log=log, error=crash,
                           own_failure=(STALE_LAST_MBS, {"kind": "InvariantViolation", "invariant": "idle_gate"}))
    own = _own_failure(settled)
    assert own == ("InvariantViolation[idle_gate]", STALE_LAST_MBS)
    find = lambda own_failure, ops=posted_ops(settled): known_bugs.find(
        signature_of(settled), topology="pp4", sglang_version="0.5.23", message=crash, ops=ops,
        own_failure=own_failure)
    # the crash alone: the entry for the crash a retract then an abort lead to
    assert find(None).name == "pp_retract_abort_adopted_decode_leak"
    assert find(own) is stale, "the program's own registered failure names the cause first"
    assert find(own, ops=("flush_cache", "pause_generation(retract)")) is None, "the entry's operations still count"
    # an entry that leaves the server usable does not explain a crash after it
    calm = known_bugs.by_name("pp_retract_chunk_abort_dropped")
    assert not calm.breaks_server
    dropped = ("ContractViolation[abort]", "ContractViolation[abort] at step 9: r1 vanished from the scheduler "
               "without a finish reason; it was running when the abort came")
    assert known_bugs.find(dropped[0], topology="pp4", sglang_version="0.5.23", message=dropped[1],
                           ops=posted_ops(settled)) is calm
    assert find(dropped) is not calm
    assert _own_failure(ScriptResult("s", passed=False, error="boom")) is None


def test_every_entry_names_a_scenario_and_a_report_that_exist():
    for bug in known_bugs.REGISTRY:
        path, _, func = bug.scenario.partition(":")
        assert f"def {func}(" in (ROOT / path).read_text(), bug.scenario
        report = (ROOT / bug.report).read_text()
        for part in ("## Symptom", "## Minimal scenario", "## Cause", "## Suggested fix"):
            assert part in report, (bug.report, part)
        assert bug.verified_on and all(known_bugs.affects(bug.releases, v) for v in bug.verified_on)


def test_by_name_lists_the_registered_on_a_miss():
    with pytest.raises(KeyError, match="pp_pause_ignored"):
        known_bugs.by_name("nope")


@pytest.mark.parametrize("signature,check", [
    ("ContractViolation[pause]", "contract pause"),
    ("InvariantViolation[idle_gate]", "invariant idle_gate"),
    ("OutputMismatch: request <rid> (N-token prompt of family N, finished)", "output oracle"),
    ("EndStateError: requests lost", "end-state check"),
])
def test_the_kill_table_names_the_check(signature, check):
    assert mutate.caught_by(signature) == check


def test_the_duplicated_token_entry_matches_only_a_repeated_token():
    def msg(out, bad, chunks=", prefilled in chunks"):
        return (f"OutputMismatch: request r4 (65-token prompt of token 1{chunks}, finished): token 1 is {bad}, the "
                f"reference has 429 (output {out}..., reference [8, 429, 508]...)")

    find = lambda m: known_bugs.find("OutputMismatch: request <rid>", topology="pp4", sglang_version="0.5.23",
                                     message=m)
    assert find(msg("[8, 8]", 8)).name == "pp_retract_chunk_duplicate_token"
    assert find(msg("[8, 9]", 9)) is None, "another wrong token is a new finding"
    # the same bug with the context-sensitive weights: the committed first token is what the
    # prompt's first chunk predicts (the oracle says so); another wrong first token is new
    chunk = ("OutputMismatch: request r4 (65-token prompt of family 0, prefilled in chunks, finished): token 0 is "
             "365, the reference has 210 (output [365]..., reference [210]...); token 0 is what the first 64 prompt "
             "tokens predict: a non-final chunk's token")
    assert find(chunk).name == "pp_retract_chunk_duplicate_token"
    assert find(chunk.split("; token 0 is what")[0]) is None
    # an aborted request whose one committed token is a non-final chunk's (the pp4 fuzzing run)
    aborted = ("OutputMismatch: request r1 (150-token prompt of family 1, prefilled in chunks, aborted): aborted "
               "after 1 tokens that are not a prefix of the reference: token 0 is 107, the reference has 109; token 0 "
               "is what the first 128 prompt tokens predict: a non-final chunk's token")
    assert find(aborted).name == "pp_retract_chunk_duplicate_token"
    assert find(aborted.split("; token 0 is what")[0]) is None
    assert known_bugs.find("OutputMismatch: request <rid>", topology="pp1-normal",
                           sglang_version="0.5.23", message=chunk) is None, "PP only"


def test_a_repeated_token_of_a_request_never_prefilled_in_chunks_is_not_the_chunk_bug():
    """Only a request prefilled in chunks has a non-final chunk to commit. A
    short request that repeats its first token after a retraction (what
    mut_fill_ids_refresh_discards_append does: its re-prefill takes the
    prompt alone) is a new finding, not pp_retract_chunk_duplicate_token (the
    pp4 kill tables of 2026-11-29 met it twice as that bug)."""
    find = lambda m: known_bugs.find("OutputMismatch: request <rid>", topology="pp4", sglang_version="0.5.23",
                                     message=m)
    seen = ("OutputMismatch: request r63-14972-803613 (8-token prompt of family 1, finished): token 1 is 154, the "
            "reference has 109 (output [154, 154, 109, 504]..., reference [154, 109, 504, 122]...)")
    assert find(seen) is None
    turn = ("OutputMismatch: request r9 (63-token prompt of family 2, a turn of session 'explored-session-1': its "
            "history as the client's conversation makes it, finished): token 1 is 7, the reference has 9 (output "
            "[7, 7, 9]..., reference [7, 9, 11]...)")
    assert find(turn) is None
    chunked_turn = turn.replace("makes it, finished", "makes it, prefilled in chunks, finished")
    assert find(chunked_turn).name == "pp_retract_chunk_duplicate_token"


def test_the_registry_sees_the_whole_verdict_of_a_session_turns_mismatch():
    """A session turn's mismatch spends ~120 characters on the turn before its
    verdict; the registry must still see the oracle's closing words (the pp4
    dev exploration of 2026-11-29 met this one as a new finding when the
    message was cut at 300 characters)."""
    from scripted_runtime.user_side.explore.runner import first_line

    error = ("OutputMismatch: request r6-21310-480980 (65-token prompt of family 0, a turn of session "
             "'explored-session-1': its history as the client's conversation makes it, prefilled in chunks, finished): "
             "token 0 is 365, the reference has 210 (output [365]..., reference [210]...); token 0 is what the first 64 "
             "prompt tokens predict: a non-final chunk's token\nTraceback: ...")
    assert len(error.splitlines()[0]) > 300
    message = first_line(error)
    assert message.endswith("a non-final chunk's token")
    bug = known_bugs.find("OutputMismatch: request <rid>", topology="pp4", sglang_version="0.5.23", message=message)
    assert bug is not None and bug.name == "pp_retract_chunk_duplicate_token"


def test_a_request_is_chunked_when_a_forward_launched_with_it_as_the_chunked_request():
    from scripted_runtime.scheduler_side.run_counters import BatchRecord

    log = [BatchRecord(1, None, "extend", ("a", "b"), "b"), BatchRecord(2, None, "extend", ("b",), None),
           BatchRecord(3, None, "decode", ("a", "b"), None)]
    assert oracle.was_chunked(log, "b") and not oracle.was_chunked(log, "a") and not oracle.was_chunked([], "b")


def test_the_chunk_hint_names_a_non_final_chunks_token():
    class Ctx:
        scheduler = type("S", (), {"server_args": type("A", (), {"chunked_prefill_size": 4})()})()

    prompt = tuple(range(10, 20))
    calls = []

    def fake_reference(ctx, p, n):
        calls.append(len(p))
        return ([100 + len(p)], 1)
        yield

    import pytest as _pytest

    mp = _pytest.MonkeyPatch()
    mp.setattr(oracle, "reference", fake_reference)
    try:
        def run(gen):
            try:
                while True:
                    next(gen)
            except StopIteration as stop:
                return stop.value

        assert run(oracle.chunk_hint(Ctx(), prompt, [108], [999])) == \
            "; token 0 is what the first 8 prompt tokens predict: a non-final chunk's token"
        assert calls == [4, 8]
        assert run(oracle.chunk_hint(Ctx(), prompt, [5], [999])) == ""  # no chunk predicts it
        assert run(oracle.chunk_hint(Ctx(), prompt, [999], [999])) == ""  # token 0 is right
        assert run(oracle.chunk_hint(Ctx(), prompt[:4], [104], [999])) == ""  # one chunk: nothing to cut
        # the chunks as SGLang scheduled them come first: a chunk that shared its budget with
        # another request ended at 6 (no multiple of 4); a recompute's ends repeat, asked once
        calls.clear()
        assert run(oracle.chunk_hint(Ctx(), prompt, [106], [999], extend_ends=[4, 6, 6, 10])) == \
            "; token 0 is what the first 6 prompt tokens predict: a non-final chunk's token"
        assert calls == [4, 6]
        calls.clear()
        assert run(oracle.chunk_hint(Ctx(), prompt, [110], [999], extend_ends=[4, 10])) == "", \
            "the final extend's end is the whole prompt: its prediction is the right one, not a chunk's"
        assert calls == [4, 8]
    finally:
        mp.undo()


class _Op:
    def __init__(self, name, processed_step, payload=None, success=True):
        self.name, self.processed_step, self.payload, self.success = name, processed_step, payload or {}, success


def test_a_request_is_compared_only_on_kv_of_the_weights_it_runs_under():
    update = _Op("update_weights_from_disk", 10, {"flush_cache": True})
    stale = _Op("update_weights_from_disk", 10, {"flush_cache": False})
    assert oracle.comparable_after_updates(5, [])
    assert not oracle.comparable_after_updates(5, [update])  # posted before: tokens of both weights
    assert oracle.comparable_after_updates(12, [update])
    # no flush: the tree keeps KV of the old weights, a prefix hit reads it (SGLang's meaning of flush_cache=False)
    assert not oracle.comparable_after_updates(12, [stale])
    assert oracle.comparable_after_updates(12, [stale, _Op("flush_cache", 11)])
    assert not oracle.comparable_after_updates(12, [stale, _Op("flush_cache", 11, success=False)])
    assert not oracle.comparable_after_updates(12, [stale, _Op("flush_cache", 9)])  # before the update
    # a flush the update asked for but the scheduler refused (a request still held): the weights
    # changed, the tree did not (0.5.23 answers success=False); met on pp4 and pp1
    refused = _Op("update_weights_from_disk", 10, {"flush_cache": True}, success=False)
    assert not oracle.comparable_after_updates(12, [refused])
    assert oracle.comparable_after_updates(12, [refused, _Op("flush_cache", 11)])


def test_a_feature_topology_has_the_bugs_of_its_plain_topology():
    """pp1-lora is pp1-overlap with LoRA on, pp1-hicache pp1-normal with
    HiCache: a bug of the loop shows there too (a pp1-lora dev exploration
    met the abort-pause wedge and reported it as new before this)."""
    from scripted_runtime.user_side import engine_config

    assert engine_config.base_topology("pp1-lora") == "pp1-overlap"
    assert engine_config.base_topology("pp1-hicache") == "pp1-normal"
    assert engine_config.base_topology("pp4") == "pp4"
    wedge = known_bugs.by_name("abort_pause_during_in_place_pause")
    assert wedge.applies("pp1-lora", "0.5.23") and wedge.applies("pp1-hicache", "0.5.23")
    assert not wedge.applies("pp4", "0.5.23")
    assert not known_bugs.by_name("pp_pause_ignored").applies("pp1-lora", "0.5.23")


def test_an_explored_update_loads_the_served_weights_back_once_the_update_checkpoint_is_loaded(monkeypatch):
    """Every explored weight update changes the weights: the update
    checkpoint (``ctx``'s default) while the served weights are loaded, the
    served weights once it is (a second load of the same checkpoint would
    change nothing, and a bug that shows only when weights change passes)."""
    from types import SimpleNamespace

    served_args = SimpleNamespace(model_path="/models/served", load_format="auto")
    ctx = SimpleNamespace(scheduler=SimpleNamespace(server_args=served_args))
    weights = {"now": (1.0,)}
    monkeypatch.setattr(oracle, "weights_fingerprint", lambda scheduler: weights["now"])
    monkeypatch.setattr(oracle, "_served", {})
    assert oracle.update_source(ctx) == (None, None), "no warm-up recorded the served weights: the default"
    oracle._served["fingerprint"] = (1.0,)
    assert oracle.update_source(ctx) == (None, None), "served weights loaded: the update checkpoint"
    weights["now"] = (2.0,)
    assert oracle.update_source(ctx) == ("/models/served", "auto"), "the update's loaded: the served ones back"
    served_args.load_format = "dummy"
    assert oracle.update_source(ctx) == (None, None), "dummy weights cannot be reloaded: the default"


def test_the_input_logprob_assert_is_the_pp_retract_bug_after_a_retract_and_the_negative_start_otherwise():
    """Two registered bugs trip the same assert in the result processor: a
    retract under PP while a chunk asking for input logprobs is in flight,
    and a logprob_start_len below -1 (one request, no control operation).
    The pp4 dev exploration at 208c8af met the first and the registry took
    it for the second."""
    crash = "SchedulerCrashed: AssertionError in add_input_logprob_return_values (logprob_result_processor.py)"
    find = lambda topology, ops: known_bugs.find(crash, topology=topology, sglang_version="0.5.23", ops=ops)
    assert find("pp4", ["pause_generation(retract)", "continue_generation"]).name == \
        "pp_retract_chunk_input_logprobs_crash"
    assert find("pp4", []).name == "logprob_start_len_negative"
    assert find("pp1-overlap", ["pause_generation(retract)"]).name == "logprob_start_len_negative"


def test_the_reset_crash_after_a_retract_with_a_chunk_in_flight_is_the_adopted_decode_leak():
    """The pp4 dev exploration at c5af699 (seed 575170279, program 1,630):
    the pause contract stopped a program right after a retract took a request
    whose last chunk was in flight; the harness's reset then posted
    continue_generation and abort_all, and release_kv_cache's KV-state assert
    killed the scheduler. Run unchecked, the same program with that abort
    shows the adopted decode's leak first, then this crash: the reset's abort
    is the entry's abort, so the crash is that entry, judged with the
    program's and the reset's operations; without an abort or a retract, or
    at pp=1, it is a new finding."""
    crash = "SchedulerCrashed: AssertionError in release_kv_cache (common.py)"
    find = lambda topology, ops: known_bugs.find(crash, topology=topology, sglang_version="0.5.23", ops=ops,
                                                 message=crash)
    program = ["get_weights_by_name('model.layers.0.mlp.down_proj.weight')", "pause_generation(retract)",
               "update_weights_from_disk"]
    reset = ["continue_generation", "abort_all"]
    assert find("pp4", program + reset).name == "pp_retract_abort_adopted_decode_leak"
    assert find("pp4", program) is None, "no abort: not this entry"
    assert find("pp4", ["pause_generation(in_place)"] + reset) is None, "no retract: not this entry"
    assert find("pp1-overlap", program + reset) is None


def test_the_pause_check_pp_pause_ignored_breaks_is_waived_only_where_it_applies():
    """pp_pause_ignored stopped 181 of 1,760 programs of a pp4 dev
    exploration at its pause check, every program that paused while a
    request ran. Where it applies (pp4, 0.5.23) an exploration turns that
    check off so programs go on past it, and its written files' replay
    commands skip it too; nowhere else, not with the registry off, not
    when asked to keep it."""
    from scripted_runtime.user_side.explore import explorer
    from scripted_runtime.user_side.explore.explore_settings import ExploreSettings
    from scripted_runtime.user_side.server_config import ServerConfig

    waived = lambda topology, version="0.5.23", checks=True: known_bugs.waived_checks(
        known_bugs.REGISTRY, topology=topology, sglang_version=version, checks=checks)
    assert waived("pp4") == {"pause": "pp_pause_ignored"}
    assert waived("pp1-overlap") == {} and waived("pp1-normal") == {}
    assert waived("pp4", version="0.6.0") == {}, "a release the bug is not registered for"
    assert waived("pp4", checks=("idle_gate",)) == {} and waived("pp4", checks=False) == {}
    config, off = explorer.waive_known_checks(ServerConfig("pp4"), ExploreSettings(), "0.5.23")
    assert off == {"pause": "pp_pause_ignored"} and "pause" not in config.checks
    assert "idle_gate" in config.checks and "greedy_output" in config.checks
    assert "--skip-invariant pause" in config.as_cli_args() and "--skip-invariant idle_gate" not in config.as_cli_args()
    for settings in (ExploreSettings(waive_known=False), ExploreSettings(known_bugs=())):
        kept, off = explorer.waive_known_checks(ServerConfig("pp4"), settings, "0.5.23")
        assert off == {} and kept.checks is True
    assert explorer.waive_known_checks(ServerConfig("pp1-normal"), ExploreSettings(), "0.5.23")[1] == {}


@pytest.mark.parametrize("error", [
    # the four forms the PP profiler corruption showed (2026-11-28): a peer of the rank that died
    # of a segmentation fault, twice over gloo; a KV index out of thin air; the harness's scan
    # reading a garbage length
    "SchedulerCrashed: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561] "
    "Connection closed by peer [127.0.0.1]:40333. This is typically caused by a remote worker crashing.",
    "SchedulerCrashed: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:545] "
    "Read error [127.0.0.1]:1746: Connection reset by peer. This is typically caused by a remote worker hanging",
    "SchedulerCrashed: IndexError: index 62997886067213 is out of bounds for dimension 0 with size 8193",
    # a torch built elsewhere: the signature (100 characters) is cut inside the message
    "SchedulerCrashed: RuntimeError: [/home/builder/src/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561] "
    "Connection closed by peer [127.0.0.1]:40333. This is typically caused by a remote worker crashing.",
    "HarnessError: the step observer raised MemoryError: Unable to allocate 459. TiB for an array with shape "
    "(63062137315197,) and data type int64",
])
def test_the_pp_profiler_corruption_is_registered_in_each_form_it_showed_only_after_a_profile(error):
    from scripted_runtime.user_side.explore.runner import posted_ops, signature_of
    from scripted_runtime.user_side.result import ScriptResult

    crashed = error.startswith("SchedulerCrashed")
    result = lambda log: ScriptResult("s", passed=False, crashed=crashed, error=error, control_log=log)
    find = lambda res, topology="pp4": known_bugs.find(signature_of(res), topology=topology, sglang_version="0.5.23",
                                                        message=error.splitlines()[0], ops=posted_ops(res))
    profiled = result([{"op": "start_profile(num_steps=2)"}])
    assert find(profiled).name == "pp_profiler_stop_with_sends_in_flight"
    assert find(result([{"op": "flush_cache"}])) is None, "without a profile the same crash is a new finding"
    assert find(profiled, topology="pp1-overlap") is None, "no PP sends at pp1"


def test_the_pp_profiler_entry_takes_no_ordinary_index_error():
    """An IndexError of a plausible index is some other bug, even after a profile."""
    from scripted_runtime.user_side.explore.runner import posted_ops, signature_of
    from scripted_runtime.user_side.result import ScriptResult

    error = "SchedulerCrashed: IndexError: index 8200 is out of bounds for dimension 0 with size 8193"
    res = ScriptResult("s", passed=False, crashed=True, error=error, control_log=[{"op": "start_profile(num_steps=2)"}])
    assert known_bugs.find(signature_of(res), topology="pp4", sglang_version="0.5.23", message=error,
                           ops=posted_ops(res)) is None
