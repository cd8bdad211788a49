"""Walkthrough scenario: flush_cache injected while a finished request is
still held by the scheduler (the window behind SGLang issue 14062).

A request that finished in iteration N stays in ``running_batch`` (and, under
overlap, in ``last_batch``) until iteration N+1's ``get_next_batch_to_run``
prunes it, but ``ingest_requests`` - where a flush is processed - runs first.
A flush injected in that window must be refused by the scheduler's idle gate;
the script checks that the refusal reaches it, and that a flush after the
prune succeeds.

    scripted-runtime run scenarios/flush_vs_finished_request.py:flush_in_window
    scripted-runtime run scenarios/flush_vs_finished_request.py:flush_in_window --pp 4
"""


def flush_in_window(ctx, max_new_tokens=4):
    # 1. set up the state: one short request
    req = ctx.start_req(prompt_len=16, max_new_tokens=max_new_tokens, ignore_eos=True)

    # 2. wait for the moment: finished, but still held somewhere
    yield from ctx.wait_until(
        lambda: req.req is not None and req.req.finished(),
        max_steps=100,
        what="the request finished but not yet pruned",
    )
    held_by = req.holders  # e.g. ['running_batch', 'last_batch']

    # 3. inject into the window; the flush is processed in the next iteration
    op = ctx.flush_cache()
    yield

    # 4. assert what the scheduler answered and the state it left
    assert op.processed, f"flush not processed in the next iteration: {op}"
    assert op.success is False, (
        f"flush accepted while {req.rid} was held by {held_by}: {ctx.describe()}"
    )
    yield from ctx.wait_idle(max_steps=50)
    op2 = ctx.flush_cache()
    yield
    assert op2.success is True, f"flush after the prune was refused: {op2}"
    assert ctx.tree_node_count() == 0
    return {"held_by": held_by, "refused": op.message}
