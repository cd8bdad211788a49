"""One scenario per named race window: reach it, inject into it, report.

Each returns ``{"window": name, "detail": ..., "hits": {reached, open_steps,
entered}, ...}`` with what the injected operation got back, so the CLI and
the tests show the window's hit count. Run one with e.g.

    scripted-runtime run scenarios/windows.py:finished_not_pruned --no-overlap
    scripted-runtime run scenarios/windows.py:pp_inflight_after_last_chunk --pp 4

Where each window opens on 0.5.23 (CPU, tiny model, chunked_prefill_size 64):
pp_inflight_after_last_chunk on pp=4; finished_not_pruned on the normal loop
and pp=4 (on the overlap loop 0.5.23 does not launch a batch past a
length-finished request, so an unforeseeable stop-token finish is used);
chunked_between_chunks everywhere; overlap_result_pending on overlap; both
pause windows everywhere.
"""
from __future__ import annotations

# Every token of the tiny model's vocabulary (512) is a stop token: the
# request finishes on its first sampled token, which the scheduler cannot
# foresee when it launches the next batch.
ALL_TOKENS = list(range(512))


def _report(ctx, name, detail, **extra):
    return {"window": name, "detail": detail, "hits": ctx.window_stats()[name], **extra}


def pp_inflight_after_last_chunk(ctx):
    """PR 27446, pp=4: a 2-chunk prompt's last chunk is in flight in an mbs
    slot while running_mbs and the queues are empty. A flush there must be
    refused (0.5.13+); before the fix it was accepted and the chunk's result
    later crashed the scheduler."""
    req = ctx.start_req(prompt_len=100, max_new_tokens=4, ignore_eos=True)
    detail = yield from ctx.wait_for_window("pp_inflight_after_last_chunk", max_steps=60)
    flush = ctx.flush_cache()
    yield
    assert flush.processed, flush
    yield from ctx.wait_finished(req, max_steps=200)
    return _report(ctx, "pp_inflight_after_last_chunk", detail, flush_success=flush.success,
                   flush_message=flush.message)


def finished_not_pruned(ctx):
    """Issue 14062: a finished request still sits in running_batch (or
    last_batch / result_queue) when the next iteration ingests. Inject
    update_weights_from_disk(flush_cache=True): <=0.5.21 asserted and killed
    the scheduler; 0.5.22+ answers success=False."""
    if ctx.loop_kind == "overlap":
        req = ctx.start_req(prompt_len=16, max_new_tokens=8, stop_token_ids=ALL_TOKENS)
    else:
        req = ctx.start_req(prompt_len=16, max_new_tokens=4, ignore_eos=True)
    detail = yield from ctx.wait_for_window("finished_not_pruned", max_steps=80)
    # The finished request's answer went out last iteration, so the
    # tokenizer's writer lock is free: the update reaches this very ingest.
    update = ctx.update_weights_from_disk(flush_cache=True, await_arrival=True)
    yield from update.wait(max_steps=80)
    yield from ctx.wait_finished(req, max_steps=80)
    return _report(ctx, "finished_not_pruned", detail, update_success=update.success,
                   update_message=update.message,
                   processed_in_window=update.processed_step == update.posted_step + 1)


def chunked_between_chunks(ctx):
    """PR 17850: a 4-chunk prompt parked between chunks holds its
    req_to_token row; 0.5.9+ keeps the same row to the end of prefill (the
    slot_ownership invariant checks it every step)."""
    req = ctx.start_req(prompt_len=200, max_new_tokens=2, ignore_eos=True)
    detail = yield from ctx.wait_for_window("chunked_between_chunks", max_steps=40)
    row = req.req_pool_idx
    rows = {row}
    while req.is_chunking or req.status == "waiting":
        yield
        if req.req_pool_idx is not None:
            rows.add(req.req_pool_idx)
    yield from ctx.wait_finished(req, max_steps=200)
    assert rows == {row}, f"chunked request changed rows: {sorted(rows)}"
    return _report(ctx, "chunked_between_chunks", detail, row=row, chunks=req.chunks_done)


def overlap_result_pending(ctx):
    """Issue 18744, overlap loop: batch N is launched before N-1's result is
    processed; a request that N-1 finished is still in N, whose forward reads
    the row the finish just freed. Fixed by a write-after-read barrier
    (0.5.13/0.5.16); here a second request starts in that window and must
    not be given a row that is still read."""
    long_req = ctx.start_req(prompt_len=16, max_new_tokens=16, ignore_eos=True)
    short = ctx.start_req(prompt_len=16, max_new_tokens=8, stop_token_ids=ALL_TOKENS)
    detail = yield from ctx.wait_for_window("overlap_result_pending", max_steps=80)
    late = ctx.start_req(prompt_len=8, max_new_tokens=4, ignore_eos=True)
    yield from ctx.wait_finished(long_req, short, late, max_steps=200)
    return _report(ctx, "overlap_result_pending", detail, late_output=len(late.output_ids))


def _flush_then_resume(ctx, req):
    """Inject a flush into the pause, resume, and let the request finish
    (600 steps: under PP a lone request decodes once per 6 slot steps)."""
    flush = ctx.flush_cache()
    yield from flush.wait()
    ctx.continue_generation()
    yield from ctx.wait_finished(req, max_steps=600)
    return flush


def paused_in_place_busy(ctx):
    """PR 10071: pause_generation(in_place) leaves the batch as it is, so a
    flush during the pause is refused; generation resumes intact."""
    req = ctx.start_req(prompt_len=16, max_new_tokens=40, ignore_eos=True)
    yield from ctx.wait_until(lambda: req.status == "running", max_steps=40, what=f"{req.rid} decoding")
    pause = ctx.pause_generation("in_place")
    detail = yield from ctx.wait_for_window("paused_in_place_busy", max_steps=20)
    flush = yield from _flush_then_resume(ctx, req)
    return _report(ctx, "paused_in_place_busy", detail, pause_success=pause.success,
                   flush_success=flush.success, output_len=len(req.output_ids))


def paused_retract_waiting_with_kv(ctx):
    """PR 10071: pause_generation(retract) re-queues the running request; its
    KV stays in the radix tree. A flush now (accepted from 0.5.21, which
    ignores the waiting queue) drops that cache; the request recomputes it
    after continue_generation and still finishes."""
    req = ctx.start_req(prompt_len=16, max_new_tokens=40, ignore_eos=True)
    yield from ctx.wait_until(lambda: len(req.output_ids) >= 4, max_steps=60, what=f"{req.rid} to decode 4 tokens")
    ctx.pause_generation("retract")
    detail = yield from ctx.wait_for_window("paused_retract_waiting_with_kv", max_steps=20)
    flush = yield from _flush_then_resume(ctx, req)
    return _report(ctx, "paused_retract_waiting_with_kv", detail, flush_success=flush.success,
                   output_len=len(req.output_ids))


def decode_retracted_waiting(ctx):
    """Decoding runs short of KV: three 150-token prompts decode, then the
    harness takes every free slot but the room SGLang reserved for them
    (``explore.exhaust_kv``: the most new tokens one request may still
    decode, 11). Three decode steps later the next cannot fit, and
    ``retract_decode`` puts requests back in the waiting queue; given the
    KV back, they are re-admitted with their prompt and generated tokens,
    and every output must still be its reference's (the end-state checks)."""
    from scripted_runtime.scheduler_side.explore import program as explore

    reqs = [ctx.start_req(input_ids=explore.prompt_ids(f, 150), max_new_tokens=12, ignore_eos=True,
                          temperature=0.0) for f in range(3)]
    yield from ctx.wait_until(lambda: all(h.status == "running" and h.output_ids for h in reqs), max_steps=40,
                              what="three requests decoding")
    taken = yield from explore.exhaust_kv(ctx, 0)
    # under PP a step is one microbatch slot and each request decodes in its own
    slots = max(1, len(getattr(ctx.scheduler, "mbs", None) or ()))
    detail = yield from ctx.wait_for_window("decode_retracted_waiting", max_steps=10 * slots)
    explore.release_kv(ctx)
    checks = yield from explore.end_state_checks(ctx, reqs)
    retracted = sum(1 for h in reqs if getattr(h.last_req, "retraction_count", 0))
    return _report(ctx, "decode_retracted_waiting", detail, taken=taken, retracted=retracted, **checks)


def prefill_not_merged(ctx):
    """PR 10071: a pause(retract) in the iteration right after a prefill:
    the prefill batch sits in ``last_batch``, not merged yet, and the pause
    must retract its request too (0.5.23 does so explicitly); after
    continue_generation it finishes with its reference's tokens (the
    end-state checks)."""
    from scripted_runtime.scheduler_side.explore import program as explore

    req = ctx.start_req(input_ids=explore.prompt_ids(0, 20), max_new_tokens=6, ignore_eos=True, temperature=0.0)
    detail = yield from ctx.wait_for_window("prefill_not_merged", max_steps=10)
    ctx.pause_generation("retract")
    yield from ctx.steps(2)
    retracted = req.status == "waiting"
    ctx.continue_generation()
    checks = yield from explore.end_state_checks(ctx, [req])
    return _report(ctx, "prefill_not_merged", detail, retracted=retracted, **checks)


ALL = (pp_inflight_after_last_chunk, finished_not_pruned, chunked_between_chunks,
       overlap_result_pending, paused_in_place_busy, paused_retract_waiting_with_kv, decode_retracted_waiting,
       prefill_not_merged)
