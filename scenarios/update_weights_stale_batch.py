"""Issue 14062: update_weights_from_disk(flush_cache=True) meets a stale
running_batch (pp=1, overlap: SGLang's default).

Window: ``finished_not_pruned``. A request has finished, but it still sits in
``running_batch`` / ``last_batch`` / ``result_queue`` because the next
iteration ingests the update before ``get_next_batch_to_run`` prunes it. On the
overlap loop 0.5.23 launches no batch past a length finish, so the request
finishes on a stop token (all 512 token ids of the tiny model are stop
tokens: it stops on its first sampled token, which the scheduler cannot
foresee). The update is sent with ``await_arrival=True``: the finished
request's answer has left, the tokenizer's writer lock is free, and the
update reaches this very iteration.

* <=0.5.21: the weight updater asserts the flush succeeded and kills the
  scheduler; measured on 0.5.13: CRASH "AssertionError: Cache flush failed
  after updating weights" (also 0.5.23 with ``--revert-fix issue14062``).
* 0.5.22+: the weights are updated, the flush is refused, and the answer says
  so (``success=False``, "...the cache was not flushed..."). The scenario
  passes and returns the answer.

Run: ``scripted-runtime run scenarios/update_weights_stale_batch.py:update_weights_in_window``
"""
from __future__ import annotations

ALL_TOKENS = list(range(512))


def update_weights_in_window(ctx):
    req = ctx.start_req(prompt_len=16, max_new_tokens=8, stop_token_ids=ALL_TOKENS)
    detail = yield from ctx.wait_for_window("finished_not_pruned", max_steps=80)
    update = ctx.update_weights_from_disk(flush_cache=True, await_arrival=True)
    yield from update.wait(max_steps=80)
    yield from ctx.wait_finished(req, max_steps=80)
    in_window = update.processed_step == update.posted_step + 1
    assert in_window, f"the update was processed at step {update.processed_step}, not in the window"
    if update.success:
        # The flush went through although a finished request was still held:
        # only safe if the scheduler's idle gate really saw nothing in flight.
        assert ctx.nothing_held, f"update flushed the cache while {detail} was held"
    return {"window": detail, "update_success": update.success, "update_message": update.message}
