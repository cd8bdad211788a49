"""Malformed and extreme requests beside ordinary ones: the survival
contract (docs/checks.md, "The survival contract (request fuzzing)").

Run it:
  scripted-runtime run scenarios/request_fuzzing.py:fuzzed_requests_survive
"""

# One case of each class and of each path SGLang refuses by (the tokenizer manager's sampling
# and length rules, the scheduler's ingest checks), none that meets a known server-killing bug.
VALID = ("top_k_all", "new_zero", "temperature_huge", "logprob_start_prompt", "token_ids_logprob_edges",
         "ids_last_token")
REFUSED = ("top_p_zero", "new_negative", "ids_past_context", "ids_past_input_limit", "logprob_start_past_prompt",
           "token_ids_logprob_past_vocab")
UNCHECKED = ("stop_ids_past_vocab", "stop_string_empty", "min_new_equal", "rid_reused")


def fuzzed_requests_survive(ctx, cases=VALID + REFUSED + UNCHECKED):
    """A two-chunk request is mid-prefill when the fuzzed requests arrive,
    one per iteration; an unknown rid is aborted and the cache flushed
    beside them. Every fuzzed request must get the clean answer its values
    call for (served, refused with a message, or either), every request
    must end, the engine must be whole, and a well-formed request sent
    after them must be served (``explore.end_state_checks``)."""
    from scripted_runtime.scheduler_side.explore import program as explore

    reqs = [ctx.start_req(input_ids=explore.prompt_ids(0, 100), max_new_tokens=6, ignore_eos=True,
                          temperature=0.0)]
    for case in cases:
        explore.fuzz_request(ctx, reqs, (case,), family=1, prompt_len=8, max_new_tokens=3)
        yield
    explore.abort_unknown(ctx)
    yield from explore.flush_cache(ctx)
    summary = yield from explore.end_state_checks(ctx, reqs)
    statuses = {h.fuzz_cases[0]: h.status for h in reqs if h.raw}
    assert summary["fuzzed"] == len(cases), summary
    return {**summary, "statuses": statuses}
