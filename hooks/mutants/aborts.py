"""Mutants of the abort paths: which batches an abort scans for running
requests, and the answer an aborted queued request gets. Written blind as a
second set (issue 34): the harness's checks and what its explorer draws were
not read, and the mutants were measured as external patches before anyone
read them, so ``expected`` is a guess of what should notice the bug."""
from __future__ import annotations

from typing import Any

from scripted_runtime.hooks.mutants.base import (ALL, check_copied_body, mutant, find_attr, find_method,
                                                 replace_attr, scheduler_class)

# Digest of the 0.5.23 body that mut_abort_misses_unmerged_prefill copies
# (normalized source: dedented, blank lines dropped, trailing space stripped).
COLLECT_INFLIGHT_BATCHES_DIGEST = "981b1ac61118ddba"


# --- running abort: the just-prefilled batch is not scanned ------------------------


@mutant("mut_abort_misses_unmerged_prefill", topologies=ALL,
        summary="abort scans only the running batch, not last_batch (PP: not the in-flight micro-batches): "
                "an abort right after a request's prefill is lost",
        expected="unknown (written blind); should show as an abort that is lost (a request aborted right after "
                 "its prefill decodes on and answers normally instead of as aborted)")
def _install_mut_abort_misses_unmerged_prefill(scheduler_module: Any) -> None:
    """``Scheduler._collect_inflight_batches`` (what ``abort_request``
    scans, through ``collect_inflight_reqs``, for requests to mark
    ``to_finish = FINISH_ABORT``) returns only the running batch at pp=1
    (``[self.running_batch]``, ``self.last_batch`` dropped) and only the
    running micro-batches under PP (``self.running_mbs``, ``self.mbs``
    dropped). A request admitted by the last prefill batch is not in the
    running batch yet: ``get_next_batch_to_run`` merges ``last_batch`` into it
    only after ``ingest_requests`` has handled the abort. Such a request is
    not in the waiting queue either, and (unless it is the chunked request)
    nothing else finds it: the abort is silently dropped, and the tokenizer
    manager does not send it again (``abort_sent``).

    Plausible: "in-flight" read as "in the running batch"; the extra
    ``last_batch`` entry looks redundant because it is merged into the
    running batch at the next step anyway. Aborts of queued requests, of the
    chunked request and of requests that have decoded at least once still
    work. The body is copied from 0.5.23 (checked by source digest) with that
    one line per branch changed. Side effects: the same list feeds the
    running-timeout poll (off by default) and the weight-version bookkeeping
    of live requests.

    Trigger: an abort (by rid, or abort_all, e.g. pause_generation(abort))
    that reaches the scheduler in the step right after the request's prefill
    ran (normal loop: after the prefill batch ran and its result was
    processed; overlap loop: while its result is still queued; PP: while the
    prefill micro-batch is in flight), for a request that is not chunked.

    Seen by (written blind), as a user sees it: the aborted request is not
    aborted; it decodes on and returns a normal answer (finish_reason length
    / stop) instead of an abort. pause_generation(abort) keeps resending
    abort_all until such a request finishes by itself. No crash, no leak.
    All topologies."""
    mutant = "mut_abort_misses_unmerged_prefill"
    cls = scheduler_class(scheduler_module, mutant)
    get_parallel = find_attr(scheduler_module, "get_parallel", mutant, "sglang.srt.managers.scheduler.get_parallel")
    find_method(cls, "collect_inflight_reqs", mutant)
    original = find_method(cls, "_collect_inflight_batches", mutant)
    check_copied_body(original, COLLECT_INFLIGHT_BATCHES_DIGEST, mutant, "Scheduler._collect_inflight_batches")

    def _collect_inflight_batches(self):
        if get_parallel().pp_size == 1:
            inflight_batches = [self.running_batch]  # MUTANT: was [self.running_batch, self.last_batch]
        else:
            inflight_batches = [*self.running_mbs]  # MUTANT: was [*self.running_mbs, *self.mbs]
        if self.enable_continuous_input_polling and self.result_queue:
            # Polling can run intake before the newest queued batch becomes last_batch.
            inflight_batches.extend(batch for batch, _ in self.result_queue)
        return inflight_batches

    replace_attr(cls, "_collect_inflight_batches", _collect_inflight_batches, original)


# --- queued abort: the request is dropped without an answer ------------------------


def _drop_abort_output(abort_req: Any, req: Any) -> None:
    """Stands in for ``send_abort_output`` inside ``abort_request``."""


@mutant("mut_abort_queued_no_reply", topologies=ALL,
        summary="an aborted queued request is popped and released but never answered (the client hangs)",
        expected="unknown (written blind); should show as a request that never gets an answer (aborted while "
                 "still queued: the client hangs, a pause(abort) or weight update behind it never completes)")
def _install_mut_abort_queued_no_reply(scheduler_module: Any) -> None:
    """``abort_request`` pops a matching request from the waiting queue
    ("abort method 1") and releases its cache-side state, but no longer sends
    the abort echo (``send_abort_output(_make_abort_req(...))``) that tells
    the tokenizer manager the request is over. The request has left every
    scheduler queue, so nothing will ever answer it. Running requests
    (``to_finish``, answered through the output stream) and the chunked
    request (``process_pending_chunked_abort``, which sends its own echo
    outside ``abort_request``) are unaffected.

    Plausible: "the tokenizer manager initiated the abort, it already knows"
    -- a clean-up that drops the send, or a refactor moving it into
    ``_release_aborted_request`` and forgetting the call site. The comment
    above the pop even says the echo is needed. The mutant wraps
    ``Scheduler.abort_request`` and shadows ``send_abort_output`` for the
    duration of the call; in the non-disaggregated, non-dLLM scheduler the
    only call of it inside ``abort_request`` is that echo, so the effect is
    exactly deleting that line.

    Trigger: an abort (by rid, or abort_all) of a request that is still in
    the waiting queue: queued behind KV pressure, max-running limits or a
    chunked prefill, or queued while the engine is paused (in_place or
    retract, which also puts retracted requests back in the queue). The
    warm-up never aborts.

    Seen by (written blind), as a user sees it: the aborted request never
    returns (the client hangs until its own timeout; its rid stays in the
    tokenizer manager). pause_generation(mode=abort) with queued requests
    never completes (it re-sends abort_all until the model-update lock
    frees, which it never does), and update_weights_from_disk waits forever.
    No crash, no KV leak (a queued request holds no KV). All topologies."""
    mutant = "mut_abort_queued_no_reply"
    cls = scheduler_class(scheduler_module, mutant)
    find_method(cls, "send_abort_output", mutant, ("abort_req", "req"))
    original = find_method(cls, "abort_request", mutant, ("recv_req",))

    def abort_request(self, recv_req):
        shadowed = "send_abort_output" not in self.__dict__
        if shadowed:
            # MUTANT: the waiting-queue pop no longer echoes the abort to the tokenizer manager
            self.send_abort_output = _drop_abort_output
        try:
            return original(self, recv_req)
        finally:
            if shadowed:
                del self.send_abort_output

    replace_attr(cls, "abort_request", abort_request, original)
