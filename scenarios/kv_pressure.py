"""KV pressure (``explore.exhaust_kv``) against what SGLang admitted.

``exhaust_kv_while_chunking``: the program the pp1-normal request-fuzzing
run stopped on (2026-11-26; its fuzzed requests and the weight update after
the crash taken out, action numbers as found). A 65-token request finishing and a 192-token prompt whose first
chunk has run; then the harness takes the free KV. Its earlier room rule
(the largest request's prompt and new tokens less *everything* SGLang
held) left 60 tokens, and the 192-token prompt's next chunk could not be
allocated: ``SchedulerCrashed: Out of memory ... Available full tokens: 1``
from ``alloc_for_extend``. That was the harness's fault, not SGLang's:
admission counted the whole prompt when it admitted the request, and a
prefill in progress cannot be retracted (``get_new_batch_prefill``
continues it with a full chunk). The room is now what SGLang reserved for
the requests it admitted (``program.room_sglang_reserved``): every prompt
token still to extend, plus the most new tokens one request may decode.

  scripted-runtime run scenarios/kv_pressure.py:exhaust_kv_while_chunking --no-overlap
"""
from scripted_runtime.scheduler_side.explore import program as explore


def exhaust_kv_while_chunking(ctx):
    """Must pass: every request finishes with its reference's tokens while
    the pressure holds (returns the tokens taken and the end-state checks)."""
    reqs = []
    # 1. start: 65 tokens of family 0 (2 chunks), 8 new, streamed
    reqs.append(ctx.start_req(input_ids=explore.prompt_ids(0, 65), max_new_tokens=8, ignore_eos=True,
                              temperature=0.0, stream=True))
    yield from ctx.steps(8)
    # 6. flush_cache (refused: the first request is still decoding)
    yield from explore.flush_cache(ctx)
    # 8. start: 192 tokens of family 0 (3 chunks), 4 new, streamed, EOS ends it
    reqs.append(ctx.start_req(input_ids=explore.prompt_ids(0, 192), max_new_tokens=4, ignore_eos=False,
                              temperature=0.0, stream=True))
    # 10. exhaust KV: hold every free slot but the room, the radix cache evicted first
    taken = yield from explore.exhaust_kv(ctx, 0, evict_cache=True)
    # 11. step 6: the 192-token prompt's next chunks run under the pressure (the old rule crashed here)
    yield from ctx.steps(6)
    # (12. an update_weights_from_disk came next in the found program: left out, so that the
    # outputs are compared against references under the same weights)
    checks = yield from explore.end_state_checks(ctx, reqs)
    return {"taken": taken, **checks}


def two_arrive_at_the_admission_boundary(ctx):
    """Must pass: two 8-token requests of one new token each arrive together
    while the free KV (the tree evicted) holds 17 tokens: room for the
    first's prompt, token and page (10) and less than the second's too (20).
    SGLang admits the first and keeps the second waiting until the first
    finished; the ``admission_budget`` contract (docs/checks.md) holds, and
    both outputs are their references'. With
    ``mut_prefill_budget_ignores_admitted_extend`` one pass admits both
    (20 tokens of prompts, new tokens and pages in 17):
    ``ContractViolation[admission_budget]``.

      scripted-runtime run scenarios/kv_pressure.py:two_arrive_at_the_admission_boundary --no-overlap
    """
    taken = yield from explore.exhaust_kv(ctx, 17, evict_cache=True)
    reqs = [ctx.start_req(input_ids=explore.prompt_ids(1, 8), max_new_tokens=1, ignore_eos=True, temperature=0.0),
            ctx.start_req(input_ids=explore.prompt_ids(2, 8), max_new_tokens=1, ignore_eos=True, temperature=0.0)]
    yield from ctx.steps(6)
    explore.release_kv(ctx)
    checks = yield from explore.end_state_checks(ctx, reqs)
    return {"taken": taken, **checks}
