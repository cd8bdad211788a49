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


def reused_rid_after_abort(ctx):
    """A chunked request is aborted while flushes are refused beside it; its
    rid is then sent again with another prompt (what the explorer's
    ``rid_reused`` does). SGLang's tokenizer has forgotten the rid once it
    answered the abort, so it takes the second request and serves it. The
    harness must tell the two apart: each handle follows its own request
    (the first stays aborted with its empty answer, the second finishes with
    its own tokens), the abort contract follows the aborted Req, not its rid
    (the explorer's first dev run met both as false failures before)."""
    from scripted_runtime.scheduler_side.explore import program as explore

    reqs = [ctx.start_req(input_ids=explore.prompt_ids(0, 128), max_new_tokens=3, ignore_eos=True,
                          temperature=0.0, stream=True)]
    yield from explore.flush_cache(ctx)
    yield from explore.flush_cache(ctx)
    explore.abort_one(ctx, reqs, 0)
    explore.abort_unknown(ctx)
    yield from explore.flush_cache(ctx)
    first = reqs[0]
    # under PP the aborted request leaves the slots a few iterations later
    yield from ctx.wait_until(lambda: first.finished and not first.holders, max_steps=60,
                              what="the aborted request to end and be held nowhere")
    second = explore.fuzz_request(ctx, reqs, ("ids_token_zero", "rid_reused", "top_k_all"), family=2,
                                  prompt_len=64, max_new_tokens=5)
    summary = yield from explore.end_state_checks(ctx, reqs)
    assert second.rid == first.rid, (second.rid, first.rid)
    assert first.status == "aborted" and second.status == "finished", (first, second)
    assert len(second.output_ids) == 5 and second.http.status == 200, second.http.as_dict()
    return {**summary, "rid": first.rid}
