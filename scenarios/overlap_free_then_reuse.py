"""Issue 18744: the overlap loop frees a finished request's row while the
next forward still reads it, and hands the row to a new request (pp=1 overlap).

Window: ``finished_not_pruned`` on the overlap loop. Request A finishes on a
stop token (the scheduler cannot foresee it, so A's next decode, forward N,
is already launched). Processing forward N-1's result releases A's
``req_to_token`` row (and its KV) while forward N, launched with that row,
is still in ``result_queue``. A new request B then arrives; with LIFO row
reuse (0.5.19+) B's prefill is given A's row at once and writes it, before
forward N's result is processed.

The harness records, at every launch, the rows of the batches still in
flight (``BatchRecord.in_flight``); the scenario finds the launch that took
a row from under an unprocessed forward and asks what fences the two
(``sglang_compat.row_reuse_fence``):

* Buggy build (CUDA, <0.5.13: no write-after-read barrier): the reuse is
  unfenced; B's writes can land before forward N's reads. The scenario fails
  with the rows and steps.
* Fixed build (CUDA, 0.5.13+ coarse barrier, 0.5.16 read-done event): the
  reuse is fenced by the barrier; the scenario passes.
* CPU (any release): the forward is synchronous, so the reuse is fenced by
  construction. The scenario shows the window and the reuse (the result says
  which rows and steps) and passes; the failing side needs a GPU runner
  (``ci/gpu_corpus.sh``).

Run: ``scripted-runtime run scenarios/overlap_free_then_reuse.py:free_then_reuse``
"""
from __future__ import annotations

from scripted_runtime.hooks import sglang_compat

ALL_TOKENS = list(range(512))


def free_then_reuse(ctx):
    if ctx.loop_kind != "overlap":
        raise ValueError(f"issue 18744 needs the overlap loop; this server runs the {ctx.loop_kind} loop")
    a = ctx.start_req(prompt_len=16, max_new_tokens=8, stop_token_ids=ALL_TOKENS)
    detail = yield from ctx.wait_for_window("finished_not_pruned", max_steps=80)
    a_row = _launched_row(ctx, a.rid)
    b = ctx.start_req(prompt_len=8, max_new_tokens=4, ignore_eos=True, prompt_token=5)
    yield from ctx.wait_finished(a, b, max_steps=80)
    taken = [(rec.step, new, old, row) for rec in ctx.batch_log for new, old, row in rec.rows_taken_in_flight()]
    fence = sglang_compat.row_reuse_fence(ctx.scheduler)
    if taken:
        step, new, old, row = taken[0]
        assert fence is not None, (
            f"row {row} of {old} (still in an unprocessed forward) was given to {new} at step {step} "
            "and nothing orders the forward's reads before the new writes (issue 18744)")
    return {"window": detail, "a_row": a_row, "b_row": _launched_row(ctx, b.rid),
            "reused_in_flight": [{"step": s, "new": n, "in_flight": o, "row": r} for s, n, o, r in taken],
            "fence": fence}


def _launched_row(ctx, rid):
    return next((row for rec in ctx.batch_log for r, row in zip(rec.rids, rec.rows) if r == rid), None)
