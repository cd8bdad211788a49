"""Session turns: requests that continue an open session (``session_params``),
the conversation shape of chat serving (docs/writing-scenarios.md
"Sessions").

    .venv/bin/scripted-runtime run scenarios/sessions.py:three_turns
    .venv/bin/scripted-runtime run scenarios/sessions.py:turn_after_an_unfinished_one

A turn's prompt is the session's history: SGLang builds it from the turn it
continues (that turn's whole prompt and its output) and the turn's own
input. The output oracle compares each turn with a fresh request of that
whole history, as the client's conversation makes it
(``handle.expected_prompt``), so a history SGLang builds wrong shows as a
mismatch.
"""
from scripted_runtime.scheduler_side.explore import program as explore

SESSION = "chat"


def _turn(ctx, family, length, after=None, max_new_tokens=6):
    return ctx.start_req(input_ids=explore.prompt_ids(family, length), max_new_tokens=max_new_tokens,
                         ignore_eos=True, temperature=0.0, session=SESSION, after=after)


def three_turns(ctx):
    """Three turns, each after the last finished, with an unrelated request
    decoding beside the second; the session closed while the third runs
    (SGLang marks it and closes it when the turn finishes). Every turn's
    output must be its history's reference, and SGLang's own record of each
    turn's prompt must be that history."""
    op = ctx.open_session(SESSION)
    yield from op.wait()
    assert op.success, op.message
    first = _turn(ctx, 0, 40)
    yield from ctx.wait_until(lambda: first.status == "finished", max_steps=200, what="the first turn to finish")
    second = _turn(ctx, 1, 20, after=first)
    beside = ctx.start_req(input_ids=explore.prompt_ids(2, 65), max_new_tokens=8, ignore_eos=True, temperature=0.0)
    yield from ctx.wait_until(lambda: second.status == "finished", max_steps=200, what="the second turn to finish")
    third = _turn(ctx, 0, 8, after=second)
    yield from ctx.steps(2)
    close = ctx.close_session(SESSION)
    yield from close.wait()
    reqs = [first, second, beside, third]
    end = yield from explore.end_state_checks(ctx, reqs)
    for turn in (second, third):
        recorded = list(getattr(turn.last_req, "origin_input_ids", ()) or ())
        assert recorded == turn.expected_prompt, (f"turn {turn.rid}: SGLang's prompt {len(recorded)} tokens, the "
                                                  f"history {len(turn.expected_prompt)}")
    assert len(third.expected_prompt) == 40 + 6 + 20 + 6 + 8, len(third.expected_prompt)
    assert end["outputs_compared"] >= 4, end
    assert SESSION not in ctx.open_sessions, ctx.open_sessions
    return end


def turn_after_an_unfinished_one(ctx):
    """A turn continuing after a turn still decoding: SGLang aborts it
    ("appending to a request that hasn't finished"); the turn it named runs
    on and is compared as usual."""
    op = ctx.open_session(SESSION)
    yield from op.wait()
    first = _turn(ctx, 0, 40, max_new_tokens=12)
    yield from ctx.wait_until(lambda: len(first.output_ids) >= 2, max_steps=200, what="the first turn decoding")
    early = _turn(ctx, 1, 20, after=first)
    assert early.expected_prompt is None  # no history yet: the oracle does not judge it as a turn
    end = yield from explore.end_state_checks(ctx, [first, early])
    assert early.status == "aborted" and first.status == "finished", (early.status, first.status)
    assert end["outputs_compared"] >= 1, end
    close = ctx.close_session(SESSION)
    yield from close.wait()
    return end
