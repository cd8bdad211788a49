"""Request fuzzing's field cases, payloads and the survival contract's
verdicts (pure logic; the real-server side is tests/server/test_request_fuzz.py)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from scripted_runtime import known_bugs
from scripted_runtime.scheduler_side import request_fuzz as F
from scripted_runtime.user_side.explore import actions as A
from scripted_runtime.user_side.explore import strategies

LIMITS = {"V": 512, "C": 4096, "L": 4090}


def payload(*cases, prompt=(5, 6, 7), new=4, reused=None):
    return F.build_payload(cases, prompt=list(prompt), max_new_tokens=new, rid="r1", limits=LIMITS,
                           reused_rid=reused)


def test_the_base_request_is_well_formed_and_deterministic():
    p = payload()
    assert p == {"input_ids": [5, 6, 7], "rid": "r1",
                 "sampling_params": {"temperature": 1.0, "sampling_seed": 0, "ignore_eos": True, "max_new_tokens": 4}}


def test_symbolic_values_resolve_against_the_model():
    assert payload("ids_past_vocab")["input_ids"] == [512] * 3
    assert payload("ids_negative")["input_ids"] == [-1] * 3
    assert payload("ids_last_token")["input_ids"] == [511] * 3
    assert len(payload("ids_past_context")["input_ids"]) == 4096
    # the longest prompt the scheduler takes (shorter than max_req_input_len), with one new token
    at_limit = payload("ids_at_input_limit", new=4)
    assert len(at_limit["input_ids"]) == 4089 and at_limit["sampling_params"]["max_new_tokens"] == 1
    assert len(payload("ids_past_input_limit")["input_ids"]) == 4090
    assert payload("ids_empty")["input_ids"] == []
    # past the context whatever the prompt (an empty one included)
    assert payload("new_past_context")["sampling_params"]["max_new_tokens"] == 4097
    assert payload("min_new_past_max", new=4)["sampling_params"]["min_new_tokens"] == 5
    assert payload("token_ids_logprob_negative")["token_ids_logprob"] == [-1]
    assert payload("stop_ids_past_vocab")["sampling_params"]["stop_token_ids"] == [519]
    assert payload("logit_bias_past_vocab")["sampling_params"]["logit_bias"] == {"512": 1.0}
    p = payload("logprob_start_past_prompt")
    assert p["logprob_start_len"] == 3 + 100 and p["return_logprob"] is True
    assert payload("token_ids_logprob_past_vocab")["token_ids_logprob"] == [512]


def test_a_later_case_on_the_same_field_wins_and_the_rid_is_reused_only_when_there_is_one():
    assert payload("new_one", "new_zero")["sampling_params"]["max_new_tokens"] == 0
    assert payload("rid_reused")["rid"] == "r1"
    assert payload("rid_reused", reused="r0")["rid"] == "r0"


def test_an_unknown_case_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown field case.*nope"):
        payload("nope")


def test_expressions_cannot_run_code():
    with pytest.raises(ValueError, match="may use only"):
        F._eval("__import__('os')", {"V": 1, "C": 1, "P": 1, "N": 1})


def test_expectation_follows_the_classes():
    assert F.expectation(["ids_token_zero", "top_k_all"]) == "served"
    assert F.expectation(["ids_token_zero", "top_p_zero"]) == "refused"
    assert F.expectation(["stop_ids_past_vocab"]) == "either"
    assert F.expectation(["stop_ids_past_vocab", "temperature_negative"]) == "refused"


@pytest.mark.parametrize("status,body,error,verdict", [
    (200, {"output_ids": [1, 2], "meta_info": {"finish_reason": {"type": "length"}}}, None, "served"),
    (400, {"error": {"message": "top_p must be in (0, 1]"}}, None, "refused"),
    (200, {"output_ids": [], "meta_info": {"finish_reason": {"type": "abort", "message": "too long"}}}, None,
     "refused"),
    (400, {}, None, "broken"),
    (500, {"error": {"message": "boom"}}, None, "broken"),
    (None, None, "ConnectionResetError", "broken"),
])
def test_verdicts(status, body, error, verdict):
    assert F.verdict(status, body, error)[0] == verdict


def test_judge_names_each_broken_promise():
    ok = {"output_ids": [1], "meta_info": {"finish_reason": {"type": "length"}}}
    refused = {"error": {"message": "bad"}}
    assert F.judge(["top_k_all"], 200, ok, None) is None
    assert "only valid values was refused" in F.judge(["top_k_all"], 400, refused, None)
    assert "refuse was served" in F.judge(["top_p_zero"], 200, ok, None)
    assert F.judge(["top_p_zero"], 400, refused, None) is None
    assert F.judge(["stop_ids_past_vocab"], 200, ok, None) is None
    assert F.judge(["stop_ids_past_vocab"], 400, refused, None) is None
    assert "no clean answer" in F.judge(["stop_ids_past_vocab"], 503, "down", None)


def test_every_case_is_classed_justified_and_its_known_bug_registered():
    for case in F.CASES:
        assert case.cls in F.CLASSES and case.why, case
        if case.known_bug:
            assert known_bugs.by_name(case.known_bug).breaks_server
    # the valid ones come first within a field: shrinking goes towards a valid value
    names = [c.name for c in F.CASES]
    assert names[0] == "ids_token_zero"


def test_cases_meeting_a_server_killing_bug_are_left_out_unless_asked_for():
    every = F.drawable_cases(())
    left = F.drawable_cases(("prompt_token_out_of_vocab",))
    assert set(every) - set(left) == {"ids_past_vocab", "ids_negative"}
    assert "top_logprobs_past_vocab" not in F.drawable_cases(("top_logprobs_num_past_vocab",))
    assert "logprob_start_negative" not in F.drawable_cases(("logprob_start_len_negative",))


def test_fuzz_cases_for_reads_the_registry_by_topology_and_release():
    from scripted_runtime.user_side.explore.explore_settings import ExploreSettings
    from scripted_runtime.user_side.explore.search import fuzz_cases_for

    reg = known_bugs.REGISTRY
    assert fuzz_cases_for(ExploreSettings(), reg, topology="pp1-overlap", version="0.5.23") is None
    on = ExploreSettings(fuzz_requests=True)
    assert "ids_past_vocab" not in fuzz_cases_for(on, reg, topology="pp1-overlap", version="0.5.23")
    # a release the bug is not registered for: drawn
    assert "ids_past_vocab" in fuzz_cases_for(on, reg, topology="pp1-overlap", version="0.6.0")
    known = ExploreSettings(fuzz_requests=True, fuzz_known_crashes=True)
    assert "ids_past_vocab" in fuzz_cases_for(known, reg, topology="pp1-overlap", version="0.5.23")


@settings(max_examples=50, deadline=None)
@given(st.data())
def test_drawn_programs_compile_and_fuzz_only_when_asked(data):
    cases = F.drawable_cases(("prompt_token_out_of_vocab",))
    program = data.draw(strategies.programs("pp1-overlap", fuzz_cases=cases))
    source = A.to_source(program).text
    compile(source, "program", "exec")
    for action in program:
        if isinstance(action, A.FuzzRequest):
            assert set(action.cases) <= set(cases) and 1 <= len(action.cases) <= strategies.FUZZ_MAX_CASES
    plain = data.draw(strategies.programs("pp1-overlap"))
    assert not any(isinstance(a, (A.FuzzRequest, A.AbortUnknown)) for a in plain)


def test_a_fuzzed_request_compiles_to_the_helper_and_is_held_back_in_a_pause():
    program = [A.Start(8, 0, 2), A.Pause("retract"), A.FuzzRequest(("top_p_zero", "new_one"), 1, 63, 3),
               A.AbortUnknown()]
    text = A.to_source(program).text
    assert ("explore.fuzz_request(ctx, reqs, ('top_p_zero', 'new_one'), family=1, prompt_len=63, "
            "max_new_tokens=3)") in text
    assert "    if explore.can_start(ctx):\n        explore.fuzz_request" in text
    assert "explore.abort_unknown(ctx)" in text


def test_an_abort_the_program_posted_excuses_a_valid_requests_abort_answer():
    aborted = {"output_ids": [], "meta_info": {"finish_reason": {"type": "abort", "message": "Abort in waiting queue"}}}
    assert "only valid values was refused" in F.judge(["ids_token_zero"], 200, aborted, None)
    assert F.judge(["ids_token_zero"], 200, aborted, None, aborted_by_program=True) is None
    # an abort never excuses a broken answer or a served invalid value
    assert "no clean answer" in F.judge(["ids_token_zero"], 500, "x", None, aborted_by_program=True)
    assert F.aborted_by_program(["flush_cache", "abort(fz1-2-3)"])
    assert F.aborted_by_program(["abort_all"]) and F.aborted_by_program(["pause_generation(abort)"])
    assert not F.aborted_by_program(["flush_cache", "pause_generation(retract)", "continue_generation"])


def test_a_later_case_that_undoes_an_earlier_one_takes_its_class_with_it():
    # the prompt set twice: only the last counts (an explored program shrank to this, wrongly judged)
    assert F.effective_cases(["ids_past_input_limit", "ids_token_zero"]) == ["ids_token_zero"]
    assert F.expectation(["ids_past_input_limit", "ids_token_zero"]) == "served"
    assert F.expectation(["ids_token_zero", "ids_past_input_limit"]) == "refused"
    # a case that sets max_new_tokens with its prompt undoes an earlier max_new_tokens case, and the reverse
    assert F.effective_cases(["new_past_context", "ids_at_input_limit"]) == ["ids_at_input_limit"]
    assert F.effective_cases(["ids_at_input_limit", "new_zero"]) == ["new_zero"]
    # the same value set with it is no undoing: both logprob cases hold
    assert F.effective_cases(["logprob_start_past_prompt", "logprob_on"]) == ["logprob_start_past_prompt",
                                                                                "logprob_on"]
    assert F.expectation(["logprob_start_past_prompt", "logprob_on"]) == "refused"
    # P is the prompt as it stands when a case is applied
    assert payload("ids_at_input_limit", "logprob_start_prompt")["logprob_start_len"] == 4089


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([c.name for c in F.CASES]), min_size=1, max_size=3))
def test_the_effective_cases_values_are_what_the_payload_holds(cases):
    """Every case judged (``effective_cases``) has its value in the payload;
    what an undone case leaves (a field it set with its own: one new token,
    logprobs on) is a valid value, so it changes no class."""
    def get(p, field):
        return p["sampling_params"].get(field.split(".", 1)[1]) if field.startswith("sampling_params.") else p.get(field)

    full, effective = payload(*cases), F.effective_cases(cases)
    alone = payload(*effective)
    for case in effective:
        c = F.BY_NAME[case]
        if c.expr and ("N" in c.expr or "P" in c.expr):
            continue  # computed from the request as the earlier cases left it (N, P), not from the case alone
        for field in F.owned_fields(case):
            assert get(full, field) == get(alone, field), (case, field)


def test_a_value_sglang_ignores_is_valid():
    # SamplingParams turns temperature 0 into greedy sampling (top_k = 1) before verify: any top_k is
    # then served (the pp1-normal dev run met this as a false "served" finding)
    assert F.expectation(["top_k_zero"]) == "refused"
    assert F.expectation(["top_k_zero", "temperature_zero"]) == "served"
    assert F.expectation(["min_p_one", "top_k_zero", "temperature_zero"]) == "served"
    assert F.expectation(["temperature_zero", "top_k_zero", "top_p_zero"]) == "refused"


def test_without_a_rid_the_payload_leaves_it_to_send_generate():
    p = F.build_payload(["top_k_all"], prompt=[1, 2], max_new_tokens=2, rid=None, limits=LIMITS)
    assert "rid" not in p
    assert F.build_payload(["rid_reused"], prompt=[1], max_new_tokens=1, rid=None, limits=LIMITS,
                           reused_rid="r3-1-2")["rid"] == "r3-1-2"


def test_the_signature_names_the_broken_promise_not_the_cases():
    from scripted_runtime.user_side.explore.runner import signature_of
    from scripted_runtime.user_side.result import ScriptResult

    def sig(msg):
        return signature_of(ScriptResult(script="p", passed=False, error=f"SurvivalError: {msg}"))

    a = sig(F.judge(["top_k_all"], 400, {"error": {"message": "bad"}}, None))
    b = sig(F.judge(["extra_key", "top_k_one"], 400, {"error": {"message": "bad"}}, None))
    assert a == b and "only valid values was refused" in a
    assert sig(F.judge(["top_p_zero"], 200, {"output_ids": [1]}, None)) != a
