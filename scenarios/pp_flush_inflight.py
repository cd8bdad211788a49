"""PR 27446: flush_cache while a PP microbatch is still in flight (pp=4).

Window: ``pp_inflight_after_last_chunk``. A 2-chunk prompt's last chunk has
been dispatched (``chunked_req`` is None) and its extend batch sits in an
``mbs`` slot; every ``running_mbs`` is empty and the queues are empty.

* Buggy build (<=0.5.12.post1, or 0.5.23 with ``--revert-fix pr27446``):
  ``is_fully_idle()`` says idle here. With invariants on (the default) the
  script fails at the window with ``InvariantViolation[idle_gate]``, before
  anything is flushed. With ``--no-invariants`` the flush is accepted, the
  tree is reset under the in-flight chunk, and the chunk's result then
  crashes the scheduler (upstream: "This request holds the node from another
  tree").
* Fixed build (0.5.13+): the flush is refused (``success=False``), the
  request finishes, the scenario passes.

Run: ``scripted-runtime run scenarios/pp_flush_inflight.py:flush_with_chunk_in_flight --pp 4
[--revert-fix pr27446] [--no-invariants]``
"""
from __future__ import annotations


WINDOW = "pp_inflight_after_last_chunk"


def flush_with_chunk_in_flight(ctx):
    req = ctx.start_req(prompt_len=100, max_new_tokens=4, ignore_eos=True)  # 64 + 36 tokens
    detail = yield from ctx.wait_for_window(WINDOW, max_steps=60)
    # One flush per slot step while the window is open: releases differ in
    # which slot their gate lies at (0.5.12.post1 also checks cur_batch and
    # last_batch, which change per slot, so it claims idle a slot or two into
    # the window; 0.5.23 with the fix reverted claims it at once).
    flushes = []
    while ctx.window_open(WINDOW) and len(flushes) < 8:
        flushes.append(ctx.flush_cache())
        yield
    assert flushes and all(f.processed for f in flushes), flushes
    # On a buggy build an accepted flush crashes the scheduler while we step.
    yield from ctx.wait_finished(req, max_steps=200)
    accepted = [i for i, f in enumerate(flushes) if f.success]
    assert not accepted, (
        f"flush_cache was accepted at slot step {accepted[0]} of the window while {detail} was in "
        "flight: is_fully_idle() missed the in-flight microbatch (PR 27446)")
    return {"window": detail, "flushes_refused": len(flushes), "flush_message": flushes[0].message,
            "output_len": len(req.output_ids)}
